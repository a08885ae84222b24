"""Thermal sensors: anything with ``read() -> ThermalReading``.

- :class:`LinuxThermalZones`: ``<root>/class/thermal/thermal_zone*/{type,temp}``; ``root`` is ``/sys`` on a
  device, a fake tree in tests, the tree of :class:`~edgesdk.budgets.thermal.simulated_device.SimulatedThermalDevice` in benchmarks.
- :class:`EdgeTpuTemperature`: a Coral Edge TPU's own sensor, ``<root>/class/apex/apex_*/temp``.
- :class:`RaspberryPiThrottled`: the firmware's own throttling flags (``vcgencmd get_throttled``) and temperature.
- :class:`PushedThermalState`: what the host app pushes from the platform APIs Python cannot call (Android thermal
  status and headroom, Apple ``ProcessInfo.thermalState``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ...choices import ThermalLevel
from ...errors import InputError

LEVELS = ThermalLevel.values()  # plain strings, in rising order
SENSOR_READ_BYTES = 64  # a sensor value is a short line; a longer file is not a sensor (raise: set this module value)
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
                zones[name] = {"type": kind, "temperature_c": int(read_sensor_file(path)) / 1000.0}
            except (OSError, ValueError) as exc:
                skipped[name] = f"{kind}: {type(exc).__name__}: {exc}"
        hottest = max(zones, key=lambda z: zones[z]["temperature_c"], default=None)
        return ThermalReading(None, zones[hottest]["temperature_c"] if hottest else None, self.source,
                              {"zones": zones, "skipped": skipped, "hottest": hottest})


def _zone_number(path: Path) -> tuple[int, str]:
    digits = path.name[len("thermal_zone"):]
    return (int(digits) if digits.isdigit() else 1 << 30, path.name)


def read_sensor_file(path: Path) -> str:
    """The stripped text of a sensor file: a regular file (sysfs attributes are, with st_size 4096) of at most
    ``SENSOR_READ_BYTES``. Opened without blocking (a FIFO with no writer would wait forever) and read once, so a
    device or a huge file costs nothing; anything else raises ValueError naming it (OSError when unreadable)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file ({_file_kind(mode)})")
        data = os.read(fd, SENSOR_READ_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > SENSOR_READ_BYTES:
        raise ValueError(f"{path} holds more than {SENSOR_READ_BYTES} bytes: not a sensor value")
    return data.decode("utf-8", "replace").strip()


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")


def _read_text(path: Path) -> str | None:
    try:
        return read_sensor_file(path)
    except (OSError, ValueError):
        return None


class EdgeTpuTemperature:
    """The hottest Edge TPU (Coral PCIe / M.2 / Dev Board) under ``root``, a directory laid out like ``/sys``:
    ``<root>/class/apex/apex_*/temp``, millidegrees C, written by the ``apex`` driver, which also throttles the
    TPU's clock at its own trip points (``trip_point0..2_temp``, reported in ``detail``). Raises
    :class:`InputError` when ``root`` holds no Edge TPU; a TPU whose ``temp`` cannot be read is skipped."""

    def __init__(self, root: str | Path = "/sys"):
        self.root = Path(root)
        base = self.root / "class" / "apex"
        self._chips = tuple(sorted(base.glob("apex_*")))
        if not self._chips:
            raise InputError(f"no Edge TPU under {base} (expected {base}/apex_*/temp from the apex driver); the "
                             f"root {self.root} must be laid out like /sys")
        self.source = f"apex:{base} ({len(self._chips)} TPU{'' if len(self._chips) == 1 else 's'})"

    def read(self) -> ThermalReading:
        chips: dict[str, dict] = {}
        skipped: dict[str, str] = {}
        for chip in self._chips:
            try:
                chips[chip.name] = {"temperature_c": int(read_sensor_file(chip / "temp")) / 1000.0}
            except (OSError, ValueError) as exc:
                skipped[chip.name] = f"{type(exc).__name__}: {exc}"
                continue
            trips = [_read_text(chip / f"trip_point{i}_temp") for i in range(3)]
            if all(t is not None and t.lstrip("-").isdigit() for t in trips):
                chips[chip.name]["trip_points_c"] = [int(t) / 1000.0 for t in trips]
        hottest = max(chips, key=lambda c: chips[c]["temperature_c"], default=None)
        return ThermalReading(None, chips[hottest]["temperature_c"] if hottest else None, self.source,
                              {"tpus": chips, "skipped": skipped, "hottest": hottest})


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


__all__ = ["LEVELS", "SENSOR_READ_BYTES", "ThermalReading", "ThermalSensor", "LinuxThermalZones", "EdgeTpuTemperature",
           "RaspberryPiThrottled", "PushedThermalState"]
