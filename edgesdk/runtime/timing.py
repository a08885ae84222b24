"""How long a run takes: the one timing loop of edgesdk, used by ``policy="autotune"`` (:mod:`.candidates`), both speed
checks (:mod:`.precision_choice`: the race and the INT8-against-FP32 pair), ``edgesdk bench`` (:mod:`edgesdk.bench.warm`)
and the per-op profilers (:mod:`edgesdk.bench.ops`). Each caller keeps its own numbers (warm-up, how many runs, how
long); what is timed and how is the same everywhere: a warm-up that is not timed, then runs timed one by one with
:func:`time.perf_counter`, until enough runs *and* enough time, or a cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class RunTimes:
    """What :func:`run_times` measured: ``seconds`` of each timed run, in order, and the warm-up it ran first
    (``warmup_runs`` runs over ``warmup_s`` seconds of wall time)."""

    seconds: tuple[float, ...]
    warmup_runs: int
    warmup_s: float

    @property
    def median_s(self) -> float:
        return float(np.median(self.seconds))

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3


def seconds(call: Callable[[], object]) -> float:
    """Seconds one call of ``call`` takes (the clock every timing here reads)."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def run_times(call: Callable[[], object], *, warmup: int = 0, warmup_s: float = 0.0, min_runs: int = 1,
              max_runs: int | None = None, min_s: float = 0.0, max_s: float | None = None, wall: bool = False,
              timed: Callable[[], float] | None = None) -> RunTimes:
    """Run ``call`` untimed for the warm-up (at least ``warmup`` runs *and* ``warmup_s`` seconds), then timed, one run
    at a time, until at least ``min_runs`` runs *and* ``min_s`` seconds were spent, or ``max_runs`` runs, or ``max_s``
    seconds (None: no such cap). ``max_runs=0`` runs the warm-up alone.

    The seconds spent are the sum of the timed runs, or with ``wall=True`` the wall time since the first timed run
    began (what happens between runs included). ``timed``, when given, makes one timed run itself and returns its
    seconds (a caller's seam for a fake clock in tests); the warm-up still calls ``call``.
    """
    one = timed or (lambda: seconds(call))
    warm_start, warm_n = time.perf_counter(), 0
    while warm_n < warmup or time.perf_counter() - warm_start < warmup_s:
        call()
        warm_n += 1
    warm_elapsed = time.perf_counter() - warm_start
    times: list[float] = []
    start, spent = time.perf_counter(), 0.0
    while not ((len(times) >= min_runs and spent >= min_s) or (max_runs is not None and len(times) >= max_runs)
               or (max_s is not None and spent >= max_s)):
        times.append(one())
        spent = time.perf_counter() - start if wall else spent + times[-1]
    return RunTimes(tuple(times), warm_n, warm_elapsed)


__all__ = ["RunTimes", "run_times", "seconds"]
