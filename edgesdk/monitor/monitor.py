"""The :class:`Monitor` on every loaded model: rolling windows of what it sees and does, drift against the bundle's
reference, alerts with hysteresis, and a snapshot as plain data.

Per prediction it writes one row of a ring of ``window`` rows: each input's summary and the output's
(:mod:`edgesdk.monitor.summaries`: a few means, never the input), the stage latencies, and the call's outcome. Every
``every`` predictions, once the window holds ``min_window`` of them, it evaluates the signals
(:class:`~edgesdk.choices.MonitorSignal`):

- ``input_drift``: the largest drift statistic (PSI by default, :mod:`edgesdk.monitor.drift`) of the input features
  against the bundle's reference (the manifest's ``monitoring`` section; none without one), counted above its
  sampling floor (what a window of that size drawn from the reference itself gives: 0.018 for 500 values);
- ``output_drift``: the same over the output features (the confidence and prediction distributions);
- ``error_rate``: the share of the window's calls that raised (by reason in the snapshot).

A signal's level (:class:`~edgesdk.choices.AlertLevel`) rises to ``warn`` or ``alert`` when its value reaches that
level's threshold at ``rise`` evaluations in a row, and falls back only when it stays below ``clear_ratio`` times
the threshold for ``clear`` evaluations in a row (hysteresis: a value near a threshold does not flap). Each change
is an :class:`Alert`, handed to every ``on_alert`` hook and to the sink. A hook that raises is logged, never
propagated: monitoring never fails a prediction, and a summary that cannot be made (an output of an unexpected
shape) is counted in ``snapshot()["monitor_errors"]`` and left out.

Costs: the ring is ``window`` rows of a few dozen floats; each prediction adds a few microseconds
(``benchmarks/monitor_overhead.py``); each evaluation reads the window once.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..choices import AlertLevel, MonitorResponse, MonitorSignal
from ..errors import InputError
from .drift import STATISTICS, noise_floor, shares
from .reference import VERSION as REFERENCE_VERSION, input_centers
from .summaries import InputSummary, OutputSummary

log = logging.getLogger("edgesdk.monitor")

MAX_WINDOW = 100_000
MIN_AGGREGATE = 20  # predictions a snapshot's input and output figures are made of, at least
MAX_HOOKS = 64


@dataclass(frozen=True)
class MonitorOptions:
    """How the monitor watches a model (``RuntimeOptions(monitor=MonitorOptions(...))``, or ``monitor=False`` to
    turn it off).

    ``window``: predictions in the rolling window (drift, error rate, latency percentiles); ``every``: predictions
    between evaluations; ``min_window``: predictions before the first one. ``statistic``: ``"psi"`` or ``"js"``;
    ``warn`` / ``alert``: its levels for the drift signals (PSI's usual 0.1 and 0.25; for JS try 0.05 and 0.1);
    ``error_warn`` / ``error_alert``: the error-rate levels. ``rise``, ``clear``, ``clear_ratio``: the hysteresis.
    ``respond``: signal -> :class:`~edgesdk.choices.MonitorResponse`, what the SDK itself does while that signal is
    at alert (nothing by default): ``refuse`` runs the model as usual (so the monitor keeps seeing the stream and the
    alert can clear) but raises :class:`~edgesdk.errors.BudgetExceeded` ``monitor`` instead of answering (not counted
    as an error); ``escalate_step`` / ``escalate_cap``: how far ``escalate_more`` moves a hybrid
    threshold per evaluation at alert, and at most; ``float_artifact`` serves the bundle's float artifact on the same
    engine and device until the signal clears (:mod:`edgesdk.runtime.float_response`; not with a thermal budget,
    which chooses the artifact itself). ``sink``: a JSON-lines file the monitor appends to (a snapshot
    every ``sink_every_s`` seconds at an evaluation, each alert, a last snapshot on close); None writes nothing.
    ``pending``: predictions whose inputs' read values are held in memory (at most 1 MiB per input, zeroed once
    summarized; never in a snapshot, sink or export) to be summarized together, which keeps the cost per prediction
    to one copy; 1 summarizes each prediction during its call (nothing held after it, a few microseconds more).
    """

    window: int = 500
    every: int = 50
    min_window: int = 300
    statistic: str = "psi"
    warn: float = 0.1
    alert: float = 0.25
    error_warn: float = 0.01
    error_alert: float = 0.05
    rise: int = 2
    clear: int = 3
    clear_ratio: float = 0.8
    respond: Mapping[MonitorSignal | str, MonitorResponse | str] = field(default_factory=dict)
    escalate_step: float = 0.02
    escalate_cap: float = 0.1
    sink: Any = None
    sink_every_s: float = 60.0
    pending: int = 50

    def __post_init__(self):
        for name in ("window", "every", "min_window", "rise", "clear", "pending"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WINDOW:
                raise InputError(f"monitor {name} must be an integer from 1 to {MAX_WINDOW}, got {value!r}")
        if self.min_window > self.window:
            raise InputError(f"monitor min_window ({self.min_window}) must not exceed window ({self.window})")
        if self.statistic not in STATISTICS:
            raise InputError(f"monitor statistic must be one of {', '.join(STATISTICS)}, got {self.statistic!r}")
        for name in ("warn", "alert", "error_warn", "error_alert", "escalate_step", "escalate_cap", "sink_every_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise InputError(f"monitor {name} must be a finite number >= 0, got {value!r}")
        if not (self.warn <= self.alert and self.error_warn <= self.error_alert):
            raise InputError(f"monitor warn levels must not exceed alert levels (warn={self.warn}, alert="
                             f"{self.alert}, error_warn={self.error_warn}, error_alert={self.error_alert})")
        if not 0 < self.clear_ratio <= 1:
            raise InputError(f"monitor clear_ratio must be in (0, 1], got {self.clear_ratio!r}")
        respond = {}
        for signal, response in dict(self.respond).items():
            respond[MonitorSignal.parse(signal, "monitor respond signal", InputError)] = \
                MonitorResponse.parse(response, f"monitor respond[{signal}]", InputError)
        object.__setattr__(self, "respond", respond)


@dataclass(frozen=True)
class Alert:
    """A signal's level changed: ``previous`` -> ``level`` at ``value`` (``threshold`` the level's; ``feature`` the
    feature that drifted most, for drift), after ``predictions`` predictions, at ``time`` (UTC, ISO 8601)."""

    signal: MonitorSignal
    level: AlertLevel
    previous: AlertLevel
    value: float
    threshold: float
    statistic: str
    feature: str | None
    predictions: int
    time: str

    def to_dict(self) -> dict[str, Any]:
        return {"signal": str(self.signal), "level": str(self.level), "previous": str(self.previous),
                "value": self.value, "threshold": self.threshold, "statistic": self.statistic,
                "feature": self.feature, "predictions": self.predictions, "time": self.time}


class _Level:
    """One signal's level with its hysteresis counters."""

    def __init__(self) -> None:
        self.level, self.value, self.feature = AlertLevel.OK, None, None
        self.above = {AlertLevel.WARN: 0, AlertLevel.ALERT: 0}
        self.below = 0


