"""The candidates a load tries, in order: listed from the bundle and what the engines report here (with the
platform profile and its thread count), devices an earlier probe found missing set aside, ordered per policy
(:mod:`edgesdk.runtime.selection`), ``require`` met, kept to the named choices with ``fallback=False``, artifacts
that failed their validation gate screened, and reordered by autotune's timing under ``policy="autotune"``. The speed
checks that reorder them further are :mod:`edgesdk.runtime.speed`'s. What was set aside on the way is kept as skips,
for the placement and the errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import autotune, numerics, selection, timing
from .. import user_cache
from ..bundle.reader import Bundle
from ..choices import BackendReason, Policy
from ..engines import Discovery, backend_names, discover
from ..errors import BackendUnavailable
from .placement import Candidate, Skip
from . import failure
from .opening import open_checked
from .options import RuntimeOptions


@dataclass
class Shortlist:
    """The load's candidates, best first (``eligible``), and everything the walk needs to know about them:
    ``skipped`` (what was set aside, in order), ``unverified`` (engine-device pairs only a model load can confirm),
    ``failed_gates`` ({artifact: how it failed its validation gate}), the ``profile`` and the ``threads`` it sets.
    The walk appends to ``skipped`` and reorders ``eligible`` as it goes."""

    bundle: Bundle
    discoveries: dict[str, Discovery]
    profile: Any
    threads: int | None
    listed: list[Candidate]  # every candidate here (less remembered failed probes), before policy, require, gates
    eligible: list[Candidate]
    skipped: list[Skip]
    unverified: set[tuple[str, str]]
    failed_gates: dict[str, str] = field(default_factory=dict)

    def drop_skipped(self) -> None:
        """Take out of ``eligible`` what a timing walk skipped already (it is not opened again)."""
        failed = {s.candidate for s in self.skipped}
        self.eligible = [c for c in self.eligible if c not in failed]

    def failed_last(self, artifact: str | None) -> None:
        """Allowed artifacts that failed their gate are the last resort, unless one was asked for by name."""
        self.eligible.sort(key=lambda c: c.artifact in self.failed_gates and c.artifact != artifact)


def shortlist(bundle: Bundle, opts: RuntimeOptions) -> Shortlist:
    """List and order the candidates for ``opts``; raise when ``require`` cannot be met at all."""
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
    ordered = selection.order(kept, opts.policy, profile, engine=opts.engine, device=opts.device,
                              artifact=opts.artifact)
    eligible = [c for c in ordered if selection.meets(c, opts.require)]
    if not opts.fallback:
        eligible, skipped = _named_only(bundle, opts, eligible, skipped)
    failed_gates = selection.failed_artifacts(bundle)
    eligible, refused = selection.screen_failed(eligible, failed_gates, opts.allow_failed)
    skipped += refused
    if opts.require is not None and not eligible:
        raise failure.every_artifact_failed(bundle, skipped, opts.require, unverified) or \
            failure.unmet(opts.require, discoveries, skipped)
    return Shortlist(bundle, discoveries, profile, threads, kept, eligible, skipped, unverified, failed_gates)


def _named_only(bundle: Bundle, opts: RuntimeOptions, eligible: list[Candidate],
                skipped: list[Skip]) -> tuple[list[Candidate], list[Skip]]:
    """``fallback=False``: the candidates (and the skips) of the named engine, device and artifact alone. Raises
    when candidates remain but none is named (the named engine does not run the named artifact, or is missing); none
    at all is left to the errors of ``require`` and of the walk."""
    named = [c for c in eligible if selection.named(c, opts.engine, opts.device, opts.artifact)]
    if eligible and not named:
        raise failure.none_named(bundle, opts.engine, opts.device, opts.artifact, skipped)
    return named, [s for s in skipped if selection.named(s.candidate, opts.engine, opts.device, opts.artifact)]


def autotuned(found: Shortlist, opts: RuntimeOptions, engine_options: dict[str, Any]) -> dict | None:
    """Under ``policy="autotune"``: put the fastest candidate first (timed now, or remembered from an earlier load
    here) and return the decision for the placement; None under any other policy."""
    if opts.policy != Policy.AUTOTUNE:
        return None
    # The choice depends on what was allowed: a decision timed under require=X is not reused without it.
    key = autotune.cache_key(found.bundle, {k: str(v) for k, v in vars(opts).items()
                                            if k not in ("budgets", "hybrid", "cache_dir")})
    decision = user_cache.lookup(key, autotune.CACHE_FILE)
    if decision:  # try the cached winner first; it is still checked
        found.eligible.sort(key=lambda c: c.label() != decision.get("candidate"))
        return {**decision, "cached": True}
    decision = _time_each(found, opts.check_numerics, engine_options, opts.isolate)
    if decision["candidate"] is not None:  # a failure is not remembered: the next load measures again
        user_cache.store(key, decision, autotune.CACHE_FILE)
    found.drop_skipped()  # recorded by the timing walk already
    found.eligible.sort(key=lambda c: c.label() != decision["candidate"])
    return decision


def _time_each(found: Shortlist, check_numerics: bool, engine_options: dict[str, Any], isolate: bool) -> dict:
    """Open every viable candidate, time it on the first golden input, keep the decision."""
    bundle = found.bundle
    feeds = numerics.golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]
    timings: dict[str, float] = {}
    for cand in found.eligible:
        try:
            engine, _ = open_checked(bundle, cand, found.threads, check_numerics=check_numerics,
                                     options=engine_options, isolate=isolate)
        except BackendUnavailable as exc:
            found.skipped.append(Skip(cand, exc.reason, exc.detail))
            continue
        try:
            timings[cand.label()] = timing.run_times(lambda: engine.run(feeds), warmup=autotune.WARMUP,
                                                     min_runs=autotune.RUNS, max_runs=autotune.RUNS).median_ms
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


__all__ = ["Shortlist", "shortlist", "autotuned", "detect_platform"]
