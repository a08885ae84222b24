"""The thermal budget: sensors on fake sysfs trees and injected platform state, the governor's levels, read
interval, pacing and critical modes, and the simulated device. Clocks are fake (time is what is under test)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import threading
import time
from pathlib import Path

import pytest

from edgesdk.errors import BudgetExceeded, InputError
from edgesdk.profiles import load_profile
from edgesdk.simulated_device import SimulatedThermalDevice
from edgesdk.thermal import (LEVELS, LinuxThermalZones, PushedThermalState, RaspberryPiThrottled, ThermalActions,
                             ThermalGovernor, ThermalReading)
from support import FakeClock, fail_validation

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


@pytest.fixture
def one_zone(tmp_path) -> Path:
    zone(tmp_path, 0, "cpu-thermal", 40000)
    return tmp_path


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


# -- levels and hysteresis -------------------------------------------------------------------------------

def step(gov: ThermalGovernor, root: Path, clock: FakeClock, celsius: float) -> str:
    set_temp(root, celsius)
    clock.t += 0.5
    return gov.poll()


def test_levels_go_up_at_a_limit_and_down_only_hysteresis_below(one_zone):
    clock = FakeClock()
    gov = governor(one_zone, clock)
    seen = [step(gov, one_zone, clock, t) for t in (69.9, 70.0, 69.0, 67.5, 70.5, 67.0, 95.0, 87.5, 87.0, 77.0, 66.9)]
    assert seen == ["nominal", "warm", "warm", "warm", "warm", "nominal", "critical", "critical", "hot", "warm",
                    "nominal"]
    assert [(a, b) for _, a, b in gov.changes] == [("nominal", "warm"), ("warm", "nominal"), ("nominal", "critical"),
                                                   ("critical", "hot"), ("hot", "warm"), ("warm", "nominal")]
    assert gov.changes[0][0] == 1.0  # the clock time of the read that changed the level


def test_no_flapping_around_a_limit(one_zone):
    clock = FakeClock()
    gov = governor(one_zone, clock)
    for i in range(40):
        step(gov, one_zone, clock, 80.4 if i % 2 else 79.4)  # around hot_c = 80, within the 3 C hysteresis
    assert [(a, b) for _, a, b in gov.changes] == [("nominal", "warm"), ("warm", "hot")]


def test_hysteresis_is_configurable(one_zone):
    clock = FakeClock()
    gov = governor(one_zone, clock, hysteresis_c=0.5)
    assert [step(gov, one_zone, clock, t) for t in (70.0, 69.6, 69.5)] == ["warm", "warm", "nominal"]


def test_sensor_is_read_at_most_every_read_interval(one_zone):
    class Counting:
        def __init__(self, inner):
            self.inner, self.reads = inner, 0

        def read(self):
            self.reads += 1
            return self.inner.read()

    clock = FakeClock()
    sensor = Counting(LinuxThermalZones(one_zone))
    gov = ThermalGovernor(sensor, clock=clock, sleep=clock.sleep)
    for i in range(100):  # 100 inferences over one second
        clock.t = i / 100
        gov.before_inference()
    assert sensor.reads == 2  # at 0.0 s and 0.5 s
    set_temp(one_zone, 75.0)
    clock.t = 0.99
    assert gov.poll() == "nominal"  # cached: the new temperature is not seen yet
    clock.t = 1.0
    assert gov.poll() == "warm" and sensor.reads == 3


def test_a_reading_without_temperature_or_hint_keeps_the_level(tmp_path):
    zone(tmp_path, 0, "cpu-thermal", 75000)
    clock = FakeClock()
    gov = governor(tmp_path, clock)
    assert gov.poll() == "warm"
    (tmp_path / "class/thermal/thermal_zone0/temp").write_text("garbage\n")
    clock.t += 1
    assert gov.poll() == "warm"
    assert gov.state()["temperature_c"] is None


# -- per inference: threads, pacing, critical ----------------------------------------------------------

def test_nominal_changes_nothing(one_zone):
    clock = FakeClock()
    gov = governor(one_zone, clock)
    decisions = [gov.before_inference() for _ in range(3)]
    assert clock.sleeps == []
    assert decisions[-1] == {"level": "nominal", "action": None, "actions": [], "threads": None, "prefer": None,
                             "slept_ms": 0.0, "temperature_c": 40.0}


def test_pacing_sleeps_so_inferences_start_min_interval_apart(one_zone):
    set_temp(one_zone, 72.0)
    clock = FakeClock()
    gov = governor(one_zone, clock)
    first, second, third = (gov.before_inference() for _ in range(3))
    assert first["level"] == "warm" and first["slept_ms"] == 0.0 and first["action"] == "threads_reduced"
    assert clock.sleeps == pytest.approx([0.020, 0.020])
    assert second["action"] == "paced" and second["actions"] == ["paced", "threads_reduced"]
    assert second["slept_ms"] == pytest.approx(20.0) and third["threads"] == 2  # half of max_threads=4
    clock.t += 0.5  # the app itself waited longer than the interval: no sleep
    assert gov.before_inference()["slept_ms"] == 0.0
    assert len(clock.sleeps) == 2


def test_hot_paces_harder_with_one_thread_and_prefers_lower_power(one_zone):
    set_temp(one_zone, 84.0)
    clock = FakeClock()
    gov = governor(one_zone, clock)
    gov.before_inference()
    decision = gov.before_inference()
    assert decision["level"] == "hot" and decision["threads"] == 1 and decision["prefer"] == "lower_power"
    assert decision["slept_ms"] == pytest.approx(100.0)


def test_pacing_holds_across_threads():
    class Hot:
        def read(self):
            return ThermalReading(None, 75.0, "fixed", {})

    gov = ThermalGovernor(Hot(), actions=ThermalActions(warm={"min_interval_ms": 2}))
    starts, lock = [], threading.Lock()

    def infer():
        for _ in range(10):
            gov.before_inference()
            with lock:
                starts.append(time.monotonic())

    workers = [threading.Thread(target=infer) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(starts) == 40
    assert max(starts) - min(starts) >= 39 * 0.002 * 0.99


def test_critical_refuses_with_budget_exceeded(one_zone):
    set_temp(one_zone, 95.0)
    clock = FakeClock()
    gov = governor(one_zone, clock)
    refusal = r"critical \(95.0 C from sysfs:.*critical limit 90 C\).*cools below 87 C"
    with pytest.raises(BudgetExceeded, match=refusal) as caught:
        gov.before_inference()
    assert caught.value.reason == "thermal"
    assert (caught.value.needed, caught.value.available) == (95.0, 90.0)
    assert clock.sleeps == []


def test_critical_defer_waits_until_below_hot(one_zone):
    set_temp(one_zone, 95.0)
    clock = FakeClock()
    cooling = iter([88.0, 85.0, 79.0, 76.0])  # one reading per pause of the deferral

    def sleep(seconds):
        clock.sleep(seconds)
        set_temp(one_zone, next(cooling, 76.0))

    actions = dataclasses.replace(FIXED, critical={"mode": "defer", "max_wait_s": 10})
    gov = ThermalGovernor(LinuxThermalZones(one_zone), warm_c=70, hot_c=80, critical_c=90, actions=actions,
                          max_threads=4, clock=clock, sleep=sleep)
    decision = gov.before_inference()
    assert decision["level"] == "warm" and decision["action"] == "deferred"
    assert decision["actions"][0] == "deferred"
    assert decision["slept_ms"] == pytest.approx(4 * 500.0)  # critical, critical, hot, hot; warm at the 4th pause
    assert [b for _, _, b in gov.changes] == ["critical", "hot", "warm"]


def test_critical_defer_gives_up_after_max_wait(one_zone):
    set_temp(one_zone, 95.0)
    clock = FakeClock()
    actions = dataclasses.replace(FIXED, critical={"mode": "defer", "max_wait_s": 2.0})
    gov = governor(one_zone, clock, actions=actions)
    with pytest.raises(BudgetExceeded, match=r"still critical after deferring 2.0 s \(max_wait_s 2\)") as caught:
        gov.before_inference()
    assert caught.value.reason == "thermal"
    assert sum(clock.sleeps) == pytest.approx(2.0)


def test_critical_defer_counts_hot_as_not_cooled_yet(one_zone):
    set_temp(one_zone, 95.0)
    clock = FakeClock()

    def sleep(seconds):
        clock.sleep(seconds)
        set_temp(one_zone, 84.0)  # cools to hot at once, never below it

    actions = dataclasses.replace(FIXED, critical={"mode": "defer", "max_wait_s": 2.0})
    gov = ThermalGovernor(LinuxThermalZones(one_zone), warm_c=70, hot_c=80, critical_c=90, actions=actions,
                          clock=clock, sleep=sleep)
    with pytest.raises(BudgetExceeded, match=r"the device is hot \(84.0 C from sysfs:.*\); still hot after deferring"):
        gov.before_inference()
    assert sum(clock.sleeps) == pytest.approx(2.0)
    clock.t += 1.0
    assert gov.before_inference()["level"] == "hot"  # a new inference at hot is served (paced), not deferred


def test_critical_escalate_is_a_decision_not_an_error(one_zone):
    set_temp(one_zone, 95.0)
    clock = FakeClock()
    gov = governor(one_zone, clock, actions=dataclasses.replace(FIXED, critical={"mode": "escalate"}))
    decision = gov.before_inference()
    assert decision["level"] == "critical" and decision["action"] == "escalate" and decision["slept_ms"] == 0.0


def test_adaptive_pacing_holds_the_simulated_device_below_hot(tmp_path):
    """Sustained work (2 ms simulated per inference) under the default actions: the temperature is held below hot
    with one level change, at no less than 80% of the best constant rate the device's model allows."""
    clock = FakeClock()
    limits = load_profile("raspberry-pi-5").thermal  # 70 / 78 / 82
    with SimulatedThermalDevice(tmp_path, clock=clock) as device:
        gov = ThermalGovernor(LinuxThermalZones(tmp_path), **limits, clock=clock, sleep=clock.sleep)
        count = paced = 0
        while clock.t < 120.0:
            paced += gov.before_inference()["action"] == "paced"
            clock.t += 0.002
            device.record_work(0.002)
            count += 1
        best_rate = device.duty_for(limits["hot_c"]) / 0.002
        assert device.peak_c <= limits["hot_c"]
        assert count / 120.0 >= 0.8 * best_rate
        assert [(a, b) for _, a, b in gov.changes] == [("nominal", "warm")]
        assert paced > count / 2
        assert gov.state()["pacing_ms"] > 2.0


