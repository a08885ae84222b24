"""Budgeted escalation: the share of inputs a hybrid ``prefer-device`` model sends to the cloud, held at a target
while the input distribution moves, with a token bucket and a hard cap on top.

A fixed threshold escalates a fixed share of the inputs only while they look like the data it was calibrated on: a
new camera or more noise moves the hardness signal, and the same threshold then escalates several times as many
(cloud cost and latency off budget) or far fewer. :class:`EscalationBudget` holds it:

- **Rate** (``EscalationPolicy(target_rate=r)``): the threshold tracks the signal's r-quantile online, by stochastic
  approximation (Robbins-Monro, the "frugal" quantile estimator) in logit space, where signals in [0, 1] that bunch
  near 0 or 1 (a confident classifier's top-1 probability is 0.999 on most inputs) are spread out:
  ``z <- z + d * step * (r - e)`` after each input, where ``e`` is 1 when the input escalated (for any reason:
  low confidence or out of range, so the total holds) and 0 otherwise, and ``d`` is +1 for a signal whose low values
  are hard (max_prob) and -1 for one whose high values are (entropy). Its fixed point escalates a share r; each step
  moves the threshold by at most ``step * max(r, 1 - r)`` in logit units (bounded), and ``z`` stays within
  ``+-LOGIT_BOUND``. It starts from the bundle's calibrated curve (``edgesdk calibrate-escalation``: the threshold
  whose escalation rate on the validation data is nearest r, for the policy's signal), else from the policy's
  threshold. With ``step=0.1``, on the digits bundle whose inputs get Gaussian noise half-way (benchmarks and
  ``tests/device/hybrid/test_escalation_budget.py``), every 1,000-input window after 500 of adaptation stays within
  0.1 +- 0.02 where the fixed threshold escalates about half of the noisy inputs.
- **Token bucket** (``max_per_minute``, ``burst``): an escalation takes a token; tokens come back at
  ``max_per_minute`` a minute up to ``burst`` (default: ``max_per_minute`` rounded up, at least 1). None: no bucket.
- **Hard cap** (``max_rate``): at most ``max_rate * rate_window`` escalations among the last ``rate_window`` inputs,
  whatever the rest says.

An input that would escalate when the bucket is empty or the cap is reached is answered by the device, with
``Result.escalation_skipped = "budget"`` (and ``escalation_reason`` saying why it wanted the cloud); the monitor counts
it (``edgesdk.hybrid.skipped``) and shows the threshold and the rate. Only inputs the device answered can be skipped:
an escalation because the device could not answer (no backend, memory, thermal, monitor refusal) is never held back.

What is learned is one number, the threshold; nothing of an input is kept. The monitor's ``escalate_more`` response
raises the target by its shift (at most its cap) instead of moving the threshold. Thread-safe.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable

LOGIT_BOUND = math.log((1 - 1e-6) / 1e-6)  # 13.8: signals within [1e-6, 1 - 1e-6]


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class EscalationBudget:
    """The state of a policy's budget on one hybrid model (``HybridModel.escalation``): the tracked threshold, the
    token bucket, the recent escalations. Made by the model from its resolved
    :class:`~edgesdk.hybrid.model.EscalationPolicy`; ``clock`` (seconds, monotonic) is for the bucket."""

    def __init__(self, policy: Any, high_is_hard: bool, start: float | None,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.tracking = policy.target_rate is not None
        self._direction = -1.0 if high_is_hard else 1.0
        self._z = logit(start if start is not None else 0.5)
        self._clock = clock
        # a bucket holds at least one token: below one a minute, it would never admit anything
        self._burst = float(policy.burst if policy.burst is not None else
                            max(1, math.ceil(policy.max_per_minute or 0)))
        self._tokens = self._burst
        self._refilled = clock()
        self._recent: deque[bool] = deque(maxlen=policy.rate_window)  # escalated (after the budget), per input
        self._escalated_recent = 0
        self._inputs = self._escalations = self._skipped = 0
        self._lock = threading.Lock()

    @property
    def threshold(self) -> float | None:
        """The threshold in force now (the signal's units): the tracked one with a target rate, else the policy's."""
        return sigmoid(self._z) if self.tracking else self.policy.threshold

    def observe(self, wanted: bool, extra_rate: float = 0.0) -> None:
        """One input the policy judged: ``wanted`` is whether it would escalate at :attr:`threshold`. Moves the
        threshold toward the target rate (plus ``extra_rate``, the monitor's escalate_more shift)."""
        if not self.tracking:
            return
        target = min(1.0, self.policy.target_rate + extra_rate)
        with self._lock:
            z = self._z + self._direction * self.policy.step * (target - float(wanted))
            self._z = min(LOGIT_BOUND, max(-LOGIT_BOUND, z))

    def admit(self) -> bool:
        """Whether an input that wants the cloud may go (takes a token when it may). Every input the model answered
        on the device passes here once: ``settle(False)`` for those that did not want the cloud."""
        with self._lock:
            if self._over_cap() or not self._take_token():
                self._settle(False)
                self._skipped += 1
                return False
            self._settle(True)
            return True

    def settle(self, escalated: bool) -> None:
        """Count one input that did not go through :meth:`admit` (it did not want the cloud)."""
        with self._lock:
            self._settle(escalated)

    def _settle(self, escalated: bool) -> None:
        self._inputs += 1
        if len(self._recent) == self._recent.maxlen and self._recent[0]:
            self._escalated_recent -= 1
        self._recent.append(escalated)
        if escalated:
            self._escalated_recent += 1
            self._escalations += 1

    def _over_cap(self) -> bool:
        cap = self.policy.max_rate
        if cap is None:
            return False
        recent = self._recent
        leaving = 1 if len(recent) == recent.maxlen and recent[0] else 0  # the input this one pushes out
        return self._escalated_recent - leaving + 1 > cap * self.policy.rate_window + 1e-9

    def _take_token(self) -> bool:
        if self.policy.max_per_minute is None:
            return True
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self.policy.max_per_minute / 60.0)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def state(self) -> dict[str, Any]:
        """Plain data for the monitor's snapshot: the threshold, the target, the escalated share of the last
        ``rate_window`` inputs, the totals."""
        with self._lock:
            n = len(self._recent)
            threshold = self.threshold
            return {"signal": self.policy.signal, "threshold": None if threshold is None else round(threshold, 6),
                    "target_rate": self.policy.target_rate, "rate": self._escalated_recent / n if n else None,
                    "window": n, "inputs": self._inputs, "escalations": self._escalations,
                    "skipped": self._skipped, "tokens": None if self.policy.max_per_minute is None
                    else round(self._tokens, 3)}


def warm_start(manifest: dict, signal: str | None, target_rate: float) -> float | None:
    """The threshold of the bundle's calibrated curve whose escalation rate is nearest ``target_rate`` (ties: the
    lower rate), for ``signal``; None when the bundle has no curve for it."""
    entry = manifest.get("hybrid") or {}
    curve = entry.get("curve") if entry.get("signal") == signal else None
    points = [p for p in curve or () if isinstance(p, dict) and _number(p.get("threshold"))
              and _number(p.get("escalation_rate"))]
    if not points:
        return None
    best = min(points, key=lambda p: (abs(p["escalation_rate"] - target_rate), p["escalation_rate"]))
    return min(1.0, max(0.0, float(best["threshold"])))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["EscalationBudget", "warm_start", "LOGIT_BOUND"]
