"""Every choice an option takes and every reason code an error, a skip or an escalation carries, as types.

Each is a ``str``-valued enum: a member compares equal to its plain string (``Policy.AUTO == "auto"``), hashes like
it, prints, formats and serializes to JSON as it (``f"{reason}"``, ``json.dumps``), so code and tools that read the
plain strings keep working; a misspelt member is an ``AttributeError`` at import time, not a branch never taken.
Options are checked against these where they are built (:class:`~edgesdk.runtime.options.RuntimeOptions`,
:class:`~edgesdk.hybrid.model.HybridOptions`), and errors turn a known code into its member
(:class:`~edgesdk.errors.BackendUnavailable`, :class:`~edgesdk.errors.BudgetExceeded`,
:class:`~edgesdk.errors.CloudError`). The README's lists (policies, hybrid modes, speed checks and the table of
reason codes) are checked against this module by ``tests/device/test_choices.py``.

This module imports nothing from edgesdk, so every other module may import it.
"""

from __future__ import annotations

import enum
from typing import TypeVar

C = TypeVar("C", bound="Choice")


class Choice(str, enum.Enum):
    """Base of the enums below: a ``str`` whose ``str()`` and ``format()`` are its value on every Python."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The plain strings, in declaration order (for messages: ``", ".join(Policy.values())``)."""
        return tuple(m.value for m in cls)

    @classmethod
    def lookup(cls: type[C], value: object) -> C | None:
        """The member equal to ``value`` (a member or its plain string), or None (never raises)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls._value2member_map_.get(str.__str__(value))  # type: ignore[return-value]
        return None

    @classmethod
    def parse(cls: type[C], value: object, what: str, error: type[Exception] = ValueError) -> C:
        """The member equal to ``value``; else raise ``error`` naming ``what`` and the allowed values."""
        found = cls.lookup(value)
        if found is None:
            raise error(f"{what} must be one of {', '.join(cls.values())}, got {value!r}")
        return found

    @classmethod
    def coerce(cls: type[C], value: str) -> C | str:
        """The member equal to ``value``; an unknown string is returned as it is (a code from elsewhere, e.g. a
        child process's exception name, is still reported rather than lost)."""
        found = cls.lookup(value)
        return value if found is None else found


# -- options --------------------------------------------------------------------------------------------------------

class Policy(Choice):
    """``RuntimeOptions.policy``: how candidates are ordered (:mod:`edgesdk.runtime.selection`)."""

    AUTO = "auto"
    PREFER_NPU = "prefer-npu"
    PREFER_GPU = "prefer-gpu"
    CPU_ONLY = "cpu-only"
    MAX_EFFICIENCY = "max-efficiency"
    AUTOTUNE = "autotune"


class Performance(Choice):
    """``RuntimeOptions.performance``: one inference at a time as fast as it goes, or parallel streams."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


class SpeedCheck(Choice):
    """``RuntimeOptions.speed_check`` (:mod:`edgesdk.runtime.precision_choice`)."""

    FULL = "full"
    PRECISION = "precision"
    OFF = "off"


class HybridMode(Choice):
    """``HybridOptions.mode`` and ``HybridModel.predict(mode=)`` (:mod:`edgesdk.hybrid.model`)."""

    DEVICE_ONLY = "device-only"
    CLOUD_ONLY = "cloud-only"
    PREFER_DEVICE = "prefer-device"
    PREFER_CLOUD = "prefer-cloud"


class CriticalMode(Choice):
    """``ThermalActions.critical["mode"]``: what a critical thermal level does (:mod:`edgesdk.budgets.thermal.governor`)."""

    REFUSE = "refuse"
    DEFER = "defer"
    ESCALATE = "escalate"


class ThermalLevel(Choice):
    """A device's thermal level (``ThermalGovernor.level``, ``ThermalReading.level_hint``), in rising order
    (:mod:`edgesdk.budgets.thermal`)."""

    NOMINAL = "nominal"
    WARM = "warm"
    HOT = "hot"
    CRITICAL = "critical"


class TaskType(Choice):
    """The manifest's ``task.type``: what a model's outputs mean, so that they are decoded, validated, shown and
    judged as that (:mod:`edgesdk.tasks`)."""

    CLASSIFICATION = "classification"
    DETECTION = "detection"
    SEGMENTATION = "segmentation"
    TEXT = "text"
    LANDMARKS = "landmarks"
    REGRESSION = "regression"
    PROBABILITY = "probability"
    EMBEDDING = "embedding"
    RAW = "raw"


class InstallStep(Choice):
    """The steps of :meth:`edgesdk.BundleStore.install`, in the order they run, as its ``progress`` callback is told
    (a step may be told more than once: ``download`` per chunk, ``copy`` per file, ``prune`` per version)."""

    STAGE = "stage"
    DOWNLOAD = "download"
    EXTRACT = "extract"
    COPY = "copy"
    VERIFY = "verify"
    SELF_CHECK = "self_check"
    PUBLISH = "publish"
    ROLLOUT = "rollout"
    ACTIVATE = "activate"
    PRUNE = "prune"
    DONE = "done"


class VersionState(Choice):
    """A version's state in a :class:`~edgesdk.BundleStore` (``StoreVersion.state``)."""

    ACTIVE = "active"  # what the store serves (``on probation`` until it passes it)
    PREVIOUS = "previous"  # kept to roll back to, newest first
    STAGED = "staged"  # installed and checked, not activated: this device is outside its rollout
    REJECTED = "rejected"  # failed its self-check, or rolled back from in probation; never re-activated by itself


class ResultSource(Choice):
    """``Result.source``: where an answer was computed."""

    DEVICE = "device"
    CLOUD = "cloud"


class BudgetAction(Choice):
    """``Result.budget["action"]`` and ``["actions"]``: what a budget changed for one inference
    (:meth:`edgesdk.budgets.thermal.ThermalGovernor.before_inference`, :mod:`edgesdk.runtime.thermal_serving`)."""

    PACED = "paced"  # waited to keep the warm rate limit
    DEFERRED = "deferred"  # waited for the level to drop below hot
    THREADS_REDUCED = "threads_reduced"
    ESCALATE = "escalate"  # critical with ThermalActions critical mode "escalate": a hybrid model asks the cloud
    ARTIFACT_SWITCHED = "artifact_switched"  # another artifact or backend serves it (memory fit or thermal ``prefer``)

# -- reasons --------------------------------------------------------------------------------------------------------

class BackendReason(Choice):
    """``BackendUnavailable.reason``; a skipped candidate (``Skip.reason``) carries one of these or ``memory``."""

    ENGINE_MISSING = "engine_missing"
    ENGINE_UNKNOWN = "engine_unknown"
    DEVICE_MISSING = "device_missing"
    COMPILE_FAILED = "compile_failed"
    LOAD_FAILED = "load_failed"
    UNSUPPORTED_OPS = "unsupported_ops"
    UNSUPPORTED_ARTIFACT = "unsupported_artifact"
    NUMERICS_MISMATCH = "numerics_mismatch"
    RUN_FAILED = "run_failed"
    VALIDATION_FAILED = "validation_failed"
    ISOLATED_PROBE_FAILED = "isolated_probe_failed"
    NO_CANDIDATE = "no_candidate"
    NO_BACKEND = "no_backend"
    NOT_PLACED = "not_placed"
    BENCH_TIMEOUT = "bench_timeout"
    BENCH_FAILED = "bench_failed"
    COLD_START_TIMEOUT = "cold_start_timeout"
    COLD_START_FAILED = "cold_start_failed"
    KSERVE_MISSING = "kserve_missing"
    KSERVE_UNSUPPORTED = "kserve_unsupported"


class BudgetReason(Choice):
    """``BudgetExceeded.reason``."""

    MEMORY = "memory"
    THERMAL = "thermal"
    MONITOR = "monitor"  # the app asked the monitor to refuse while a signal is at alert (MonitorResponse.REFUSE)


class AlertLevel(Choice):
    """A monitor signal's state (:mod:`edgesdk.monitor`), in rising order."""

    OK = "ok"
    WARN = "warn"
    ALERT = "alert"


class MonitorSignal(Choice):
    """The signals the monitor raises alerts on (:mod:`edgesdk.monitor`)."""

    INPUT_DRIFT = "input_drift"
    OUTPUT_DRIFT = "output_drift"
    ERROR_RATE = "error_rate"


class MonitorResponse(Choice):
    """What the monitor does by itself while a signal is at alert, when the app opts in
    (``MonitorOptions(respond={...})``); each is bounded and undone when the signal clears."""

    REFUSE = "refuse"  # predict raises BudgetExceeded("monitor")
    ESCALATE_MORE = "escalate_more"  # a hybrid model escalates more, its threshold moved by at most a cap
    FLOAT_ARTIFACT = "float_artifact"  # the model serves its float artifact (same engine and device) meanwhile


class StoreReason(Choice):
    """``StoreError.reason`` (:mod:`edgesdk.store`), and the code a version's recorded reason starts with
    (``StoreVersion.reason``, the store's history): the last five are recorded, never raised."""

    NO_ACTIVE_VERSION = "no_active_version"  # load / active_path on a store with nothing active
    NO_PREVIOUS_VERSION = "no_previous_version"  # rollback with no kept version to go back to
    UNKNOWN_VERSION = "unknown_version"  # activate names no version the store holds
    REJECTED_BEFORE = "rejected_before"  # install / activate of a rejected version without allow_rejected
    NOT_A_STORE = "not_a_store"  # the root is a file, or a folder of something else
    BAD_SOURCE = "bad_source"  # not a bundle folder, an .edgebundle or an http(s) URL
    DOWNLOAD_FAILED = "download_failed"  # HTTP error, refused redirect, connection lost after the retries, timeout
    TOO_LARGE = "too_large"  # over the store's size cap (announced or counted)
    SELF_CHECK_FAILED = "self_check_failed"  # the bundle did not load and reproduce its golden outputs here
    NOT_CHECKED = "not_checked"  # it loaded, but nothing checked its numerics (no golden data)
    PROBATION_ALERT = "probation_alert"  # recorded: rolled back from for a monitor alert during probation
    LOAD_FAILED = "load_failed"  # recorded: rolled back from because it failed to load during probation
    MANUAL = "manual"  # recorded: rolled back from by rollback()
    NOT_IN_ROLLOUT = "not_in_rollout"  # recorded: staged, this device is outside the version's rollout_percent
    RECOVERY = "recovery"  # recorded: the pointer named a version that is gone or incomplete; an older one serves


class CloudReason(Choice):
    """``CloudError.reason`` (:mod:`edgesdk.hybrid.client`)."""

    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    OVERLOADED = "overloaded"
    CIRCUIT_OPEN = "circuit_open"
    RETRY_BUDGET = "retry_budget"
    REJECTED = "rejected"
    SERVER_ERROR = "server_error"
    BAD_RESPONSE = "bad_response"
    TLS = "tls"
    NO_TOKEN = "no_token"
    MODEL_MISMATCH = "model_mismatch"
    TRANSPORT_ERROR = "transport_error"
    RESPONSE_TOO_LARGE = "response_too_large"


class EscalationReason(Choice):
    """``Result.escalation_reason``: why a hybrid ``prefer-device`` model asked the cloud."""

    NO_BACKEND = "no_backend"
    MEMORY = "memory"
    THERMAL = "thermal"
    MONITOR = "monitor"  # the device model refused: its monitor is at alert and the app asked it to refuse
    LOW_CONFIDENCE = "low_confidence"
    OUT_OF_RANGE = "out_of_range"


class EscalationSkip(Choice):
    """``Result.escalation_skipped``: why a hybrid model answered on the device an input that wanted the cloud."""

    BUDGET = "budget"  # the escalation budget (token bucket or hard cap) was spent (edgesdk.hybrid.budget)


class CacheState(Choice):
    """``Engine.cache_state``: what a load did with the engine's compile cache (None: no cache asked for)."""

    HIT = "hit"
    STORED = "stored"
    REBUILT = "rebuilt"
    UNAVAILABLE = "unavailable"


__all__ = ["Choice", "Policy", "Performance", "SpeedCheck", "HybridMode", "CriticalMode", "ThermalLevel",
           "BackendReason", "BudgetReason", "CloudReason", "EscalationReason", "CacheState", "TaskType", "InstallStep",
           "VersionState", "StoreReason", "ResultSource", "BudgetAction"]
