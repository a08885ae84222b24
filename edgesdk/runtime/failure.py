"""Why nothing serves: the one error a load raises when no candidate could serve a bundle, synthesized from what
stopped each candidate (its :class:`~edgesdk.runtime.placement.Skip`): an unmet ``require``, a memory budget no artifact
fits, artifacts that all failed their validation gate, a file that crashed its isolated probe, or the first
engine's own reason (with ``fallback=False``: the named candidate's). Every error names the bundle and the candidates
it tried.
"""

from __future__ import annotations

from typing import Any

from . import selection
from ..bundle.reader import Bundle
from ..choices import BackendReason, BudgetReason
from ..errors import BackendUnavailable, BudgetExceeded, BundleError
from .placement import Skip


def unmet(require: str, discoveries: dict[str, Any], skipped: list[Skip]) -> BackendUnavailable:
    """The error when no candidate meets ``require`` (an engine or a device kind) at all."""
    if require in discoveries:
        missing = [s for s in skipped if s.candidate.engine == require]
        if missing:
            return BackendUnavailable(missing[0].reason, missing[0].detail)
        return BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT,
                                  f"the bundle has no artifact engine {require!r} can run")
    notes = [n for d in discoveries.values() for n in d.notes if n.startswith(require)]
    return BackendUnavailable(BackendReason.DEVICE_MISSING, f"no engine reports a {require} device here"
                                                            f"{': ' + '; '.join(notes) if notes else ''}")


def none_named(bundle: Bundle, engine: str | None, device: str | None, artifact: str | None,
               skipped: list[Skip]) -> BackendUnavailable:
    """The error when ``fallback=False`` names no candidate here: the named engine's own skip of the named artifact
    (its package missing, say), else ``unsupported_artifact``."""
    asked = named_choices(engine, device, artifact)
    own = next((s for s in skipped if engine in (None, s.candidate.engine)
                and artifact in (None, s.candidate.artifact)), None)
    if own is not None:
        return BackendUnavailable(own.reason, f"{own.detail} ({asked}, fallback=False)")
    return BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT,
                              f"no candidate of {bundle.name!r} here is {asked} (fallback=False): the engine does "
                              f"not run that artifact, or the device is not one of its")


def named_choices(engine: str | None, device: str | None, artifact: str | None) -> str:
    """``engine='x', artifact='y'``: the choices a load named, as the errors show them."""
    return ", ".join(f"{k}={v!r}" for k, v in (("engine", engine), ("device", device), ("artifact", artifact))
                     if v is not None)


def every_artifact_failed(bundle: Bundle, skipped: list[Skip], require: str | None,
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


def nothing_serves(bundle: Bundle, skipped: list[Skip], over_budget: list[BudgetExceeded], require: str | None,
                   unverified: set[tuple[str, str]], only: str | None = None) -> Exception:
    """The error when the walk tried every candidate and none serves. Memory is the answer when every candidate
    that exists here was ruled out by the budget; a file that crashed its isolated probe is the bundle's fault
    (:class:`BundleError`); else :class:`BackendUnavailable` with the first reason of a backend that is here and
    failed (before any engine or device that is missing), listing every candidate. ``only``: the named choices
    (:func:`named_choices`) when ``fallback=False`` kept the load to them."""
    absent = (BudgetReason.MEMORY, BackendReason.DEVICE_MISSING, BackendReason.ENGINE_MISSING,
              BackendReason.VALIDATION_FAILED)
    if over_budget and all(s.reason in absent for s in skipped if selection.meets(s.candidate, require)):
        cheapest = min(over_budget, key=lambda e: e.needed)
        return BudgetExceeded(BudgetReason.MEMORY, f"no artifact of {bundle.name!r} fits: {cheapest.detail}",
                              needed=cheapest.needed, available=cheapest.available)
    every_failed = every_artifact_failed(bundle, skipped, require, unverified)
    if every_failed is not None:
        return every_failed
    tried = [s for s in skipped if selection.meets(s.candidate, require)]
    crashed = [s for s in tried if s.reason == BackendReason.ISOLATED_PROBE_FAILED]
    if crashed:  # a file that kills its engine is the bundle's fault, whatever else failed
        return BundleError(f"bundle {bundle.name!r}: {crashed[0].candidate.artifact} failed its isolated probe and "
                           f"no other candidate serves: " + "; ".join(f"{s.candidate.label()}: {s.reason} ({s.detail})"
                                                                      for s in tried))
    # A backend that exists here and failed (numerics, compile, run...) says more than one that is not here: a
    # device_missing from a GPU tried first must not hide that every CPU artifact failed its numerics check.
    found_here = [s for s in tried if s.reason not in absent]
    first = next(iter(found_here), next((s for s in tried if s.reason != BackendReason.VALIDATION_FAILED),
                                        tried[0] if tried else None))
    detail = "; ".join(f"{s.candidate.label()}: {s.reason} ({s.detail})" for s in tried) or "no candidate"
    return BackendUnavailable(first.reason if first else BackendReason.NO_CANDIDATE,
                              f"no backend can serve {bundle.name!r}"
                              f"{' under require=' + repr(require) if require else ''}"
                              f"{f' as {only} (fallback=False: nothing else tried)' if only else ''}: {detail}")


__all__ = ["unmet", "none_named", "named_choices", "every_artifact_failed", "nothing_serves"]
