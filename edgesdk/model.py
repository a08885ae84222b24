"""``edgesdk.load`` and the loaded :class:`Model`: predict on the backend that proved it can."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import autotune, memory, numerics, precision_choice, selection
from .bundle import Bundle
from .choices import BackendReason, BudgetReason, EscalationReason, HybridMode, Performance, Policy, SpeedCheck
from .engines import Engine, backend_names, discover, open_engine
from .errors import BackendUnavailable, BudgetExceeded, BundleError, InputError
from .bundle_io import BundleIO, Top
from .hybrid import HybridModel, HybridOptions
from .placement import Candidate, Placement, Skip
from .thermal.serving import ThermalServing
from .trust import Trust, bundle_dir

_ENGINES_LOADED: set[str] = set()  # engines that served a load in this process (their libraries are warm)


@dataclass(frozen=True)
class Budgets:
    """What serving may cost on this device.

    ``memory_mb`` caps the process memory (None: the platform profile's ``memory.budget_mb`` where it
    has one, else only the cgroup and physical limits apply). ``thermal`` is a
    :class:`~edgesdk.thermal.ThermalGovernor` consulted before every inference (None: no thermal budget).
    """

    memory_mb: float | None = None
    thermal: Any = None


@dataclass(frozen=True)
class RuntimeOptions:
    """How :func:`load` picks and runs a backend (see :mod:`edgesdk.selection` for the policies).

    ``require`` (a device kind or an engine) is strict: when it cannot be met, load raises
    :class:`BackendUnavailable` with the reason. ``profile`` names a platform profile (or a path
    to one); None detects it. ``threads`` overrides the profile's CPU thread count.
    ``budgets`` (see :class:`Budgets`): a candidate whose expected memory cost does not fit is
    skipped for a cheaper one, and when none fits load raises :class:`BudgetExceeded`; a thermal
    governor paces, cuts threads, switches to INT8 or refuses. ``load(..., memory_mb=..., thermal=...)``
    are shortcuts for the two budget fields.

    ``performance`` is ``"latency"`` (one inference at a time, as fast as it goes) or ``"throughput"``
    (OpenVINO splits the device into parallel streams and :meth:`Model.predict_batch` keeps them busy; other
    engines run as with ``"latency"``). ``cache_dir`` lets the engine keep its compiled model there for
    later loads (OpenVINO ``CACHE_DIR``, ONNX Runtime's optimized graph; LiteRT has none): a later load
    in a new process is faster, and a stale or damaged entry is rebuilt, never served.

    ``trust`` (a :class:`~edgesdk.trust.Trust`) accepts only bundles signed with its public key's pair: the
    signature is checked before any engine reads a byte, and an unsigned or altered bundle raises
    :class:`BundleError` naming the file or the reason. None (the default) checks the manifest's checksums only.
    A path to an ``.edgebundle`` file is extracted safely into the cache first.

    ``isolate=True`` opens each artifact first in a child process and runs it on every golden input the
    numerics check runs (see :mod:`edgesdk.isolate`), so a model file that crashes its engine's native code (a segfault,
    an abort) kills the child, not the application. A candidate whose child dies, exits abnormally or times
    out is skipped with reason ``isolated_probe_failed`` and is never opened in this process; when no other
    candidate serves, load raises :class:`BundleError` naming the artifact, the signal and the child's last
    stderr lines. It costs a Python start, the engine's import and one model load per candidate tried.

    An artifact whose validation gate failed at quantize time (the manifest's ``validation.<id>.passed`` is
    false) is never served by default: it is skipped with reason ``validation_failed``, naming the gate; asked
    for by ``artifact`` it raises :class:`BundleError`; when nothing else can serve, load raises
    :class:`BackendUnavailable` with reason ``validation_failed``. ``allow_failed=True`` lets such artifacts
    serve (a named one first, others only after every artifact that passed) and warns with
    :class:`~edgesdk.errors.FailedArtifactWarning` when one is loaded. A thermal budget never switches to one.

    ``speed_check`` (policies ``auto``, ``cpu-only``, ``prefer-npu``, ``prefer-gpu``; see
    :mod:`edgesdk.precision_choice`): ``"full"`` (default) times, at the first load on a machine, every candidate of
    the first device kind alone (each engine's INT8 and FP32) and serves the fastest, the profile's first unless
    another is clearly faster; ``"precision"`` keeps the profile's engine order and only times INT8 against the
    FP32 artifact of the same engine and device; ``"off"`` times nothing (the profile's order, INT8 first). The
    decisions are cached per machine; nothing is timed with ``performance="throughput"``, an explicit ``artifact``,
    or a bundle without golden inputs, and the full check also needs no ``engine``/``device`` named and room in
    the memory limit for every engine it opens.

    ``policy``, ``performance`` and ``speed_check`` take the members of :class:`~edgesdk.choices.Policy`,
    :class:`~edgesdk.choices.Performance` and :class:`~edgesdk.choices.SpeedCheck` or their strings, and hold the
    members: a value that is none of them raises :class:`InputError` here, naming the allowed ones (so does
    ``threads`` outside 1..256), also through ``dataclasses.replace`` and ``load(**overrides)``.
    """

    policy: Policy | str = Policy.AUTO
    require: str | None = None
    engine: str | None = None
    device: str | None = None
    artifact: str | None = None
    check_numerics: bool = True
    profile: str | Path | None = None
    threads: int | None = None
    performance: Performance | str = Performance.LATENCY
    cache_dir: str | Path | None = None
    trust: Trust | None = None
    isolate: bool = False
    allow_failed: bool = False
    speed_check: SpeedCheck | str = SpeedCheck.FULL
    budgets: Budgets = field(default_factory=Budgets)
    hybrid: HybridOptions = field(default_factory=HybridOptions)

    def __post_init__(self):
        selection.check_policy(self.policy, None)
        object.__setattr__(self, "policy", Policy(self.policy))
        object.__setattr__(self, "performance", Performance.parse(self.performance, "performance", InputError))
        object.__setattr__(self, "speed_check", SpeedCheck.parse(self.speed_check, "speed_check", InputError))
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or not 1 <= self.threads <= 256):
            raise InputError(f"threads must be an integer from 1 to 256, got {self.threads!r}")


@dataclass
class Result:
    """One prediction: raw outputs, top-k (classification), where it ran and how long each stage took.

    In hybrid mode (:mod:`edgesdk.hybrid`) also: ``source`` (``device`` / ``cloud``), ``escalation_reason``
    (why the cloud was asked), ``degraded`` (the cloud failed and the device answered), ``cloud_error`` (the
    cloud failure's reason) and ``signals`` (the device output's hardness signals). ``placement`` is the
    device's, None when the cloud answered a model that has no device backend.

    The top-k postprocessing runs when ``top`` is first read (an app that only needs the raw outputs
    does not pay for it); ``timings_ms["postprocess"]`` is recorded then.
    """

    outputs: list[np.ndarray]
    placement: Placement
    timings_ms: dict[str, float]
    source: str = "device"
    budget: dict[str, Any] = field(default_factory=dict)
    escalation_reason: EscalationReason | None = None
    degraded: bool = False
    signals: dict[str, float | None] | None = None
    cloud_error: str | None = None
    _topk: Any = field(default=None, repr=False, compare=False)
    _top: list[Top] | None = field(default=None, repr=False, compare=False)

    @property
    def top(self) -> list[Top]:
        if self._top is None:
            t0 = time.perf_counter()
            self._top = self._topk(self.outputs) if self._topk is not None else []
            self.timings_ms["postprocess"] = (time.perf_counter() - t0) * 1e3
        return self._top

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "escalation_reason": self.escalation_reason, "degraded": self.degraded,
                "cloud_error": self.cloud_error, "signals": self.signals, "top": [t._asdict() for t in self.top],
                "timings_ms": self.timings_ms, "outputs": [o.tolist() for o in self.outputs], "budget": self.budget}


def load(path: str | Path, options: RuntimeOptions | None = None, **overrides: Any) -> "Model | HybridModel":
    """Open and verify a bundle, pick a backend per the options, check its numerics, return a Model.

    Keyword shortcuts override ``options`` fields: ``load(p, policy="cpu-only", require="NPU")``;
    ``memory_mb``/``thermal`` set the budgets, ``mode``/``cloud``/``token_env``/``escalation`` the hybrid
    options. In a hybrid mode other than ``device-only`` the result is a :class:`~edgesdk.hybrid.HybridModel`
    (same ``predict``), which also serves when the device cannot (``prefer-*`` modes).
    """
    opts = _options(options, overrides)
    if opts.hybrid.mode == HybridMode.DEVICE_ONLY:
        return _load(path, opts, memory.rss_mb)
    return _load_hybrid(path, opts)


def _load_hybrid(path: str | Path, opts: RuntimeOptions) -> HybridModel:
    from .cloud.client import CloudClient, check_url

    hyb = opts.hybrid
    owns = isinstance(hyb.cloud, str)
    if owns:
        check_url(hyb.cloud)  # a bad URL is refused before the (slow) device load
    device, error = None, None
    if hyb.mode != HybridMode.CLOUD_ONLY:
        try:
            device = _load(path, opts, memory.rss_mb)
        except (BackendUnavailable, BudgetExceeded, BundleError) as exc:  # the cloud serves what the device cannot
            # (a BundleError here is an artifact that crashed its isolated probe; a bundle that fails its own
            # checks or its signature fails again just below, where the cloud client needs its manifest)
            error = exc
    # Opened (and verified) once: the device model's, else here.
    bundle = device.bundle if device is not None else Bundle.open(bundle_dir(path, opts.trust))
    if error is not None and opts.artifact is not None and not opts.allow_failed \
            and bundle.failed_gate(opts.artifact) is not None:
        raise error  # a failed artifact asked for by name is a misuse to fix, not something for the cloud to cover
    cloud = CloudClient(hyb.cloud, bundle.name, token_env=hyb.token_env) if owns else hyb.cloud
    return HybridModel(bundle, device, error, hyb, cloud, owns_cloud=owns)


def _options(options: RuntimeOptions | None, overrides: dict[str, Any]) -> RuntimeOptions:
    opts = options or RuntimeOptions()
    budget_overrides = {k: overrides.pop(k) for k in ("memory_mb", "thermal") if k in overrides}
    if budget_overrides:
        opts = replace(opts, budgets=replace(opts.budgets, **budget_overrides))
    hybrid = {k: overrides.pop(k) for k in ("mode", "cloud", "token_env") if k in overrides}
    if "escalation" in overrides:
        hybrid["policy"] = overrides.pop("escalation")
    if hybrid:
        opts = replace(opts, hybrid=replace(opts.hybrid, **hybrid))
    try:
        return replace(opts, **overrides)
    except TypeError as exc:
        raise InputError(f"load() got an unknown option: {exc}") from exc


def _load(path: str | Path, opts: RuntimeOptions, in_use_mb) -> "Model":
    """The load walk; ``in_use_mb()`` says how much of the memory limit is taken (a pool accounts its own).
    ``opts`` checked its policy, performance, speed_check and threads when it was built; require (engines may be
    registered after that) is checked here."""
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
    discoveries = {name: discover(name) for name in backend_names()}
    profile, _why = _profile(opts.profile, discoveries)
    threads = opts.threads or getattr(profile, "threads", None)
    # Devices only a model load can find (LiteRT GPU/NPU) are probed, except where an earlier probe on
    # this machine and engine version already failed (then only prefer-gpu/npu, require or an explicit
    # device try again).
    cands, skipped = selection.enumerate_candidates(bundle, discoveries, opts.device, True, opts.engine)
    unverified = {(d.engine, d.name) for found in discoveries.values() for d in found.devices if not d.verified}
    insist = opts.policy in selection.PROBING_POLICIES or opts.require in ("GPU", "NPU")
    kept = []
    for c in cands:
        known = (c.engine, c.device) in unverified and not insist and opts.device not in (c.device, c.kind) \
            and autotune.failed_probe(c.engine, c.device)
        if known:
            skipped.append(Skip(c, BackendReason.DEVICE_MISSING, f"{known} (remembered from an earlier probe here)"))
        else:
            kept.append(c)
    cands = kept
    ordered = selection.order(cands, opts.policy, profile, engine=opts.engine, device=opts.device,
                              artifact=opts.artifact)
    eligible = [c for c in ordered if selection.meets(c, opts.require)]
    failed_gates = selection.failed_artifacts(bundle)
    eligible, refused = selection.screen_failed(eligible, failed_gates, opts.allow_failed)
    skipped += refused
    if opts.require is not None and not eligible:
        raise _every_artifact_failed(bundle, skipped, opts.require, unverified) or \
            _unmet(opts.require, discoveries, skipped)

    decision = None
    if opts.policy == Policy.AUTOTUNE:
        # The choice depends on what was allowed: a decision timed under require=X is not reused without it.
        key = autotune.cache_key(bundle, {k: str(v) for k, v in vars(opts).items()
                                           if k not in ("budgets", "hybrid", "cache_dir")})
        decision = autotune.lookup(key)
        if decision:  # try the cached winner first; it is still checked
            eligible.sort(key=lambda c: c.label() != decision.get("candidate"))
            decision = {**decision, "cached": True}
        else:
            decision = _autotune(bundle, eligible, skipped, threads, opts.check_numerics, engine_options,
                                 opts.isolate)
            if decision["candidate"] is not None:  # a failure is not remembered: the next load measures again
                autotune.store(key, decision)
            failed = {s.candidate for s in skipped}
            eligible = [c for c in eligible if c not in failed]  # recorded by the timing walk already
            eligible.sort(key=lambda c: c.label() != decision["candidate"])

    # Allowed artifacts that failed their gate are the last resort, unless one was asked for by name.
    eligible.sort(key=lambda c: c.artifact in failed_gates and c.artifact != opts.artifact)

    budget_mb = opts.budgets.memory_mb
    if budget_mb is None and profile is not None:
        budget_mb = profile.memory.get("budget_mb")  # the device family's default, where it has one
    if budget_mb is not None and not budget_mb > 0:
        raise InputError(f"memory_mb must be positive, got {budget_mb!r}")
    limit = memory.process_limit(budget_mb)
    costs = memory.CostBook()
    over_budget: list[BudgetExceeded] = []
    failed_devices: dict[tuple[str, str], Skip] = {}
    # Which engine and precision are fastest here (edgesdk.precision_choice)? Timed once per machine, then cached.
    engine_choice, race_probed = None, set()
    if precision_choice.race_applies(opts.speed_check, opts.policy, opts.engine, opts.device, opts.artifact,
                                     opts.performance, bundle):
        entrants = precision_choice.shortlist(eligible, failed_gates, unverified)
        if len(entrants) > 1:
            engine_choice = precision_choice.cached_race(bundle, entrants, threads, opts.performance)
            if engine_choice is None and _race_fits(bundle, entrants, costs, limit, in_use_mb()):
                engine_choice = _race(bundle, entrants, skipped, unverified, threads, opts, engine_options,
                                      race_probed)
            failed = {s.candidate for s in skipped}  # skipped by the race already: not opened again
            eligible = [c for c in eligible if c not in failed]
            if engine_choice is not None:
                eligible = precision_choice.put_first(eligible, engine_choice)
                # still: allowed artifacts that failed their gate last, unless one was asked for by name
                eligible.sort(key=lambda c: c.artifact in failed_gates and c.artifact != opts.artifact)

    # Without a race (an engine or device named, or no room for it): is INT8 really faster than FP32 on the first
    # engine? A cached decision orders the candidates now; an INT8 candidate without one is timed against its FP32
    # rival once both are loaded, below.
    choose_precision = engine_choice is None and opts.speed_check != SpeedCheck.OFF \
        and opts.performance == Performance.LATENCY \
        and precision_choice.applies(opts.policy, opts.artifact) and bool(bundle.manifest.get("golden"))
    known_choices: dict[str, dict] = {}
    if choose_precision:
        eligible, known_choices = precision_choice.arrange(bundle, eligible, threads, opts.performance,
                                                           barred=failed_gates)
    held: tuple[Model, Candidate] | None = None  # a loaded INT8 model and its FP32 rival, loaded next
    queue = list(eligible)
    try:
        while queue:
            cand = queue.pop(0)
            if held is not None and cand != held[1]:
                break  # the rival did not load
            if (cand.engine, cand.device) in failed_devices:
                first = failed_devices[(cand.engine, cand.device)]
                skipped.append(Skip(cand, first.reason, f"{first.detail} (as for {first.candidate.artifact})"))
                continue
            art = bundle.artifact(cand.artifact)
            cost_key = memory.CostBook.key(art.entry["files"][0]["sha256"], cand.engine, cand.device)
            file_bytes = sum(f["bytes"] for f in art.entry["files"])
            expected, measured = costs.expected_mb(cost_key, file_bytes, cand.engine)
            try:
                # a held INT8 model (timed against this FP32 rival next) is not in the caller's accounts yet
                memory.check_fits(cand.label(), expected, limit, in_use_mb() + (held[0].cost_mb if held else 0.0))
            except BudgetExceeded as exc:
                over_budget.append(exc)
                skipped.append(Skip(cand, BudgetReason.MEMORY, exc.detail))
                continue
            before = memory.rss_mb()
            try:
                engine, check = _open(bundle, cand, threads, opts.check_numerics, engine_options,
                                      opts.isolate and cand not in race_probed)
            except BackendUnavailable as exc:
                skip = Skip(cand, exc.reason, exc.detail)
                skipped.append(skip)
                if exc.reason == BackendReason.DEVICE_MISSING:
                    failed_devices[(cand.engine, cand.device)] = skip
                    if (cand.engine, cand.device) in unverified:
                        autotune.remember_failed_probe(cand.engine, cand.device, exc.detail)
                continue
            measured_now = max(memory.rss_mb() - before, file_bytes / memory.MB)
            # Only a cold load (the engine's first in this process) shows the full cost, libraries included;
            # a warm one grows the RSS less (pages reused), so it does not overwrite what was learned.
            if cand.engine not in _ENGINES_LOADED or not measured:
                costs.remember(cost_key, measured_now)
            _ENGINES_LOADED.add(cand.engine)
            cost = costs.expected_mb(cost_key, 0, cand.engine)[0]  # what this model is charged
            budget = {"memory": {"limit_mb": round(limit.limit_mb, 1), "source": limit.source,
                                 "model_mb": round(cost, 2), "expected_mb": round(expected, 2),
                                 "expected_was_measured": measured},
                      "action": "artifact_switched" if over_budget else None}
            placement = Placement(
                engine=cand.engine, device=cand.device, kind=cand.kind, artifact=cand.artifact,
                precision=cand.precision, executing=engine.executing,
                effective_precision=engine.effective_precision, fully_accelerated=engine.fully_accelerated,
                numerics=check, policy=opts.policy,
                profile=getattr(profile, "name", None), skipped=skipped, autotune=decision,
                precision_choice=precision_choice.shown(cand, known_choices) if engine_choice is None else
                precision_choice.precision_from_race(engine_choice, cands) if cand.label() == engine_choice["chosen"]
                else None, engine_choice=engine_choice)
            try:
                alternatives = []
                if opts.budgets.thermal is not None:  # where a hot device may move it
                    failed = {s.candidate for s in skipped} | {cand}
                    # Never onto an artifact that failed its validation gate: allow_failed admits what load serves,
                    # not a silent switch later.
                    alternatives = _fitting([c for c in eligible if c not in failed
                                             and c.artifact not in failed_gates], bundle, costs, limit,
                                            in_use_mb(), cand)
                bundle.warn_if_failed(cand.artifact, stacklevel=3)  # only allow_failed gets here with one
                model = Model(bundle, engine, placement, budget=budget, thermal=opts.budgets.thermal,
                              cost_mb=cost, threads=threads, alternatives=alternatives,
                              check_numerics=opts.check_numerics, engine_options=engine_options)
            except BaseException:
                engine.close()
                raise
            if held is not None:
                return _faster(bundle, held, (model, cand), threads, opts.performance)
            rival = precision_choice.rival(cand, queue, known_choices, failed_gates) if choose_precision else None
            if rival is None:
                return model
            held = (model, rival)  # load the rival next, then time the two
            queue.remove(rival)
            queue.insert(0, rival)
        if held is not None:  # the rival did not load: the INT8 model serves
            model, rival = held
            model.placement.precision_choice = precision_choice.unmeasured(model.placement, rival, skipped)
            return model
    except BaseException:
        if held is not None:
            held[0].close()
        raise
    # Memory is the answer when every candidate that exists here was ruled out by the budget.
    absent = (BudgetReason.MEMORY, BackendReason.DEVICE_MISSING, BackendReason.ENGINE_MISSING,
              BackendReason.VALIDATION_FAILED)
    if over_budget and all(s.reason in absent for s in skipped if selection.meets(s.candidate, opts.require)):
        cheapest = min(over_budget, key=lambda e: e.needed)
        raise BudgetExceeded(BudgetReason.MEMORY, f"no artifact of {bundle.name!r} fits: {cheapest.detail}",
                             needed=cheapest.needed, available=cheapest.available)
    every_failed = _every_artifact_failed(bundle, skipped, opts.require, unverified)
    if every_failed is not None:
        raise every_failed
    tried = [s for s in skipped if selection.meets(s.candidate, opts.require)]
    crashed = [s for s in tried if s.reason == BackendReason.ISOLATED_PROBE_FAILED]
    if crashed:  # a file that kills its engine is the bundle's fault, whatever else failed
        raise BundleError(f"bundle {bundle.name!r}: {crashed[0].candidate.artifact} failed its isolated probe and no "
                          f"other candidate serves: " + "; ".join(f"{s.candidate.label()}: {s.reason} ({s.detail})"
                                                                  for s in tried))
    first = next((s for s in tried if s.reason != BackendReason.VALIDATION_FAILED), tried[0] if tried else None)
    detail = "; ".join(f"{s.candidate.label()}: {s.reason} ({s.detail})" for s in tried) or "no candidate"
    raise BackendUnavailable(first.reason if first else BackendReason.NO_CANDIDATE,
                             f"no backend can serve {bundle.name!r}"
                             f"{' under require=' + repr(opts.require) if opts.require else ''}: {detail}")


def _every_artifact_failed(bundle: Bundle, skipped: list[Skip], require: str | None,
                           unverified: set[tuple[str, str]]) -> BackendUnavailable | None:
    """The error when what stopped every candidate (under ``require``) is that its artifact failed its validation
    gate: the others found no engine or device here. None when anything else stopped one, or when the failed ones
    would have found no device either (a device found missing, or one only a probe could confirm)."""
    tried = [s for s in skipped if selection.meets(s.candidate, require)]
    missing = {(s.candidate.engine, s.candidate.device) for s in skipped
               if s.reason == BackendReason.DEVICE_MISSING} | unverified
    refused = [s for s in tried if s.reason == BackendReason.VALIDATION_FAILED
               and (s.candidate.engine, s.candidate.device) not in missing]
    settled = (BackendReason.VALIDATION_FAILED, BackendReason.ENGINE_MISSING, BackendReason.DEVICE_MISSING)
    if not refused or any(s.reason not in settled for s in tried):
        return None
    gates = "; ".join(f"{aid}: {gate}" for aid, gate in {s.candidate.artifact: s.detail for s in refused}.items())
    return BackendUnavailable(
        BackendReason.VALIDATION_FAILED,
        f"every artifact of {bundle.name!r} that could serve here{' under require=' + repr(require) if require else ''}"
        f" failed its validation gate ({gates}); re-quantize the bundle (edgesdk quantize, with more representative "
        f"calibration data or another --max-drop) or pass allow_failed=True (CLI: --allow-failed) to serve one anyway")


def _race_fits(bundle: Bundle, entrants: list[Candidate], costs: memory.CostBook, limit: memory.MemoryLimit,
               in_use: float) -> bool:
    """Whether the race may open every entrant: one at a time, but each engine's runtime stays in the process."""
    need = 0.0
    for c in entrants:
        files = bundle.artifact(c.artifact).entry["files"]
        key = memory.CostBook.key(files[0]["sha256"], c.engine, c.device)
        need += costs.expected_mb(key, sum(f["bytes"] for f in files), c.engine)[0]
    return need <= limit.limit_mb - in_use


def _race(bundle: Bundle, entrants: list[Candidate], skipped: list[Skip], unverified: set[tuple[str, str]],
          threads: int | None, opts: RuntimeOptions, engine_options: dict[str, Any],
          probed: set[Candidate]) -> dict | None:
    """Time each entrant alone (:mod:`edgesdk.precision_choice`): opened (numerics checked and isolated when asked:
    ``probed`` collects what an isolated probe already passed), timed, closed; then the leader and the incumbent once
    more. A candidate that does not open is skipped, as in the load walk. None when fewer than two were timed."""

    def timed(cand: Candidate, first: bool) -> float | None:
        try:
            engine, _ = _open(bundle, cand, threads, opts.check_numerics and first, engine_options,
                              opts.isolate and first)
        except BackendUnavailable as exc:
            skipped.append(Skip(cand, exc.reason, exc.detail))
            if exc.reason == BackendReason.DEVICE_MISSING and (cand.engine, cand.device) in unverified:
                autotune.remember_failed_probe(cand.engine, cand.device, exc.detail)
            return None
        if opts.isolate:
            probed.add(cand)
        _ENGINES_LOADED.add(cand.engine)
        try:
            return precision_choice.time_alone(bundle, engine)
        except Exception as exc:  # it would fail when served too: the race goes on without it
            skipped.append(Skip(cand, BackendReason.RUN_FAILED, f"{cand.label()} failed while timed: {exc}"))
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


def _faster(bundle: Bundle, held: tuple[Model, Candidate], loaded: tuple[Model, Candidate], threads: int | None,
            performance: str) -> Model:
    """Time a loaded INT8 model against its loaded FP32 rival (:mod:`edgesdk.precision_choice`); return the one that
    serves, with its placement saying why, and close the other. The caller closes the INT8 one if this raises."""
    (int8, _), (fp32, fp32_cand) = held, loaded
    try:
        choice = precision_choice.measure(bundle, int8.placement, int8._engine, fp32_cand, fp32._engine, threads,
                                          performance)
    except Exception as exc:  # an engine that fails here (check_numerics=False) fails at predict too: INT8 serves
        choice = precision_choice.unmeasured(int8.placement, fp32_cand, [], f"timing failed: {exc}")
    except BaseException:
        fp32.close()
        raise
    keep, drop = (fp32, int8) if choice["chosen"] == "fp32" else (int8, fp32)
    drop.close()
    keep.placement.precision_choice = choice
    return keep


def _fitting(cands: list[Candidate], bundle: Bundle, costs: memory.CostBook, limit: memory.MemoryLimit,
             in_use: float, loaded: Candidate) -> list[Candidate]:
    """The candidates a loaded model may switch to without breaking the memory limit. On the loaded engine (its
    runtime is in memory already) an artifact whose files are no larger than the loaded one's; on another, one
    whose expected cost fits beside what is in use now (both engines live for a moment during the switch)."""
    def file_bytes(artifact: str) -> int:
        return sum(f["bytes"] for f in bundle.artifact(artifact).entry["files"])

    fitting = []
    for c in cands:
        if c.engine == loaded.engine:
            if file_bytes(c.artifact) <= file_bytes(loaded.artifact):
                fitting.append(c)
            continue
        files = bundle.artifact(c.artifact).entry["files"]
        key = memory.CostBook.key(files[0]["sha256"], c.engine, c.device)
        if costs.expected_mb(key, file_bytes(c.artifact), c.engine)[0] <= limit.limit_mb - in_use:
            fitting.append(c)
    return fitting


def _open(bundle: Bundle, cand: Candidate, threads: int | None, check_numerics: bool,
          engine_options: dict[str, Any], isolate: bool = False) -> tuple[Engine, dict]:
    art = bundle.artifact(cand.artifact)
    options = art.engine_options(device=cand.device, **engine_options)
    if threads:
        options["num_threads"] = threads  # the app's (or profile's) choice wins over the artifact's
    if isolate:  # raises (a skip) unless a child process opened and ran it first
        from .isolate import probe

        probe(bundle, cand.artifact, cand.engine, options)
    engine = open_engine(cand.engine, art.model_path, **options)
    if not check_numerics:
        return engine, {"checked": False, "why": "turned off (check_numerics=False)"}
    try:
        return engine, numerics.check(engine, bundle, cand.artifact)
    except BaseException:
        engine.close()
        raise


def _autotune(bundle: Bundle, eligible: list[Candidate], skipped: list[Skip], threads, check_numerics,
              engine_options: dict[str, Any], isolate: bool = False) -> dict:
    """Open every viable candidate, time it on the first golden input, keep the decision."""
    feeds = numerics.golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]
    timings: dict[str, float] = {}
    for cand in eligible:
        try:
            engine, _ = _open(bundle, cand, threads, check_numerics, engine_options, isolate)
        except BackendUnavailable as exc:
            skipped.append(Skip(cand, exc.reason, exc.detail))
            continue
        try:
            timings[cand.label()] = autotune.median_ms(engine, feeds)
        finally:
            engine.close()
    if not timings:
        return {"candidate": None, "timings_ms": {}, "cached": False}
    best = min(timings, key=timings.get)
    return {"candidate": best, "timings_ms": timings, "cached": False,
            "method": f"median of {autotune.RUNS} runs after {autotune.WARMUP} warm-up, golden input 0"}


def _profile(choice, discoveries):
    from . import profiles

    if choice is not None:
        return profiles.load_profile(choice), [f"chosen: {choice}"]
    return detect_platform(discoveries)


def detect_platform(discoveries):
    """The platform profile for this machine, given what the engines reported (``{name: Discovery}``)."""
    from .profiles import detect_profile

    ort = {d.name for d in discoveries["onnxruntime"].devices} if "onnxruntime" in discoveries else set()
    ov = {d.kind for d in discoveries["openvino"].devices} if "openvino" in discoveries else set()
    return detect_profile(ort_providers=ort, openvino_devices=ov)


def _unmet(require: str, discoveries, skipped: list[Skip]) -> BackendUnavailable:
    if require in discoveries:
        missing = [s for s in skipped if s.candidate.engine == require]
        if missing:
            return BackendUnavailable(missing[0].reason, missing[0].detail)
        return BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT,
                                  f"the bundle has no artifact engine {require!r} can run")
    notes = [n for d in discoveries.values() for n in d.notes if n.startswith(require)]
    return BackendUnavailable(BackendReason.DEVICE_MISSING, f"no engine reports a {require} device here"
                                                            f"{': ' + '; '.join(notes) if notes else ''}")


