"""The thermal governor: levels and hysteresis, read interval, pacing (fixed and adaptive), critical modes, and its
configuration. Clocks are fake (time is what is under test)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from edgesdk.errors import BudgetExceeded, InputError
from edgesdk.runtime.profiles import load_profile
from edgesdk.budgets.thermal.simulated_device import SimulatedThermalDevice
from edgesdk.budgets.thermal import LEVELS, LinuxThermalZones, ThermalActions, ThermalGovernor, ThermalReading
from support import FakeClock
from thermal_support import FIXED, governor, set_temp, zone


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
    limit_at_hot = gov.rate_limit
    assert limit_at_hot is not None and limit_at_hot <= 500.0
    infer_for(2.0, 74.0)  # cooled: warm again; the app ran at ~10/s under hot's pacing, far below the limit
    assert gov.level == "warm"
    # kept, and loosened by at most 5% a read (four reads at warm): not back at full speed
    assert gov.rate_limit is not None and gov.rate_limit <= 1.05 ** 4 * limit_at_hot * 1.001
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
    assert gov.level == "warm" and gov.rate_limit is not None
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
        limits.append(gov.rate_limit)
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
    assert gov.level == "nominal" and gov.rate_limit is None

    gov, clock = heat_to_a_limit(one_zone)
    set_temp(one_zone, 76.0)  # still warm, forecast below hold_c (77): the app just stops for a while
    for _ in range(12):
        clock.t += 0.5
        gov.poll()
    assert gov.rate_limit is None  # an idle app is not held back by anything
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
    at_hot = gov.rate_limit
    assert at_hot is not None and at_hot > 100.0  # halved on entering hot, then left alone: not ~2/s
    set_temp(one_zone, 60.0)
    count, end = 0, clock.t + 10.0
    while clock.t < end:
        gov.before_inference()
        clock.t += 0.001
        count += 1
    assert gov.level == "nominal" and gov.rate_limit is None and count > 9000  # back to full speed


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
    assert gov._coolest == 40.0  # private: the adaptive scale's reference temperature, no public reading
    set_temp(one_zone, 71.0)  # warm; the slope alone is 62 C/s: the forecast is far above hold_c
    # private: the scale formula itself, pinned here because the public effect (pacing) mixes it with time
    assert gov._scale(77.0 + 37.0) == pytest.approx(0.5)
    assert gov._scale(77.0 + 3.7) == pytest.approx(37.0 / 40.7)
    assert gov._scale(77.0 - 10.0) == pytest.approx(1.05)  # loosening is capped at 5% a read
    set_temp(one_zone, 25.0)  # one low glitch does not move the idle estimate (median of three reads)
    clock.t += 0.5
    gov.poll()
    assert gov._coolest == 40.0  # private, as above


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