class NoisySensor:
    """A real sensor whose readings get seeded Gaussian noise and a 1 C resolution, as cheap SoC sensors have."""

    def __init__(self, inner, noise_c: float, seed: int = 0):
        import random

        self.inner, self.noise_c, self.rng = inner, noise_c, random.Random(seed)

    def read(self) -> ThermalReading:
        reading = self.inner.read()
        noisy = round(reading.temperature_c + self.rng.gauss(0.0, self.noise_c))
        return ThermalReading(None, float(noisy), reading.source, reading.detail)


@pytest.mark.parametrize("tau_s, work_s", [(2.0, 0.002), (3.0, 0.02), (20.0, 0.0002)])
def test_adaptive_pacing_holds_fast_and_slow_noisy_devices(tmp_path, tau_s, work_s):
    """A device that heats in seconds and one that takes a minute, read through a noisy 1 C sensor, with the work
    per inference varying by a third: below hot, at most one level change, at least 85% of the best constant rate."""
    import random

    rng = random.Random(1)
    clock = FakeClock()
    limits = load_profile("raspberry-pi-5").thermal  # 70 / 78 / 82
    with SimulatedThermalDevice(tmp_path, clock=clock, tau_s=tau_s) as device:
        gov = ThermalGovernor(NoisySensor(LinuxThermalZones(tmp_path), 0.4), **limits, clock=clock, sleep=clock.sleep)
        count = 0
        while clock.t < 180.0:
            gov.before_inference()
            work = work_s * (1.0 + rng.uniform(-1 / 3, 1 / 3))
            clock.t += work
            device.record_work(work)
            count += 1
        best_rate = device.duty_for(limits["hot_c"]) / work_s
        assert device.peak_c <= limits["hot_c"]
        assert [(a, b) for _, a, b in gov.changes] == [("nominal", "warm")]
        assert count / 180.0 >= 0.85 * best_rate


