"""``python -m edgesdk.cli``: the same as the ``edgesdk`` command."""

from . import main

main()