_RANK = {AlertLevel.OK: 0, AlertLevel.WARN: 1, AlertLevel.ALERT: 2}


class Monitor:
    """The monitor of one model (``model.monitor``). Thread-safe. See the module docstring."""

    def __init__(self, manifest: Mapping[str, Any], layout: str | None, spec: Any, softmax: bool,
                 identity: Callable[[], dict[str, Any]], options: MonitorOptions | None = None,
                 decode: Callable[[Sequence[np.ndarray]], Any] | None = None):
        self.options = opts = options or MonitorOptions()
        self._identity = identity
        self._decode = decode  # the task's decoding of raw outputs, for an observation that brings no Result
        n = opts.window
        centers = input_centers(manifest)
        self.inputs = [InputSummary(t["name"], t["shape"], layout if i == 0 else None, n, centers[i], opts.pending)
                       for i, t in enumerate(manifest["inputs"])]
        outputs = manifest["outputs"]
        self.outputs = OutputSummary(spec, [t["name"] for t in outputs], [t["shape"] for t in outputs], softmax, n)
        self.reference = manifest.get("monitoring") or None
        if self.reference is not None and self.reference.get("version", REFERENCE_VERSION) != REFERENCE_VERSION:
            log.warning("monitor: the bundle's reference is version %s; this edgesdk reads %s: drift is off",
                        self.reference.get("version"), REFERENCE_VERSION)
            self.reference = None
        self._window, self._every, self._first = n, opts.every, opts.min_window
        # per-prediction scalars in Python lists (a list store costs a tenth of a numpy one)
        self._pre = [math.nan] * n  # preprocess ms
        self._inf = [math.nan] * n  # inference ms
        one = self.inputs[0].hold if len(self.inputs) == 1 else None
        scores = self.outputs.scores if self.outputs.bulk else None
        self._hot = (one, scores, self.outputs.scores_at, self._pre, self._inf, n)
        self._failures = 0
        self._failed_at: deque[int] = deque(maxlen=n)  # the numbers of the calls that raised (the last window's)
        self._placement: str | None = None
        self._switches = 0
        self._lock = threading.Lock()
        self._seen = 0  # predictions observed (rows written)
        self._errors: Counter[str] = Counter()
        self._broken = 0
        self._placements: Counter[str] = Counter()
        self._hybrid: Counter[str] = Counter()
        self._levels = {s: _Level() for s in MonitorSignal}
        self._evaluating = threading.RLock()  # one evaluation at a time (a hook may evaluate again)
        self._evaluated_seen = -1  # the predictions count at the last evaluation
        self._hooks: list[Callable[[Alert], Any]] = []
        self._evaluate_hooks: list[Callable[["Monitor", dict[str, Any]], Any]] = []
        self._reported = 0  # predictions handed to the evaluate hooks so far
        self._reported_errors: Counter[str] = Counter()
        self._sink = None
        self._last_sink = 0.0
        self._escalation_state: Callable[[], dict[str, Any]] | None = None  # a hybrid model's budget, if any
        self.escalation_shift = 0.0  # how far escalate_more has moved a hybrid threshold (toward escalating more)
        self.refusing: tuple[str, ...] = ()  # the signals at alert whose response is refuse (the model refuses)
        self.wants_float = False  # a signal whose response is float_artifact is at alert (the model switches)
        self.started = _now()
        if opts.sink is not None:
            from .sink import JsonLinesSink

            self._sink = opts.sink if hasattr(opts.sink, "write") else JsonLinesSink(opts.sink)

    @classmethod
    def for_bundle(cls, bundle: Any, identity: Callable[[], dict[str, Any]], options: MonitorOptions | None = None,
                   io: Any = None) -> "Monitor":
        """The monitor of a model of ``bundle`` (a :class:`~edgesdk.bundle.reader.Bundle`): what a loaded
        :class:`~edgesdk.Model` makes, and what a server that runs the bundle's engine itself (``edgesdk serve``)
        makes to report the same figures. ``identity``: a callable giving the version identity
        (:func:`edgesdk.monitor.identity.version_identity`); ``io``: the model's
        :class:`~edgesdk.bundle.tensors.BundleIO` (made here when None)."""
        if io is None:
            from ..bundle.tensors import BundleIO

            io = BundleIO(bundle)
        layout = bundle.preprocess.layout if bundle.preprocess is not None else None
        return cls(bundle.manifest, layout, io.task, io.softmax, identity, options, lambda outs: io.decode(list(outs)))

    # -- what the model reports -------------------------------------------------
    def observe(self, feeds: Sequence[np.ndarray], outputs: Sequence[np.ndarray], preprocess_ms: float,
                inference_ms: float, result: Any = None, placement: str | None = None, owned: bool = False) -> None:
        """One prediction that answered: its prepared inputs, outputs, stage times, the :class:`Result` (whose
        ``decoded`` the tasks other than classification are summarized from: decoded once, shared with the app)
        and the artifact that answered it; ``owned``: the feeds were made for this prediction (the bundle's
        preprocess made them from an image) and nothing writes to them again (:meth:`InputSummary.hold`). Never
        raises.

        It takes the monitor's lock only to evaluate: two predictions that run at the same moment on one model may
        take the same row number, and one of them is then left out of the window, nothing worse. The inputs' read
        values wait in a small buffer (``pending`` predictions, at most 1 MiB per input) and are summarized together
        (:meth:`InputSummary.hold`), under that buffer's own lock, so no thread's copy is overwritten or zeroed by
        another's. The evaluations and the level changes are serialized."""
        record, scores, at, pre, inf, window = self._hot  # one attribute read: this runs on every prediction
        seen = self._seen
        i = seen % window
        try:
            if record is not None:
                record(feeds[0], i, owned)
            else:
                for summary, x in zip(self.inputs, feeds):
                    summary.hold(x, i, owned)
            if scores is not None:
                scores[i] = outputs[at]  # the engine's fresh array, summarized in bulk at the next evaluation
            else:
                self.outputs.record(outputs, lambda: result.decoded if result is not None else self._decode(outputs), i)
        except Exception as exc:  # a summary never fails the prediction
            self._summary_failed(i, exc)
        pre[i] = preprocess_ms
        inf[i] = inference_ms
        self._seen = seen = seen + 1
        if placement is not self._placement and placement != self._placement:
            self._placement_changed(placement)
        if seen % self._every == 0 and seen >= self._first:
            self._evaluate_safely()

    def _evaluate_safely(self) -> None:
        try:
            self.evaluate()
        except Exception:  # an evaluation never fails the prediction that triggered it
            log.exception("monitor: an evaluation failed; the levels stay as they were")

    def _summary_failed(self, i: int, exc: Exception) -> None:
        self._broken += 1
        for summary in self.inputs:
            summary.clear(i)
        self.outputs.clear(i)
        if self._broken == 1:
            log.warning("monitor: could not summarize a prediction (%s); such predictions are left out", exc)

    def _placement_changed(self, placement: str | None) -> None:
        if self._placement is not None:
            self._switches += 1
        self._placement = placement
        self._placements[placement] += 1

    def failed(self, reason: str) -> None:
        """One call that raised (``reason``: the error's reason code, else its type). Never raises."""
        with self._lock:
            self._errors[reason] += 1
            self._failures += 1
            self._failed_at.append(self._seen + self._failures)  # the call's number
            calls = self._seen + self._failures
            # evaluated on the calls' count too: a model whose calls now all fail still has its error rate judged
            due = calls % self._every == 0 and calls >= self._first
        if due:
            self._evaluate_safely()

    def _error_share(self) -> tuple[int, int]:
        """(calls in the window, errors among them): the last ``window`` calls."""
        calls = self._seen + self._failures
        counted = min(calls, self._window)
        return counted, sum(1 for at in self._failed_at if at > calls - counted)

    def hybrid(self, source: str, escalation: str | None, degraded: bool, skipped: str | None = None) -> None:
        """A hybrid model's answer: which side answered, why it escalated, whether the cloud failed."""
        with self._lock:
            self._hybrid[f"source:{source}"] += 1
            if escalation is not None:
                self._hybrid[f"escalated:{escalation}"] += 1
            if degraded:
                self._hybrid["degraded"] += 1
            if skipped is not None:
                self._hybrid[f"skipped:{skipped}"] += 1

    def watch_escalation(self, state: Callable[[], dict[str, Any]]) -> None:
        """Show a hybrid model's escalation budget (``state()``: its threshold, target and recent rate, skips) in
        :meth:`snapshot` as ``escalation`` (:mod:`edgesdk.hybrid.budget`)."""
        self._escalation_state = state

    def on_alert(self, hook: Callable[[Alert], Any]) -> Callable[[Alert], Any]:
        """Call ``hook(alert)`` on every level change (usable as a decorator). Returns ``hook``."""
        return self._register(self._hooks, hook, "on_alert", "alert")

    def on_evaluate(self, hook: Callable[["Monitor", dict[str, Any]], Any]) -> Callable:
        """Call ``hook(monitor, recent)`` after every evaluation, where ``recent`` holds what happened since the
        previous one: ``{"predictions": int, "errors": {reason: count}, "latency_ms": {"preprocess": [...],
        "inference": [...]}}`` (the latencies of those predictions, oldest first; at most ``window`` of them). This is
        how exporters (:mod:`edgesdk.monitor.otel`) record per-prediction histograms without a cost per prediction.
        A hook that raises is logged. Returns ``hook``."""
        return self._register(self._evaluate_hooks, hook, "on_evaluate", "evaluate")

    def _register(self, hooks: list[Callable], hook: Callable, method: str, kind: str) -> Callable:
        if not callable(hook):
            raise InputError(f"{method} takes a callable, got {type(hook).__name__}")
        with self._lock:
            if len(hooks) >= MAX_HOOKS:
                raise InputError(f"a monitor takes at most {MAX_HOOKS} {kind} hooks")
            hooks.append(hook)
        return hook

    def remove_hook(self, hook: Callable) -> None:
        """Stop calling ``hook`` (an ``on_alert`` or ``on_evaluate`` one); nothing when it is not registered."""
        with self._lock:
            for hooks in (self._hooks, self._evaluate_hooks):
                if hook in hooks:
                    hooks.remove(hook)

    def identity(self) -> dict[str, Any] | None:
        """What every figure is about (``snapshot()["identity"]``): the bundle, where it runs now, the CPU class."""
        return self._identity_safe()["identity"]

    def _recent(self) -> dict[str, Any]:
        """What happened since the previous call (for the evaluate hooks); under the lock."""
        seen, last = self._seen, self._reported
        count = min(seen - last, self._window)
        idx = [(seen - count + j) % self._window for j in range(count)]
        errors = self._errors - self._reported_errors
        self._reported, self._reported_errors = seen, Counter(self._errors)
        return {"predictions": seen - last, "errors": dict(errors),
                "latency_ms": {"preprocess": [self._pre[i] for i in idx], "inference": [self._inf[i] for i in idx]}}

    # -- what it makes of it --------------------------------------------------------
    def level(self, signal: MonitorSignal | str) -> AlertLevel:
        return self._levels[MonitorSignal.parse(signal, "monitor signal", InputError)].level

    def responding(self, response: MonitorResponse) -> bool:
        """Whether ``response`` is in force: a signal it is set for is at alert."""
        return bool(self._in_force(response))

    def _in_force(self, response: MonitorResponse) -> tuple[str, ...]:
        """The signals at alert whose response is ``response``."""
        return tuple(str(s) for s, r in self.options.respond.items()
                     if r is response and self._levels[s].level is AlertLevel.ALERT)

    def evaluate(self) -> list[Alert]:
        """Evaluate the signals on the window now (the monitor does it every ``every`` predictions); returns the
        level changes, already handed to the hooks and the sink. Evaluations run one at a time."""
        with self._evaluating:
            return self._evaluate()

    def _evaluate(self) -> list[Alert]:
        opts = self.options
        with self._lock:
            n = min(self._seen, opts.window)
            calls, errors = self._error_share()
            error_rate = errors / calls if calls else 0.0
            inputs = [s.features(n) for s in self.inputs]
            outputs = self.outputs.features(n)
            seen = self._seen
        stat = opts.statistic
        fresh = seen != self._evaluated_seen  # the drift signals move only on a window with new predictions
        self._evaluated_seen = seen
        drift = self._drift_of(n, inputs, outputs, (stat,)) if fresh else {"inputs": {}, "outputs": {}}
        changes = []
        for signal, group in ((MonitorSignal.INPUT_DRIFT, "inputs"), (MonitorSignal.OUTPUT_DRIFT, "outputs")):
            if drift[group]:  # the largest excess over the sampling floor
                feature, entry = max(drift[group].items(), key=lambda kv: kv[1][stat] - kv[1][f"{stat}_floor"])
                excess = max(0.0, entry[stat] - entry[f"{stat}_floor"])
                changes += self._update(signal, round(excess, 6), feature, seen)
        changes += self._update(MonitorSignal.ERROR_RATE, error_rate, None, seen)
        with self._lock:
            self._respond()
            recent = self._recent() if self._evaluate_hooks else None
        for alert in changes:
            self._emit(alert)
        for hook in list(self._evaluate_hooks):
            try:
                hook(self, recent)
            except Exception:  # an exporter never breaks predictions
                log.exception("monitor: an on_evaluate hook raised")
        self._maybe_sink()
        return changes

    def _drift_of(self, n: int, inputs: list[np.ndarray], outputs: np.ndarray,
                  statistics: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
        drift: dict[str, dict[str, dict[str, float]]] = {"inputs": {}, "outputs": {}}
        if self.reference is not None and n:
            names = [name for s in self.inputs for name in s.names]
            values = np.concatenate(inputs, axis=1) if inputs else np.zeros((n, 0))
            drift["inputs"] = _drift(self.reference.get("inputs") or {}, names, values, statistics)
            # the artifact's own reference where the bundle has one (what it gave on the validation data)
            own = ((self.reference.get("artifacts") or {}).get(self._placement) or {}).get("outputs")
            drift["outputs"] = _drift(own or self.reference.get("outputs") or {}, self.outputs.names, outputs,
                                      statistics)
        return drift

    def _scale(self, signal: MonitorSignal) -> tuple[str, float, float]:
        """A signal's statistic and its warn and alert levels."""
        opts = self.options
        if signal is MonitorSignal.ERROR_RATE:
            return "share", opts.error_warn, opts.error_alert
        return opts.statistic, opts.warn, opts.alert

    def _update(self, signal: MonitorSignal, value: float, feature: str | None, seen: int) -> list[Alert]:
        opts = self.options
        statistic, warn, alert = self._scale(signal)
        state = self._levels[signal]
        state.value, state.feature = value, feature
        reached = AlertLevel.ALERT if value >= alert else AlertLevel.WARN if value >= warn else AlertLevel.OK
        for lvl in (AlertLevel.WARN, AlertLevel.ALERT):
            state.above[lvl] = state.above[lvl] + 1 if _RANK[reached] >= _RANK[lvl] else 0
        new = state.level
        if state.above[AlertLevel.ALERT] >= opts.rise:
            new = AlertLevel.ALERT
        elif state.above[AlertLevel.WARN] >= opts.rise and _RANK[new] < _RANK[AlertLevel.WARN]:
            new = AlertLevel.WARN
        if new is state.level and state.level is not AlertLevel.OK:
            threshold = alert if state.level is AlertLevel.ALERT else warn
            state.below = state.below + 1 if value < opts.clear_ratio * threshold else 0
            if state.below >= opts.clear:  # falls to the level the value still reaches
                new = AlertLevel.WARN if state.level is AlertLevel.ALERT and value >= warn else AlertLevel.OK
        if new is state.level:
            return []
        previous, state.level, state.below = state.level, new, 0
        rising = _RANK[new] > _RANK[previous]
        threshold = alert if (new if rising else previous) is AlertLevel.ALERT else warn
        return [Alert(signal, new, previous, float(value), float(threshold), statistic, feature, seen, _now())]

    def _respond(self) -> None:
        opts = self.options
        self.refusing = self._in_force(MonitorResponse.REFUSE)
        self.wants_float = bool(self._in_force(MonitorResponse.FLOAT_ARTIFACT))
        if self._in_force(MonitorResponse.ESCALATE_MORE):
            self.escalation_shift = min(opts.escalate_cap, self.escalation_shift + opts.escalate_step)
        elif self.escalation_shift:
            self.escalation_shift = max(0.0, self.escalation_shift - opts.escalate_step)

    def _emit(self, alert: Alert) -> None:
        (log.warning if alert.level is AlertLevel.ALERT else log.info)(
            "monitor: %s %s -> %s (%s %.3g, threshold %.3g%s)", alert.signal, alert.previous, alert.level,
            alert.statistic, alert.value, alert.threshold, f", most: {alert.feature}" if alert.feature else "")
        for hook in list(self._hooks):
            try:
                hook(alert)
            except Exception:  # an app's hook never breaks its predictions
                log.exception("monitor: an on_alert hook raised")
        if self._sink is not None:
            self._write({"type": "alert", **self._identity_safe(), **alert.to_dict()})

    def _maybe_sink(self) -> None:
        if self._sink is not None and time.monotonic() - self._last_sink >= self.options.sink_every_s:
            self._last_sink = time.monotonic()
            self._write({"type": "snapshot", **self.snapshot()})

    def _write(self, record: dict[str, Any]) -> None:
        try:
            self._sink.write(record)
        except Exception as exc:  # a full disk stops the sink, not the app
            log.warning("monitor: the sink failed (%s); it is turned off", exc)
            sink, self._sink = self._sink, None
            try:
                if sink is not None and hasattr(sink, "close"):
                    sink.close()
            except Exception:  # closing flushes: it may fail the same way
                pass

    def _identity_safe(self) -> dict[str, Any]:
        try:
            return {"identity": self._identity()}
        except Exception:
            return {"identity": None}

    # -- what the app reads ----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The monitor's state as plain data (JSON-ready): version identity, counts, latency percentiles, each
        signal's value and level, drift per feature with its reference, the output distributions, hybrid counts."""
        opts = self.options
        with self._lock:
            n = min(self._seen, opts.window)
            latency = np.array([self._pre[:n], self._inf[:n]], dtype=np.float64).T
            outputs = self.outputs.features(n)
            # figures of the inputs and outputs are aggregates of MIN_AGGREGATE predictions at least: one
            # prediction's cell means would be a thumbnail of its input
            shown = n >= MIN_AGGREGATE
            drift = self._drift_of(n, [s.features(n) for s in self.inputs], outputs, tuple(STATISTICS)) if shown \
                else {"inputs": {}, "outputs": {}}
            calls, errors_in_window = self._error_share()
            snap = {
                "time": _now(), "started": self.started, "predictions": self._seen, "calls": self._seen + self._failures,
                "options": {"window": opts.window, "every": opts.every, "min_window": opts.min_window,
                            "statistic": opts.statistic, "rise": opts.rise, "clear": opts.clear},
                "errors": dict(self._errors), "monitor_errors": self._broken, "window": n,
                "window_calls": calls, "window_errors": errors_in_window,
                "placement": self._placement, "placements_used": dict(self._placements),
                "placement_switches": self._switches, "hybrid": dict(self._hybrid),
                "escalation_shift": self.escalation_shift,
                "signals": {str(s): {"level": str(st.level), "value": st.value, "feature": st.feature,
                                     **dict(zip(("statistic", "warn", "alert"), self._scale(s)))}
                            for s, st in self._levels.items()},
                "drift": drift,
                "reference": self.reference is not None,
            }
        snap["identity"] = self._identity_safe()["identity"]
        if self._escalation_state is not None:
            snap["escalation"] = self._escalation_state()
        stages = {"preprocess": latency[:, 0], "inference": latency[:, 1], "total": latency.sum(axis=1)}
        snap["latency_ms"] = {stage: _percentiles(v) for stage, v in stages.items()}
        snap["outputs"] = {name: _distribution(outputs[:, j]) for j, name in enumerate(self.outputs.names)} \
            if shown else {}
        from ..budgets.memory import rss_mb

        snap["memory_mb"] = round(rss_mb(), 1)
        return snap

    def close(self) -> None:
        """Write a last snapshot to the sink and close it."""
        sink, self._sink = self._sink, None
        if sink is not None:
            self._sink = sink
            self._write({"type": "snapshot", **self.snapshot()})
            sink, self._sink = self._sink, None
            if sink is not None and hasattr(sink, "close"):
                sink.close()


def _drift(reference: Mapping[str, Any], names: Sequence[str], values: np.ndarray,
           statistics: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per feature with a reference: the statistics, the window's mean beside the reference's, the values counted."""
    out = {}
    for j, name in enumerate(names):
        entry = reference.get(name)
        if not entry:
            continue
        col = values[:, j]
        window, counted, mean = shares(entry, col)
        if not counted or len(entry["p"]) != window.size:
            continue
        ref = np.asarray(entry["p"], dtype=np.float64)
        out[name] = {s: round(STATISTICS[s](ref, window), 6) for s in statistics} | {
            f"{s}_floor": round(noise_floor(s, ref.size, counted, int(entry.get("n") or counted)), 6)
            for s in statistics} | {"mean": round(mean, 6), "reference_mean": entry.get("mean"), "n": counted}
    return out


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    v = values[np.isfinite(values)]
    if not v.size:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(v, [50, 95, 99])
    return {"p50": round(float(p[0]), 4), "p95": round(float(p[1]), 4), "p99": round(float(p[2]), 4)}


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    v = values[np.isfinite(values)]
    if not v.size:
        return {"mean": None, "p10": None, "p50": None, "p90": None, "n": 0}
    p = np.percentile(v, [10, 50, 90])
    return {"mean": round(float(v.mean()), 6), "p10": round(float(p[0]), 6), "p50": round(float(p[1]), 6),
            "p90": round(float(p[2]), 6), "n": int(v.size)}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


__all__ = ["Monitor", "MonitorOptions", "Alert"]
