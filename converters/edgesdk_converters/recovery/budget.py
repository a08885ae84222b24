"""How long accuracy recovery may take: one budget for the whole quantize run, shared by the INT8 artifacts that fail
their gate (:class:`Budget`: each gets what is left, divided by the artifacts still to go), derived from the float
model when the caller gives none (:func:`default_budget`).

Why the default scales with MACs: every trial re-quantizes (calibration runs the model on each calibration sample)
and validates (the candidate and its float reference on each validation sample), so a trial costs about the model's
multiply-accumulates times the samples, and a budget in proportion buys about as many trials on a big model as on a
small one; each failing artifact runs its own trials, so above ``SMALL_MODEL_BYTES`` the budget is per failing
artifact (the PP-OCRv4 recognizer, 0.70 GMAC: its three INT8 artifacts failed their gate and needed 15, 30 and 26 s,
where one 60 s budget for all left the third out of time). Under ``SMALL_MODEL_BYTES`` the budget is
``SMALL_BUDGET`` for the whole run whatever the MACs and the artifacts, so that a default ``quantize`` of a small
model finishes within two minutes on two cores, recovery included.
"""

from __future__ import annotations

import time
from typing import Callable

SMALL_MODEL_BYTES = 10_000_000  # the float model's files: below this, the budget is SMALL_BUDGET
SMALL_BUDGET = 60.0  # seconds for all of a run's recovery
SECONDS_PER_GMAC = 60.0  # above SMALL_MODEL_BYTES: per 10^9 multiply-accumulates of one inference
BYTES_PER_SMALL_BUDGET = 20_000_000  # when the MACs cannot be read: SMALL_BUDGET per this many bytes of the model
MAX_BUDGET = 1800.0


def default_budget(model_bytes: int, macs: int | None = None, artifacts: int = 1) -> tuple[float, str]:
    """The recovery budget of a quantize run, in seconds, and how it was derived (said in the log and the manifest).
    ``model_bytes``: the float model's files; ``macs``: its multiply-accumulates for one inference (None: they
    could not be read; the size stands in for them); ``artifacts``: the INT8 artifacts that fail their gate. Under
    ``SMALL_MODEL_BYTES``: ``SMALL_BUDGET``; above it: ``SECONDS_PER_GMAC`` per GMAC per failing artifact (at least
    ``SMALL_BUDGET``, at most ``MAX_BUDGET``)."""
    if model_bytes < SMALL_MODEL_BYTES:
        return SMALL_BUDGET, f"the default for a float model under {SMALL_MODEL_BYTES / 1e6:g} MB: {_size(model_bytes)}"
    artifacts = max(1, int(artifacts))
    each = f" per failing INT8 artifact, {artifacts} failing" if artifacts > 1 else ""
    if macs is not None and macs > 0:
        seconds = SECONDS_PER_GMAC * macs / 1e9 * artifacts
        how = (f"{SECONDS_PER_GMAC:g} s per GMAC of the float model{each}: {macs / 1e9:.2f} GMAC, "
               f"{_size(model_bytes)}")
    else:
        seconds = SMALL_BUDGET * model_bytes / BYTES_PER_SMALL_BUDGET * artifacts
        how = (f"{SMALL_BUDGET:g} s per {BYTES_PER_SMALL_BUDGET / 1e6:g} MB of the float model{each}: "
               f"{_size(model_bytes)} (its MACs could not be read)")
    if seconds > MAX_BUDGET:
        return MAX_BUDGET, how + f", at most {MAX_BUDGET:g} s"
    if seconds < SMALL_BUDGET:
        return SMALL_BUDGET, how + f", at least {SMALL_BUDGET:g} s"
    return seconds, how


def _size(model_bytes: int) -> str:
    return f"{model_bytes / 1e6:.1f} MB" if model_bytes >= 100_000 else f"{model_bytes / 1e3:.1f} kB"


class Budget:
    """The seconds recovery may still spend in this run, from its start (``clock``: seconds, monotonic)."""

    def __init__(self, seconds: float, how: str, clock: Callable[[], float] = time.perf_counter):
        self.seconds, self.how, self.clock = float(seconds), how, clock
        self.started = clock()
        self.finished: float | None = None

    def spent(self) -> float:
        return (self.clock() if self.finished is None else self.finished) - self.started

    def finish(self) -> None:
        """Recovery is over: what was spent stays as it is now."""
        self.finished = self.clock()

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent())

    def share(self, artifacts_to_go: int) -> float:
        """What the next artifact may spend: what is left, divided evenly among the artifacts still to recover (one
        that finishes early leaves its rest to the others)."""
        return self.left() / max(1, artifacts_to_go)

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 1), "derived": self.how, "spent": round(self.spent(), 1)}
