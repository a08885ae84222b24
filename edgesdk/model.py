"""``from edgesdk.model import load, Model, RuntimeOptions, Budgets, Result``: the names this module always had.
They live in :mod:`edgesdk.runtime` now (options, result, loading, the loaded model), split by what each owns."""

from __future__ import annotations

from .bundle_io import Top
from .runtime.candidates import detect_platform
from .runtime.loading import load
from .runtime.model import Model
from .runtime.options import Budgets, RuntimeOptions
from .runtime.result import Result

__all__ = ["load", "Model", "RuntimeOptions", "Budgets", "Result", "Top", "detect_platform"]
