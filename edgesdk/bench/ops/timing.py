"""Timing one call the same way for every profiler: the median of repeated runs after a warm-up."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np


def time_call(call: Callable[[], object], min_runs: int, min_seconds: float, warmup: int = 2) -> float:
    """The median ms of ``call`` over at least ``min_runs`` runs and ``min_seconds`` (at most ``20 * min_runs``
    runs), after ``warmup`` runs."""
    for _ in range(warmup):
        call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if len(times) >= 20 * min_runs:
            break
    return float(np.median(times) * 1e3)
