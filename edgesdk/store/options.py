"""How a :class:`~edgesdk.BundleStore` installs, keeps and watches versions: :class:`StoreOptions` with its nested
:class:`Probation`, checked where they are built (an :class:`~edgesdk.errors.InputError` naming the field and what
it takes). Nothing here touches the disk."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..choices import HybridMode, MonitorSignal
from ..errors import InputError
from ..runtime.options import RuntimeOptions
from ..trust import ArchiveLimits, Trust

MAX_KEEP = 20  # previous versions kept: each is a whole bundle on the device's disk
MAX_PROBATION_PREDICTIONS = 10_000_000
MAX_PROBATION_S = 30 * 86_400.0
MAX_DOWNLOAD_BYTES = 1 << 40
MAX_RETRIES = 20


@dataclass(frozen=True)
class Probation:
    """How long a newly activated version is watched, and what rolls it back.

    A version is on probation from its activation until models of it loaded through the store
    (:meth:`~edgesdk.BundleStore.load`, a :class:`~edgesdk.ModelPool` serving the store) have made ``predictions``
    predictions, or ``seconds`` have passed since the activation, whichever comes first (the second bounds a device
    that predicts rarely; the count starts again in a new process, the clock does not). While it is, a monitor alert
    at level ``alert`` on one of ``signals`` rolls it back to the previous version and marks it rejected, and so does
    a load of it that fails. The monitor raises its first alert only after ``min_window + (rise - 1) * every``
    predictions (350 with the default :class:`~edgesdk.monitor.MonitorOptions`), so ``predictions`` must be at least
    that: a store load refuses a shorter probation, which could pass without anything being judged.
    """

    predictions: int = 1000
    seconds: float = 86_400.0
    signals: tuple[MonitorSignal | str, ...] = (MonitorSignal.ERROR_RATE, MonitorSignal.INPUT_DRIFT)

    def __post_init__(self):
        if not _integer(self.predictions) or not 1 <= self.predictions <= MAX_PROBATION_PREDICTIONS:
            raise InputError(f"probation predictions must be an integer from 1 to {MAX_PROBATION_PREDICTIONS}, "
                             f"got {self.predictions!r}")
        if not _number(self.seconds) or not 0 < self.seconds <= MAX_PROBATION_S:
            raise InputError(f"probation seconds must be a number in (0, {MAX_PROBATION_S:g}] (30 days), "
                             f"got {self.seconds!r}")
        if isinstance(self.signals, (str, bytes)) or not isinstance(self.signals, (tuple, list)) or not self.signals:
            raise InputError(f"probation signals must be a non-empty tuple of {', '.join(MonitorSignal.values())}, "
                             f"got {self.signals!r}")
        object.__setattr__(self, "signals", tuple(MonitorSignal.parse(s, "a probation signal", InputError)
                                                  for s in self.signals))


@dataclass(frozen=True)
class StoreOptions:
    """How a :class:`~edgesdk.BundleStore` installs and keeps versions.

    ``keep``: previous versions kept to roll back to (0 to 20; older ones are deleted after each activation, and so
    are staged and rejected versions past that many). ``probation``: see :class:`Probation`; None turns the automatic
    rollback off (a version is confirmed when it is activated).

    ``self_check``: the load options of the check an install runs on this machine before activating anything (every
    file against the manifest's sha256, then the bundle loaded as ``edgesdk.load(path, self_check)`` loads it, the
    golden inputs run and compared, then closed); ``check_numerics`` must stay on. A bundle that crashes its engine's
    native code kills the installing process, which leaves the store as any kill does (the previous version active);
    ``self_check=RuntimeOptions(isolate=True, monitor=False)`` runs each artifact in a child process first and makes
    that a rejection instead. ``require_golden``: refuse a bundle whose numerics nothing checked (no golden data or
    tolerance), which would activate unchecked.

    ``trust``: every install must carry a signature that verifies with this key (``install(trust=...)`` can only add
    a check). ``max_bytes``: the largest bundle or download taken (2 GiB), checked against the announced size
    before anything is read and on every byte after; ``archive_limits`` bound an ``.edgebundle``'s extraction.
    ``timeout_s``: seconds a download waits for a connection or for any byte; ``deadline_s``: the longest a download
    (every retry included) may take; ``retries``: how many times a dropped download is resumed (HTTP ``Range``)
    before install gives up, the part kept for the next install of the same URL.
    """

    keep: int = 2
    probation: Probation | None = field(default_factory=Probation)
    self_check: RuntimeOptions = field(default_factory=lambda: RuntimeOptions(monitor=False))
    require_golden: bool = True
    trust: Trust | None = None
    max_bytes: int = 2 << 30
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    timeout_s: float = 30.0
    deadline_s: float = 3600.0
    retries: int = 3

    def __post_init__(self):
        if not _integer(self.keep) or not 0 <= self.keep <= MAX_KEEP:
            raise InputError(f"keep must be an integer from 0 to {MAX_KEEP}, got {self.keep!r}")
        if self.probation is not None and not isinstance(self.probation, Probation):
            raise InputError(f"probation must be a Probation or None, got {type(self.probation).__name__}")
        if not isinstance(self.self_check, RuntimeOptions):
            raise InputError(f"self_check must be a RuntimeOptions, got {type(self.self_check).__name__}")
        if self.self_check.hybrid.mode is not HybridMode.DEVICE_ONLY:
            raise InputError(f"self_check loads on this device only; its hybrid mode is {self.self_check.hybrid.mode}")
        if not self.self_check.check_numerics:
            raise InputError("self_check must keep check_numerics=True: it is the check that an install runs before "
                             "it activates anything")
        if not isinstance(self.require_golden, bool):
            raise InputError(f"require_golden must be True or False, got {self.require_golden!r}")
        if self.trust is not None and not isinstance(self.trust, Trust):
            raise InputError(f"trust must be an edgesdk.Trust or None, got {type(self.trust).__name__}")
        if not _integer(self.max_bytes) or not 1 <= self.max_bytes <= MAX_DOWNLOAD_BYTES:
            raise InputError(f"max_bytes must be an integer from 1 to 2**40, got {self.max_bytes!r}")
        if not isinstance(self.archive_limits, ArchiveLimits):
            raise InputError(f"archive_limits must be an ArchiveLimits, got {type(self.archive_limits).__name__}")
        for name, high in (("timeout_s", 3600.0), ("deadline_s", 7 * 86_400.0)):
            value = getattr(self, name)
            if not _number(value) or not 0 < value <= high:
                raise InputError(f"{name} must be a number of seconds in (0, {high:g}], got {value!r}")
        if not _integer(self.retries) or not 0 <= self.retries <= MAX_RETRIES:
            raise InputError(f"retries must be an integer from 0 to {MAX_RETRIES}, got {self.retries!r}")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["StoreOptions", "Probation", "MAX_KEEP"]
