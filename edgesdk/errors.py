"""The one exception tree of edgesdk.

::

    EdgeSDKError
     +-- BundleError            a bundle is missing, malformed, tampered with, or escapes its folder; an artifact
     |                          asked for by id is not in it, or failed its validation gate (without allow_failed)
     +-- InputError             bad request data (shape, dtype, missing input, unreadable image)
     +-- BackendUnavailable     no engine/device can serve the artifact (carries a machine-readable reason)
     +-- BudgetExceeded         serving would break a memory or thermal budget (reason "memory" / "thermal")
     +-- ConversionError        the workstation could not build an artifact (bad source, unsupported route)
     |    +-- CalibrationError  the calibration/validation data is empty, corrupt or does not fit the model
     |    +-- TargetsFailed     one or more targets could not be built; the bundle holds the others (or none built)
     +-- ValidationFailed       an INT8 artifact lost more accuracy than allowed
     +-- StoreError             a BundleStore refused: nothing to roll back to, a download failed, a version failed
     |                          its self-check here (``reason``: a StoreReason; the state it found is in the message)
 +-- CloudError             the cloud endpoint did not answer a call (``reason``, HTTP ``status`` when one came)
      +-- CloudTimeout      the call's deadline passed
      +-- CloudUnavailable  unreachable, overloaded (429/5xx after retries), circuit open or retry budget spent
      +-- CloudRejected     the server refused the request (4xx); ``detail`` is the server's own message

    UserWarning
     +-- FailedArtifactWarning  an artifact that failed its validation gate is served (``allow_failed=True``)

Every ``reason`` is a member of a ``str``-valued enum of :mod:`edgesdk.choices` (equal to its plain string).
Engine exceptions are translated at the engine boundary into this tree, with the
original chained (``raise ... from exc``).
"""

from __future__ import annotations

from .choices import BackendReason, BudgetReason, CloudReason, StoreReason


class EdgeSDKError(Exception):
    """Base of every error edgesdk raises on purpose."""

    def to_dict(self) -> dict[str, str]:
        """The error as data (``edgesdk run --json``, logs): its type, its ``reason`` where it has one (the enum's
        string) and the human detail."""
        out = {"type": type(self).__name__}
        reason = getattr(self, "reason", None)
        if reason is not None:
            out["reason"] = str(reason)
        out["detail"] = getattr(self, "detail", None) or str(self)
        return out


class BundleError(EdgeSDKError):
    """A bundle cannot be trusted or read: missing/altered file, bad manifest, path escape. Also an artifact asked
    for by id that the bundle does not have, or whose validation gate failed at quantize time (the bundle itself
    says it must not be served; ``allow_failed=True`` overrides that)."""


class InputError(EdgeSDKError):
    """Data handed to a model does not fit it."""


class BackendUnavailable(EdgeSDKError):
    """No backend can serve the request.

    ``reason`` is machine-readable: a :class:`~edgesdk.choices.BackendReason` (``engine_missing``,
    ``device_missing``, ``compile_failed``, ``unsupported_artifact``, ``validation_failed`` ...; a plain string
    only for a code that is not one, such as a benchmark child's exception name); ``detail`` is for humans.
    """

    def __init__(self, reason: BackendReason | str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = BackendReason.coerce(reason)
        self.detail = detail


class BudgetExceeded(EdgeSDKError):
    """Serving now would break a budget.

    ``reason`` is a :class:`~edgesdk.choices.BudgetReason`: ``"memory"`` or ``"thermal"``; ``needed`` /
    ``available`` are in MB for memory (degrees C for thermal: the temperature and the limit) when known.
    """

    def __init__(self, reason: BudgetReason | str, detail: str, needed: float | None = None,
                 available: float | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = BudgetReason.coerce(reason)
        self.detail = detail
        self.needed = needed
        self.available = available


class ConversionError(EdgeSDKError):
    """A source model could not be turned into the requested artifact."""


class CalibrationError(ConversionError):
    """Calibration or validation data is unusable for this model."""


class TargetsFailed(ConversionError):
    """One or more targets could not be built: conversion or quantization failed, or the artifact did not load and
    run in its engine when checked right after it was built.

    ``failed`` maps each failed target (``tflite``, ``openvino``, ``onnx``) to its full error text, causes
    included. ``bundle`` is the path of the bundle still written with the targets that worked (its manifest's
    ``build`` section says what was dropped and why), or None when no target worked and nothing was written.
    ``failing`` lists the built artifacts that also failed their validation gate (as :class:`ValidationFailed`).
    """

    def __init__(self, message: str, failed: dict[str, str], bundle: str | None = None,
                 failing: list[str] | None = None):
        super().__init__(message)
        self.failed = failed
        self.bundle = bundle
        self.failing = failing or []


class ValidationFailed(EdgeSDKError):
    """One or more INT8 artifacts failed the accuracy gate.

    ``failing`` lists the artifact ids; ``bundle`` is the path of the bundle that
    was still written (with ``passed: false`` recorded) so the report can be read.
    """

    def __init__(self, message: str, failing: list[str], bundle: str | None = None):
        super().__init__(message)
        self.failing = failing
        self.bundle = bundle


class StoreError(EdgeSDKError):
    """A :class:`~edgesdk.BundleStore` refused an install, an activation, a rollback or a load.

    ``reason`` is a :class:`~edgesdk.choices.StoreReason` (``no_previous_version``, ``self_check_failed``,
    ``download_failed``, ``too_large`` ...); ``detail`` is for humans and names the store's state (its active version).
    A bundle that fails its checksums or its signature raises :class:`BundleError` instead, as a load would.
    """

    def __init__(self, reason: StoreReason | str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = StoreReason.coerce(reason)
        self.detail = detail

class CloudError(EdgeSDKError):
    """A call to the cloud endpoint failed.

    ``reason`` is a :class:`~edgesdk.choices.CloudReason` (``timeout``, ``unreachable``, ``overloaded``,
    ``circuit_open``, ``retry_budget``, ``rejected``, ``server_error``, ``bad_response``, ``response_too_large``, ``tls``,
    ``no_token``, ``model_mismatch``, ``transport_error``); ``detail`` is for humans (for a rejection, the server's ``error``
    message); ``status`` is the last HTTP status, when one came; ``attempts`` how many requests were sent.
    """

    def __init__(self, reason: CloudReason | str, detail: str, status: int | None = None, attempts: int = 0):
        super().__init__(f"{reason}: {detail}")
        self.reason = CloudReason.coerce(reason)
        self.detail = detail
        self.status = status
        self.attempts = attempts


class CloudTimeout(CloudError):
    """The call's deadline passed before an answer came."""


class CloudUnavailable(CloudError):
    """The endpoint cannot answer now: unreachable, overloaded, circuit open, or the retry budget is spent."""


class CloudRejected(CloudError):
    """The server refused the request (a 4xx other than 429): retrying would not help."""


class FailedArtifactWarning(UserWarning):
    """An artifact whose ``validation.<id>.passed`` is false is being served, because the caller passed
    ``allow_failed=True`` (CLI ``--allow-failed``): its outputs may be wrong by more than its gate allowed."""
