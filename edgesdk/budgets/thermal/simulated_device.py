"""A simulated device for tests and benchmarks: a first-order thermal model that writes a fake sysfs tree.

This machine has no thermal sensor to drive, so the thermal budget is proven on this model instead: real
inference calls report how long they were busy (:meth:`SimulatedThermalDevice.record_work`), the model turns
busy time into power and power into temperature, and writes the temperature where
:class:`~edgesdk.budgets.thermal.LinuxThermalZones` reads it (``<root>/class/thermal/thermal_zone0/temp``).

Simulated time runs ``time_scale`` times faster than real time: ``now()`` is ``time_scale`` times the real
seconds since the device was made, real busy time is scaled the same way (so the duty cycle, busy time per unit
time, is the same in both), and ``sleep(s)`` sleeps ``s / time_scale`` real seconds. With ``time_scale=20`` a
simulated minute takes three real seconds and a 30 us inference counts as 0.6 ms of simulated work. Give a
governor ``clock=device.now, sleep=device.sleep`` so that its read interval and pacing are in simulated time.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

from ...errors import InputError
from ...lifecycle import Closeable

_WIDTH = 7  # millidegrees: -999.999 .. 9999.999 C
SPIN_S = 0.0003  # time.sleep overshoots by ~60 us here: the last part of a sleep spins on perf_counter


class SimulatedThermalDevice(Closeable):
    """First-order thermal model: dT/dt = (P(t) * R_th - (T - T_ambient)) / tau, P = idle_w + active_w * duty.

    ``duty`` is the busy time recorded over an update interval divided by its length (work of concurrent threads
    adds up). Between updates the power is taken as constant, so each update is the exact exponential step
    ``T <- T_ss + (T - T_ss) * exp(-dt / tau)`` with ``T_ss = T_ambient + P * R_th``. Idle, the device settles at
    ``T_ambient + idle_w * R_th``; it starts there unless ``start_c`` is given.

    The defaults stand for a small passively cooled board (think Raspberry Pi without a heatsink): 25 C room,
    10 C/W, tau 8 s, 0.5 W idle and 8 W more when busy. Busy all the time it heads for 110 C and passes 70 C
    5.5 s and 78 C 7.3 s (simulated) after starting from idle; it stays at or below 78 C up to a duty of 0.6.

    ``record_work`` updates the model (and the file) when ``update_interval_s`` of simulated time has passed since
    the last update; ``advance`` updates it now. ``peak_c`` is the highest temperature reached. ``clock`` is the real
    clock that simulated time is scaled from (tests pass a fake one and call ``advance(now)``). The temperature
    file stays open until :meth:`close` (or the end of a ``with`` block). Not thread-safe: call it from one thread,
    or hold a lock.
    """

    def __init__(self, root: str | Path, *, ambient_c: float = 25.0, r_th_c_per_w: float = 10.0, tau_s: float = 8.0,
                 idle_w: float = 0.5, active_w: float = 8.0, zone_type: str = "cpu-thermal", time_scale: float = 1.0,
                 start_c: float | None = None, update_interval_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic):
        for name, value in (("r_th_c_per_w", r_th_c_per_w), ("tau_s", tau_s), ("time_scale", time_scale)):
            if not value > 0:
                raise InputError(f"simulated device: {name} must be > 0, got {value!r}")
        if idle_w < 0 or active_w < 0 or update_interval_s < 0:
            raise InputError(f"simulated device: idle_w, active_w and update_interval_s must be >= 0, got "
                             f"{idle_w}, {active_w}, {update_interval_s}")
        self.root = Path(root)
        self.ambient_c, self.r_th_c_per_w, self.tau_s = float(ambient_c), float(r_th_c_per_w), float(tau_s)
        self.idle_w, self.active_w = float(idle_w), float(active_w)
        self.time_scale, self.update_interval_s = float(time_scale), float(update_interval_s)
        self._clock = clock
        self._clock0 = clock()
        self.zone = self.root / "class" / "thermal" / "thermal_zone0"
        self.zone.mkdir(parents=True, exist_ok=True)
        (self.zone / "type").write_text(zone_type + "\n")
        # Held open and rewritten in place (a fixed-width record, so nothing is left over): a rename per update
        # costs milliseconds on some filesystems, which would eat into the very loop being measured.
        self._fd = os.open(self.zone / "temp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.temperature_c = self.steady_state_c(0.0) if start_c is None else float(start_c)
        self.peak_c = self.temperature_c
        self._updated_at = self.now()
        self._busy_s = 0.0
        self.sleep_cpu_s = 0.0
        self._write()

    # -- time -------------------------------------------------------------------------------------------------
    def now(self) -> float:
        """Simulated seconds since the device was made."""
        return (self._clock() - self._clock0) * self.time_scale

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of simulated time (``seconds / time_scale`` real seconds, to a few microseconds).

        The last ~0.3 ms of real time is spun, not slept; the process CPU time that costs is added to
        ``sleep_cpu_s`` so that a caller measuring work with ``time.process_time`` can leave it out."""
        if seconds <= 0:
            return
        cpu0 = time.process_time()
        deadline = time.perf_counter() + seconds / self.time_scale
        coarse = deadline - time.perf_counter() - SPIN_S
        if coarse > 0:
            time.sleep(coarse)
        while time.perf_counter() < deadline:
            pass
        self.sleep_cpu_s += time.process_time() - cpu0

    # -- the model --------------------------------------------------------------------------------------------
    def steady_state_c(self, duty: float) -> float:
        """Where the temperature settles at a constant duty cycle (0 idle .. 1 always busy)."""
        return self.ambient_c + (self.idle_w + self.active_w * duty) * self.r_th_c_per_w

    def duty_for(self, temperature_c: float) -> float:
        """The constant duty cycle whose steady state is ``temperature_c`` (may be < 0 or > 1: out of reach)."""
        if self.active_w == 0:
            return math.inf
        return ((temperature_c - self.ambient_c) / self.r_th_c_per_w - self.idle_w) / self.active_w

    def record_work(self, busy_s: float) -> None:
        """Add ``busy_s`` real seconds of work (the measured duration of one real inference)."""
        if not busy_s >= 0:
            raise InputError(f"simulated device: busy time must be >= 0 seconds, got {busy_s!r}")
        self._busy_s += busy_s * self.time_scale
        if self.now() - self._updated_at >= self.update_interval_s:
            self.advance()

    def advance(self, now: float | None = None) -> float:
        """Integrate from the last update to ``now`` (simulated seconds, default :meth:`now`), write the
        temperature file, and return the temperature."""
        now = self.now() if now is None else float(now)
        dt = now - self._updated_at
        if dt < 0:
            raise InputError(f"simulated device: cannot advance to {now:.3f} s, it is already at "
                             f"{self._updated_at:.3f} s")
        if dt > 0:
            steady = self.steady_state_c(self._busy_s / dt)
            self.temperature_c = steady + (self.temperature_c - steady) * math.exp(-dt / self.tau_s)
            self.peak_c = max(self.peak_c, self.temperature_c)
            self._busy_s = 0.0
            self._updated_at = now
        self._write()
        return self.temperature_c

    def _write(self) -> None:
        if self._fd is None:
            raise InputError(f"simulated device at {self.root} was closed")
        # Millidegrees, right-aligned in a fixed width: one small write replaces the whole value.
        os.pwrite(self._fd, f"{round(self.temperature_c * 1000):>{_WIDTH}d}\n".encode(), 0)

    def close(self) -> None:
        """Close the temperature file (the tree stays, with the last temperature)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["SimulatedThermalDevice"]
