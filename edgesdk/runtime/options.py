"""How :func:`edgesdk.load` is asked to pick and run a backend: :class:`RuntimeOptions` with its nested
:class:`Budgets` (and :class:`~edgesdk.hybrid.model.HybridOptions`), checked where they are built, and
:func:`merge_options`, which applies ``load``'s keyword shortcuts to them. Nothing here opens a bundle or an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import selection
from ..choices import Performance, Policy, SpeedCheck
from ..bundle.schema import MAX_THREADS  # the same bound as a manifest's runtime.num_threads
from ..errors import InputError
from ..hybrid.model import HybridOptions
from ..monitor.monitor import MonitorOptions
from ..trust import Trust


@dataclass(frozen=True)
class Budgets:
    """What serving may cost on this device.

    ``memory_mb`` caps the process memory (None: the platform profile's ``memory.budget_mb`` where it
    has one, else only the cgroup and physical limits apply). ``thermal`` is a
    :class:`~edgesdk.budgets.thermal.ThermalGovernor` consulted before every inference (None: no thermal budget).
    """

    memory_mb: float | None = None
    thermal: Any = None


@dataclass(frozen=True)
class RuntimeOptions:
    """How :func:`load` picks and runs a backend (see :mod:`edgesdk.runtime.selection` for the policies).

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
    numerics check runs (see :mod:`edgesdk.runtime.isolate`), so a model file that crashes its engine's native code (a segfault,
    an abort) kills the child, not the application. A candidate whose child dies, exits abnormally or times
    out is skipped with reason ``isolated_probe_failed`` and is never opened in this process; when no other
    candidate serves, load raises :class:`BundleError` naming the artifact, the signal and the child's last
    stderr lines. It costs a Python start, the engine's import and one model load per candidate tried. A thermal
    budget's backend switch probes a backend the same way before it opens it, once per backend.

    An artifact whose validation gate failed at quantize time (the manifest's ``validation.<id>.passed`` is
    false) is never served by default: it is skipped with reason ``validation_failed``, naming the gate; asked
    for by ``artifact`` it raises :class:`BundleError`; when nothing else can serve, load raises
    :class:`BackendUnavailable` with reason ``validation_failed``. ``allow_failed=True`` lets such artifacts
    serve (a named one first, others only after every artifact that passed) and warns with
    :class:`~edgesdk.errors.FailedArtifactWarning` when one is loaded. A thermal budget never switches to one.

    ``engine``, ``device`` and ``artifact`` name a choice, tried first; when it does not serve, the other candidates
    remain as fallbacks. ``fallback=False`` takes them away: only candidates matching every named choice are tried,
    and when none serves, load raises what stopped them (:class:`BackendUnavailable` with the engine's or the
    numerics check's reason and detail) instead of serving another artifact. ``edgesdk bench`` loads this way, so
    it measures what it was asked to; at least one of the three must be named.

    ``speed_check`` (policies ``auto``, ``cpu-only``, ``prefer-npu``, ``prefer-gpu``; see
    :mod:`edgesdk.runtime.precision_choice`): ``"full"`` (default) times, at the first load on a machine, every candidate of
    the first device kind alone (each engine's INT8 and FP32) and serves the fastest, the profile's first unless
    another is clearly faster; ``"precision"`` keeps the profile's engine order and only times INT8 against the
    FP32 artifact of the same engine and device; ``"off"`` times nothing (the profile's order, INT8 first). The
    decisions are cached per machine; nothing is timed with ``performance="throughput"``, an explicit ``artifact``,
    or a bundle without golden inputs, and the full check also needs no ``engine``/``device`` named and room in
    the memory limit for every engine it opens.

    ``monitor`` (on by default; :mod:`edgesdk.monitor`): ``model.monitor`` keeps rolling windows of what the model
    sees and does (summaries, never inputs), drift against the bundle's reference and alerts; a
    :class:`~edgesdk.monitor.MonitorOptions` tunes it, ``False`` turns it off (``model.monitor`` is then None).

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
    fallback: bool = True
    speed_check: SpeedCheck | str = SpeedCheck.FULL
    budgets: Budgets = field(default_factory=Budgets)
    hybrid: HybridOptions = field(default_factory=HybridOptions)
    monitor: MonitorOptions | bool = True

    def __post_init__(self):
        if self.monitor is True:
            object.__setattr__(self, "monitor", MonitorOptions())
        elif self.monitor is not False and not isinstance(self.monitor, MonitorOptions):
            raise InputError(f"monitor must be True, False or a MonitorOptions, got {type(self.monitor).__name__}")
        selection.check_policy(self.policy, None)
        object.__setattr__(self, "policy", Policy(self.policy))
        object.__setattr__(self, "performance", Performance.parse(self.performance, "performance", InputError))
        object.__setattr__(self, "speed_check", SpeedCheck.parse(self.speed_check, "speed_check", InputError))
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or not 1 <= self.threads <= MAX_THREADS):
            raise InputError(f"threads must be an integer from 1 to {MAX_THREADS}, got {self.threads!r}")
        if not isinstance(self.fallback, bool):
            raise InputError(f"fallback must be True or False, got {self.fallback!r}")
        if not self.fallback and self.engine is None and self.device is None and self.artifact is None:
            raise InputError("fallback=False keeps load to the named engine, device or artifact; none is named")


def merge_options(options: RuntimeOptions | None, overrides: dict[str, Any]) -> RuntimeOptions:
    """``options`` (None: the defaults) with ``load``'s keyword shortcuts applied; ``overrides`` is emptied of the
    budget and hybrid shortcuts on the way. An unknown keyword raises :class:`InputError`."""
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


__all__ = ["Budgets", "RuntimeOptions", "merge_options"]
