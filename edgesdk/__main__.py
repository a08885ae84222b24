"""``python -m edgesdk``: the same as the ``edgesdk`` command."""

from .cli import main

if __name__ == "__main__":
    main()
