"""The thermal budget: how hot the device is, and what the next inference does about it.

Sensors (anything with ``read() -> ThermalReading``):

- :class:`LinuxThermalZones`: ``<root>/class/thermal/thermal_zone*/{type,temp}``; ``root`` is ``/sys`` on a
  device, a fake tree in tests, the tree of :class:`~edgesdk.simulated_device.SimulatedThermalDevice` in benchmarks.
- :class:`RaspberryPiThrottled`: the firmware's own throttling flags (``vcgencmd get_throttled``) and temperature.
- :class:`PushedThermalState`: what the host app pushes from the platform APIs Python cannot call (Android thermal
  status and headroom, Apple ``ProcessInfo.thermalState``).

:class:`ThermalGovernor` turns readings into a level (:data:`LEVELS`) and a level into what the next inference does
(:class:`ThermalActions`: fewer threads, pacing, a lower-power backend, and at critical refuse, defer or escalate).
The runtime calls :meth:`ThermalGovernor.before_inference` before every inference; sensors are read at most every
``min_read_interval_s``, not per inference.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from .errors import BudgetExceeded, InputError

LEVELS = ("nominal", "warm", "hot", "critical")
_RANK = {name: rank for rank, name in enumerate(LEVELS)}


def _worst(*levels: str | None) -> str | None:
    """The most severe of the given levels (None entries ignored); None when all are None."""
    known = [level for level in levels if level is not None]
    return max(known, key=_RANK.__getitem__) if known else None


@dataclass(frozen=True)
class ThermalReading:
    """One sensor reading. ``level_hint`` is set when the source reports a level itself (Android status, Apple
    state, Raspberry Pi throttling); ``temperature_c`` is the hottest zone, when known; ``source`` says where the
    reading came from; ``detail`` holds the per-zone or per-flag values (JSON-safe)."""

    level_hint: str | None
    temperature_c: float | None
    source: str
    detail: dict


class ThermalSensor(Protocol):
    def read(self) -> ThermalReading: ...


# -- Linux thermal zones ----------------------------------------------------------------------------------

class LinuxThermalZones:
    """The hottest of the Linux thermal zones under ``root``, a directory laid out like ``/sys``.

    Zones are found once, here: ``<root>/class/thermal/thermal_zone*``, whose ``temp`` is in millidegrees C.
    ``zone_types`` keeps the zones whose ``type`` contains one of the given substrings, ignoring case (e.g.
    ``("cpu", "soc")`` to leave out the battery and the modem). A zone whose ``temp`` cannot be read or parsed
    at read time (some drivers fail while the sensor sleeps) is skipped and named in ``detail["skipped"]``;
    when every zone fails, ``temperature_c`` is None. Raises :class:`InputError` when ``root`` holds no zone
    (or none of the wanted types).
    """

    def __init__(self, root: str | Path = "/sys", zone_types: Sequence[str] | None = None):
        if isinstance(zone_types, str):
            zone_types = (zone_types,)
        self.root = Path(root)
        base = self.root / "class" / "thermal"
        found = sorted(base.glob("thermal_zone*"), key=_zone_number)
        if not found:
            raise InputError(f"no thermal zones under {base} (expected {base}/thermal_zone*/temp); the thermal root "
                             f"{self.root} must be laid out like /sys")
        zones, types = [], []
        for zone in found:
            kind = _read_text(zone / "type") or "unknown"
            types.append(f"{zone.name}={kind}")
            if zone_types and not any(t.casefold() in kind.casefold() for t in zone_types):
                continue
            zones.append((zone.name, kind, zone / "temp"))
        if not zones:
            raise InputError(f"no thermal zone under {base} has a type containing {', '.join(zone_types or ())} "
                             f"(zones: {', '.join(types)})")
        self._zones = tuple(zones)
        self.source = f"sysfs:{base} ({len(zones)} zone{'' if len(zones) == 1 else 's'})"

    def read(self) -> ThermalReading:
        zones: dict[str, dict] = {}
        skipped: dict[str, str] = {}
        for name, kind, path in self._zones:
            try:
                zones[name] = {"type": kind, "temperature_c": int(path.read_text().strip()) / 1000.0}
            except (OSError, ValueError) as exc:
                skipped[name] = f"{kind}: {type(exc).__name__}: {exc}"
        hottest = max(zones, key=lambda z: zones[z]["temperature_c"], default=None)
        return ThermalReading(None, zones[hottest]["temperature_c"] if hottest else None, self.source,
                              {"zones": zones, "skipped": skipped, "hottest": hottest})


def _zone_number(path: Path) -> tuple[int, str]:
    digits = path.name[len("thermal_zone"):]
    return (int(digits) if digits.isdigit() else 1 << 30, path.name)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# -- Raspberry Pi ------------------------------------------------------------------------------------------

THROTTLED_FLAGS = {0: "under-voltage", 1: "arm frequency capped", 2: "currently throttled",
                   3: "soft temperature limit active"}


class RaspberryPiThrottled:
    """The Raspberry Pi firmware's throttling flags (``vcgencmd get_throttled``) and SoC temperature (``measure_temp``).

    Bits 0-3 describe now (bits 16-19, the same since boot, are reported in ``detail`` only). Level hint: bit 2
    (the firmware is throttling the cores now) -> ``hot``; bit 1 (ARM frequency capped) or bit 3 (soft temperature
    limit active) -> ``warm``; otherwise ``nominal``. Bit 0 (under-voltage) is a power supply problem, not heat:
    it is reported but does not raise the level. ``critical`` comes from the temperature and the governor's limits.

    ``command`` runs one vcgencmd subcommand (``"get_throttled"``, ``"measure_temp"``) and returns its output; the
    default runs ``vcgencmd`` and exists only where ``shutil.which("vcgencmd")`` finds it (else :class:`InputError`).
    A failed or unparsable command gives a reading without level or temperature and the error in ``detail``.
    """

    def __init__(self, command: Callable[[str], str] | None = None, *, measure_temp: bool = True,
                 timeout_s: float = 2.0):
        if command is None:
            path = shutil.which("vcgencmd")
            if path is None:
                raise InputError("vcgencmd is not on PATH: RaspberryPiThrottled reads the Raspberry Pi firmware "
                                 "through it (Raspberry Pi OS ships it; elsewhere use LinuxThermalZones)")
            command = _vcgencmd(path, timeout_s)
        self._command = command
        self._measure_temp = measure_temp

    def read(self) -> ThermalReading:
        detail: dict[str, Any] = {}
        try:
            flags = _field(self._command("get_throttled"), "throttled", lambda v: int(v, 16))
            temperature = _field(self._command("measure_temp"), "temp", lambda v: float(v.rstrip("'C"))) \
                if self._measure_temp else None
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            detail["error"] = f"{type(exc).__name__}: {exc}"
            return ThermalReading(None, None, "vcgencmd", detail)
        now = [name for bit, name in THROTTLED_FLAGS.items() if flags >> bit & 1]
        since_boot = [name for bit, name in THROTTLED_FLAGS.items() if flags >> (bit + 16) & 1]
        hint = "hot" if flags & 0b100 else "warm" if flags & 0b1010 else "nominal"
        detail.update({"throttled": f"0x{flags:x}", "now": now, "since_boot": since_boot})
        return ThermalReading(hint, temperature, "vcgencmd", detail)


def _vcgencmd(path: str, timeout_s: float) -> Callable[[str], str]:
    def run(subcommand: str) -> str:
        return subprocess.run([path, subcommand], capture_output=True, text=True, timeout=timeout_s,
                              check=True).stdout
    return run


def _field(output: str, key: str, parse: Callable[[str], Any]) -> Any:
    match = re.search(rf"{key}=(\S+)", output)
    if match is None:
        raise ValueError(f"no '{key}=' in vcgencmd output {output.strip()[:80]!r}")
    return parse(match.group(1))


# -- pushed by the host app --------------------------------------------------------------------------------

# Android PowerManager.THERMAL_STATUS_*: NONE, LIGHT, MODERATE, SEVERE, CRITICAL, EMERGENCY, SHUTDOWN. LIGHT and
# MODERATE are throttling the user does not notice yet (warm); SEVERE is noticeable (hot); from CRITICAL on the
# platform has done everything it can to cut power (critical).
ANDROID_STATUS = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")
ANDROID_STATUS_LEVELS = ("nominal", "warm", "warm", "hot", "critical", "critical", "critical")
# getThermalHeadroom: 1.0 is the start of SEVERE throttling, so >= 1.0 is hot; warm from 0.75 (our choice: a
# quarter of the way below severe). Headroom has no documented point for CRITICAL: push the status for that.
ANDROID_HEADROOM_LEVELS = ((1.0, "hot"), (0.75, "warm"))
ANDROID_HEADROOM_HYSTERESIS = 0.05
# Apple ProcessInfo.ThermalState.
APPLE_STATE_LEVELS = {"nominal": "nominal", "fair": "warm", "serious": "hot", "critical": "critical"}


class PushedThermalState:
    """The platform's own thermal state, pushed by the host app (Python cannot read it on Android or iOS).

    Mapping to levels: Android status 0 NONE -> nominal, 1 LIGHT and 2 MODERATE -> warm, 3 SEVERE -> hot,
    4 CRITICAL, 5 EMERGENCY and 6 SHUTDOWN -> critical; Android headroom (``getThermalHeadroom``, 1.0 = at the
    severe limit) >= 1.0 -> hot, >= 0.75 -> warm, going back down only 0.05 below a limit; Apple nominal, fair,
    serious, critical -> nominal, warm, hot, critical. When several were pushed the most severe counts. A NaN
    headroom (Android's answer when asked too often or unsupported) clears the headroom. Thread-safe: push from
    the app's callback thread, read from the inference thread.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._android_status: int | None = None
        self._headroom: float | None = None
        self._headroom_level: str | None = None
        self._apple: str | None = None

    def push_android_status(self, status: int) -> None:
        if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 6:
            raise InputError(f"Android thermal status must be an integer 0 (NONE) .. 6 (SHUTDOWN), got {status!r}")
        with self._lock:
            self._android_status = status

    def push_android_headroom(self, headroom: float) -> None:
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or headroom < 0:
            raise InputError(f"Android thermal headroom must be a number >= 0 (1.0 = severe), got {headroom!r}")
        with self._lock:
            if math.isnan(headroom):
                self._headroom = self._headroom_level = None
                return
            level = next((lvl for limit, lvl in ANDROID_HEADROOM_LEVELS if headroom >= limit), "nominal")
            current = self._headroom_level
            if current is not None and _RANK[level] < _RANK[current]:
                # Go down only once the headroom is clearly below the current level's limit (no flapping).
                limit = dict((lvl, lim) for lim, lvl in ANDROID_HEADROOM_LEVELS)[current]
                if headroom > limit - ANDROID_HEADROOM_HYSTERESIS:
                    level = current
            self._headroom, self._headroom_level = float(headroom), level

    def push_apple_state(self, state: str) -> None:
        key = state.strip().lower() if isinstance(state, str) else None
        if key not in APPLE_STATE_LEVELS:
            raise InputError(f"Apple thermal state must be one of {', '.join(APPLE_STATE_LEVELS)}, got {state!r}")
        with self._lock:
            self._apple = key

    def read(self) -> ThermalReading:
        with self._lock:
            detail: dict[str, Any] = {}
            sources = []
            status_level = None
            if self._android_status is not None:
                status_level = ANDROID_STATUS_LEVELS[self._android_status]
                detail["android_status"] = f"{self._android_status} {ANDROID_STATUS[self._android_status]}"
            if self._headroom is not None:
                detail["android_headroom"] = self._headroom
            if status_level or self._headroom_level:
                sources.append("android")
            if self._apple is not None:
                detail["apple_state"] = self._apple
                sources.append("apple")
            hint = _worst(status_level, self._headroom_level, APPLE_STATE_LEVELS.get(self._apple))
        return ThermalReading(hint, None, "+".join(sources) or "pushed (nothing pushed yet)", detail)


# -- the governor --------------------------------------------------------------------------------------------

_LEVEL_KEYS = {"threads": None, "min_interval_ms": 0.0, "adaptive": False, "prefer": None}
_CRITICAL_KEYS = {"mode": "refuse", "max_wait_s": 30.0}
CRITICAL_MODES = ("refuse", "defer", "escalate")


@dataclass(frozen=True)
class ThermalActions:
    """What the governor does at each level above nominal.

    ``warm`` and ``hot`` take (a key left out does nothing):

    - ``threads``: CPU threads per inference, an integer or ``"half"`` (of the governor's ``max_threads``);
    - ``min_interval_ms``: least time between the starts of two inferences (fixed pacing);
    - ``adaptive``: also pace adaptively, holding the temperature at the governor's ``hold_c`` (needs a sensor
      that reports a temperature; see :class:`ThermalGovernor`);
    - ``prefer``: a hint for the runtime, ``"lower_power"``: serve from a lower-power backend or artifact.

    ``critical`` takes ``mode``: ``"refuse"`` (raise :class:`BudgetExceeded`, reason ``thermal``), ``"defer"``
    (wait until the level is below hot, at most ``max_wait_s``, then serve; refuse after that) or ``"escalate"``
    (the decision says ``escalate``: the hook for hybrid mode to serve from the cloud; without it, refuse).

    The defaults pace adaptively from warm on: with fixed pacing only, nothing slows the heating between warm and
    hot, and a fast-heating device passes the hot limit within one sensor read.
    """

    warm: dict = field(default_factory=lambda: {"threads": "half", "min_interval_ms": 0, "adaptive": True})
    hot: dict = field(default_factory=lambda: {"threads": 1, "min_interval_ms": 100, "adaptive": True,
                                               "prefer": "lower_power"})
    critical: dict = field(default_factory=lambda: {"mode": "refuse", "max_wait_s": 30.0})

    def __post_init__(self):
        for name in ("warm", "hot"):
            object.__setattr__(self, name, _level_actions(name, getattr(self, name)))
        critical = _known_keys("critical", self.critical, _CRITICAL_KEYS)
        if critical["mode"] not in CRITICAL_MODES:
            raise InputError(f"thermal actions: critical mode {critical['mode']!r} is not one of "
                             f"{', '.join(CRITICAL_MODES)}")
        if not _number(critical["max_wait_s"]) or critical["max_wait_s"] < 0:
            raise InputError(f"thermal actions: critical max_wait_s must be a number >= 0, got "
                             f"{critical['max_wait_s']!r}")
        object.__setattr__(self, "critical", critical)


def _known_keys(level: str, given: dict, defaults: dict) -> dict:
    if not isinstance(given, dict):
        raise InputError(f"thermal actions: {level} must be a dict, got {type(given).__name__}")
    unknown = [key for key in given if key not in defaults]
    if unknown:
        raise InputError(f"thermal actions: {level} has unknown key {unknown[0]!r} (known: {', '.join(defaults)})")
    return {**defaults, **given}


def _level_actions(level: str, given: dict) -> dict:
    acts = _known_keys(level, given, _LEVEL_KEYS)
    threads = acts["threads"]
    if threads is not None and threads != "half" and (isinstance(threads, bool) or not isinstance(threads, int)
                                                      or threads < 1):
        raise InputError(f"thermal actions: {level} threads must be an integer >= 1, 'half' or None, got {threads!r}")
    if not _number(acts["min_interval_ms"]) or acts["min_interval_ms"] < 0:
        raise InputError(f"thermal actions: {level} min_interval_ms must be a number >= 0, got "
                         f"{acts['min_interval_ms']!r}")
    if not isinstance(acts["adaptive"], bool):
        raise InputError(f"thermal actions: {level} adaptive must be true or false, got {acts['adaptive']!r}")
    if acts["prefer"] not in (None, "lower_power"):
        raise InputError(f"thermal actions: {level} prefer must be 'lower_power' or None, got {acts['prefer']!r}")
    return acts


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


# Adaptive pacing (see ThermalGovernor): at each sensor read the temperature is forecast LOOKAHEAD_S ahead from
# its slope (a running average giving the newest read SLOPE_WEIGHT, against sensor noise). Above hold_c the rate
# limit drops by GAIN_PER_C per degree of excess (at most halved per read); below hold_c - DEADBAND_C it rises by
# GAIN_PER_C per degree (at most RAISE_MAX per read) until it no longer binds. Tuned on the simulated device (fake
# clock) with tau 4-20 s, 1 C sensor steps, 0.3-0.5 C noise and inference times varying by up to half: one level
# change per run, peaks within 1.5 C of hold_c. A device that heats past hot within one read interval is beyond it.
LOOKAHEAD_S = 2.0
SLOPE_WEIGHT = 0.7
GAIN_PER_C = 0.1
RAISE_MAX = 1.1
DEADBAND_C = 0.5
MIN_RATE_PER_S = 1.0  # adaptive pacing never spaces inferences more than a second apart; critical is for worse


class ThermalGovernor:
    """Maps sensor readings to a level and the level to what each inference does.

    Levels: a temperature at or above ``warm_c`` / ``hot_c`` / ``critical_c`` raises the level at once; it goes
    back down only when the temperature is ``hysteresis_c`` below the current level's limit, so it does not flap
    around a limit. A level hint from the sensor is used as given (the platform has its own hysteresis); when a
    reading has both, the more severe level wins. A reading with neither keeps the level.

    The sensor is read at most every ``min_read_interval_s`` (``clock`` seconds); :meth:`poll` and
    :meth:`before_inference` use the cached reading in between.

    Pacing: at a level with ``min_interval_ms`` the starts of two inferences are at least that far apart (the
    caller sleeps in :meth:`before_inference`). With ``adaptive``, the governor also holds the temperature at
    ``hold_c`` (default ``hot_c - hysteresis_c``): at each read it forecasts the temperature ``LOOKAHEAD_S`` (2 s)
    ahead from its slope and lowers the rate limit (inferences per second, starting from the rate it measured) when the
    forecast is above ``hold_c``, raises it when below, and drops it when it no longer binds. The limit is
    forgotten at nominal. The rate is counted over every caller, so it holds for several threads together.

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
        self._read_at: float | None = None
        self._slope: float | None = None
        self._starts = 0  # inferences started since the last read
        self._rate_limit: float | None = None
        self._last_start: float | None = None

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
        if self._read_at is not None and now - self._read_at < self.min_read_interval_s:
            return
        reading = self.sensor.read()
        if reading.level_hint is not None and reading.level_hint not in LEVELS:
            raise InputError(f"thermal sensor {reading.source} gave level {reading.level_hint!r}; levels are "
                             f"{', '.join(LEVELS)}")
        temperature = reading.temperature_c
        level = _worst(reading.level_hint, None if temperature is None else self._level_for(temperature)) \
            or self.level
        if level != self.level:
            self.changes.append((now, self.level, level))
            self.level = level
        previous, previous_at = self._reading, self._read_at
        self._reading, self._read_at = reading, now
        if previous is not None and previous.temperature_c is not None and temperature is not None:
            self._adapt(temperature, previous.temperature_c, now - previous_at)
        if not self._level_actions().get("adaptive"):
            self._rate_limit = None
        self._starts = 0

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

    def _adapt(self, temperature: float, previous: float, dt: float) -> None:
        if dt <= 0:
            return
        slope = (temperature - previous) / dt
        self._slope = slope if self._slope is None else SLOPE_WEIGHT * slope + (1 - SLOPE_WEIGHT) * self._slope
        if not self._level_actions().get("adaptive") or self._starts < 2:
            return  # nothing to hold, or the app is not inferring: nothing to learn from
        rate = self._starts / dt
        forecast = temperature + self._slope * LOOKAHEAD_S
        if forecast > self.hold_c:
            base = self._rate_limit if self._rate_limit is not None else rate
            self._rate_limit = max(MIN_RATE_PER_S, base * max(0.5, 1.0 - GAIN_PER_C * (forecast - self.hold_c)))
        elif forecast < self.hold_c - DEADBAND_C and self._rate_limit is not None:
            self._rate_limit *= min(RAISE_MAX, 1.0 + GAIN_PER_C * (self.hold_c - forecast))
            if self._rate_limit > 1.5 * rate:
                self._rate_limit = None  # the app runs slower than the limit: it no longer binds

    def _level_actions(self) -> dict:
        return getattr(self.actions, self.level) if self.level in ("warm", "hot") else {}

    # -- per inference -----------------------------------------------------------------------------------
    def before_inference(self) -> dict:
        """Decide how the next inference is served; called by the runtime before each one.

        Polls the sensor (at most every ``min_read_interval_s``), sleeps for pacing, and returns
        ``{"level", "action", "actions", "threads", "prefer", "slept_ms", "temperature_c"}``: ``action`` is the
        main thing the budget changed (None, ``"paced"``, ``"threads_reduced"``, ``"deferred"``, ``"escalate"``;
        the runtime reports ``"artifact_switched"`` itself when it acts on ``prefer``), ``actions`` all of them,
        ``threads`` the thread count to use (None: unchanged). At critical, mode refuse raises
        :class:`BudgetExceeded` (reason ``thermal``, ``needed`` the temperature and ``available`` the critical
        limit when known); mode defer waits (polling) until the level is below hot and raises the same if
        ``max_wait_s`` passes first.
        """
        deferred_s = 0.0
        deadline = None
        while True:
            with self._lock:
                now = self._clock()
                self._poll(now)
                blocked = self.level == "critical" or (deadline is not None and self.level == "hot")
                if not blocked:
                    decision, wait = self._schedule(now)
                    break
                critical = self.actions.critical
                if critical["mode"] == "escalate":
                    return self._decision("escalate", ["escalate"], None, None, 0.0)
                if critical["mode"] == "refuse":
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
        if deferred_s:
            decision["actions"].insert(0, "deferred")
            decision.update(action="deferred", slept_ms=decision["slept_ms"] + deferred_s * 1e3)
        return decision

    def _schedule(self, now: float) -> tuple[dict, float]:
        """Count this inference and reserve its start; returns the decision and how long to sleep first."""
        acts = self._level_actions()
        interval = acts.get("min_interval_ms", 0.0) / 1e3
        if acts.get("adaptive") and self._rate_limit is not None:
            interval = max(interval, 1.0 / self._rate_limit)
        start = now if self._last_start is None else max(now, self._last_start + interval)
        self._last_start = start
        self._starts += 1
        threads = self._threads(acts.get("threads"))
        actions = []
        if threads is not None and threads < self.max_threads:
            actions.append("threads_reduced")
        if start > now:
            actions.insert(0, "paced")
        return self._decision(actions[0] if actions else None, actions, threads, acts.get("prefer"),
                              (start - now) * 1e3), start - now

    def _threads(self, wanted: int | str | None) -> int | None:
        if wanted is None:
            return None
        if wanted == "half":
            return max(1, self.max_threads // 2)
        return min(int(wanted), self.max_threads)

    def _decision(self, action, actions, threads, prefer, slept_ms) -> dict:
        temperature = self._reading.temperature_c if self._reading else None
        return {"level": self.level, "action": action, "actions": actions, "threads": threads, "prefer": prefer,
                "slept_ms": slept_ms, "temperature_c": temperature}

    def _refusal(self, what: str | None) -> BudgetExceeded:
        """BudgetExceeded at critical (``what`` None) or when a deferral ran out, naming what the sensor said."""
        reading = self._reading
        temperature, hint = reading.temperature_c, reading.level_hint
        critical = self.limits["critical"]
        if temperature is not None:
            seen = f"{temperature:.1f} C{f' and level {hint}' if hint else ''} from {reading.source}, " \
                   f"critical limit {critical:g} C"
            what = what or f"local inference is refused until it cools below {critical - self.hysteresis_c:g} C"
            return BudgetExceeded("thermal", f"the device is {self.level} ({seen}); {what}", needed=temperature,
                                  available=critical)
        what = what or "local inference is refused until it reports a lower level"
        return BudgetExceeded("thermal", f"the device is {self.level} ({reading.source} reports level {hint}); {what}")

    # -- reporting -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        """The governor as of its last read, JSON-safe (call :meth:`poll` first for a fresh one)."""
        with self._lock:
            reading = self._reading
            acts = self._level_actions()
            pacing = acts.get("min_interval_ms", 0.0)
            if acts.get("adaptive") and self._rate_limit is not None:
                pacing = max(pacing, 1e3 / self._rate_limit)
            return {"level": self.level,
                    "temperature_c": reading.temperature_c if reading else None,
                    "level_hint": reading.level_hint if reading else None,
                    "source": reading.source if reading else None,
                    "thresholds": {"warm_c": self.limits["warm"], "hot_c": self.limits["hot"],
                                   "critical_c": self.limits["critical"], "hysteresis_c": self.hysteresis_c,
                                   "hold_c": self.hold_c},
                    "last_read": self._read_at,
                    "pacing_ms": pacing,
                    "threads": self._threads(acts.get("threads")),
                    "critical_mode": self.actions.critical["mode"],
                    "level_changes": len(self.changes),
                    "detail": reading.detail if reading else {}}


__all__ = ["LEVELS", "ThermalReading", "ThermalSensor", "LinuxThermalZones", "RaspberryPiThrottled",
           "PushedThermalState", "ThermalActions", "ThermalGovernor"]
