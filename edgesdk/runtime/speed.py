"""The speed decisions of a load, measured and cached by :mod:`edgesdk.runtime.precision_choice`: the engine race before
the walk (each candidate of the first device kind opened alone and timed; the clear winner goes first) and the
INT8-against-FP32 pair during it (a loaded INT8 model timed against its loaded FP32 rival; the walk keeps one).
Here is when each runs and how it reorders the :class:`~edgesdk.runtime.candidates.Shortlist`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..budgets import memory
from . import autotune, precision_choice
from ..choices import BackendReason
from ..engines import Engine
from ..errors import BackendUnavailable
from .placement import Candidate, Skip
from . import fitting
from .candidates import Shortlist
from .opening import open_checked
from .options import RuntimeOptions


def race(found: Shortlist, opts: RuntimeOptions, engine_options: dict[str, Any], costs: memory.CostBook,
         limit: memory.MemoryLimit, in_use_mb: Callable[[], float]) -> tuple[dict | None, set[Candidate]]:
    """Which engine and precision are fastest here? Timed once per machine (when the race applies and there is
    room in the memory limit for every entrant), then cached; the winner goes first in ``found.eligible``.
    Returns the decision (None: no race) and the candidates an isolated probe passed during it (not probed again)."""
    engine_choice, probed = None, set()
    bundle = found.bundle
    if not precision_choice.race_applies(opts.speed_check, opts.policy, opts.engine, opts.device, opts.artifact,
                                         opts.performance, bundle):
        return engine_choice, probed
    entrants = precision_choice.shortlist(found.eligible, found.failed_gates, found.unverified)
    if len(entrants) > 1:
        engine_choice = precision_choice.cached_race(bundle, entrants, found.threads, opts.performance)
        if engine_choice is None and fitting.race_fits(bundle, entrants, costs, limit, in_use_mb()):
            engine_choice = _run_race(found, entrants, opts, engine_options, probed)
        found.drop_skipped()  # skipped by the race already: not opened again
        if engine_choice is not None:
            found.eligible = precision_choice.put_first(found.eligible, engine_choice)
            found.failed_last(opts.artifact)  # still: allowed artifacts that failed their gate last
    return engine_choice, probed


def _run_race(found: Shortlist, entrants: list[Candidate], opts: RuntimeOptions, engine_options: dict[str, Any],
              probed: set[Candidate]) -> dict | None:
    """Time each entrant alone: opened (numerics checked and isolated when asked: ``probed`` collects what an
    isolated probe already passed), timed, closed; then the leader and the incumbent once more. A candidate that
    does not open is skipped, as in the load walk. None when fewer than two were timed."""
    bundle, threads = found.bundle, found.threads
    feeds = precision_choice.race_feeds(bundle)

    def timed(cand: Candidate, first: bool) -> float | None:
        try:
            engine, _ = open_checked(bundle, cand, threads, check_numerics=opts.check_numerics and first,
                                     options=engine_options, isolate=opts.isolate and first)
        except BackendUnavailable as exc:
            found.skipped.append(Skip(cand, exc.reason, exc.detail))
            if exc.reason == BackendReason.DEVICE_MISSING and (cand.engine, cand.device) in found.unverified:
                autotune.remember_failed_probe(cand.engine, cand.device, exc.detail)
            return None
        if opts.isolate:
            probed.add(cand)
        fitting.WARM_ENGINES.add(cand.engine)
        try:
            return precision_choice.time_alone(engine, feeds)
        except Exception as exc:  # it would fail when served too: the race goes on without it
            found.skipped.append(Skip(cand, BackendReason.RUN_FAILED, f"{cand.label()} failed while timed: {exc}"))
            return None
        finally:
            engine.close()

    first: dict[Candidate, float] = {}
    for cand in entrants:
        seconds = timed(cand, True)
        if seconds is not None:
            first[cand] = seconds
    if len(first) < 2:
        return None
    second: dict[Candidate, float] = {}
    incumbent, best = next(iter(first)), precision_choice.leader(first)
    if best != incumbent:
        for cand in (incumbent, best):
            seconds = timed(cand, False)
            if seconds is not None:
                second[cand] = seconds
    return precision_choice.decide_race(bundle, entrants, first, second, threads, opts.performance)


def pair_applies(found: Shortlist, opts: RuntimeOptions, engine_choice: dict | None) -> tuple[bool, dict[str, dict]]:
    """Without a race (an engine or device named, or no room for it): is INT8 really faster than FP32 on the first
    engine? A cached decision orders ``found.eligible`` now; an INT8 candidate without one is timed against its FP32
    rival once both are loaded (:func:`timed_pair`). Returns whether the walk looks for rivals, and the cached
    decisions by candidate label."""
    applies = engine_choice is None and precision_choice.applies(opts.speed_check, opts.policy, opts.artifact,
                                                                 opts.performance, found.bundle)
    known: dict[str, dict] = {}
    if applies:
        found.eligible, known = precision_choice.arrange(found.bundle, found.eligible, found.threads,
                                                         opts.performance, barred=found.failed_gates)
    return applies, known


def shown(cand: Candidate, found: Shortlist, engine_choice: dict | None, known: dict[str, dict]) -> dict | None:
    """The precision decision a placement on ``cand`` shows before any pair is timed: the race's view of the
    winner's two artifacts, or a cached pair decision."""
    if engine_choice is None:
        return precision_choice.shown(cand, known)
    if cand.label() == engine_choice["chosen"]:
        return precision_choice.precision_from_race(engine_choice, found.listed)
    return None


def timed_pair(found: Shortlist, int8: Candidate, int8_engine: Engine, fp32: Candidate, fp32_engine: Engine,
               performance: str) -> dict[str, Any]:
    """Time a loaded INT8 engine against its loaded FP32 rival; the decision's ``chosen`` says which serves. An
    engine that fails here (check_numerics=False) fails at predict too: then INT8 serves, unmeasured."""
    try:
        return precision_choice.measure(found.bundle, int8, int8_engine, fp32, fp32_engine, found.threads,
                                        performance)
    except Exception as exc:
        return precision_choice.unmeasured(int8, fp32, [], f"timing failed: {exc}")


__all__ = ["race", "pair_applies", "shown", "timed_pair"]