def test_a_limit_cut_at_hot_survives_the_return_to_warm(one_zone):
    """Regression: hot's fixed 100 ms pacing keeps the app well below the adaptive limit; the limit used to be
    dropped as 'not binding' then, so the app came back to warm at full speed and flapped between warm and hot."""
    clock = FakeClock()
    gov = ThermalGovernor(LinuxThermalZones(one_zone), warm_c=70, hot_c=80, critical_c=90, clock=clock,
                          sleep=clock.sleep)

    def infer_for(seconds: float, celsius: float) -> None:
        set_temp(one_zone, celsius)
        end = clock.t + seconds
        while clock.t < end:
            gov.before_inference()
            clock.t += 0.001  # 1 ms of work: 1000/s when not paced

    infer_for(1.0, 60.0)
    infer_for(1.0, 76.0)  # warm and steady below hold_c (77): no limit yet
    infer_for(0.6, 84.0)  # hot: cut at once, and the fixed 100 ms pacing applies
    assert gov.level == "hot"
    limit_at_hot = gov._rate_limit
    assert limit_at_hot is not None and limit_at_hot <= 500.0
    infer_for(2.0, 74.0)  # cooled: warm again; the app ran at ~10/s under hot's pacing, far below the limit
    assert gov.level == "warm"
    # kept, and loosened by at most 5% a read (four reads at warm): not back at full speed
    assert gov._rate_limit is not None and gov._rate_limit <= 1.05 ** 4 * limit_at_hot * 1.001
    assert gov.plan.interval_s >= 1.0 / (1.05 ** 4 * limit_at_hot * 1.001) > 0.001


def heat_to_a_limit(one_zone) -> tuple[ThermalGovernor, FakeClock]:
    """A governor whose temperature rose fast to 79 C (warm; hot is 80), so that it set a rate limit."""
    clock = FakeClock()
    gov = ThermalGovernor(LinuxThermalZones(one_zone), warm_c=70, hot_c=80, critical_c=90, clock=clock,
                          sleep=clock.sleep)
    set_temp(one_zone, 60.0)
    for celsius in (60.0, 65.0, 72.0, 79.0):
        set_temp(one_zone, celsius)
        end = clock.t + 0.5
        while clock.t < end:
            gov.before_inference()
            clock.t += 0.001
    assert gov.level == "warm" and gov._rate_limit is not None
    return gov, clock