class Model:
    """A bundle loaded on one backend. Thread-safe: a lock serializes inference on the one engine
    instance, so concurrent calls return exactly what sequential calls return."""

    def __init__(self, bundle: Bundle, engine: Engine, placement: Placement, budget: dict | None = None,
                 thermal: Any = None, cost_mb: float = 0.0, threads: int | None = None,
                 alternatives: Sequence[Candidate] = (), check_numerics: bool = True,
                 engine_options: dict[str, Any] | None = None):
        self.bundle = bundle
        self.placement = placement  # where load put it; a result's placement is where it really ran
        self.budget = budget or {}
        self.cost_mb = cost_mb
        self._thermal = None if thermal is None else \
            ThermalServing(thermal, bundle, engine, placement, self.budget, threads, alternatives, check_numerics,
                           engine_options)
        self._engine = engine
        self._lock = threading.Lock()
        self.io = BundleIO(bundle)
        self._feeds, self._top = self.io.feeds, self.io.top  # bound once: called on every prediction

    @property
    def labels(self) -> list[str] | None:
        return self.io.labels

    @property
    def parallel_requests(self) -> int:
        """How many inferences :meth:`predict_batch` keeps in flight (more than 1 only with
        ``performance="throughput"`` on an engine that overlaps them)."""
        engine = self._engine
        return engine.parallel_requests if engine is not None else 1

    # -- inference ------------------------------------------------------------
    def predict(self, x: Any) -> Result:
        """Predict one input: an image (path, PIL image, uint8 HxW[xC] array), preprocessed per the
        manifest; or a float array of the model's input shape (with or without the batch axis);
        or, for several inputs, a list or a {name: array} dict."""
        t0 = time.perf_counter()
        return self._run(self._feeds(x), t0)

    def _run(self, feeds: list[np.ndarray], t0: float) -> Result:
        """Run prepared input tensors (from ``self._feeds``) under the lock and the budgets."""
        with self._lock:
            if self._engine is None:
                raise InputError(f"model {self.bundle.name!r} was closed")
            placement, budget = self.placement, self.budget
            if self._thermal is not None:
                # The governor may pace (sleep), cut threads, switch backend, or refuse (BudgetExceeded "thermal").
                budget = self._thermal.admit()
                self._engine, placement = self._thermal.engine, self._thermal.placement
            t1 = time.perf_counter()
            try:
                outputs = self._engine.run_prepared(feeds)  # _feeds validated and converted them
            except Exception as exc:  # engine errors enter the edgesdk tree here, chained
                raise BackendUnavailable(BackendReason.RUN_FAILED, f"{placement.engine}:{placement.device} failed "
                                                                   f"on {placement.artifact}: {exc}") from exc
        t2 = time.perf_counter()
        timings = {"preprocess": (t1 - t0) * 1e3, "inference": (t2 - t1) * 1e3}
        return Result(outputs, placement, timings, budget=budget, _topk=self._top)

    def predict_batch(self, xs: Sequence[Any]) -> list[Result]:
        """Predict several inputs (each as :meth:`predict` takes it); results in the same order.

        Artifacts are compiled for batch 1, so each input is its own inference. Loaded with
        ``performance="throughput"``, OpenVINO overlaps them on parallel streams; otherwise (and under a
        thermal budget, which decides before each inference) they run one after the other. Every input is
        checked before any runs. A result's ``timings_ms["inference"]`` is the batch's inference time
        divided by its size.
        """
        xs = list(xs)  # any iterable of inputs
        if self._thermal is not None or len(xs) < 2:
            return [self.predict(x) for x in xs]
        t0 = time.perf_counter()
        batch = [self._feeds(x) for x in xs]
        with self._lock:
            if self._engine is None:
                raise InputError(f"model {self.bundle.name!r} was closed")
            placement = self.placement
            t1 = time.perf_counter()
            try:
                outputs = self._engine.run_many(batch)
            except Exception as exc:  # engine errors enter the edgesdk tree here, chained
                raise BackendUnavailable(BackendReason.RUN_FAILED, f"{placement.engine}:{placement.device} failed "
                                                                   f"on {placement.artifact}: {exc}") from exc
        t2 = time.perf_counter()
        timings = {"preprocess": (t1 - t0) * 1e3 / len(batch), "inference": (t2 - t1) * 1e3 / len(batch)}
        return [Result(out, placement, dict(timings), budget=self.budget, _topk=self._top) for out in outputs]

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<edgesdk.Model {self.bundle.name!r} on {self.placement}>"
