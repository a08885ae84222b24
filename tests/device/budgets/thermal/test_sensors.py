"""Thermal sensors: Linux zones on fake sysfs trees, pushed platform state (Android, Apple), the Raspberry Pi
throttle bits, the Edge TPU, and the simulated device. Clocks are fake."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import time

import pytest

from edgesdk.errors import BudgetExceeded, InputError
from edgesdk.runtime.profiles import load_profile
from edgesdk.budgets.thermal.simulated_device import SimulatedThermalDevice
from edgesdk.budgets.thermal import (LinuxThermalZones, PushedThermalState, RaspberryPiThrottled, ThermalGovernor,
                             ThermalReading)
from support import FakeClock
from thermal_support import FIXED, set_temp, zone


# -- Linux thermal zones ---------------------------------------------------------------------------------

def test_zones_read_millidegrees_and_report_the_hottest(tmp_path):
    zone(tmp_path, 0, "cpu-thermal", 45000)
    zone(tmp_path, 1, "gpu-thermal", 61500)
    zone(tmp_path, 2, "battery", 38250)
    reading = LinuxThermalZones(tmp_path).read()
    assert reading.temperature_c == 61.5
    assert reading.level_hint is None
    assert "3 zones" in reading.source and str(tmp_path) in reading.source
    assert reading.detail["hottest"] == "thermal_zone1"
    assert reading.detail["zones"]["thermal_zone2"] == {"type": "battery", "temperature_c": 38.25}


def test_zone_type_filter_keeps_matching_zones(tmp_path):
    zone(tmp_path, 0, "cpu-thermal", 45000)
    zone(tmp_path, 1, "SoC-Thermal", 52000)
    zone(tmp_path, 2, "battery", 70000)
    sensor = LinuxThermalZones(tmp_path, zone_types=("cpu", "soc"))
    assert sensor.read().temperature_c == 52.0
    assert "2 zones" in sensor.source
    with pytest.raises(InputError, match=r"no thermal zone .* has a type containing gpu .*thermal_zone2=battery"):
        LinuxThermalZones(tmp_path, zone_types=["gpu"])


def test_unreadable_zones_are_skipped(tmp_path):
    zone(tmp_path, 0, "cpu-thermal", 47000)
    zone(tmp_path, 1, "gpu-thermal", None)           # no temp file
    zone(tmp_path, 2, "modem", "N/A")                 # not a number
    zone(tmp_path, 10, "ddr-thermal", 51000)          # numbered past 9: still found
    reading = LinuxThermalZones(tmp_path).read()
    assert reading.temperature_c == 51.0
    assert set(reading.detail["skipped"]) == {"thermal_zone1", "thermal_zone2"}
    assert "ValueError" in reading.detail["skipped"]["thermal_zone2"]
    set_temp(tmp_path, 0)
    (tmp_path / "class/thermal/thermal_zone0/temp").unlink()
    (tmp_path / "class/thermal/thermal_zone10/temp").unlink()
    assert LinuxThermalZones(tmp_path).read().temperature_c is None


def test_root_without_zones_is_refused(tmp_path):
    with pytest.raises(InputError, match="no thermal zones under .*class/thermal"):
        LinuxThermalZones(tmp_path)
    with pytest.raises(InputError, match="must be laid out like /sys"):
        LinuxThermalZones(tmp_path / "missing")


# -- pushed platform state --------------------------------------------------------------------------------

@pytest.mark.parametrize("status, level", [(0, "nominal"), (1, "warm"), (2, "warm"), (3, "hot"), (4, "critical"),
                                           (5, "critical"), (6, "critical")])
def test_android_status_maps_to_levels(status, level):
    state = PushedThermalState()
    state.push_android_status(status)
    reading = state.read()
    assert reading.level_hint == level and reading.source == "android" and reading.temperature_c is None


def test_android_headroom_maps_with_hysteresis():
    state = PushedThermalState()
    levels = []
    for headroom in (0.5, 0.8, 1.0, 1.3, 0.97, 0.94, 0.72, 0.69):
        state.push_android_headroom(headroom)
        levels.append(state.read().level_hint)
    assert levels == ["nominal", "warm", "hot", "hot", "hot", "warm", "warm", "nominal"]
    assert state.read().detail["android_headroom"] == 0.69
    state.push_android_headroom(math.nan)  # Android's answer when asked too often
    assert state.read().level_hint is None


@pytest.mark.parametrize("apple, level", [("nominal", "nominal"), ("fair", "warm"), ("serious", "hot"),
                                          ("Critical", "critical")])
def test_apple_state_maps_to_levels(apple, level):
    state = PushedThermalState()
    state.push_apple_state(apple)
    assert state.read().level_hint == level and state.read().source == "apple"


def test_pushed_state_takes_the_most_severe_and_refuses_bad_values():
    state = PushedThermalState()
    assert state.read() == ThermalReading(None, None, "pushed (nothing pushed yet)", {})
    state.push_android_status(1)
    state.push_android_headroom(1.1)
    assert state.read().level_hint == "hot"
    assert state.read().detail == {"android_status": "1 LIGHT", "android_headroom": 1.1}
    with pytest.raises(InputError, match=r"0 \(NONE\) .. 6 \(SHUTDOWN\), got 7"):
        state.push_android_status(7)
    with pytest.raises(InputError, match="must be a number >= 0"):
        state.push_android_headroom(-0.1)
    with pytest.raises(InputError, match="nominal, fair, serious, critical, got 'hot'"):
        state.push_apple_state("hot")


def test_governor_uses_pushed_levels_as_given():
    clock = FakeClock()
    state = PushedThermalState()
    gov = ThermalGovernor(state, clock=clock, sleep=clock.sleep)
    state.push_android_status(3)
    assert gov.poll() == "hot"
    state.push_android_status(0)
    clock.t += 0.5
    assert gov.poll() == "nominal"  # no temperature hysteresis on a platform's own level
    state.push_apple_state("critical")
    clock.t += 0.5
    with pytest.raises(BudgetExceeded, match=r"critical \(android\+apple reports level critical\); local inference "
                                             "is refused until it reports a lower level") as caught:
        gov.before_inference()
    assert (caught.value.needed, caught.value.available) == (None, None)


# -- Raspberry Pi ------------------------------------------------------------------------------------------

def vcgencmd(throttled: str, temp: str = "temp=55.0'C"):
    calls = []

    def run(subcommand):
        calls.append(subcommand)
        return {"get_throttled": f"throttled={throttled}\n", "measure_temp": temp + "\n"}[subcommand]
    run.calls = calls
    return run


@pytest.mark.parametrize("flags, level, now", [
    ("0x0", "nominal", []),
    ("0x1", "nominal", ["under-voltage"]),
    ("0x2", "warm", ["arm frequency capped"]),
    ("0x8", "warm", ["soft temperature limit active"]),
    ("0x4", "hot", ["currently throttled"]),
    ("0xe", "hot", ["arm frequency capped", "currently throttled", "soft temperature limit active"]),
    ("0x50000", "nominal", []),  # throttled and under-voltage since boot, not now
])
def test_raspberry_pi_throttled_bits(flags, level, now):
    command = vcgencmd(flags)
    reading = RaspberryPiThrottled(command).read()
    assert reading.level_hint == level and reading.detail["now"] == now
    assert reading.temperature_c == 55.0 and reading.source == "vcgencmd"
    assert command.calls == ["get_throttled", "measure_temp"]


def test_raspberry_pi_since_boot_and_failures():
    reading = RaspberryPiThrottled(vcgencmd("0x50005"), measure_temp=False).read()
    assert reading.detail["since_boot"] == ["under-voltage", "currently throttled"]
    assert reading.level_hint == "hot" and reading.temperature_c is None

    def broken(subcommand):
        raise subprocess.CalledProcessError(255, ["vcgencmd", subcommand])
    failed = RaspberryPiThrottled(broken).read()
    assert failed.level_hint is None and "CalledProcessError" in failed.detail["error"]
    garbled = RaspberryPiThrottled(vcgencmd("0x0", temp="error=1")).read()
    assert "no 'temp=' in vcgencmd output" in garbled.detail["error"]


def test_raspberry_pi_needs_vcgencmd(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(InputError, match="vcgencmd is not on PATH"):
        RaspberryPiThrottled()


def test_raspberry_pi_hint_and_temperature_take_the_worse():
    clock = FakeClock()
    gov = ThermalGovernor(RaspberryPiThrottled(vcgencmd("0x2", "temp=84.2'C")), warm_c=70, hot_c=78, critical_c=82,
                          actions=dataclasses.replace(FIXED, critical={"mode": "escalate"}), clock=clock,
                          sleep=clock.sleep)
    assert gov.poll() == "critical"  # the firmware only caps the frequency, but 84.2 C is past critical_c


# -- the simulated device --------------------------------------------------------------------------------

def test_simulated_device_heats_under_work_and_cools_toward_ambient_when_idle(tmp_path):
    clock = FakeClock()
    with SimulatedThermalDevice(tmp_path, clock=clock) as device:
        sensor = LinuxThermalZones(tmp_path)
        idle = device.steady_state_c(0.0)
        assert device.temperature_c == idle == 30.0 and sensor.read().temperature_c == 30.0
        assert "cpu-thermal" == sensor.read().detail["zones"]["thermal_zone0"]["type"]
        temps = []
        while clock.t < 10.0:  # always busy
            clock.t += 0.01
            device.record_work(0.01)
            temps.append(device.temperature_c)
        assert temps == sorted(temps) and device.temperature_c > 78.0  # past a 78 C hot limit within 10 s
        assert sensor.read().temperature_c == pytest.approx(device.temperature_c, abs=0.001)
        hot = device.temperature_c
        cooled = device.advance(clock.t + 8.0)  # idle for one tau
        assert cooled == pytest.approx(idle + (hot - idle) * math.exp(-1.0))
        assert device.advance(clock.t + 120.0) == pytest.approx(idle, abs=0.01)
        assert device.peak_c == hot
        assert sensor.read().temperature_c == pytest.approx(idle, abs=0.001)


def test_simulated_device_time_scale(tmp_path):
    clock = FakeClock()
    with SimulatedThermalDevice(tmp_path, clock=clock, time_scale=20.0, update_interval_s=1.0) as device:
        clock.t = 0.5
        assert device.now() == 10.0
        device.record_work(0.25)  # half of the real time busy: 5 simulated seconds of work
        expected = device.steady_state_c(0.5) + (30.0 - device.steady_state_c(0.5)) * math.exp(-10.0 / 8.0)
        assert device.temperature_c == pytest.approx(expected)
        start = time.perf_counter()
        device.sleep(0.2)  # simulated: 10 ms real
        assert 0.009 <= time.perf_counter() - start < 0.2


def test_simulated_device_misuse(tmp_path):
    clock = FakeClock()
    with pytest.raises(InputError, match="tau_s must be > 0"):
        SimulatedThermalDevice(tmp_path, tau_s=0, clock=clock)
    device = SimulatedThermalDevice(tmp_path, clock=clock)
    with pytest.raises(InputError, match="busy time must be >= 0"):
        device.record_work(-1.0)
    clock.t = 5.0
    device.advance()
    with pytest.raises(InputError, match="cannot advance to 1.000 s, it is already at 5.000 s"):
        device.advance(1.0)
    device.close()
    with pytest.raises(InputError, match="was closed"):
        device.advance()


def test_edge_tpu_sensor_reads_the_hottest_tpu_and_its_trip_points(tmp_path):
    from edgesdk.budgets.thermal import EdgeTpuTemperature

    for name, temp in (("apex_0", "61250"), ("apex_1", "84800"), ("apex_2", "garbage")):
        chip = tmp_path / "class" / "apex" / name
        chip.mkdir(parents=True)
        (chip / "temp").write_text(temp + "\n")
        for i, trip in enumerate((85000, 90000, 95000)):
            (chip / f"trip_point{i}_temp").write_text(f"{trip}\n")
    sensor = EdgeTpuTemperature(tmp_path)
    reading = sensor.read()
    assert reading.temperature_c == 84.8 and reading.detail["hottest"] == "apex_1"
    assert reading.detail["tpus"]["apex_0"] == {"temperature_c": 61.25, "trip_points_c": [85.0, 90.0, 95.0]}
    assert "apex_2" in reading.detail["skipped"] and reading.source.endswith("(3 TPUs)")
    gov = ThermalGovernor.from_profile(sensor, load_profile("google-coral"))
    assert gov.poll() == "warm"  # 84.8 C: below the driver's first clock step (hot, 85 C)
    with pytest.raises(InputError, match=r"no Edge TPU under .*class/apex"):
        EdgeTpuTemperature(tmp_path / "empty")