def test_the_limit_carries_down_to_nominal_and_is_loosened_until_it_no_longer_binds(one_zone):
    gov, clock = heat_to_a_limit(one_zone)
    set_temp(one_zone, 66.0)  # nominal (below 70 - 3), but not clearly cool (above 70 - 2 x 3)
    limits = []
    for _ in range(60):
        end = clock.t + 0.5
        while clock.t < end:
            decision = gov.before_inference()
            clock.t += 0.001
        limits.append(gov._rate_limit)
    assert gov.level == "nominal"
    loosening = [limit for limit in limits if limit is not None]
    assert len(loosening) >= 2 and loosening == sorted(loosening)  # only loosened at nominal
    assert limits[-1] is None and decision["action"] is None  # dropped once the app no longer needs it


def test_a_carried_limit_is_dropped_once_clearly_cool_or_idle(one_zone):
    gov, clock = heat_to_a_limit(one_zone)
    set_temp(one_zone, 62.0)  # more than two hysteresis steps below warm
    for _ in range(2):
        clock.t += 0.5
        gov.before_inference()
    assert gov.level == "nominal" and gov._rate_limit is None

    gov, clock = heat_to_a_limit(one_zone)
    set_temp(one_zone, 76.0)  # still warm, forecast below hold_c (77): the app just stops for a while
    for _ in range(12):
        clock.t += 0.5
        gov.poll()
    assert gov._rate_limit is None  # an idle app is not held back by anything
    assert gov.before_inference()["slept_ms"] == 0.0


def test_hot_fixed_pacing_does_not_wind_the_limit_down(one_zone):
    """Regression: at hot the 100 ms fixed pacing holds the app; cutting the adaptive limit every read then had
    no effect but wound it down until fewer than two inferences started per read, and it stuck there for good."""
    gov, clock = heat_to_a_limit(one_zone)
    set_temp(one_zone, 82.0)
    end = clock.t + 30.0
    while clock.t < end:
        gov.before_inference()
        clock.t += 0.001
    assert gov.level == "hot"
    at_hot = gov._rate_limit
    assert at_hot is not None and at_hot > 100.0  # halved on entering hot, then left alone: not ~2/s
    set_temp(one_zone, 60.0)
    count, end = 0, clock.t + 10.0
    while clock.t < end:
        gov.before_inference()
        clock.t += 0.001
        count += 1
    assert gov.level == "nominal" and gov._rate_limit is None and count > 9000  # back to full speed


def test_a_cut_follows_the_first_order_model(one_zone):
    """The limit is scaled so that the forecast would land on hold_c, taking the rise above the coolest temperature
    as proportional to the rate: 40 C idle, hold 77 C, forecast 77 + 37 = 114 C -> half the rate."""
    clock = FakeClock()
    gov = ThermalGovernor(LinuxThermalZones(one_zone), warm_c=70, hot_c=80, critical_c=90, clock=clock,
                          sleep=clock.sleep)
    for celsius in (40.0, 40.0, 40.0):
        set_temp(one_zone, celsius)
        clock.t += 0.5
        gov.poll()
    assert gov._coolest == 40.0
    set_temp(one_zone, 71.0)  # warm; the slope alone is 62 C/s: the forecast is far above hold_c
    assert gov._scale(77.0 + 37.0) == pytest.approx(0.5)
    assert gov._scale(77.0 + 3.7) == pytest.approx(37.0 / 40.7)
    assert gov._scale(77.0 - 10.0) == pytest.approx(1.05)  # loosening is capped at 5% a read
    set_temp(one_zone, 25.0)  # one low glitch does not move the idle estimate (median of three reads)
    clock.t += 0.5
    gov.poll()
    assert gov._coolest == 40.0


def test_plan_is_shared_between_reads_and_admit_reports_pacing(one_zone):
    set_temp(one_zone, 72.0)
    clock = FakeClock()
    gov = governor(one_zone, clock)
    first = gov.admit()
    second = gov.admit()
    assert first[0] is second[0] and first[0].level == "warm" and first[0].threads == 2
    assert (first[1], second[1]) == (0.0, pytest.approx(0.020)) and second[2] == 0.0
    clock.t += 0.6  # a read is due: a new plan
    assert gov.admit()[0] is not first[0]


def test_fixed_pacing_alone_lets_a_fast_device_pass_hot(tmp_path):
    """Why adaptive pacing is the default: with nothing slowing the heating between warm and hot, the temperature
    overshoots the hot limit before the next read and flaps between warm and hot."""
    clock = FakeClock()
    with SimulatedThermalDevice(tmp_path, clock=clock) as device:
        unpaced_warm = ThermalActions(warm={"threads": "half"},
                                      hot={"threads": 1, "min_interval_ms": 100, "prefer": "lower_power"})
        gov = ThermalGovernor(LinuxThermalZones(tmp_path), warm_c=70, hot_c=78, critical_c=82, actions=unpaced_warm,
                              clock=clock, sleep=clock.sleep)
        while clock.t < 60.0:
            gov.before_inference()
            clock.t += 0.002
            device.record_work(0.002)
        assert device.peak_c > 78
        assert len(gov.changes) > 5


