"""Timing one call the same way for every profiler: the median of repeated runs after a warm-up, through the one
timing loop of edgesdk (:func:`edgesdk.runtime.timing.run_times`)."""

from __future__ import annotations

from typing import Callable

from ...runtime import timing


def time_call(call: Callable[[], object], min_runs: int, min_seconds: float, warmup: int = 2) -> float:
    """The median ms of ``call`` over at least ``min_runs`` runs and ``min_seconds`` of wall time (at most
    ``20 * min_runs`` runs), after ``warmup`` runs."""
    return timing.run_times(call, warmup=warmup, min_runs=min_runs, max_runs=20 * min_runs, min_s=min_seconds,
                     wall=True).median_ms
