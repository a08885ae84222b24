"""``edgesdk.load``: open and verify a bundle, walk its candidates best first, serve the first that opens, checks
and fits. The walk reads as its steps, each another module's: list and order the candidates
(:mod:`~edgesdk.runtime.candidates`), the speed checks (:mod:`~edgesdk.runtime.speed`), the memory budget
(:mod:`~edgesdk.runtime.fitting`), opening and checking one (:mod:`~edgesdk.runtime.opening`), and the error when
nothing serves (:mod:`~edgesdk.runtime.failure`). :func:`load_device` is the walk alone, for a
:class:`~edgesdk.ModelPool` that accounts memory itself; :func:`load` merges options, and adds the cloud in hybrid
mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..budgets import memory
from . import autotune, precision_choice, selection
from ..bundle.reader import Bundle
from ..choices import BackendReason, BudgetReason, HybridMode
from ..engines import Engine, backend_names
from ..errors import BackendUnavailable, BudgetExceeded, BundleError, InputError
from ..hybrid.model import HybridModel
from .placement import Candidate, Placement, Skip
from ..trust import bundle_dir
from . import candidates, failure, fitting, speed
from .model import Model
from .opening import open_checked
from .options import RuntimeOptions, merge_options


def load(path: str | Path, options: RuntimeOptions | None = None, **overrides: Any) -> "Model | HybridModel":
    """Open and verify a bundle, pick a backend per the options, check its numerics, return a Model.

    Keyword shortcuts override ``options`` fields: ``load(p, policy="cpu-only", require="NPU")``;
    ``memory_mb``/``thermal`` set the budgets, ``mode``/``cloud``/``token_env``/``escalation`` the hybrid
    options. In a hybrid mode other than ``device-only`` the result is a :class:`~edgesdk.hybrid.model.HybridModel`
    (same ``predict``), which also serves when the device cannot (``prefer-*`` modes).
    """
    opts = merge_options(options, overrides)
    if opts.hybrid.mode == HybridMode.DEVICE_ONLY:
        return load_device(path, opts)
    return _load_hybrid(path, opts)


def _load_hybrid(path: str | Path, opts: RuntimeOptions) -> HybridModel:
    from ..hybrid.client import CloudClient, check_url

    hyb = opts.hybrid
    owns = isinstance(hyb.cloud, str)
    if owns:
        check_url(hyb.cloud)  # a bad URL is refused before the (slow) device load
    device, error = None, None
    if hyb.mode != HybridMode.CLOUD_ONLY:
        try:
            device = load_device(path, opts)
        except (BackendUnavailable, BudgetExceeded, BundleError) as exc:  # the cloud serves what the device cannot
            # (a BundleError here is an artifact that crashed its isolated probe; a bundle that fails its own
            # checks or its signature fails again just below, where the cloud client needs its manifest)
            error = exc
    # Opened (and verified) once: the device model's, else here.
    bundle = device.bundle if device is not None else Bundle.open(bundle_dir(path, opts.trust))
    if error is not None and opts.artifact is not None and not opts.allow_failed \
            and bundle.failed_gate(opts.artifact) is not None:
        raise error  # a failed artifact asked for by name is a misuse to fix, not something for the cloud to cover
    # the bundle's task's check of a cloud answer (detection: boxes) is the model's, passed with each call: an app's
    # own client is never changed
    cloud = CloudClient(hyb.cloud, bundle.name, token_env=hyb.token_env) if owns else hyb.cloud
    return HybridModel(bundle, device, error, hyb, cloud, owns_cloud=owns)


@dataclass
class _Opened:
    """A candidate opened and checked by the walk, not yet a Model (the precision pair may still drop it)."""

    cand: Candidate
    engine: Engine
    numerics: dict[str, Any]
    cost_mb: float
    budget: dict[str, Any]
    alternatives: list[Candidate]
    precision_choice: dict[str, Any] | None


def load_device(path: str | Path, opts: RuntimeOptions, in_use_mb: Callable[[], float] = memory.rss_mb) -> Model:
    """Load ``path`` on this device (``opts`` as merged by :func:`merge_options`; its hybrid part is not read).
    ``in_use_mb()`` says how much of the memory limit is taken now: the process RSS, or what a
    :class:`~edgesdk.ModelPool` accounts for its models. Raises as :func:`load` does when nothing serves."""
    # opts checked its policy, performance, speed_check and threads when it was built; require (engines may be
    # registered after that) is checked here.
    selection.check_policy(opts.policy, opts.require)
    if not isinstance(opts.allow_failed, bool):
        raise InputError(f"allow_failed must be True or False, got {opts.allow_failed!r}")
    engine_options = {"performance": opts.performance, "cache_dir": opts.cache_dir}
    if opts.engine is not None and opts.engine not in backend_names():
        raise InputError(f"unknown engine {opts.engine!r} (engines: {', '.join(backend_names())})")
    bundle = Bundle.open(bundle_dir(path, opts.trust))
    if opts.artifact is not None:
        # An unknown id, or one that failed its validation gate (without allow_failed), is a BundleError.
        bundle.servable_artifact(opts.artifact, opts.allow_failed)
    found = candidates.shortlist(bundle, opts)
    decision = candidates.autotuned(found, opts, engine_options)
    found.failed_last(opts.artifact)
    limit = fitting.memory_limit(opts.budgets.memory_mb, found.profile)
    costs = memory.CostBook()
    engine_choice, race_probed = speed.race(found, opts, engine_options, costs, limit, in_use_mb)
    choose_precision, known_choices = speed.pair_applies(found, opts, engine_choice)

    over_budget: list[BudgetExceeded] = []
    failed_devices: dict[tuple[str, str], Skip] = {}
    skipped = found.skipped

    def model(kept: _Opened, choice: dict[str, Any] | None) -> Model:
        """The Model serving ``kept``, its placement showing every skip of the walk (closes it if that fails)."""
        cand = kept.cand
        try:
            placement = Placement(
                engine=cand.engine, device=cand.device, kind=cand.kind, artifact=cand.artifact,
                precision=cand.precision, executing=kept.engine.executing,
                effective_precision=kept.engine.effective_precision,
                fully_accelerated=kept.engine.fully_accelerated, numerics=kept.numerics, policy=opts.policy,
                profile=getattr(found.profile, "name", None), skipped=skipped, autotune=decision,
                precision_choice=choice, engine_choice=engine_choice)
            return Model(bundle, kept.engine, placement, budget=kept.budget, thermal=opts.budgets.thermal,
                         cost_mb=kept.cost_mb, threads=found.threads, alternatives=kept.alternatives,
                         check_numerics=opts.check_numerics, engine_options=engine_options, isolate=opts.isolate,
                         monitor=opts.monitor or None)
        except BaseException:
            kept.engine.close()
            raise

    held: tuple[_Opened, Candidate] | None = None  # an opened INT8 candidate and its FP32 rival, opened next
    queue = list(found.eligible)
    try:
        while queue:
            cand = queue.pop(0)
            if held is not None and cand != held[1]:
                break  # the rival did not load
            if (cand.engine, cand.device) in failed_devices:
                first = failed_devices[(cand.engine, cand.device)]
                skipped.append(Skip(cand, first.reason, f"{first.detail} (as for {first.candidate.artifact})"))
                continue
            cost = fitting.expected(bundle, cand, costs)
            try:
                # a held INT8 model (timed against this FP32 rival next) is not in the caller's accounts yet
                memory.check_fits(cand.label(), cost.mb, limit, in_use_mb() + (held[0].cost_mb if held else 0.0))
            except BudgetExceeded as exc:
                over_budget.append(exc)
                skipped.append(Skip(cand, BudgetReason.MEMORY, exc.detail))
                continue
            before = memory.rss_mb()
            try:
                engine, check = open_checked(bundle, cand, found.threads, check_numerics=opts.check_numerics,
                                             options=engine_options, isolate=opts.isolate and cand not in race_probed)
            except BackendUnavailable as exc:
                skip = Skip(cand, exc.reason, exc.detail)
                skipped.append(skip)
                if exc.reason == BackendReason.DEVICE_MISSING:
                    failed_devices[(cand.engine, cand.device)] = skip
                    if (cand.engine, cand.device) in found.unverified:
                        autotune.remember_failed_probe(cand.engine, cand.device, exc.detail)
                continue
            try:
                charged = fitting.charged(costs, cand, cost, before)
                alternatives = []
                if opts.budgets.thermal is not None:  # where a hot device may move it
                    failed = {s.candidate for s in skipped} | {cand}
                    # Never onto an artifact that failed its validation gate: allow_failed admits what load serves,
                    # not a silent switch later.
                    alternatives = fitting.switch_candidates(
                        [c for c in found.eligible if c not in failed and c.artifact not in found.failed_gates],
                        bundle, costs, limit, in_use_mb(), cand)
                # only allow_failed gets here with one; the warning points at load's caller
                bundle.warn_if_failed(cand.artifact, stacklevel=3)
            except BaseException:
                engine.close()
                raise
            budget = fitting.budget_entry(limit, charged, cost, switched=bool(over_budget))
            opened = _Opened(cand, engine, check, charged, budget, alternatives,
                             speed.shown(cand, found, engine_choice, known_choices))
            if held is not None:
                int8, held = held[0], None
                try:
                    choice = speed.timed_pair(found, int8.cand, int8.engine, cand, engine, opts.performance)
                except BaseException:
                    engine.close()
                    int8.engine.close()
                    raise
                keep, drop = (opened, int8) if choice["chosen"] == "fp32" else (int8, opened)
                drop.engine.close()
                return model(keep, choice)
            rival = precision_choice.rival(cand, queue, known_choices, found.failed_gates) \
                if choose_precision else None
            if rival is None:
                return model(opened, opened.precision_choice)
            held = (opened, rival)  # load the rival next, then time the two
            queue.remove(rival)
            queue.insert(0, rival)
        if held is not None:  # the rival did not load: the INT8 model serves
            int8, rival = held
            held = None
            return model(int8, precision_choice.unmeasured(int8.cand, rival, skipped))
    except BaseException:
        if held is not None:
            held[0].engine.close()
        raise
    raise failure.nothing_serves(bundle, skipped, over_budget, opts.require, found.unverified,
                                 None if opts.fallback else failure.named_choices(opts.engine, opts.device,
                                                                                  opts.artifact))


__all__ = ["load", "load_device"]
