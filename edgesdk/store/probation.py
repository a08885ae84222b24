"""The probation watch: hooks on the monitor of a model of a version on probation, which roll the store back on an
alert and confirm the version once the probation is over (:class:`~edgesdk.store.options.Probation` says how long).

The hooks run in the thread whose prediction made the monitor evaluate (the monitor's own rule); each does a short
locked change of the store's pointer and returns. The model the app holds keeps serving what it was loaded with: the
store never closes it under the app. After a rollback, :meth:`~edgesdk.BundleStore.load` (or
:meth:`~edgesdk.ModelPool.reload`) gives the version that is active now; :meth:`~edgesdk.BundleStore.on_change`
tells the app when that happened.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..choices import AlertLevel
from ..errors import InputError
from .options import Probation


def needed_predictions(monitor_options: Any) -> int:
    """How many predictions a monitor with these options makes before it can raise its first alert."""
    return monitor_options.min_window + (monitor_options.rise - 1) * monitor_options.every


def check_watchable(monitor_options: Any, probation: Probation, version: str) -> None:
    """Refuse a model that probation could not judge: no monitor (``monitor_options`` None), or a probation shorter
    than its monitor's first alert."""
    if monitor_options is None:
        raise InputError(f"version {version} is on probation, and it is watched through the model's monitor: load it "
                         "with a monitor (monitor=False was given), or turn probation off (StoreOptions(probation="
                         "None))")
    needed = needed_predictions(monitor_options)
    if probation.predictions < needed:
        raise InputError(f"a probation of {probation.predictions} predictions ends before this model's monitor can "
                         f"raise its first alert (after min_window + (rise - 1) x every = {needed} predictions): make "
                         f"Probation(predictions=...) at least {needed}, or the monitor's window shorter")


class ProbationWatch:
    """Watches one model of ``version`` until the probation ends: an alert at level ``alert`` on one of the
    probation's signals calls ``failed(version, reason)``; ``predictions`` predictions, or ``since_unix + seconds``
    passed, call ``passed(version, count)``. Either happens once; the hooks are then removed."""

    def __init__(self, model: Any, version: str, probation: Probation, since_unix: float,
                 failed: Callable[[str, str], None], passed: Callable[[str, int], None]):
        self.version = version
        self._monitor = model.monitor
        self._probation = probation
        self._until = since_unix + probation.seconds
        self._failed, self._passed = failed, passed
        self._count = 0
        self._done = False
        self._lock = threading.Lock()
        self._monitor.on_alert(self._alert)
        self._monitor.on_evaluate(self._evaluated)

    @property
    def done(self) -> bool:
        return self._done

    def _finish(self) -> bool:
        """True for the one caller that ends the watch."""
        with self._lock:
            if self._done:
                return False
            self._done = True
        self._monitor.remove_hook(self._alert)
        self._monitor.remove_hook(self._evaluated)
        return True

    def _alert(self, alert: Any) -> None:
        if alert.level is not AlertLevel.ALERT or alert.signal not in self._probation.signals:
            return
        if not self._finish():
            return
        what = f"{alert.statistic} {alert.value:.4g} >= {alert.threshold:.4g}"
        if alert.feature:
            what += f", most: {alert.feature}"
        reason = (f"{alert.signal} alert during probation ({what}) after {alert.predictions} predictions of this "
                  "model")
        self._failed(self.version, reason)

    def _evaluated(self, monitor: Any, recent: dict[str, Any] | None) -> None:
        self._count += (recent or {}).get("predictions", 0)
        if self._count >= self._probation.predictions or time.time() >= self._until:
            if self._finish():
                self._passed(self.version, self._count)


__all__ = ["ProbationWatch", "check_watchable", "needed_predictions"]
