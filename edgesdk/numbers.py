"""What counts as a number in data edgesdk reads (a manifest, a preprocess table, an option): one test, so that
every checker agrees on ``true``, infinity and NaN.

This module imports nothing from edgesdk, so every other module may import it.
"""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any, finite: bool = True) -> bool:
    """Whether ``value`` is a Python ``int`` or ``float`` (what JSON and TOML yield and ``json.dumps`` writes back).

    ``bool`` is not a number here (``True`` is an ``int`` to Python, but ``true`` in a manifest is a mistake, not 1).
    With ``finite`` (the default), ``inf``, ``-inf`` and ``nan`` are not numbers either: no value read from outside
    is meant to be one, and a NaN slips through every ``<``/``>`` range check. ``finite=False`` accepts them, for a
    caller that gives infinity a meaning of its own and says so. ``numpy.float64`` is a ``float`` subclass and so
    counts; other numpy scalars (``float32``, ``int64``, ``bool_``) do not (``json.dumps`` refuses them); a string
    such as ``"1"`` never does.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return not finite or math.isfinite(value)


__all__ = ["is_number"]
