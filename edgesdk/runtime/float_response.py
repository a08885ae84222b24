"""The monitor's ``float_artifact`` response (:class:`~edgesdk.choices.MonitorResponse`) for one loaded
:class:`~edgesdk.Model`: while a signal it is set for is at alert, the model serves the bundle's float artifact on the
same engine and device (FP32, else FP16), which quantization did not narrow to the calibration data's ranges; once
the signal clears, it goes back to the artifact load chose.

Bounded: the level's hysteresis bounds how often it is asked to switch (one switch per level change, never per
inference); a switch reopens the engine as load does (:func:`~edgesdk.runtime.opening.open_checked`: numerics
checked unless loaded with ``check_numerics=False``); a switch that fails to open or to check (either way) keeps the
engine in use and is not tried again for ``RETRY_AFTER_S``; an artifact that failed its validation gate at quantize
time is never a target. A model already on a float artifact, or whose bundle has none for its engine, stays where it
is (logged once). The float engine is opened before the INT8 one is closed, outside the memory budget's accounts
(the model's ``cost_mb`` stays the INT8 artifact's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from .opening import open_checked
from .placement import Candidate, Placement

log = logging.getLogger("edgesdk.monitor")

FLOAT_PRECISIONS = ("fp32", "fp16")  # in the order tried
RETRY_AFTER_S = 30.0


class FloatResponse:
    """Which engine and placement serve a model while the monitor asks for its float artifact."""

    def __init__(self, bundle: Any, placement: Placement, threads: int | None, check_numerics: bool,
                 engine_options: dict[str, Any] | None, isolate: bool):
        self._bundle = bundle
        self._home = placement
        self._threads, self._check, self._isolate = threads, check_numerics, isolate
        self._options = dict(engine_options or {})
        self.target = None if placement.precision in FLOAT_PRECISIONS else _float_artifact(bundle, placement)
        self.on_float = False
        self._failed_at: float | None = None
        self._told = False

    def follow(self, wanted: bool, engine: Any, placement: Placement) -> tuple[Any, Placement]:
        """The engine and placement to serve with now that the monitor wants (or no longer wants) the float
        artifact; ``engine`` is closed when it is replaced. Never raises: a switch that fails keeps ``engine``."""
        if wanted == self.on_float:
            return engine, placement
        if wanted and self.target is None:
            if not self._told:
                self._told = True
                log.warning("monitor: float_artifact response: bundle %r has no float artifact for %s that passed "
                            "its gate (it runs %s); it stays where it is", self._bundle.name, self._home.engine,
                            self._home.artifact)
            return engine, placement
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
            return engine, placement  # a switch (either way) failed a moment ago: not every inference tries again
        goal = self.target if wanted else Candidate(self._home.engine, self._home.device, self._home.kind,
                                                    self._home.artifact, self._home.precision)
        try:
            fresh, check = open_checked(self._bundle, goal, self._threads, check_numerics=self._check,
                                        options=self._options, isolate=self._isolate and wanted)
        except Exception as exc:  # its probe, load or numbers failed: keep serving with what runs
            self._failed_at = time.monotonic()
            log.warning("monitor: float_artifact response: could not open %s (%s); %s keeps serving", goal.artifact,
                        exc, placement.artifact)
            return engine, placement
        engine.close()
        self.on_float, self._failed_at = wanted, None
        log.warning("monitor: float_artifact response: %s now serves %r (was %s)", goal.artifact, self._bundle.name,
                    placement.artifact)
        if not wanted:
            return fresh, self._home
        return fresh, replace(self._home, artifact=goal.artifact, precision=goal.precision,
                              executing=fresh.executing, effective_precision=fresh.effective_precision,
                              fully_accelerated=fresh.fully_accelerated, numerics=check)


def _float_artifact(bundle: Any, placement: Placement) -> Candidate | None:
    """The bundle's float artifact for the placement's engine (FP32 first), or None."""
    mine = [a for a in bundle.artifacts if a.engine == placement.engine and a.precision in FLOAT_PRECISIONS
            and bundle.failed_gate(a.id) is None]
    if not mine:
        return None
    best = min(mine, key=lambda a: FLOAT_PRECISIONS.index(a.precision))
    return Candidate(placement.engine, placement.device, placement.kind, best.id, best.precision)


__all__ = ["FloatResponse", "RETRY_AFTER_S"]
