"""Hybrid mode: the device answers what it can, a cloud endpoint (Open Inference Protocol V2) takes the rest.

Modes (per load, and per call with ``predict(x, mode=...)``):

``device-only``    the device answers; nothing leaves the device (no socket is opened).
``cloud-only``     the cloud answers; a failed call raises its :class:`~edgesdk.errors.CloudError`.
``prefer-device``  the device answers; the cloud takes what the device cannot serve: no viable backend
                   (``no_backend``), a memory budget that no artifact fits (``memory``), a thermal refusal or
                   escalation (``thermal``), or a hard input (``low_confidence``, ``out_of_range``). When the
                   cloud fails, the device's answer is returned with ``degraded=True`` (if there is one).
``prefer-cloud``   the cloud answers; when it is unreachable or late, the device does (``degraded=True``).

Hardness signals from the device's output (:func:`signals`): the top-1 probability, the top-1/top-2 margin, the
entropy of the class distribution, and ours: the share of input values outside the range the INT8 input
quantization was calibrated on (the manifest's ``calibration.input_ranges``). :class:`EscalationPolicy`
combines them: one confidence signal against a threshold, plus a cap on the clipped share.

A cloud answer is checked against the bundle's outputs (the manifest's ``outputs``: names, count, shapes,
datatypes, finite values) and capped in bytes by them before it is used; one that differs is the cloud's failure
(``bad_response``, ``response_too_large``), answered like any other.

Every :class:`~edgesdk.Result` says which ``source`` answered (``device`` / ``cloud``), why it escalated
(``escalation_reason``), whether it is ``degraded``, and, when the cloud failed, ``cloud_error`` (its reason).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..choices import BackendReason, CloudReason, EscalationReason, EscalationSkip, HybridMode, TaskType
from ..errors import BackendUnavailable, BudgetExceeded, BundleError, CloudError, CloudTimeout, InputError
from ..lifecycle import Closeable
from ..result import Result
from ..tasks.answers import AnswerCheck
from ..tasks.hardness import SIGNALS as TASK_SIGNALS, signals as task_signals
from .budget import EscalationBudget, warm_start
from .v2_codec import expected_outputs

log = logging.getLogger("edgesdk.hybrid.model")

MODES = tuple(HybridMode)
MAX_STEP = 2.0  # the budget's estimator gain, in logit units per input
MAX_PER_MINUTE = 1e6
MAX_BURST = 1_000_000
MAX_RATE_WINDOW = 100_000
RECHECK_S = 30.0  # a failed model check (other than an outage) is asked again after this long
CLASSIFICATION_SIGNALS = ("max_prob", "margin", "entropy")
# Every signal a policy may escalate on: the classifier's, then each task's (edgesdk.tasks.hardness).
SIGNALS = CLASSIFICATION_SIGNALS + tuple(s for s in TASK_SIGNALS if s not in CLASSIFICATION_SIGNALS)
# Used when neither the policy nor the bundle's calibration (edgesdk calibrate-escalation) sets a threshold.
DEFAULT_THRESHOLDS = {"max_prob": 0.6, "margin": 0.2, "entropy": 0.5,
                      **{name: entry[2] for name, entry in TASK_SIGNALS.items()}}
# A signal whose high values mean a hard input (the others: low values)
HIGH_IS_HARD = {"entropy", *(name for name, entry in TASK_SIGNALS.items() if entry[1] == "high")}
# The signal a policy uses when it names none, per task type
DEFAULT_SIGNAL = {"classification": "max_prob", "detection": "uncertain_share", "segmentation": "uncertain_pixel_share",
                  "text": "min_char_confidence", "regression": "threshold_distance",
                  "probability": "threshold_distance"}


def signals(probabilities: np.ndarray | None, feeds: Sequence[np.ndarray] | None = None,
            input_ranges: Sequence[dict] | None = None) -> dict[str, float | None]:
    """The hardness signals of one prediction. ``probabilities`` is the class distribution (None for a model
    that is not a classifier: the confidence signals are None); ``entropy`` is normalized to [0, 1] by
    log(classes); ``clipped_share`` is the share of input values outside the calibrated ranges (None when the
    bundle records none)."""
    out: dict[str, float | None] = {"max_prob": None, "margin": None, "entropy": None, "clipped_share": None}
    if probabilities is not None and probabilities.size:
        p = np.clip(probabilities.astype(np.float64).reshape(-1), 0.0, 1.0)
        top2 = np.partition(p, -2)[-2:] if p.size > 1 else np.array([0.0, p[0]])
        out["max_prob"] = float(top2[1])
        out["margin"] = float(top2[1] - top2[0])
        nz = p[p > 0]
        out["entropy"] = float(-(nz * np.log(nz)).sum() / math.log(p.size)) if p.size > 1 else 0.0
    if feeds is not None and input_ranges:
        outside = total = 0
        for arr, rng in zip(feeds, input_ranges):
            outside += int(np.count_nonzero((arr < rng["min"]) | (arr > rng["max"])))
            total += arr.size
        out["clipped_share"] = outside / total if total else 0.0
    return out


@dataclass(frozen=True)
class EscalationPolicy:
    """When the device's answer is too unsure to keep.

    ``signal`` against ``threshold``: for a classifier ``max_prob``, ``margin`` or ``entropy`` (escalate when the
    top-1 probability or the margin is below it, or the entropy above it); for other tasks their own
    (:mod:`edgesdk.tasks.hardness`: a detector's ``uncertain_share`` of boxes or ``min_kept_score``, a segmenter's
    ``uncertain_pixel_share``, a text model's ``min_char_confidence`` or ``mean_margin``, a regression's or
    probability's ``threshold_distance``). Reason ``low_confidence``. ``signal`` None: the task's usual one
    (max_prob, uncertain_share, uncertain_pixel_share, min_char_confidence, threshold_distance; none for
    landmarks, embedding and raw, which escalate only on ``out_of_range``). ``threshold``
    None takes the bundle's calibrated one (``manifest["hybrid"]``, written by ``edgesdk calibrate-escalation``)
    and else :data:`DEFAULT_THRESHOLDS`. ``max_clipped``: escalate when more than this share of the input lies
    outside the calibration range (reason ``out_of_range``; None: never).

    The budget (:mod:`edgesdk.hybrid.budget`; off unless one of these is set): ``target_rate`` holds the share of
    escalated inputs at that value under drift, the threshold tracking the signal's quantile (``step``: the
    estimator's gain, in logit units; the start: the bundle's calibrated curve at that rate, else ``threshold``);
    ``max_per_minute`` and ``burst``: a token bucket (``burst`` default: ``max_per_minute`` rounded up, at least 1); ``max_rate``: at most
    that share of the last ``rate_window`` inputs escalate. An input over the budget gets the device's answer with
    ``escalation_skipped="budget"``.
    """

    signal: str | None = None
    threshold: float | None = None
    max_clipped: float | None = 0.05
    target_rate: float | None = None
    step: float = 0.1
    max_per_minute: float | None = None
    burst: int | None = None
    max_rate: float | None = None
    rate_window: int = 1000

    def __post_init__(self):
        if self.signal is not None and self.signal not in SIGNALS:
            raise InputError(f"escalation signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        for name in ("threshold", "max_clipped"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 <= value <= 1.0):
                raise InputError(f"escalation {name} must be a number in [0, 1] or None, got {value!r}")
        for name, low, high, none in (("target_rate", 0.0, 1.0, True), ("max_rate", 0.0, 1.0, True),
                                      ("step", 0.0, MAX_STEP, False), ("max_per_minute", 0.0, MAX_PER_MINUTE, True)):
            value = getattr(self, name)
            if value is None and none:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high \
                    or (name == "target_rate" and value >= 1.0):
                closing = ")" if name == "target_rate" else "]"
                raise InputError(f"escalation {name} must be a number in ({low:g}, {high:g}{closing}"
                                 f"{' or None' if none else ''}, got {value!r}")
        for name, low, high, none in (("burst", 1, MAX_BURST, True), ("rate_window", 10, MAX_RATE_WINDOW, False)):
            value = getattr(self, name)
            if (value is not None or not none) and (isinstance(value, bool) or not isinstance(value, int)
                                                    or not low <= value <= high):
                raise InputError(f"escalation {name} must be an integer from {low} to {high}"
                                 f"{' or None' if none else ''}, got {value!r}")
        if self.burst is not None and self.max_per_minute is None:
            raise InputError("escalation burst sizes a token bucket: set max_per_minute too")

    @property
    def budgeted(self) -> bool:
        """Whether a budget applies (a target rate, a token bucket or a hard cap)."""
        return self.target_rate is not None or self.max_per_minute is not None or self.max_rate is not None

    def resolved(self, manifest: dict) -> "EscalationPolicy":
        """This policy with its signal (the task's usual one) and threshold filled in from the bundle's
        calibration, else the default. A signal the bundle's task does not give is an :class:`InputError`."""
        kind = str((manifest.get("task") or {}).get("type") or (
            TaskType.CLASSIFICATION if (manifest.get("postprocess") or {}).get("type") == TaskType.CLASSIFICATION
            else TaskType.RAW))
        if self.signal is None:
            calibrated = (manifest.get("hybrid") or {}).get("signal")
            if calibrated is not None and calibrated not in SIGNALS:
                raise BundleError(f"the bundle's calibrated escalation signal {calibrated!r} (manifest hybrid.signal) "
                                  f"is not one this edgesdk knows ({', '.join(SIGNALS)}): calibrate it again, or "
                                  f"name the signal: EscalationPolicy(signal=...)")
            signal = calibrated if calibrated is not None else DEFAULT_SIGNAL.get(kind)
            if signal is None and self.target_rate is not None:
                raise InputError(f"escalation target_rate tracks a hardness signal; this bundle's task ({kind}) has "
                                 f"none: use max_per_minute or max_rate alone")
            # a task with no hardness signal (landmarks, embedding, raw): only out-of-range inputs escalate
            return self if signal is None else replace(self, signal=signal).resolved(manifest)
        given_by = (str(TaskType.CLASSIFICATION),) if self.signal in CLASSIFICATION_SIGNALS else \
            tuple(str(t) for t in TASK_SIGNALS[self.signal][0])
        if kind != TaskType.RAW and kind not in given_by:
            raise InputError(f"escalation signal {self.signal!r} is a {'/'.join(given_by)} signal; this bundle's task "
                             f"is {kind} (its signal: {DEFAULT_SIGNAL.get(kind, 'none')})")
        if self.threshold is not None:
            return self
        calibrated = manifest.get("hybrid") or {}
        if calibrated.get("signal") == self.signal and calibrated.get("threshold") is not None:
            return replace(self, threshold=float(calibrated["threshold"]))
        return replace(self, threshold=DEFAULT_THRESHOLDS[self.signal])

    def reason(self, sig: dict[str, float | None], threshold: float | None = None) -> EscalationReason | None:
        """Why this prediction should escalate (``low_confidence``, ``out_of_range``), or None. ``threshold``: the
        one in force when it is not the policy's (a budget's, or moved by the monitor)."""
        value = sig.get(self.signal)
        threshold = self.threshold if threshold is None else threshold
        if value is not None and threshold is not None:
            if (value > threshold) if self.signal in HIGH_IS_HARD else (value < threshold):
                return EscalationReason.LOW_CONFIDENCE
        clipped = sig.get("clipped_share")
        if self.max_clipped is not None and clipped is not None and clipped > self.max_clipped:
            return EscalationReason.OUT_OF_RANGE
        return None


@dataclass(frozen=True)
class HybridOptions:
    """Hybrid mode for :func:`edgesdk.load` (``RuntimeOptions(hybrid=...)``, or ``load(..., mode=, cloud=)``).

    ``cloud`` is a :class:`~edgesdk.hybrid.client.CloudClient`, or the server's URL (a client is made for the
    bundle's name, with ``token_env`` naming the environment variable that holds the bearer token).
    ``check_model``: before the first cloud call, compare the served model's inputs with the bundle's. ``mode`` is a
    :class:`~edgesdk.choices.HybridMode` or its string (held as the member; anything else raises :class:`InputError`
    here, naming the modes).
    """

    mode: HybridMode | str = HybridMode.DEVICE_ONLY
    cloud: Any = None
    policy: EscalationPolicy = field(default_factory=EscalationPolicy)
    token_env: str | None = None
    check_model: bool = True

    def __post_init__(self):
        object.__setattr__(self, "mode", HybridMode.parse(self.mode, "hybrid mode", InputError))
        if self.mode != HybridMode.DEVICE_ONLY and self.cloud is None:
            raise InputError(f"hybrid mode {self.mode.value!r} needs a cloud endpoint (cloud=URL or a CloudClient)")


class HybridModel(Closeable):
    """A bundle served by the device, a cloud endpoint, or both (see the module docstring). Made by
    :func:`edgesdk.load` when the mode is not ``device-only``. ``device`` is the on-device
    :class:`~edgesdk.Model`, or None when it could not load (``device_error`` says why)."""

    def __init__(self, bundle: Any, device: Any, device_error: Exception | None, options: HybridOptions, cloud: Any,
                 owns_cloud: bool = False):
        from ..bundle.tensors import BundleIO

        self.bundle = bundle
        self.device = device
        self.device_error = device_error
        self.mode = options.mode
        self.policy = options.policy.resolved(bundle.manifest)
        self.cloud = cloud
        self._owns_cloud = owns_cloud  # made here from a URL: closed with the model
        self._io = device.io if device is not None else BundleIO(bundle)
        self._names = [t["name"] for t in bundle.manifest["inputs"]]
        try:  # what every cloud answer must be, whoever made the client
            self._expected = expected_outputs(bundle.manifest["outputs"])
        except InputError as exc:
            raise BundleError(f"bundle {bundle.name!r}: its outputs cannot be checked in a cloud answer: {exc}") \
                from None
        self._answer_check = AnswerCheck.of(bundle.manifest)  # what the task refuses in a cloud answer (boxes)
        self._ranges = (bundle.manifest.get("calibration") or {}).get("input_ranges")
        self._check_model = options.check_model
        self._model_checked: tuple[CloudError, float] | bool = False
        if self.policy.max_clipped is not None and not self._ranges:
            log.warning("bundle %r records no calibration input ranges (quantize it again with this edgesdk): the "
                        "clipped-share signal is off, out_of_range never escalates", bundle.name)
        calibrated_on = (bundle.manifest.get("hybrid") or {}).get("device_artifact")
        if calibrated_on and device is not None and calibrated_on != device.placement.artifact:
            log.warning("the escalation threshold of %r was calibrated on %s; this device runs %s", bundle.name,
                        calibrated_on, device.placement.artifact)
        self.placement = device.placement if device is not None else None
        #: The budget's state (:class:`~edgesdk.hybrid.budget.EscalationBudget`), None without a budget.
        self.escalation = self._budget(bundle.manifest)

    def _budget(self, manifest: dict) -> EscalationBudget | None:
        policy = self.policy
        if not policy.budgeted:
            return None
        start = None
        if policy.target_rate is not None:  # resolved() gave it a signal and a threshold
            start = warm_start(manifest, policy.signal, policy.target_rate)
            start = policy.threshold if start is None else start
        budget = EscalationBudget(policy, policy.signal in HIGH_IS_HARD, start)
        if self.monitor is not None:
            self.monitor.watch_escalation(budget.state)
        return budget

    @property
    def labels(self) -> list[str] | None:
        return self._io.labels

    @property
    def monitor(self) -> Any:
        """The device model's :class:`~edgesdk.monitor.Monitor` (None without a device model or with
        ``monitor=False``). It also counts this model's answers by source, escalation reason and degradation, and
        its ``escalate_more`` response moves this model's threshold toward escalating more (at most its cap)."""
        return self.device.monitor if self.device is not None else None

    def predict(self, x: Any, mode: str | None = None) -> Any:
        """Predict one input (as :meth:`edgesdk.Model.predict` takes it) in this model's mode, or ``mode``."""
        result = self._predict(x, mode)
        monitor = self.monitor
        if monitor is not None:
            skipped = result.escalation_skipped
            monitor.hybrid(result.source, result.escalation_reason if skipped is None else None, result.degraded,
                           skipped)
        return result

    def _threshold(self) -> float | None:
        """The threshold in force: the budget's (a target rate), else the policy's moved toward escalating more by
        the monitor's ``escalate_more`` shift (which a target rate takes as a higher rate instead). A number, not a
        new policy: this runs on every prediction."""
        budget = self.escalation
        if budget is not None and budget.tracking:
            return budget.threshold
        monitor = self.monitor
        shift = monitor.escalation_shift if monitor is not None else 0.0
        if not shift or self.policy.threshold is None:
            return self.policy.threshold
        moved = self.policy.threshold - shift if self.policy.signal in HIGH_IS_HARD else self.policy.threshold + shift
        return min(1.0, max(0.0, moved))

    def _predict(self, x: Any, mode: str | None) -> Any:
        mode = self.mode if mode is None else HybridMode.parse(mode, "hybrid mode", InputError)
        t0 = time.perf_counter()
        feeds, where = self._io.prepare(x)
        if mode == HybridMode.DEVICE_ONLY:
            return self._device(feeds, t0, where)
        if mode == HybridMode.CLOUD_ONLY:
            return self._cloud(feeds, t0, None, where)
        if mode == HybridMode.PREFER_CLOUD:
            try:
                return self._cloud(feeds, t0, None, where)
            except Exception as exc:  # the client raises CloudError; anything else must not lose the answer either
                try:
                    result = self._device(feeds, t0, where)
                except Exception as device_exc:
                    raise device_exc from exc
                return replace(result, degraded=True, cloud_error=_reason(exc))
        # prefer-device
        if self.device is None:
            return self._escalate(feeds, t0, _device_reason(self.device_error), None, self.device_error, where)
        try:
            result = self._device(feeds, t0, where)
        except BudgetExceeded as exc:  # a thermal refusal (or escalation) at this moment
            return self._escalate(feeds, t0, EscalationReason.coerce(exc.reason), None, exc, where)
        except BackendUnavailable as exc:  # the backend failed on this input (run_failed): the cloud takes it
            return self._escalate(feeds, t0, EscalationReason.NO_BACKEND, None, exc, where)
        sig = self.signals(result, feeds)
        result.signals = sig
        reason = self.policy.reason(sig, self._threshold())
        budget = self.escalation
        if budget is not None:
            monitor = self.monitor
            budget.observe(reason is not None, monitor.escalation_shift if monitor is not None else 0.0)
            if reason is None:
                budget.settle(False)
            elif not budget.admit():  # over the budget: the device's answer, saying what it wanted
                result.escalation_reason, result.escalation_skipped = reason, EscalationSkip.BUDGET
                return result
        if reason is None:
            return result
        return self._escalate(feeds, t0, reason, result, None, where)

    def signals(self, result: Result, feeds: Sequence[np.ndarray] | None = None) -> dict[str, float | None]:
        """The hardness signals of a device ``result``: a classifier's (top-1 probability, margin, entropy) or the
        bundle's task's (:mod:`edgesdk.tasks.hardness`), and the clipped share of ``feeds``."""
        sig = signals(self._io.probabilities(result.outputs), feeds, self._ranges)
        if self._io.task.type not in (TaskType.CLASSIFICATION, TaskType.RAW):
            sig.update(task_signals(self._io.task, result.decoded, result.outputs, self._io.output_names))
        return sig

    def predict_batch(self, xs: Sequence[Any], mode: str | None = None) -> list[Any]:
        return [self.predict(x, mode) for x in xs]

    # -- the two sources -------------------------------------------------------------------------------------
    def _device(self, feeds: list[np.ndarray], t0: float, where: Any = None) -> Any:
        if self.device is None:
            if self.device_error is not None:
                raise _copy(self.device_error) from self.device_error  # a fresh one per call: no shared traceback
            raise BackendUnavailable(BackendReason.NO_BACKEND, f"no device backend serves {self.bundle.name!r}")
        return self.device.run_prepared(feeds, t0, where)

    def _cloud(self, feeds: list[np.ndarray], t0: float, reason: EscalationReason | None, where: Any = None) -> Any:
        # One deadline for everything this answer needs from the cloud (the model check, once, and the call).
        end = self.cloud.clock() + self.cloud.deadline_s
        self._ensure_model_checked(self.cloud.deadline_s)
        t1 = time.perf_counter()
        remaining = end - self.cloud.clock()
        if remaining <= 0:
            raise CloudTimeout(CloudReason.TIMEOUT, f"checking the cloud model of {self.bundle.name!r} used up the "
                                                    f"deadline ({self.cloud.deadline_s:g} s)")
        outputs = self.cloud.infer(feeds, self._names, deadline_s=remaining, expected_outputs=self._expected,
                                   answer_check=self._answer_check)
        t2 = time.perf_counter()
        timings = {"preprocess": (t1 - t0) * 1e3, "cloud": (t2 - t1) * 1e3}
        return Result(outputs, self.placement, timings, source="cloud", escalation_reason=reason,
                      _topk=self._io.top, _decoder=self._io.decode, _transform=where)

    def _escalate(self, feeds, t0, reason: EscalationReason, device_result: Any,
                  device_failure: Exception | None, where: Any = None) -> Any:
        try:
            result = self._cloud(feeds, t0, reason, where)
        except Exception as exc:  # CloudError from the client; anything else must not lose the device's answer
            if device_result is None:
                # Neither side can answer: the device's own refusal is the error, with the cloud's chained.
                raise (_copy(device_failure) if device_failure is not None else exc) from exc
            device_result.degraded = True
            device_result.escalation_reason = reason
            device_result.cloud_error = _reason(exc)
            return device_result
        if device_result is not None:
            result.signals = device_result.signals
        return result

    def _ensure_model_checked(self, deadline_s: float) -> None:
        """Compare the cloud model's inputs with the bundle's, once. A mismatch stays a mismatch (every later
        escalation fails at once); another failure is asked again after ``RECHECK_S``."""
        if not self._check_model or self._model_checked is True:
            return
        failed = self._model_checked
        if isinstance(failed, tuple):
            error, at = failed
            if error.reason == CloudReason.MODEL_MISMATCH or time.monotonic() - at < RECHECK_S:
                raise _copy(error) from error
        try:
            self.cloud.check_inputs(self.bundle.manifest["inputs"], deadline_s=deadline_s)
        except CloudError as exc:
            if exc.reason in (CloudReason.MODEL_MISMATCH, CloudReason.REJECTED, CloudReason.BAD_RESPONSE):
                self._model_checked = (exc, time.monotonic())  # an outage is asked again at once, these are not
            raise
        self._model_checked = True

    # -- lifetime -----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.device is not None:
            self.device.close()
        if self._owns_cloud:
            self.cloud.close()

    def __repr__(self) -> str:
        where = self.device.placement if self.device is not None else f"no device ({self.device_error})"
        return f"<edgesdk.HybridModel {self.bundle.name!r} {self.mode}, device: {where}, cloud: {self.cloud!r}>"


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or type(exc).__name__


def _copy(exc: BaseException) -> BaseException:
    """A new exception equal to ``exc`` (our errors keep their fields), to raise without sharing a traceback."""
    if isinstance(exc, BudgetExceeded):
        return BudgetExceeded(exc.reason, exc.detail, exc.needed, exc.available)
    if isinstance(exc, BackendUnavailable):
        return BackendUnavailable(exc.reason, exc.detail)
    if isinstance(exc, CloudError):
        return type(exc)(exc.reason, exc.detail, exc.status, exc.attempts)
    return exc


def _device_reason(error: Exception | None) -> EscalationReason:
    if isinstance(error, BudgetExceeded):
        return EscalationReason.coerce(error.reason)
    return EscalationReason.NO_BACKEND


__all__ = ["MODES", "SIGNALS", "DEFAULT_THRESHOLDS", "signals", "EscalationPolicy", "HybridOptions", "HybridModel"]