def test_state_is_json_ready(one_zone):
    clock = FakeClock(10.0)
    gov = governor(one_zone, clock)
    assert gov.state()["level"] == "nominal" and gov.state()["temperature_c"] is None
    gov.poll()
    state = json.loads(json.dumps(gov.state()))
    assert state["level"] == "nominal" and state["temperature_c"] == 40.0
    assert state["source"].startswith("sysfs:")
    assert state["thresholds"] == {"warm_c": 70.0, "hot_c": 80.0, "critical_c": 90.0, "hysteresis_c": 3.0,
                                   "hold_c": 77.0}
    assert state["last_read"] == 10.0 and state["critical_mode"] == "refuse"


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


# -- configuration -----------------------------------------------------------------------------------------

def test_from_profile_takes_the_thresholds(one_zone):
    profile = load_profile("raspberry-pi-5")
    gov = ThermalGovernor.from_profile(LinuxThermalZones(one_zone), profile)
    assert gov.limits == {"warm": 70.0, "hot": 78.0, "critical": 82.0}
    assert gov.max_threads == (profile.threads or gov.max_threads)
    assert ThermalGovernor.from_profile(LinuxThermalZones(one_zone), profile, hysteresis_c=1.0).hold_c == 77.0
    with pytest.raises(InputError, match="'raspberry-pi-5' sets no \\[thermal\\] limits"):
        ThermalGovernor.from_profile(LinuxThermalZones(one_zone), dataclasses.replace(profile, thermal={}))


@pytest.mark.parametrize("options, message", [
    ({"warm_c": 80.0, "hot_c": 80.0}, "limits must rise, warm_c < hot_c < critical_c, got 80.0 / 80.0 / 90.0"),
    ({"hysteresis_c": -1.0}, "must be >= 0"),
    ({"hold_c": 85.0}, r"hold_c must be a number below hot_c \(80.0\)"),
    ({"max_threads": 0}, "max_threads must be an integer >= 1"),
    ({"critical_c": "hot"}, "critical_c must be a number, got 'hot'"),
])
def test_governor_misuse(one_zone, options, message):
    with pytest.raises(InputError, match=message):
        ThermalGovernor(LinuxThermalZones(one_zone), **{"warm_c": 70.0, "hot_c": 80.0, "critical_c": 90.0,
                                                        **options})


@pytest.mark.parametrize("actions, message", [
    ({"warm": {"thread": 2}}, "warm has unknown key 'thread' \\(known: threads, min_interval_ms, adaptive, prefer\\)"),
    ({"hot": {"threads": 0}}, "hot threads must be an integer >= 1, 'half' or None, got 0"),
    ({"warm": {"min_interval_ms": -5}}, "warm min_interval_ms must be a number >= 0"),
    ({"hot": {"prefer": "fast"}}, "prefer must be 'lower_power' or None"),
    ({"critical": {"mode": "ignore"}}, "critical mode 'ignore' is not one of refuse, defer, escalate"),
])
def test_actions_misuse(actions, message):
    with pytest.raises(InputError, match=message):
        ThermalActions(**actions)


def test_bad_level_hint_from_a_sensor_is_named():
    class Odd:
        def read(self):
            return ThermalReading("scorching", None, "odd-sensor", {})

    with pytest.raises(InputError, match=f"odd-sensor gave level 'scorching'; levels are {', '.join(LEVELS)}"):
        ThermalGovernor(Odd()).poll()


# -- the governor driving a real model -------------------------------------------------------------------

def test_hot_device_switches_a_float_model_to_int8_with_fewer_threads_and_back(digits_bundle, tmp_path):
    """The governor's decisions are carried out by Model.predict, and the result says what changed."""
    import edgesdk
    from edgesdk import Bundle
    from edgesdk.thermal import LinuxThermalZones, ThermalGovernor

    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    temp = zone / "temp"
    temp.write_text("40000\n")
    slept = []
    governor = ThermalGovernor(LinuxThermalZones(tmp_path / "sys"), warm_c=70, hot_c=78, critical_c=90,
                               min_read_interval_s=0.0, max_threads=2, sleep=slept.append)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-fp32",
                      thermal=governor) as model:
        cool = model.predict(x)
        assert cool.budget["thermal"]["level"] == "nominal" and cool.budget["action"] is None
        assert cool.budget["thermal"]["artifact_now"] == "onnxruntime-fp32"

        temp.write_text("80000\n")  # hot
        hot = model.predict(x)
        assert hot.budget["thermal"]["level"] == "hot"
        assert hot.budget["action"] == "artifact_switched"
        assert "threads_reduced" in hot.budget["thermal"]["actions"]
        assert hot.budget["thermal"]["artifact_now"] == "onnxruntime-int8"
        assert hot.budget["thermal"]["threads_now"] == 1
        assert model._engine.model_path.name == "model_int8.onnx"  # really switched
        assert int(hot.outputs[0].argmax()) == int(cool.outputs[0].argmax())

        temp.write_text("40000\n")  # cooled well below hot - hysteresis
        back = model.predict(x)
        assert back.budget["thermal"]["level"] == "nominal"
        # the adaptive rate limit may still pace for a moment; nothing else stays changed
        assert back.budget["action"] in (None, "paced")
        assert not {"artifact_switched", "threads_reduced"} & set(back.budget["thermal"]["actions"])
        assert back.budget["thermal"]["artifact_now"] == "onnxruntime-fp32"
        assert model._engine.model_path.name == "model_fp32.onnx"


