"""The ``edgesdk`` Typer application that the command modules register on."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="edgesdk: quantize models into validated INT8 bundles, inspect them, and run them on the best device here.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
