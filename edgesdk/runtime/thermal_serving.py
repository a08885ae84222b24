"""How a loaded model carries out the thermal governor's plan (:mod:`edgesdk.budgets.thermal`): which backend and thread count serve the next
inference, and what its result's budget entry says.

At load the runtime hands over the candidates it may serve from (the policy's order, ``require`` met, none that
failed at load, and within the memory limit: see :func:`edgesdk.runtime.fitting.switch_candidates`). The
lower-power one is an NPU
when the model is not on one, else a lower precision on the same kind of device (INT8 before FP16 before FP32,
the same engine and device first). The CPU and a GPU are not traded for each other: which draws less depends on
the device (a phone GPU more than its CPU, a Jetson GPU less). A plan that says ``prefer: lower_power`` (hot, by
default) switches to it; a plan that does not switches back. Engines fix their device, artifact and threads at
load, so a switch reopens the engine, once per plan (i.e. per sensor read that changes it), never per
inference. A backend is opened as the load opens one (:func:`edgesdk.runtime.opening.open_checked`): its numerics
checked unless the model was loaded with ``check_numerics=False``, and with ``isolate=True`` probed in a child process
first, once per backend and model (the one load put it on was probed then). A backend that fails to open, its probe
or its numerics check is not used, and not tried again for ``RETRY_AFTER_S``; the plan's thread count is then applied
to the backend in use.

The result's budget entry is made once per plan, read-only (:mod:`edgesdk.frozen`); only a paced or deferred
inference, whose sleep is its own, gets an entry of its own.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Sequence

from ..budgets.thermal.governor import Plan, describe
from ..choices import BudgetAction, BudgetReason
from ..engines import Engine
from ..errors import BudgetExceeded
from ..frozen import FrozenDict, freeze
from .opening import open_checked
from .placement import Candidate, Placement

PRECISION_POWER = ("int8", "fp16", "fp32")
RETRY_AFTER_S = 30.0  # a backend that failed to open or to check is not tried again for this long


def _precision(c: Candidate) -> int:
    return PRECISION_POWER.index(c.precision) if c.precision in PRECISION_POWER else len(PRECISION_POWER)


def lower_power(current: Candidate, alternatives: Sequence[Candidate]) -> Candidate | None:
    """Where ``prefer: lower_power`` moves a model served by ``current``, or None: an NPU if ``current`` is not
    one, else a lower precision on the same kind of device; INT8 first, then the same engine and device as
    ``current``, then the earlier alternative (the policy's preference)."""
    def lower(c: Candidate) -> bool:
        if c.kind == "NPU" and current.kind != "NPU":
            return True
        return c.kind == current.kind and _precision(c) < _precision(current)

    same = (current.engine, current.device)
    found = [c for c in alternatives if lower(c)]
    return min(found, key=lambda c: (c.kind != "NPU", _precision(c), (c.engine, c.device) != same)) \
        if found else None


class ThermalServing:
    """The thermal side of one :class:`~edgesdk.Model`: call :meth:`admit` under the model's lock before each
    inference; it returns the engine to run on, the placement to report and the result's budget entry."""

    def __init__(self, governor: Any, bundle: Any, engine: Engine, placement: Placement, budget: dict,
                 threads: int | None, alternatives: Sequence[Candidate] = (), check_numerics: bool = True,
                 engine_options: dict[str, Any] | None = None, isolate: bool = False):
        self.governor = governor
        self._bundle = bundle
        self._budget = budget
        self._home = _candidate(placement)
        self._home_placement = placement
        self._lower = lower_power(self._home, [c for c in alternatives if c != self._home])
        self._base_threads = threads
        self.engine, self.placement = engine, placement
        self._now, self._threads_now = self._home, threads
        self._check_numerics = check_numerics
        self._engine_options = dict(engine_options or {})  # performance, cache_dir: as the model was loaded
        self._isolate = isolate
        self._probed = {self._home}  # with isolate: backends a child process opened and ran (home: at load)
        self._failed: dict[tuple[Candidate, int | None], float] = {}  # -> when it failed (time.monotonic)
        self._plan: Plan | None = None
        self._entries: tuple[FrozenDict, FrozenDict] = (FrozenDict(), FrozenDict())  # unpaced, paced

    @property
    def lower_power(self) -> Candidate | None:
        """Where ``prefer: lower_power`` moves this model (None: it already runs on the lowest-power choice)."""
        return self._lower

    def admit(self) -> FrozenDict:
        """Ask the governor (it may sleep, or raise :class:`BudgetExceeded`), follow a new plan, and return the
        budget entry for this inference (read-only). Afterwards ``engine`` and ``placement`` are what serves it."""
        plan, paced_s, deferred_s = self.governor.admit()
        if plan is not self._plan:
            if plan.escalate:
                # The hook for hybrid mode: until a cloud endpoint exists, escalating means not serving here.
                raise BudgetExceeded(BudgetReason.THERMAL,
                                     f"the device is {plan.level} and the governor escalates, but no "
                                     "cloud endpoint is configured; local inference is refused",
                                     needed=plan.temperature_c)
            self._follow(plan)
        if deferred_s:
            return self._entry(plan, paced_s, deferred_s)
        if not paced_s:
            return self._entries[0]  # the plan's own entry, shared by its unpaced results: read-only
        # Paced: the plan's paced entry with this inference's sleep; the rest is shared, read-only.
        template = self._entries[1]
        return FrozenDict({**template, "thermal": FrozenDict({**template["thermal"], "slept_ms": paced_s * 1e3})})

    def _follow(self, plan: Plan) -> None:
        # The governor only ever reduces threads: never above what the model was loaded with.
        cap = self._base_threads or os.cpu_count() or 1
        threads = plan.threads if plan.threads is not None and plan.threads < cap else self._base_threads
        target = self._lower if plan.prefer == "lower_power" and self._lower is not None else self._home
        # The wanted backend, else the one in use (or home) with the wanted threads.
        for choice in dict.fromkeys(((target, threads), (self._now, threads), (self._home, threads))):
            if choice == (self._now, self._threads_now):
                break
            failed_at = self._failed.get(choice)
            if failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER_S:
                continue
            if self._reopen(*choice):
                break
        self._plan = plan
        self._entries = (self._entry(plan, 0.0, 0.0), self._entry(plan, 1e-9, 0.0))

    def _reopen(self, target: Candidate, threads: int | None) -> bool:
        """Swap the engine for ``target`` with ``threads``; keep the old one when the new one fails its probe, to
        load or its numerics check (the budget then simply does not claim the change). True when swapped. Only
        the thread count changing on the backend in use is not checked again."""
        moving = target != self._now
        try:
            fresh, check = open_checked(self._bundle, target, threads, check_numerics=self._check_numerics and moving,
                                        options=self._engine_options,
                                        isolate=self._isolate and target not in self._probed)
        except Exception:  # its probe, its load or its numbers failed (or no golden data to check them with)
            self._failed[(target, threads)] = time.monotonic()
            return False
        if self._isolate:
            self._probed.add(target)
        if not moving:
            check = self.placement.numerics
        self.engine.close()
        self._failed.pop((target, threads), None)
        self.engine, self._now, self._threads_now = fresh, target, threads
        self.placement = replace(self._home_placement, engine=target.engine, device=target.device, kind=target.kind,
                                 artifact=target.artifact, precision=target.precision, executing=fresh.executing,
                                 effective_precision=fresh.effective_precision,
                                 fully_accelerated=fresh.fully_accelerated, numerics=check)
        return True

    def _entry(self, plan: Plan, paced_s: float, deferred_s: float) -> FrozenDict:
        """The result's budget entry for one inference under ``plan``: the governor's decision, with what this
        model did about it. A switch of artifact or backend is the main action; pacing and deferral come
        before fewer threads."""
        thermal = describe(plan, paced_s, deferred_s)
        switched = self._now != self._home
        actions = ["artifact_switched"] if switched else []
        actions += [a for a in thermal["actions"] if a in (BudgetAction.DEFERRED, BudgetAction.PACED)]
        if self._threads_now != self._base_threads:
            actions.append("threads_reduced")
        thermal.update(actions=actions, action=actions[0] if actions else None, artifact_now=self._now.artifact,
                       backend_now=self._now.label(), threads_now=self._threads_now)
        return freeze({**self._budget, "thermal": thermal, "action": thermal["action"] or self._budget.get("action")})


def _candidate(p: Placement) -> Candidate:
    return Candidate(p.engine, p.device, p.kind, p.artifact, p.precision)


__all__ = ["ThermalServing", "lower_power", "RETRY_AFTER_S"]