def test_a_sustained_predict_loop_under_the_governor_holds_the_simulated_device(digits_bundle, tmp_path):
    """The production path: load(..., thermal=governor), then model.predict in a loop. Each call counts as 2 ms of
    simulated work on a fake clock, so the run is deterministic whatever this machine's load."""
    import edgesdk
    from edgesdk import Bundle

    clock = FakeClock()
    limits = load_profile("raspberry-pi-5").thermal
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with SimulatedThermalDevice(tmp_path, clock=clock) as device:
        gov = ThermalGovernor(LinuxThermalZones(tmp_path), **limits, max_threads=2, clock=clock, sleep=clock.sleep)
        with edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-int8",
                          thermal=gov) as model:
            results, actions = [], set()
            while clock.t < 60.0:
                result = model.predict(x)
                actions.add(result.budget["action"])
                results.append(result)
                clock.t += 0.002
                device.record_work(0.002)
    assert device.peak_c <= limits["hot_c"]
    assert len(results) / 60.0 >= 0.8 * device.duty_for(limits["hot_c"]) / 0.002
    assert [(a, b) for _, a, b in gov.changes] == [("nominal", "warm")]
    assert "paced" in actions
    paced = next(r for r in results if r.budget["action"] == "paced")
    assert paced.budget["thermal"]["slept_ms"] > 0 and paced.budget["thermal"]["level"] == "warm"
    assert paced.budget["thermal"]["actions"][0] == "paced"
    # Results made under one plan share no mutable part: their budget entries are read-only.
    a, b = results[-2].budget, results[-1].budget
    with pytest.raises(TypeError, match="read-only"):
        a["thermal"]["actions"].append("mutated")
    with pytest.raises(TypeError, match="read-only"):
        a["thermal"]["slept_ms"] = 0.0
    assert "mutated" not in b["thermal"]["actions"]


# -- lower-power backend at hot ------------------------------------------------------------------------------

def test_lower_power_is_an_npu_or_a_lower_precision_on_the_same_kind():
    from edgesdk.placement import Candidate
    from edgesdk.thermal.serving import lower_power

    cpu32 = Candidate("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-fp32", "fp32")
    cpu8 = Candidate("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-int8", "int8")
    lite8 = Candidate("litert", "CPU", "CPU", "litert-int8", "int8")
    gpu16 = Candidate("litert", "GPU", "GPU", "litert-fp16", "fp16")
    npu32 = Candidate("fake-npu", "NPU", "NPU", "onnxruntime-fp32", "fp32")
    npu8 = Candidate("fake-npu", "NPU", "NPU", "onnxruntime-int8", "int8")
    assert lower_power(cpu32, [cpu32, lite8, cpu8]) == cpu8  # a tie keeps the engine
    lite32 = Candidate("litert", "CPU", "CPU", "litert-fp32", "fp32")
    ov8 = Candidate("openvino", "CPU", "CPU", "openvino-int8", "int8")
    assert lower_power(lite32, [ov8, lite8]) == lite8
    assert lower_power(cpu32, [ov8, lite8]) == ov8  # then the policy's order
    assert lower_power(cpu32, [cpu8, npu32, npu8]) == npu8
    assert lower_power(cpu8, [cpu32, lite8]) is None  # nothing ranks below: stay
    assert lower_power(gpu16, [cpu32, cpu8]) is None  # CPU and GPU are not traded: which draws less depends
    assert lower_power(cpu8, [gpu16]) is None
    gpu8 = Candidate("litert", "GPU", "GPU", "litert-int8", "int8")
    assert lower_power(gpu16, [cpu8, gpu8, npu32]) == npu32  # an NPU first, then a lower precision
    assert lower_power(gpu16, [cpu8, gpu8]) == gpu8
    assert lower_power(npu8, [cpu8, npu32]) is None


@pytest.fixture
def fake_npu():
    """The fake NPU (hardware this machine lacks; computes with onnxruntime on the CPU), for one test."""
    from edgesdk.engines import register_backend, unregister_backend
    from fakes import NAME, FakeNPUEngine

    register_backend(NAME, FakeNPUEngine)
    yield FakeNPUEngine
    FakeNPUEngine.broken = False
    unregister_backend(NAME)


