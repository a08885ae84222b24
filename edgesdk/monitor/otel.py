"""Publishing a monitor's figures through the OpenTelemetry metrics API (the ``edgesdk[otel]`` extra).

``publish(model)`` (or ``publish(model.monitor)``) puts the figures below on the app's meter provider
(``meter_provider=None``: the global one, ``opentelemetry.metrics.set_meter_provider``). Only ``opentelemetry-api``
is imported, and only by :func:`publish`; the app brings the SDK, its readers and exporters (OTLP to a Collector:
``samples/monitoring/``). Without the API, :func:`publish` raises :class:`~edgesdk.errors.InputError` naming the
extra. The names follow the OpenTelemetry semantic conventions' style (GenAI's ``gen_ai.client.operation.duration``:
a duration histogram in seconds; ``error.type`` for the error's kind; counts in ``{annotation}`` units).

| instrument | kind | unit | attributes | meaning |
| --- | --- | --- | --- | --- |
| `edgesdk.inference.duration` | histogram | s | `edgesdk.stage` | one prediction's stage: `preprocess` (the input made into the model's tensors) or `inference` (the engine's run) |
| `edgesdk.predictions` | counter | {prediction} | - | predictions answered since the model was loaded |
| `edgesdk.errors` | counter | {error} | `error.type` | calls that raised, by reason code (else exception type; `_OTHER` past 32 kinds) |
| `edgesdk.monitor.signal.value` | gauge | 1 | `edgesdk.monitor.signal`, `edgesdk.monitor.statistic` | a signal at the last evaluation: `input_drift`, `output_drift` (the largest PSI or JS of their features), `error_rate` (share of the window's calls that raised) |
| `edgesdk.monitor.signal.level` | gauge | {level} | `edgesdk.monitor.signal` | that signal's level after hysteresis: 0 ok, 1 warn, 2 alert |
| `edgesdk.monitor.drift` | gauge | 1 | `edgesdk.monitor.signal`, `edgesdk.monitor.feature`, `edgesdk.monitor.statistic` | each feature's drift against the bundle's reference (feature names: the manifest's `monitoring` section) |
| `edgesdk.memory.usage` | gauge | By | - | the process's resident memory (shared by the models of a process, not a per-model figure) |
| `edgesdk.placement.switches` | counter | {switch} | - | times the answering artifact changed (thermal placement, fallback) |
| `edgesdk.hybrid.escalation_shift` | gauge | 1 | - | how far the monitor's `escalate_more` response has moved a hybrid threshold (0 unless set) |
| `edgesdk.hybrid.answers` | counter | {answer} | `edgesdk.hybrid.source` | a hybrid model's answers by side (`device`, `cloud`) |
| `edgesdk.hybrid.escalations` | counter | {escalation} | `edgesdk.hybrid.reason` | its escalations by reason (`low_confidence`, `out_of_range`, `thermal`...) |
| `edgesdk.hybrid.degraded` | counter | {answer} | - | its answers given by the device because the cloud failed |
| `edgesdk.hybrid.skipped` | counter | {escalation} | `edgesdk.hybrid.reason` | its escalations not tried, by reason (`budget`: the escalation budget was spent) |
| `edgesdk.hybrid.threshold` | gauge | 1 | `edgesdk.hybrid.signal` | with an escalation budget (`EscalationPolicy(target_rate=...)`): the threshold in force, on that hardness signal |
| `edgesdk.hybrid.escalation_rate` | gauge | 1 | - | with an escalation budget: the share of its last `rate_window` inputs that went to the cloud |

Every figure also carries the model's version identity (``Model.identity()``): ``edgesdk.bundle.name``,
``edgesdk.bundle.version``, ``edgesdk.bundle.fingerprint``, ``edgesdk.artifact.id``, ``edgesdk.engine.name``,
``edgesdk.engine.version``, ``edgesdk.device``, ``edgesdk.precision``, ``edgesdk.cpu.class``,
``edgesdk.sdk.version`` (one whose value is unknown is left out). No attribute holds anything of an input: the
values are the identity, the enums' strings, error reason codes or type names, and the manifest's feature names,
each cut to ``MAX_ATTRIBUTE_CHARS``. Gauges are left out until there is a value (a signal before its first
evaluation, drift for a bundle without a reference, the budget's for a model without one); the hybrid figures appear
once a hybrid model has answered.

Costs: nothing per prediction. At each of the monitor's evaluations (``on_evaluate``, every ``MonitorOptions.every``
predictions) the latencies of the predictions since the previous one (at most ``window`` of them) are kept, and
recorded into the histogram when a reader collects, on the reader's thread (the Python SDK spends about 10 us per
value, which would otherwise land on every ``every``-th prediction). The histogram thus lags by up to ``every``
predictions; at most ``MAX_PENDING`` latencies wait between two collections. Its buckets (``DURATION_BUCKETS_S``,
50 us to 10 s) are advice that an app's View may replace. The rest is read at a collection from one
``Monitor.snapshot()``. Counters are totals since the model was loaded, each part attributed to the identity
current at the collection that first counted it (a placement switch does not move the past). Two models of one
identity (one bundle loaded twice in a process) add up in the counters and the histogram (closing one of them is a
counter reset); a gauge shows the larger of their values (the worse signal). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from array import array
from typing import Any, Callable, Iterable, Mapping

from ..choices import AlertLevel, MonitorSignal
from ..errors import InputError
from ..lifecycle import Closeable
from ..version import __version__
from .monitor import Monitor

log = logging.getLogger("edgesdk.monitor")

EXTRA = "edgesdk[otel]"
SCOPE = "edgesdk.monitor"
MAX_ERROR_TYPES = 32  # distinct error.type values per publication; later ones are counted as OTHER
OTHER = "_OTHER"  # the semantic conventions' value for an error.type beyond the known ones
MAX_ATTRIBUTE_CHARS = 256
SNAPSHOT_MAX_AGE_S = 0.5  # one snapshot serves every callback of one collection
IDENTITY_MAX_AGE_S = 1.0  # the histogram's identity is read again at most this often
MAX_PENDING = 1 << 16  # latencies kept between two collections (8 bytes each); more are dropped, with a warning
# From 50 us (a small model on a desktop CPU) to 10 s (a large one on a small board).
DURATION_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                      1.0, 2.5, 5.0, 10.0)
STAGES = ("preprocess", "inference")
IDENTITY = {"bundle": "edgesdk.bundle.name", "version": "edgesdk.bundle.version",
            "fingerprint": "edgesdk.bundle.fingerprint", "artifact": "edgesdk.artifact.id",
            "engine": "edgesdk.engine.name", "engine_version": "edgesdk.engine.version", "device": "edgesdk.device",
            "precision": "edgesdk.precision", "cpu_class": "edgesdk.cpu.class", "edgesdk": "edgesdk.sdk.version"}
LEVELS = {str(AlertLevel.OK): 0, str(AlertLevel.WARN): 1, str(AlertLevel.ALERT): 2}
DRIFT_GROUPS = {"inputs": str(MonitorSignal.INPUT_DRIFT), "outputs": str(MonitorSignal.OUTPUT_DRIFT)}
# Monitor.hybrid's counter keys ("source:device", "escalated:low_confidence", "degraded") -> instrument, attribute
HYBRID = {"source": ("edgesdk.hybrid.answers", "edgesdk.hybrid.source"),
          "escalated": ("edgesdk.hybrid.escalations", "edgesdk.hybrid.reason"),
          "degraded": ("edgesdk.hybrid.degraded", None),
          "skipped": ("edgesdk.hybrid.skipped", "edgesdk.hybrid.reason")}
MB = 1024 * 1024

# (name, kind, unit, description); the module docstring's table says the same, and the tests hold them together.
INSTRUMENTS = (
    ("edgesdk.predictions", "counter", "{prediction}", "Predictions answered since the model was loaded"),
    ("edgesdk.errors", "counter", "{error}", "Calls that raised, by reason code"),
    ("edgesdk.monitor.signal.value", "gauge", "1", "A monitor signal's value at its last evaluation"),
    ("edgesdk.monitor.signal.level", "gauge", "{level}", "A monitor signal's level: 0 ok, 1 warn, 2 alert"),
    ("edgesdk.monitor.drift", "gauge", "1", "A feature's drift against the bundle's reference"),
    ("edgesdk.memory.usage", "gauge", "By", "Resident memory of the process"),
    ("edgesdk.placement.switches", "counter", "{switch}", "Times the answering artifact changed"),
    ("edgesdk.hybrid.escalation_shift", "gauge", "1", "How far the monitor has moved a hybrid threshold"),
    ("edgesdk.hybrid.answers", "counter", "{answer}", "A hybrid model's answers by side"),
    ("edgesdk.hybrid.escalations", "counter", "{escalation}", "A hybrid model's escalations by reason"),
    ("edgesdk.hybrid.degraded", "counter", "{answer}", "Device answers given because the cloud failed"),
    ("edgesdk.hybrid.skipped", "counter", "{escalation}", "Escalations not tried, by reason"),
    ("edgesdk.hybrid.threshold", "gauge", "1", "A hybrid model's escalation threshold (its budget's)"),
    ("edgesdk.hybrid.escalation_rate", "gauge", "1", "Share of recent inputs a hybrid model escalated"),
)

Attributes = Mapping[str, str]


def publish(source: Any, meter_provider: Any = None) -> "Publication":
    """Publish the figures of ``source`` (a loaded model, or its ``monitor``) on ``meter_provider`` (None: the
    global one) until the returned :class:`Publication` is closed. Raises :class:`InputError` when
    opentelemetry-api is missing, when the model was loaded with ``monitor=False``, and when the monitor is
    already published on that provider."""
    monitor = _monitor_of(source)
    try:
        from opentelemetry import metrics
    except ImportError as exc:
        raise InputError(f"publishing monitor figures to OpenTelemetry needs opentelemetry-api, which is not "
                         f"installed: pip install '{EXTRA}'") from exc
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    if not callable(getattr(provider, "get_meter", None)):
        raise InputError(f"meter_provider must be an OpenTelemetry MeterProvider, got {type(provider).__name__}")
    identity = source.identity if source is not monitor and callable(getattr(source, "identity", None)) else None
    with _LOCK:
        instruments = _REGISTRY.get(provider)
        if instruments is None:
            instruments = _REGISTRY[provider] = _Instruments(provider.get_meter(SCOPE, __version__), metrics)
        if any(p.monitor is monitor for p in instruments.publications):
            raise InputError("this monitor is already published on this meter provider; close that publication "
                             "first")
        return Publication(monitor, instruments, identity)


class Publication(Closeable):
    """One monitor's figures on one meter provider (made by :func:`publish`). ``close()`` stops them (idempotent).
    It lives as long as its monitor: dropping the handle does not stop the figures; closing the model does not
    either (its last values stay), so close both."""

    def __init__(self, monitor: Monitor, instruments: "_Instruments", identity: Callable[[], Any] | None):
        self.monitor = monitor
        self._instruments = instruments
        self._identity = identity or monitor.identity
        self._lock = threading.Lock()  # the kept latencies
        self._observing = threading.Lock()  # the observations and totals
        self._closed = False
        self._pending: list[tuple[Attributes, array]] = []  # (attributes, latencies in ms), oldest first
        self._pending_count = self._dropped = 0
        self._set_identity(self._identity())
        self._observed: dict[str, list[tuple[float, Attributes]]] = {}
        self._observed_at = float("-inf")
        self._last: dict[tuple[str, str | None], int] = {}  # the monitor's totals at the previous collection
        self._totals: dict[tuple[str, str | None, tuple], int] = {}  # (instrument, label, identity) -> count
        self._error_types: set[str] = set()
        monitor.on_evaluate(self._record)  # may raise InputError (too many hooks): before it is registered
        instruments.publications.add(self)

    def close(self) -> None:
        with _LOCK:
            if self._closed:
                return
            self._closed = True
            self._instruments.publications.discard(self)
        self.monitor.remove_hook(self._record)
        self._flush()  # the latencies kept since the last collection go to the next one

    # -- the histogram: latencies kept at each evaluation, recorded at the next collection --------------
    def _record(self, monitor: Monitor, recent: Mapping[str, Any] | None) -> None:
        """The monitor's evaluate hook, on the predicting thread: only keeps the latencies (the SDK's cost, about
        10 us per recorded value, is paid on the reader's thread when it collects)."""
        if self._closed or not recent:
            return
        if time.monotonic() - self._identity_at >= IDENTITY_MAX_AGE_S:
            self._set_identity(self._identity())
        latency = recent.get("latency_ms") or {}
        with self._lock:
            for stage in STAGES:
                values = latency.get(stage) or ()
                room = MAX_PENDING - self._pending_count
                if len(values) > room:
                    self._dropped += len(values) - max(room, 0)
                    values = values[:max(room, 0)]
                if not values:
                    continue
                attributes = self._stages[stage]
                if not self._pending or self._pending[-1][0] is not attributes:
                    self._pending.append((attributes, array("d")))
                self._pending[-1][1].extend(values)
                self._pending_count += len(values)

    def _flush(self) -> None:
        """Record the kept latencies into the histogram (called by a collection and by close)."""
        with self._lock:
            pending, self._pending, self._pending_count = self._pending, [], 0
            dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning("monitor: %d latencies were not published (more than %d between two collections)",
                        dropped, MAX_PENDING)
        histogram = self._instruments.duration
        for attributes, values in pending:
            for ms in values:
                if ms >= 0:  # False for NaN
                    histogram.record(ms / 1e3, attributes)

    def _set_identity(self, identity: Mapping[str, Any] | None) -> None:
        attributes = {IDENTITY[k]: _text(v) for k, v in (identity or {}).items() if k in IDENTITY and v is not None}
        if attributes != getattr(self, "_attributes", None):
            self._attributes = attributes
            self._stages = {stage: {**attributes, "edgesdk.stage": stage} for stage in STAGES}
        self._identity_at = time.monotonic()

    # -- everything else, when a reader collects -----------------------------------------
    def observations(self, name: str) -> list[tuple[float, Attributes]]:
        """The values of instrument ``name`` now, with their attributes (what the callbacks hand to the SDK)."""
        if self._closed:
            return []
        with self._observing:
            if time.monotonic() - self._observed_at > SNAPSHOT_MAX_AGE_S:
                self._flush()
                self._observed = self._observe(self.monitor.snapshot())
                self._observed_at = time.monotonic()
            return self._observed.get(name, [])

    def _observe(self, snap: Mapping[str, Any]) -> dict[str, list[tuple[float, Attributes]]]:
        """Under ``_observing``: every instrument's observations from one snapshot."""
        self._set_identity(snap.get("identity"))
        base = self._attributes
        out: dict[str, list[tuple[float, Attributes]]] = {name: [] for name, *_ in INSTRUMENTS}
        for signal, state in snap["signals"].items():
            if state.get("value") is None:
                continue
            attributes = {**base, "edgesdk.monitor.signal": signal}
            out["edgesdk.monitor.signal.value"].append(
                (float(state["value"]), {**attributes, "edgesdk.monitor.statistic": state["statistic"]}))
            out["edgesdk.monitor.signal.level"].append((LEVELS.get(state["level"], 0), attributes))
        statistic = self.monitor.options.statistic
        for group, signal in DRIFT_GROUPS.items():
            for feature, entry in (snap.get("drift") or {}).get(group, {}).items():
                if entry.get(statistic) is not None:
                    out["edgesdk.monitor.drift"].append((float(entry[statistic]), {
                        **base, "edgesdk.monitor.signal": signal, "edgesdk.monitor.feature": _text(feature),
                        "edgesdk.monitor.statistic": statistic}))
        if snap.get("memory_mb") is not None:
            out["edgesdk.memory.usage"].append((int(snap["memory_mb"] * MB), base))
        out["edgesdk.hybrid.escalation_shift"].append((float(snap.get("escalation_shift") or 0.0), base))
        budget = snap.get("escalation")
        if budget:
            if budget.get("threshold") is not None and budget.get("signal"):
                out["edgesdk.hybrid.threshold"].append(
                    (float(budget["threshold"]), {**base, "edgesdk.hybrid.signal": _text(budget["signal"])}))
            if budget.get("rate") is not None:
                out["edgesdk.hybrid.escalation_rate"].append((float(budget["rate"]), base))
        for (name, label, identity), total in self._count(snap).items():
            attribute = _LABELS.get(name)
            out[name].append((total, {**dict(identity), attribute: label} if attribute else dict(identity)))
        return out

    def _count(self, snap: Mapping[str, Any]) -> dict[tuple[str, str | None, tuple], int]:
        """Add what the monitor counted since the previous collection to the current identity's totals."""
        now: dict[tuple[str, str | None], int] = {
            ("edgesdk.predictions", None): snap.get("predictions", 0),
            ("edgesdk.placement.switches", None): snap.get("placement_switches", 0)}
        for reason, n in (snap.get("errors") or {}).items():
            key = ("edgesdk.errors", self._error_type(reason))
            now[key] = now.get(key, 0) + n
        for counter, n in (snap.get("hybrid") or {}).items():
            kind, _, label = str(counter).partition(":")
            if kind in HYBRID:
                key = (HYBRID[kind][0], _text(label) if HYBRID[kind][1] else None)
                now[key] = now.get(key, 0) + n
        identity = tuple(sorted(self._attributes.items()))
        for key, n in now.items():
            slot = (*key, identity)
            self._totals[slot] = self._totals.get(slot, 0) + max(0, n - self._last.get(key, 0))
            self._last[key] = max(n, self._last.get(key, 0))
        return self._totals

    def _error_type(self, reason: str) -> str:
        reason = _text(reason)
        if reason not in self._error_types and len(self._error_types) >= MAX_ERROR_TYPES:
            return OTHER
        self._error_types.add(reason)
        return reason


