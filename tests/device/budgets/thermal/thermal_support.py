"""Helpers of the thermal tests: fake sysfs zones, a governor on a fake clock, the fixed actions they use."""

from __future__ import annotations

from pathlib import Path

from edgesdk.budgets.thermal import LinuxThermalZones, ThermalActions, ThermalGovernor
from support import FakeClock



FIXED = ThermalActions(warm={"threads": "half", "min_interval_ms": 20},
                       hot={"threads": 1, "min_interval_ms": 100, "prefer": "lower_power"})


def zone(root: Path, n: int, kind: str, temp: int | str | None) -> Path:
    """``root/class/thermal/thermal_zone<n>`` with a type and a temp (millidegrees; text as given; None: no file)."""
    path = root / "class" / "thermal" / f"thermal_zone{n}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "type").write_text(kind + "\n")
    if temp is not None:
        (path / "temp").write_text(f"{temp}\n")
    return path


def set_temp(root: Path, celsius: float, n: int = 0) -> None:
    (root / "class" / "thermal" / f"thermal_zone{n}" / "temp").write_text(f"{round(celsius * 1000)}\n")


def governor(root: Path, clock: FakeClock, **options) -> ThermalGovernor:
    options = {"warm_c": 70.0, "hot_c": 80.0, "critical_c": 90.0, "actions": FIXED, "max_threads": 4, **options}
    return ThermalGovernor(LinuxThermalZones(root), clock=clock, sleep=clock.sleep, **options)