def hot_zone(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    zone(root, 0, "cpu-thermal", 40000)
    return root


@pytest.fixture
def engine_log(monkeypatch, fake_npu):
    """Counts fake-NPU opens and closes and numerics checks, by engine and artifact."""
    from edgesdk import numerics

    log = {"opened": 0, "closed": 0, "checked": []}
    real_init, real_close, real_check = fake_npu.__init__, fake_npu.close, numerics.check

    def init(self, *args, **kwargs):
        log["opened"] += 1
        real_init(self, *args, **kwargs)

    def close(self):
        log["closed"] += 1
        real_close(self)

    def check(engine, bundle, artifact_id):
        log["checked"].append((type(engine).__name__, artifact_id))
        return real_check(engine, bundle, artifact_id)

    monkeypatch.setattr(fake_npu, "__init__", init)
    monkeypatch.setattr(fake_npu, "close", close)
    monkeypatch.setattr(numerics, "check", check)
    return log


def hot_governor(root: Path) -> ThermalGovernor:
    return ThermalGovernor(LinuxThermalZones(root), warm_c=70, hot_c=78, critical_c=90, min_read_interval_s=0.0,
                           max_threads=2, sleep=lambda s: None)


def test_hot_moves_a_cpu_model_to_the_npu_and_back(digits_bundle, tmp_path, engine_log):
    import edgesdk
    from edgesdk import Bundle

    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    # An explicit engine goes first; the other candidates (the fake NPU among them) stay as alternatives.
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8",
                      thermal=hot_governor(root)) as model:
        cool = model.predict(x)
        assert cool.placement.kind == "CPU" and cool.placement.engine == "onnxruntime"
        assert cool.budget["thermal"]["backend_now"] == "onnxruntime:CPUExecutionProvider:onnxruntime-int8"
        checks_at_load = len(engine_log["checked"])

        set_temp(root, 80.0)
        hot = model.predict(x)
        assert hot.budget["action"] == "artifact_switched"
        assert hot.placement.engine == "fake-npu" and hot.placement.kind == "NPU"
        assert hot.placement.executing == ["NPU"] and hot.placement.numerics["checked"]
        assert engine_log["checked"][checks_at_load:] == [("FakeNPUEngine", "onnxruntime-int8")]  # checked there
        assert hot.budget["thermal"]["backend_now"].startswith("fake-npu:NPU:")
        assert model.placement.engine == "onnxruntime"  # where load put it: unchanged
        assert int(hot.outputs[0].argmax()) == int(cool.outputs[0].argmax())
        # A result's budget entry is a value: read-only, the memory part included, so no result can change another's
        # or the model's.
        again = model.predict(x)
        assert again.budget["memory"] == hot.budget["memory"] == model.budget["memory"]
        with pytest.raises(TypeError, match="read-only"):
            hot.budget["memory"]["model_mb"] = 0.0

        set_temp(root, 40.0)
        back = model.predict(x)
        assert back.placement.engine == "onnxruntime" and back.placement.kind == "CPU"
        assert "artifact_switched" not in back.budget["thermal"]["actions"]
        assert engine_log["opened"] == engine_log["closed"] == 1  # the NPU engine was closed on the way back


def test_a_lower_power_backend_that_fails_its_numerics_is_not_used(digits_bundle, tmp_path, fake_npu, engine_log):
    import edgesdk
    from edgesdk import Bundle

    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8",
                      thermal=hot_governor(root)) as model:
        model.predict(x)
        fake_npu.broken = True  # the NPU delegate now returns wrong numbers
        set_temp(root, 80.0)
        results = [model.predict(x) for _ in range(5)]
        assert all(r.placement.engine == "onnxruntime" for r in results)
        assert all("artifact_switched" not in r.budget["thermal"]["actions"] for r in results)
        assert results[0].budget["thermal"]["level"] == "hot"
        # Hot still cuts the threads, on the backend in use.
        last = results[-1].budget["thermal"]
        assert last["threads_now"] == 1 and "threads_reduced" in last["actions"]
        assert engine_log["opened"] == 1 and engine_log["closed"] == 1  # tried once, and not left open


def test_a_failed_switch_is_tried_again_later(digits_bundle, tmp_path, fake_npu, engine_log, monkeypatch):
    import edgesdk
    from edgesdk import Bundle
    from edgesdk.thermal import serving

    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8",
                      thermal=hot_governor(root)) as model:
        fake_npu.broken = True
        set_temp(root, 80.0)
        assert model.predict(x).placement.engine == "onnxruntime"
        fake_npu.broken = False  # the delegate recovers
        assert model.predict(x).placement.engine == "onnxruntime"  # not retried at once
        monkeypatch.setattr(serving, "RETRY_AFTER_S", 0.0)
        assert model.predict(x).placement.engine == "fake-npu"


def test_a_switch_follows_check_numerics_and_a_failing_check_leaks_nothing(digits_bundle, tmp_path, engine_log):
    """A bundle loaded with check_numerics=False switches unchecked; an error in the check never leaks an engine."""
    import edgesdk
    from edgesdk import Bundle
    from edgesdk import numerics

    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8", check_numerics=False,
                      thermal=hot_governor(root)) as model:
        set_temp(root, 80.0)
        hot = model.predict(x)
        assert hot.placement.engine == "fake-npu" and hot.placement.numerics == {
            "checked": False, "why": "turned off (check_numerics=False)"}

    def broken_check(engine, bundle, artifact_id):
        raise ValueError("golden.npz is unreadable")

    set_temp(root, 40.0)
    opened, closed = engine_log["opened"], engine_log["closed"]
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8",
                      thermal=hot_governor(root)) as model:
        numerics.check = broken_check  # undone by engine_log's monkeypatch
        set_temp(root, 80.0)
        results = [model.predict(x) for _ in range(3)]
        assert all(r.placement.engine == "onnxruntime" for r in results)
    assert engine_log["opened"] - opened == 1 and engine_log["closed"] - closed == 1


