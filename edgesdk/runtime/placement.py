"""Where a loaded model really runs, and what was tried before it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Sequence

from ..choices import BackendReason, BudgetReason, Policy
from ..frozen import freeze, thaw


@dataclass(frozen=True)
class Candidate:
    """One way to serve a bundle: a backend, one of its devices, and an artifact it can run."""

    engine: str
    device: str
    kind: str  # NPU, GPU or CPU
    artifact: str
    precision: str

    def label(self) -> str:
        return f"{self.engine}:{self.device}:{self.artifact}"


@dataclass(frozen=True)
class Skip:
    """A candidate that was not used, with a machine-readable reason and the engine's own words.

    ``reason`` is the :class:`~edgesdk.choices.BackendReason` its engine raised, or ``BudgetReason.MEMORY`` when the
    memory budget ruled it out (a plain string given here becomes its member)."""

    candidate: Candidate
    reason: BackendReason | BudgetReason | str
    detail: str

    def __post_init__(self):
        reason = BackendReason.lookup(self.reason) or BudgetReason.lookup(self.reason)
        if reason is not None:
            object.__setattr__(self, "reason", reason)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.candidate), "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class Placement:
    """The placement proof of a loaded model.

    ``device`` is what was asked of the engine; ``executing`` is what the engine reports
    running on (OpenVINO EXECUTION_DEVICES, the ORT session's providers, LiteRT's device),
    ``fully_accelerated`` is LiteRT's own verdict for GPU/NPU. ``numerics`` is the golden
    self-check result. ``precision_choice`` is the INT8-against-FP32 timing of
    :mod:`edgesdk.runtime.precision_choice` (``int8``/``fp32`` candidates, ``int8_ms``, ``fp32_ms``, ``ratio``,
    ``pairs``, ``int8_slower_in``, ``chosen``, ``cached``, ``method``); None when no such choice was made.
    ``engine_choice`` is the engine race of the same module (``kind``, ``chosen`` engine, ``incumbent`` (the
    profile's first), ``timings_ms`` and ``ratio_to_incumbent`` per candidate, ``passes``, ``cached``, ``method``);
    None when there was none (one engine, or an engine, device, artifact or memory budget was given).

    A placement is a value, shared by a model and its results: it is frozen, and its lists and dicts are read-only
    (:mod:`edgesdk.frozen`: still lists and dicts to read, compare and ``json.dumps``), made so once when it is
    built; :meth:`to_dict` gives plain, mutable data.
    """

    engine: str
    device: str
    kind: str
    artifact: str
    precision: str
    executing: Sequence[str]
    effective_precision: str | None
    fully_accelerated: bool | None
    numerics: Mapping[str, Any]
    policy: Policy
    profile: str | None
    skipped: Sequence[Skip] = field(default_factory=list)
    autotune: Mapping[str, Any] | None = None
    precision_choice: Mapping[str, Any] | None = None
    engine_choice: Mapping[str, Any] | None = None

    def __post_init__(self):
        for name in ("executing", "numerics", "skipped", "autotune", "precision_choice", "engine_choice"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: thaw(getattr(self, f.name)) for f in fields(self)}
        data["skipped"] = [s.to_dict() for s in self.skipped]
        return data

    def __str__(self) -> str:
        where = ", ".join(self.executing)
        text = f"{self.artifact} on {self.engine}:{self.device} (executing on {where}"
        if self.effective_precision:
            text += f", computing in {self.effective_precision}"
        return text + ")"
