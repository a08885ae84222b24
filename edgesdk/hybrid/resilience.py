"""What keeps a struggling endpoint from being stormed: the retry budget and the circuit breaker of the cloud
client."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


from ..errors import InputError


class RetryBudget:
    """Retries may use at most ``ratio`` of the calls, plus a ``reserve`` for a quiet start: every call deposits
    ``ratio`` tokens (up to ``reserve``), every retry takes one. Thread-safe."""

    def __init__(self, ratio: float = 0.2, reserve: float = 10.0):
        if not 0 <= ratio <= 1 or reserve < 1:
            raise InputError(f"retry budget: ratio must be in [0, 1] and reserve >= 1, got {ratio}, {reserve}")
        self.ratio, self.reserve = float(ratio), float(reserve)
        self._tokens = float(reserve)
        self._lock = threading.Lock()
        self.spent = self.refused = 0

    def deposit(self) -> None:
        with self._lock:
            self._tokens = min(self.reserve, self._tokens + self.ratio)

    def withdraw(self) -> bool:
        with self._lock:
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                self.spent += 1
                return True
            self.refused += 1
            return False


class CircuitBreaker:
    """Closed, open, half-open. Opens when at least ``min_calls`` of the last ``window`` calls were made and
    ``failure_rate`` of them failed (after their retries); while open, calls fail at once. After ``cooldown_s`` one
    probe call is let through (half-open): success closes it, failure opens it again. Thread-safe; ``clock`` is
    injectable."""

    def __init__(self, failure_rate: float = 0.5, window: int = 50, min_calls: int = 20, cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        if not 0 < failure_rate <= 1 or window < 1 or not 1 <= min_calls <= window or cooldown_s < 0:
            raise InputError("circuit breaker: need 0 < failure_rate <= 1, window >= 1, 1 <= min_calls <= window "
                             f"and cooldown_s >= 0, got {failure_rate}, {window}, {min_calls}, {cooldown_s}")
        self.failure_rate, self.min_calls, self.cooldown_s = failure_rate, min_calls, cooldown_s
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._clock = clock
        self._lock = threading.Lock()
        self.state = "closed"
        self._opened_at = 0.0
        self._probing = False
        self._generation = 0  # bumped at every state change: tickets of older generations are not counted
        self.opened = self.recovered = 0  # how many times it opened, and closed again after a probe

    def allow(self) -> tuple[int, bool] | None:
        """A ticket for one call (None: fail fast), to hand back to :meth:`record`. In half-open only one
        ticket is a probe; results of calls let through before the state changed are ignored."""
        with self._lock:
            if self.state == "closed":
                return (self._generation, False)
            if self.state == "open" and self._clock() - self._opened_at >= self.cooldown_s:
                self.state = "half_open"
                self._generation += 1
            if self.state == "half_open" and not self._probing:
                self._probing = True
                return (self._generation, True)
            return None

    def record(self, ticket: tuple[int, bool], success: bool | None) -> None:
        """Count a call's outcome; ``success`` None: it sent nothing (a probe is handed back unused)."""
        generation, probe = ticket
        with self._lock:
            if generation != self._generation:
                return  # a call from before the last state change: it says nothing about now
            if self.state == "half_open":
                if not probe:
                    return
                self._probing = False
                if success is None:
                    return
                if success:
                    self.state = "closed"
                    self._generation += 1
                    self._outcomes.clear()
                    self.recovered += 1
                else:
                    self._open()
                return
            if self.state != "closed" or success is None:
                return
            self._outcomes.append(success)
            failures = self._outcomes.count(False)
            if len(self._outcomes) >= self.min_calls and failures >= self.failure_rate * len(self._outcomes):
                self._open()

    def _open(self) -> None:
        self.state = "open"
        self._generation += 1
        self._opened_at = self._clock()
        self._outcomes.clear()
        self.opened += 1