def test_a_switch_under_isolate_probes_the_new_backend_first_once(digits_bundle, tmp_path, monkeypatch):
    """isolate=True holds for the thermal switch as for load: a backend is opened here only after a child process
    opened and ran it, once per backend (load probed the first); a failed probe keeps the model where it is."""
    import edgesdk
    from edgesdk import BackendUnavailable, Bundle, isolate

    probed, refuse = [], set()
    real_probe = isolate.probe

    def spy(bundle, artifact_id, engine, options, **kwargs):
        probed.append(artifact_id)
        if artifact_id in refuse:  # stands in for a child that crashed: the real probe is tested in test_isolate
            raise BackendUnavailable("isolated_probe_failed", f"{artifact_id}: the child was killed by SIGSEGV")
        return real_probe(bundle, artifact_id, engine, options, **kwargs)

    monkeypatch.setattr(isolate, "probe", spy)
    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-fp32", isolate=True,
                      thermal=hot_governor(root)) as model:
        assert probed == ["onnxruntime-fp32"]
        set_temp(root, 80.0)
        assert model.predict(x).budget["thermal"]["artifact_now"] == "onnxruntime-int8"
        set_temp(root, 40.0)
        assert model.predict(x).budget["thermal"]["artifact_now"] == "onnxruntime-fp32"
        set_temp(root, 80.0)
        assert model.predict(x).budget["thermal"]["artifact_now"] == "onnxruntime-int8"
        assert probed == ["onnxruntime-fp32", "onnxruntime-int8"]  # each backend once

    probed.clear()
    refuse.add("onnxruntime-int8")
    set_temp(root, 40.0)
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-fp32", isolate=True,
                      thermal=hot_governor(root)) as model:
        set_temp(root, 80.0)
        hot = model.predict(x)
        assert hot.budget["thermal"]["artifact_now"] == "onnxruntime-fp32" and hot.placement.numerics["checked"]
        assert "artifact_switched" not in hot.budget["thermal"]["actions"]
        assert probed == ["onnxruntime-fp32", "onnxruntime-int8"]


def test_edge_tpu_sensor_reads_the_hottest_tpu_and_its_trip_points(tmp_path):
    from edgesdk.thermal import EdgeTpuTemperature

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


def test_switch_candidates_must_fit_the_memory_limit(digits_bundle, tmp_path):
    from edgesdk import Bundle
    from edgesdk.memory import CostBook, MemoryLimit
    from edgesdk.runtime.fitting import switch_candidates
    from edgesdk.placement import Candidate

    bundle = Bundle.open(digits_bundle.bundle)
    home = Candidate("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-fp32", "fp32")
    int8 = Candidate("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-int8", "int8")
    npu = Candidate("fake-npu", "NPU", "NPU", "onnxruntime-int8", "int8")
    costs = CostBook(tmp_path / "costs.json")
    roomy, tight = MemoryLimit(10_000.0, "budget"), MemoryLimit(101.0, "budget")
    assert switch_candidates([int8, npu], bundle, costs, roomy, 100.0, home) == [int8, npu]
    # 1 MB free: the fake NPU's runtime would not fit beside; the INT8 sibling's smaller files on the loaded
    # engine do.
    assert switch_candidates([int8, npu], bundle, costs, tight, 100.0, home) == [int8]
    assert switch_candidates([home], bundle, costs, roomy, 100.0, int8) == []  # larger files than the loaded ones


@pytest.mark.parametrize("allow_failed", [False, True])
def test_hot_never_switches_to_an_int8_artifact_that_failed_its_gate(bundle_copy, tmp_path, allow_failed):
    """The INT8 alternative of an FP32 placement is left out when it failed validation, even under allow_failed
    (which admits what load serves, not a switch made later without a word)."""
    import edgesdk
    from edgesdk import Bundle

    fail_validation(bundle_copy, "onnxruntime-int8")
    root = hot_zone(tmp_path)
    x = Bundle.open(bundle_copy).golden()["input_0"][:1]
    with edgesdk.load(bundle_copy, require="onnxruntime", artifact="onnxruntime-fp32", allow_failed=allow_failed,
                      thermal=hot_governor(root)) as model:
        assert model._thermal.lower_power is None  # the only lower-power choice here failed its gate
        set_temp(root, 80.0)
        hot = model.predict(x)
        assert hot.budget["thermal"]["level"] == "hot"
        assert hot.budget["thermal"]["artifact_now"] == "onnxruntime-fp32"
        assert "artifact_switched" not in hot.budget["thermal"]["actions"]
