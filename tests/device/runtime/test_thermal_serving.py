"""The governor driving a real model (edgesdk.runtime.thermal_serving): fewer threads, pacing, and the switch to a
lower-power backend at hot and back; real engines, a fake NPU where the machine has none, fake clocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.runtime.profiles import load_profile
from edgesdk.budgets.thermal.simulated_device import SimulatedThermalDevice
from edgesdk.budgets.thermal import LinuxThermalZones, ThermalGovernor
from support import FakeClock, fail_validation
from thermal_support import set_temp, zone


# -- the governor driving a real model -------------------------------------------------------------------

def test_hot_device_switches_a_float_model_to_int8_with_fewer_threads_and_back(digits_bundle, tmp_path):
    """The governor's decisions are carried out by Model.predict, and the result says what changed."""
    import edgesdk
    from edgesdk import Bundle
    from edgesdk.budgets.thermal import LinuxThermalZones, ThermalGovernor

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
        assert model._engine.model_path.name == "model_int8.onnx"  # really switched (private: the file the engine opened)
        assert int(hot.outputs[0].argmax()) == int(cool.outputs[0].argmax())

        temp.write_text("40000\n")  # cooled well below hot - hysteresis
        back = model.predict(x)
        assert back.budget["thermal"]["level"] == "nominal"
        # the adaptive rate limit may still pace for a moment; nothing else stays changed
        assert back.budget["action"] in (None, "paced")
        assert not {"artifact_switched", "threads_reduced"} & set(back.budget["thermal"]["actions"])
        assert back.budget["thermal"]["artifact_now"] == "onnxruntime-fp32"
        # private: proves the file that runs, beside what the placement says
        assert model._engine.model_path.name == "model_fp32.onnx"  # private: the file the engine really opened


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
    from edgesdk.runtime.placement import Candidate
    from edgesdk.runtime.thermal_serving import lower_power

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
    from edgesdk.runtime import numerics

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
    from edgesdk.runtime import thermal_serving

    root = hot_zone(tmp_path)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", artifact="onnxruntime-int8",
                      thermal=hot_governor(root)) as model:
        fake_npu.broken = True
        set_temp(root, 80.0)
        assert model.predict(x).placement.engine == "onnxruntime"
        fake_npu.broken = False  # the delegate recovers
        assert model.predict(x).placement.engine == "onnxruntime"  # not retried at once
        monkeypatch.setattr(thermal_serving, "RETRY_AFTER_S", 0.0)
        assert model.predict(x).placement.engine == "fake-npu"


def test_a_switch_follows_check_numerics_and_a_failing_check_leaks_nothing(digits_bundle, tmp_path, engine_log):
    """A bundle loaded with check_numerics=False switches unchecked; an error in the check never leaks an engine."""
    import edgesdk
    from edgesdk import Bundle
    from edgesdk.runtime import numerics

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
    from edgesdk import BackendUnavailable, Bundle
    from edgesdk.runtime import isolate

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


def test_switch_candidates_must_fit_the_memory_limit(digits_bundle, tmp_path):
    from edgesdk import Bundle
    from edgesdk.budgets.memory import CostBook, MemoryLimit
    from edgesdk.runtime.fitting import switch_candidates
    from edgesdk.runtime.placement import Candidate

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