# the attribute that carries a counter's label, beside the identity
_LABELS = {"edgesdk.errors": "error.type", **{name: attr for name, attr in HYBRID.values() if attr}}


class _Instruments:
    """The instruments of one meter provider, shared by every publication on it: an SDK keeps the callbacks of an
    instrument's first creation and ignores those of a later one with the same name, so one set of callbacks reads
    every publication."""

    def __init__(self, meter: Any, metrics: Any):
        self.publications: "weakref.WeakSet[Publication]" = weakref.WeakSet()
        self.duration = meter.create_histogram(
            "edgesdk.inference.duration", unit="s", description="Duration of a prediction's stage",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
        for name, kind, unit, description in INSTRUMENTS:
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            create(name, callbacks=[self._callback(name, kind, metrics.Observation)], unit=unit,
                   description=description)

    def _callback(self, name: str, kind: str, observation: type) -> Callable[[Any], Iterable[Any]]:
        combine = (lambda a, b: a + b) if kind == "counter" else max

        def callback(options: Any) -> list[Any]:
            found: dict[tuple, tuple[float, Attributes]] = {}
            for publication in list(self.publications):
                try:
                    for value, attributes in publication.observations(name):
                        key = tuple(sorted(attributes.items()))
                        if key in found:  # two models of one identity (one bundle loaded twice)
                            value = combine(found[key][0], value)
                        found[key] = (value, attributes)
                except Exception:  # one monitor's failure does not hide the others'
                    log.exception("monitor: reading %s for OpenTelemetry failed", name)
            return [observation(value, attributes) for value, attributes in found.values()]

        return callback


_LOCK = threading.Lock()
_REGISTRY: "weakref.WeakKeyDictionary[Any, _Instruments]" = weakref.WeakKeyDictionary()


def _monitor_of(source: Any) -> Monitor:
    if isinstance(source, Monitor):
        return source
    monitor = getattr(source, "monitor", _MISSING)
    if monitor is _MISSING:
        raise InputError(f"publish takes a loaded model or its monitor; a {type(source).__name__} has no monitor")
    if not isinstance(monitor, Monitor):
        raise InputError(f"{source!r} has no monitor to publish (it was loaded with monitor=False)")
    return monitor


_MISSING = object()


def _text(value: Any) -> str:
    return str(value)[:MAX_ATTRIBUTE_CHARS]


__all__ = ["publish", "Publication", "INSTRUMENTS", "IDENTITY", "EXTRA"]
