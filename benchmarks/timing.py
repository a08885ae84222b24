"""Interleaved timing: the calls being compared take turns, so that the noise of a shared machine hits all alike."""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np


def interleaved(calls: dict[str, Callable[[], object]], iters: int, warmup: int = 20,
                block: int = 1) -> dict[str, np.ndarray]:
    """Seconds per call for each of ``calls``, ``iters`` samples each.

    Runs in rounds: each round runs every call ``block`` times in a row, and the order rotates from one
    round to the next, so no call always follows the same neighbour (an engine whose thread pool still
    spins after its run slows whatever runs next).
    """
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds = -(-iters // block)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            call, out = calls[name], times[name]
            for _ in range(block):
                t0 = time.perf_counter()
                call()
                out.append(time.perf_counter() - t0)
    return {name: np.asarray(t[:iters]) for name, t in times.items()}


def p50_us(samples: np.ndarray) -> float:
    return float(np.median(samples)) * 1e6


class OtherLoad:
    """CPU time used by other processes while the block runs, in cores (Linux; None elsewhere).

    The machine is shared: a run during which others kept a core busy is not comparable to a quiet one.
    ``children=True`` also counts as its own the child processes this one waited for in the block (a benchmark
    that runs ``edgesdk bench`` in a subprocess).
    """

    cores: float | None = None

    def __init__(self, children: bool = False):
        self._children = children

    def __enter__(self) -> "OtherLoad":
        self._start = _busy_seconds(), _own_seconds(self._children), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        busy0, own0, t0 = self._start
        busy1 = _busy_seconds()
        if busy0 is not None and busy1 is not None:
            own = _own_seconds(self._children) - own0
            self.cores = max(0.0, (busy1 - busy0) - own) / (time.perf_counter() - t0)

    def __str__(self) -> str:
        return "unknown" if self.cores is None else f"{self.cores:.2f} cores"


def _busy_seconds() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds(children: bool = False) -> float:
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)
