"""``python -m edgesdk.cli``: the same as the ``edgesdk`` command."""

from . import main

if __name__ == "__main__":
    main()
