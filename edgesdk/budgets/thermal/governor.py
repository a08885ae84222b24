"""The thermal governor: turns sensor readings into a level, and a level into what the next inference does.

Levels (:data:`~edgesdk.budgets.thermal.sensors.LEVELS`) come from the temperature and the limits (with hysteresis) or from
the sensor's own level hint. What each level does is a :class:`ThermalActions`: fewer threads, pacing (fixed, and
adaptive: holding the temperature below hot), a lower-power backend or artifact, and at critical refuse, defer or
escalate. The runtime asks :meth:`ThermalGovernor.before_inference` (or, inside :class:`~edgesdk.Model`, the
cheaper :meth:`ThermalGovernor.admit`) before every inference; sensors are read at most every
``min_read_interval_s``, not per inference.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ...choices import BudgetReason, CriticalMode, ThermalLevel
from ...errors import BudgetExceeded, InputError
from .actions import CRITICAL_MODES, ThermalActions, _number  # noqa: F401  (CRITICAL_MODES: re-exported)
from .sensors import LEVELS, ThermalReading, ThermalSensor, _RANK, _worst


# Adaptive pacing (see ThermalGovernor). At each sensor read the temperature is forecast LOOKAHEAD_S ahead from its
# slope (a running average giving the newest read SLOPE_WEIGHT, against sensor noise; restarted after a cut, since
# the heating rate follows the work at once). The rate limit is scaled so that the forecast would land on hold_c,
# taking the rise above the coolest temperature seen as proportional to the rate (a first-order device): down at
# most by half per read when the forecast is above hold_c, up at most RAISE_MAX per read when it is more than
# DEADBAND_C below and the limit is what holds the app back. Entering hot halves the limit at once. The limit is
# dropped only when the app runs well below it on its own (no pacing sleeps): a limit that fixed pacing undercuts
# (hot's 100 ms) is kept, or the app would come back from hot at full speed and flap; and it is kept at nominal,
# only loosened there, for the same reason. Tuned on the simulated device (fake clock; benchmarks/thermal.py for
# the real loop) with tau 2-40 s, 1 C sensor steps, 0.4 C noise and inference times 0.2-20 ms varying by up to
# half: peaks 1-2 C above hold_c, at most 3 level changes in 3 minutes, 88-100% of the best constant rate. Not
# covered: a device that heats past hot within one read interval, or a sudden several-fold rise of the work per
# inference (3x: it passes hot for a read or two before the hot actions pull it back).
LOOKAHEAD_S = 3.0
SLOPE_WEIGHT = 0.7
MIN_SPAN_C = 5.0  # a device first read near hold_c is scaled as if it idled this far below it
RAISE_MAX = 1.05
DEADBAND_C = 0.5
CUT = 0.8  # a limit lowered below this share of the last one was cut: the slope is measured afresh
PACED_SHARE = 0.05  # pacing sleeps under this share of a window: the app was not held back
IDLE_S = 5.0  # a window this long with fewer than two inferences: the app idles
MIN_RATE_PER_S = 1.0  # adaptive pacing never spaces inferences more than a second apart; critical is for worse


@dataclass(frozen=True)
class Plan:
    """What the current level means for each inference; rebuilt at each sensor read, shared until the next.

    ``interval_s`` is the least time between inference starts (fixed and adaptive pacing together;
    ``fixed_interval_s`` the fixed part alone); ``threads``
    the thread count to use (None: unchanged); ``threads_reduced`` whether that is below ``max_threads``;
    ``escalate`` is set (on a plan of its own) when the critical mode is ``escalate``."""

    level: str
    interval_s: float
    threads: int | None
    threads_reduced: bool
    prefer: str | None
    temperature_c: float | None
    fixed_interval_s: float = 0.0
    escalate: bool = False


class ThermalGovernor:
    """Maps sensor readings to a level and the level to what each inference does.

    Levels: a temperature at or above ``warm_c`` / ``hot_c`` / ``critical_c`` raises the level at once; it goes
    back down only when the temperature is ``hysteresis_c`` below the current level's limit, so it does not flap
    around a limit. A level hint from the sensor is used as given (the platform has its own hysteresis); when a
    reading has both, the more severe level wins. A reading with neither keeps the level.

    The sensor is read at most every ``min_read_interval_s`` (``clock`` seconds); in between, inferences use the
    plan made at the last read.

    Pacing: at a level with ``min_interval_ms`` the starts of two inferences are at least that far apart (the
    caller sleeps in :meth:`before_inference`). With ``adaptive``, the governor also holds the temperature at
    ``hold_c`` (default ``hot_c - hysteresis_c``): at each read it forecasts the temperature ``LOOKAHEAD_S`` (3 s)
    ahead from its slope and scales the rate limit (inferences per second, starting from the rate it measured)
    so the forecast lands on ``hold_c``: down when the forecast is above it, up when below while the limit is
    what holds the app back. The limit is dropped when the app runs well below it on its own; back at nominal it
    is kept, and only loosened, until then. The rate is counted over every caller, so it holds for several
    threads together.

    Thread-safe: callers share one governor; sleeps happen outside its lock. ``clock`` and ``sleep`` are
    injectable (tests, and the simulated device's scaled time).
    """

    def __init__(self, sensor: ThermalSensor, *, warm_c: float = 70.0, hot_c: float = 80.0, critical_c: float = 90.0,
                 hysteresis_c: float = 3.0, min_read_interval_s: float = 0.5, actions: ThermalActions | None = None,
                 hold_c: float | None = None, max_threads: int | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        limits = {"warm_c": warm_c, "hot_c": hot_c, "critical_c": critical_c, "hysteresis_c": hysteresis_c,
                  "min_read_interval_s": min_read_interval_s}
        for key, value in limits.items():
            if not _number(value):
                raise InputError(f"thermal governor: {key} must be a number, got {value!r}")
        if not warm_c < hot_c < critical_c:
            raise InputError(f"thermal governor: limits must rise, warm_c < hot_c < critical_c, got "
                             f"{warm_c} / {hot_c} / {critical_c}")
        if hysteresis_c < 0 or min_read_interval_s < 0:
            raise InputError(f"thermal governor: hysteresis_c and min_read_interval_s must be >= 0, got "
                             f"{hysteresis_c} and {min_read_interval_s}")
        hold_c = hot_c - hysteresis_c if hold_c is None else hold_c
        if not _number(hold_c) or hold_c >= hot_c:
            raise InputError(f"thermal governor: hold_c must be a number below hot_c ({hot_c}), got {hold_c!r}")
        if max_threads is not None and (isinstance(max_threads, bool) or not isinstance(max_threads, int)
                                        or max_threads < 1):
            raise InputError(f"thermal governor: max_threads must be an integer >= 1, got {max_threads!r}")
        self.sensor = sensor
        self.limits = {"warm": float(warm_c), "hot": float(hot_c), "critical": float(critical_c)}
        self.hysteresis_c = float(hysteresis_c)
        self.hold_c = float(hold_c)
        self.min_read_interval_s = float(min_read_interval_s)
        self.actions = actions if actions is not None else ThermalActions()
        self.max_threads = max_threads or os.cpu_count() or 1
        self.level = "nominal"
        self.changes: list[tuple[float, str, str]] = []
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._reading: ThermalReading | None = None
        self._read_at = -math.inf
        self._slope: float | None = None
        self._window_at = -math.inf  # the rate is measured over a window of reads starting here
        self._starts = 0  # inferences started in the window
        self._paced_s = 0.0  # pacing sleeps handed out in the window
        self._window_fixed_s = 0.0  # the longest fixed pacing in force during the window
        self._rate_limit: float | None = None
        self._just_cut = False  # the limit was cut at the last read
        self._coolest = math.inf  # the coolest temperature read: about idle, when the governor starts cool
        self._recent: list[float] = []  # the last three temperatures read
        self._last_start = -math.inf
        self.plan = self._make_plan()

    @classmethod
    def from_profile(cls, sensor: ThermalSensor, profile: Any, **options: Any) -> "ThermalGovernor":
        """A governor with the limits of a platform profile's ``[thermal]`` table (keywords override them) and
        its thread count as ``max_threads``."""
        thermal = dict(getattr(profile, "thermal", None) or {})
        name = getattr(profile, "name", profile)
        if not thermal:
            raise InputError(f"platform profile {name!r} sets no [thermal] limits: pass warm_c, hot_c and critical_c "
                             "to ThermalGovernor instead")
        options.setdefault("max_threads", getattr(profile, "threads", None))
        return cls(sensor, **{**thermal, **options})

    # -- levels ---------------------------------------------------------------------------------------------
    def poll(self) -> str:
        """The current level, reading the sensor if the last read is at least ``min_read_interval_s`` old."""
        with self._lock:
            self._poll(self._clock())
            return self.level

    def _poll(self, now: float) -> None:
        if now - self._read_at < self.min_read_interval_s:
            return
        reading = self.sensor.read()
        if reading.level_hint is not None and reading.level_hint not in LEVELS:
            raise InputError(f"thermal sensor {reading.source} gave level {reading.level_hint!r}; levels are "
                             f"{', '.join(LEVELS)}")
        temperature = reading.temperature_c
        if temperature is not None:
            # The median of the last three reads, so that one low glitch does not weaken every later cut.
            self._recent = (self._recent + [temperature])[-3:]
            self._coolest = min(self._coolest, sorted(self._recent)[len(self._recent) // 2])
        level = _worst(reading.level_hint, None if temperature is None else self._level_for(temperature)) \
            or self.level
        entered_hot = level == ThermalLevel.HOT and _RANK[self.level] < _RANK[ThermalLevel.HOT]
        if level != self.level:
            self.changes.append((now, self.level, level))
            self.level = level
        previous, previous_at = self._reading, self._read_at
        self._reading, self._read_at = reading, now
        if previous is None:
            self._new_window(now)
        if previous is not None and previous.temperature_c is not None and temperature is not None:
            self._adapt(temperature, previous.temperature_c, now - previous_at, now, entered_hot)
        if not self._adaptive():
            self._rate_limit = None
            self._new_window(now)
        self.plan = self._make_plan()
        self._window_fixed_s = max(self._window_fixed_s, self.plan.fixed_interval_s)

    def _new_window(self, now: float) -> None:
        """Start counting inferences (and pacing sleeps) afresh: the rate is measured over a window of reads."""
        self._window_at, self._starts, self._paced_s, self._window_fixed_s = now, 0, 0.0, 0.0

    def _level_for(self, temperature: float) -> str:
        """The level for this temperature given the current one: up at a limit, down ``hysteresis_c`` below it."""
        up = "nominal"
        stay = "nominal"
        for name in LEVELS[1:]:
            if temperature >= self.limits[name]:
                up = name
            if temperature > self.limits[name] - self.hysteresis_c:
                stay = name
        return _worst(up, min(self.level, stay, key=_RANK.__getitem__))

    def _adapt(self, temperature: float, previous: float, dt: float, now: float, entered_hot: bool) -> None:
        if dt <= 0:
            return
        slope = (temperature - previous) / dt
        # Averaged against sensor noise, but not across a cut of the limit: the heating rate follows the work at
        # once, and the old steep slope would cut the new limit again.
        if self._slope is not None and not self._just_cut:
            slope = SLOPE_WEIGHT * slope + (1 - SLOPE_WEIGHT) * self._slope
        self._slope, self._just_cut = slope, False
        if not self._adaptive():
            return
        window = now - self._window_at
        idle = self._starts < 2
        if idle and window < IDLE_S:
            return  # too few inferences to measure a rate yet: keep counting over the next reads
        rate = self._starts / window
        forecast = temperature + slope * LOOKAHEAD_S
        limit = self._rate_limit
        # Whether the adaptive limit is what paces: tighter than every fixed pacing in force in this window (hot's
        # 100 ms makes the app slow, not the limit; cutting the limit then would only wind it down), and whether
        # the app ran at it (slept for pacing, or ran within 10% of it).
        paced = self._paced_s >= PACED_SHARE * window
        tighter = limit is not None and 1.0 / limit > self._window_fixed_s
        at_limit = tighter and (paced or rate >= 0.9 * limit)
        if self.level == ThermalLevel.NOMINAL:
            if temperature < self.limits["warm"] - 2 * self.hysteresis_c:
                limit = None  # clearly cool: a limit carried down from warm is no longer needed
        elif entered_hot and not idle:
            # The forecast did not stop it: cut hard now rather than by degrees.
            limit = 0.5 * min(rate, limit if limit is not None else rate)
        elif forecast > self.hold_c and not idle and (limit is None or tighter):
            limit = (limit if limit is not None else rate) * self._scale(forecast)
        if forecast < self.hold_c - DEADBAND_C and limit is not None:
            if at_limit:  # the limit is what holds the app back: loosen it
                limit *= self._scale(forecast)
            elif not paced:
                limit = None  # the app runs slower than the limit by itself (or idles): it no longer binds
        limit = None if limit is None else max(MIN_RATE_PER_S, limit)
        self._just_cut = limit is not None and (self._rate_limit is None or limit < CUT * self._rate_limit)
        self._rate_limit = limit
        self._new_window(now)

    def _scale(self, forecast: float) -> float:
        """How much to scale the rate so the forecast lands on ``hold_c``, taking the rise above the coolest
        temperature seen as proportional to the rate (a first-order device); at most halved, at most RAISE_MAX."""
        span = max(self.hold_c - self._coolest, MIN_SPAN_C)
        return min(RAISE_MAX, max(0.5, span / max(span + forecast - self.hold_c, 1e-9)))

    def _adaptive(self) -> bool:
        """Whether the rate limit applies now: at a level whose actions say ``adaptive``, and at nominal while a
        limit carried down from warm still binds (dropping it at once would send the app back to full speed and
        up again, flapping between nominal and warm)."""
        if self.level == ThermalLevel.NOMINAL:
            return self._rate_limit is not None and bool(self.actions.warm.get("adaptive"))
        return bool(self._level_actions().get("adaptive"))

    def _level_actions(self) -> dict:
        return getattr(self.actions, self.level) if self.level in (ThermalLevel.WARM, ThermalLevel.HOT) else {}

    def _make_plan(self) -> Plan:
        acts = self._level_actions()
        fixed = interval = acts.get("min_interval_ms", 0.0) / 1e3
        if self._rate_limit is not None and self._adaptive():
            interval = max(interval, 1.0 / self._rate_limit)
        threads = self._threads(acts.get("threads"))
        return Plan(self.level, interval, threads, threads is not None and threads < self.max_threads,
                    acts.get("prefer"), self._reading.temperature_c if self._reading else None, fixed)

    def _threads(self, wanted: int | str | None) -> int | None:
        if wanted is None:
            return None
        if wanted == "half":
            return max(1, self.max_threads // 2)
        return min(int(wanted), self.max_threads)

    # -- per inference -----------------------------------------------------------------------------------
    def admit(self) -> tuple[Plan, float, float]:
        """Admit one inference: poll the sensor when a read is due, sleep for pacing (and deferral), and return
        ``(plan, paced_s, deferred_s)``. The plan object stays the same between sensor reads, so a caller can
        cache what it derives from it. At critical, mode refuse raises :class:`BudgetExceeded` (reason
        ``thermal``, ``needed`` the temperature and ``available`` the critical limit when known); mode defer
        waits (polling) until the level is below hot and raises the same if ``max_wait_s`` passes first; mode
        escalate returns a plan with ``escalate`` set and does not sleep."""
        deferred_s = 0.0
        deadline = None
        while True:
            with self._lock:
                now = self._clock()
                if now - self._read_at >= self.min_read_interval_s:
                    self._poll(now)
                plan = self.plan
                if plan.level != ThermalLevel.CRITICAL and (deadline is None or plan.level != ThermalLevel.HOT):
                    start = now if now >= self._last_start + plan.interval_s else self._last_start + plan.interval_s
                    self._last_start = start
                    self._starts += 1
                    wait = start - now
                    self._paced_s += wait
                    break
                critical = self.actions.critical
                if critical["mode"] == CriticalMode.ESCALATE:
                    return Plan(plan.level, 0.0, None, False, None, plan.temperature_c, escalate=True), 0.0, 0.0
                if critical["mode"] == CriticalMode.REFUSE:
                    raise self._refusal(None)
                if deadline is None:
                    deadline = now + critical["max_wait_s"]
                if now >= deadline:
                    raise self._refusal(f"still {self.level} after deferring {deferred_s:.1f} s "
                                        f"(max_wait_s {critical['max_wait_s']:g})")
                pause = min(max(self.min_read_interval_s, 0.01), deadline - now)
            self._sleep(pause)
            deferred_s += pause
        if wait > 0:
            self._sleep(wait)
        return plan, wait, deferred_s

    def before_inference(self) -> dict:
        """Decide how the next inference is served, as a dict: :meth:`admit`, spelled out.

        Returns ``{"level", "action", "actions", "threads", "prefer", "slept_ms", "temperature_c"}``: ``action``
        is the main thing the budget changed (None, ``"paced"``, ``"threads_reduced"``, ``"deferred"``,
        ``"escalate"``; the runtime reports ``"artifact_switched"`` itself when it acts on ``prefer``),
        ``actions`` all of them, ``threads`` the thread count to use (None: unchanged). Raises as :meth:`admit`.
        """
        plan, paced_s, deferred_s = self.admit()
        return describe(plan, paced_s, deferred_s)

    def _refusal(self, what: str | None) -> BudgetExceeded:
        """BudgetExceeded at critical (``what`` None) or when a deferral ran out, naming what the sensor said."""
        reading = self._reading
        temperature, hint = reading.temperature_c, reading.level_hint
        critical = self.limits["critical"]
        if temperature is not None:
            seen = f"{temperature:.1f} C{f' and level {hint}' if hint else ''} from {reading.source}, " \
                   f"critical limit {critical:g} C"
            what = what or f"local inference is refused until it cools below {critical - self.hysteresis_c:g} C"
            return BudgetExceeded(BudgetReason.THERMAL,
                                  f"the device is {self.level} ({seen}); {what}", needed=temperature,
                                  available=critical)
        what = what or "local inference is refused until it reports a lower level"
        return BudgetExceeded(BudgetReason.THERMAL,
                              f"the device is {self.level} ({reading.source} reports level {hint}); {what}")

    # -- reporting -----------------------------------------------------------------------------------------
    @property
    def rate_limit(self) -> float | None:
        """The adaptive pacing limit in inferences per second (warm, with ``adaptive``), None when not pacing."""
        return self._rate_limit

    def state(self) -> dict:
        """The governor as of its last read, JSON-safe (call :meth:`poll` first for a fresh one)."""
        with self._lock:
            reading, plan = self._reading, self.plan
            return {"level": self.level,
                    "temperature_c": reading.temperature_c if reading else None,
                    "level_hint": reading.level_hint if reading else None,
                    "source": reading.source if reading else None,
                    "thresholds": {"warm_c": self.limits["warm"], "hot_c": self.limits["hot"],
                                   "critical_c": self.limits["critical"], "hysteresis_c": self.hysteresis_c,
                                   "hold_c": self.hold_c},
                    "last_read": None if self._reading is None else self._read_at,
                    "pacing_ms": plan.interval_s * 1e3,
                    "rate_limit_per_s": self._rate_limit,
                    "threads": plan.threads,
                    "critical_mode": self.actions.critical["mode"],
                    "level_changes": len(self.changes),
                    "detail": reading.detail if reading else {}}


def plan_actions(plan: Plan) -> list[str]:
    """What a plan changes for every inference it admits (before pacing or deferral): escalate, fewer threads."""
    if plan.escalate:
        return ["escalate"]
    return ["threads_reduced"] if plan.threads_reduced else []


def describe(plan: Plan, paced_s: float, deferred_s: float) -> dict:
    """The decision dict for one admitted inference (see :meth:`ThermalGovernor.before_inference`)."""
    actions = plan_actions(plan)
    if paced_s > 0:
        actions.insert(0, "paced")
    if deferred_s > 0:
        actions.insert(0, "deferred")
    return {"level": plan.level, "action": actions[0] if actions else None, "actions": actions,
            "threads": plan.threads, "prefer": plan.prefer, "slept_ms": (paced_s + deferred_s) * 1e3,
            "temperature_c": plan.temperature_c}


__all__ = ["ThermalActions", "ThermalGovernor", "Plan", "CRITICAL_MODES"]
