"""Which backend serves a bundle: candidates, their order per policy, and ``require``.

A candidate is (backend, device, artifact). Policies order them:

=================  ==================================================================
``auto``           the platform profile's device order (default NPU > GPU > CPU), INT8 before FP32
                   (unless measured slower here: :mod:`edgesdk.runtime.precision_choice`)
``prefer-npu``     NPU > GPU > CPU, probing again devices an earlier probe found missing
``prefer-gpu``     GPU > NPU > CPU, likewise
``cpu-only``       CPU candidates only
``max-efficiency`` NPU > CPU > GPU, INT8 first (a phone GPU draws the most power per inference)
``autotune``       every viable candidate is timed on the golden inputs; the fastest wins (cached)
=================  ==================================================================

Within a device kind, engines follow the profile's order. Explicit ``engine``/``device``/
``artifact`` choices go first; without ``require`` the others remain as fallbacks, and with ``fallback=False``
there are no others (:func:`named`).

An artifact whose validation gate failed at quantize time (``validation.<id>.passed`` false) is never a
candidate: it is skipped with reason ``validation_failed`` (see :func:`screen_failed`). ``allow_failed``
lets it back in, after every artifact that passed, unless it was named explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..bundle.reader import Bundle
from ..choices import BackendReason, Policy
from ..engines import KINDS, Device, Discovery, backend_names, engine_class
from ..errors import BackendUnavailable, InputError
from .placement import Candidate, Skip

POLICIES = tuple(Policy)
_KIND_ORDER = {
    Policy.PREFER_NPU: ("NPU", "GPU", "CPU"),
    Policy.PREFER_GPU: ("GPU", "NPU", "CPU"),
    Policy.CPU_ONLY: ("CPU",),
    Policy.MAX_EFFICIENCY: ("NPU", "CPU", "GPU"),
}


def policy_error(policy: object) -> InputError | None:
    """The error for a ``policy`` that is not a :class:`~edgesdk.choices.Policy`, or None."""
    if Policy.lookup(policy) is None:
        return InputError(f"unknown policy {policy!r} (policies: {', '.join(Policy.values())})")
    return None


def check_policy(policy: str, require: str | None) -> None:
    error = policy_error(policy)
    if error is not None:
        raise error
    if require is not None and require not in KINDS and require not in backend_names():
        raise InputError(f"require must be a device kind ({', '.join(KINDS)}) or an engine "
                         f"({', '.join(backend_names())}), got {require!r}")
    if policy == Policy.CPU_ONLY and require in ("GPU", "NPU"):
        raise InputError(f"policy 'cpu-only' contradicts require={require!r}")


PROBING_POLICIES = (Policy.PREFER_NPU, Policy.PREFER_GPU)


def enumerate_candidates(bundle: Bundle, discoveries: dict[str, Discovery], device: str | None = None,
                         probe: bool = False, engine: str | None = None) -> tuple[list[Candidate], list[Skip]]:
    """Every (backend, device, artifact) the machine might serve, and artifacts no installed engine runs.

    Unverified devices (only a model load can tell) are included with ``probe`` or when asked for.
    """
    cands: list[Candidate] = []
    skips: list[Skip] = []
    for art in bundle.artifacts:
        runnable = False
        for name in backend_names():
            try:
                cls = engine_class(name)
            except BackendUnavailable as exc:
                if name == art.engine:
                    skips.append(Skip(Candidate(name, "-", "-", art.id, art.precision), exc.reason, exc.detail))
                continue
            if not cls.accepts(art.engine):
                continue
            runnable = True
            devices = [d for d in discoveries[name].devices
                       if d.verified or probe or (device in (d.name, d.kind) and engine in (None, name))]
            if device is not None and engine in (None, name) and \
                    not any(device in (d.name, d.kind) for d in discoveries[name].devices):
                # Asked for explicitly but not reported: try it anyway, so the engine says why it fails.
                devices.append(Device(name, device.split(".")[0] if device.split(".")[0] in KINDS else "CPU", device))
            cands += [Candidate(name, d.name, d.kind, art.id, art.precision) for d in devices]
        if not runnable and not any(s.candidate.artifact == art.id for s in skips):
            skips.append(Skip(Candidate(art.engine, "-", "-", art.id, art.precision), BackendReason.ENGINE_MISSING,
                              f"no installed engine runs {art.engine} artifacts"))
    return cands, skips


def failed_artifacts(bundle: Bundle) -> dict[str, str]:
    """{artifact id: how it failed} for the bundle's artifacts that failed their validation gate at quantize time."""
    gates = {a["id"]: bundle.failed_gate(a["id"]) for a in bundle.manifest["artifacts"]}
    return {aid: gate for aid, gate in gates.items() if gate is not None}


def screen_failed(cands: list[Candidate], failed: dict[str, str],
                  allow_failed: bool) -> tuple[list[Candidate], list[Skip]]:
    """Split off the candidates whose artifact is in ``failed`` (from :func:`failed_artifacts`) as skips with reason
    ``validation_failed``; with ``allow_failed`` they all stay (the caller tries them after the others)."""
    if allow_failed:
        return cands, []
    kept = [c for c in cands if c.artifact not in failed]
    return kept, [Skip(c, BackendReason.VALIDATION_FAILED, failed[c.artifact]) for c in cands if c.artifact in failed]


def order(cands: Iterable[Candidate], policy: str, profile=None, *, engine: str | None = None,
          device: str | None = None, artifact: str | None = None) -> list[Candidate]:
    """Rank candidates for ``policy``; explicit choices first."""
    kinds = _KIND_ORDER.get(policy) or tuple(getattr(profile, "devices", None) or KINDS)
    precisions = tuple(getattr(profile, "precisions", None) or ("int8", "fp32"))
    engines = tuple(getattr(profile, "engines", None) or ())

    def rank(c: Candidate) -> tuple:
        return (
            0 if named(c, engine, device, artifact) else 1,
            kinds.index(c.kind) if c.kind in kinds else len(kinds),
            precisions.index(c.precision) if c.precision in precisions else len(precisions),
            engines.index(c.engine) if c.engine in engines else len(engines),
        )

    ranked = sorted(cands, key=rank)
    if policy == Policy.CPU_ONLY:
        ranked = [c for c in ranked if c.kind == "CPU"]
    return ranked


def named(c: Candidate, engine: str | None, device: str | None, artifact: str | None) -> bool:
    """Whether ``c`` is what the explicit choices name (``device`` by name or kind, in any case: ``cpu`` names
    ``CPUExecutionProvider``'s kind CPU as a user types it; a choice left None names every candidate)."""
    return engine in (None, c.engine) and (device is None or device.upper() in (c.device.upper(), c.kind.upper())) \
        and artifact in (None, c.artifact)


def meets(c: Candidate, require: str | None) -> bool:
    return require is None or c.kind == require or c.engine == require
