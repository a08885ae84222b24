"""INT8 against FP32 at first load (edgesdk.runtime.precision_choice): timed once per machine, cached, shown in the placement.

The engines and bundles are real. Which of the two is faster on this CPU is not something a test can rely on, so
the tests that need a given answer put a fake clock in ``precision_choice.time_run``: each inference of an artifact
"takes" the time the test sets, and everything else (loading both, the numerics check, the decision, the cache,
closing the loser) runs as in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import edgesdk
from edgesdk import Bundle
from edgesdk.runtime import autotune, precision_choice

INT8, FP32 = "litert-int8", "litert-fp32"  # the pair auto times first on this CPU (the profile's engine order)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(path))
    return path


class FakeRunClock:
    """A fake clock for ``precision_choice.time_run``: an inference of an artifact takes the seconds set for it
    (by its model file; a list is taken in turn, over and over); ``runs`` counts the inferences timed per artifact."""

    def __init__(self, bundle_path: Path, seconds: dict[str, float | list[float]]):
        bundle = Bundle.open(bundle_path)
        self._ids = {bundle.artifact(aid).model_path.resolve(): aid for aid in seconds}
        self._seconds = {aid: s if isinstance(s, list) else [s] for aid, s in seconds.items()}
        self.runs: dict[str, int] = {aid: 0 for aid in seconds}

    def __call__(self, engine, feeds) -> float:
        engine.run(feeds)  # the real engine still runs
        aid = self._ids[Path(engine.model_path).resolve()]
        seconds = self._seconds[aid][self.runs[aid] % len(self._seconds[aid])]
        self.runs[aid] += 1
        return seconds


def _no_timing(engine, feeds):
    raise AssertionError("a cached decision was timed again")


def _load(path, **kw):
    """Load and close; the INT8/FP32 pair check alone unless the test asks for the full race."""
    kw.setdefault("speed_check", "precision")
    with edgesdk.load(path, **kw) as model:
        return model.placement


def test_first_load_times_int8_against_fp32_and_shows_it(digits_bundle, cache_dir):
    pl = _load(digits_bundle.bundle)
    choice = pl.precision_choice
    assert choice["int8"] == f"litert:CPU:{INT8}" and choice["fp32"] == f"litert:CPU:{FP32}"
    assert choice["cached"] is False
    assert choice["int8_ms"] > 0 and choice["fp32_ms"] > 0 and choice["ratio"] > 0
    assert precision_choice.MIN_PAIRS <= choice["pairs"] <= precision_choice.MAX_PAIRS
    assert 0 <= choice["int8_slower_in"] <= choice["pairs"]
    assert choice["chosen"] in ("int8", "fp32")
    assert pl.artifact == (INT8 if choice["chosen"] == "int8" else FP32)
    assert "back-to-back int8/fp32 pairs" in choice["method"] and "above 1.05" in choice["method"]
    assert pl.numerics["checked"] is True
    assert pl.to_dict()["precision_choice"] == choice
    assert (cache_dir / "precision.json").is_file()


def test_second_load_reads_the_decision_without_timing(digits_bundle, monkeypatch):
    first = _load(digits_bundle.bundle).precision_choice
    monkeypatch.setattr(precision_choice, "time_run", _no_timing)
    second = _load(digits_bundle.bundle)
    assert second.precision_choice == {**first, "cached": True}
    assert second.artifact == (INT8 if first["chosen"] == "int8" else FP32)
    assert second.numerics["checked"] is True  # a cached choice is still checked


def test_int8_measured_slower_serves_fp32_and_next_load_starts_there(digits_bundle, monkeypatch):
    clock = FakeRunClock(digits_bundle.bundle, {INT8: 0.004, FP32: 0.002})
    monkeypatch.setattr(precision_choice, "time_run", clock)
    with edgesdk.load(digits_bundle.bundle, speed_check="precision") as model:
        pl = model.placement
        assert (pl.artifact, pl.precision) == (FP32, "fp32")
        # private: proves the FP32 file itself is what runs, not only what the placement says
        # private: the file the engine really opened, not what placement claims
        assert model._engine.model_path == Bundle.open(digits_bundle.bundle).artifact(FP32).model_path
        result = model.predict(Bundle.open(digits_bundle.bundle).golden()["input_0"][:1])
        assert result.placement.precision_choice == pl.precision_choice
    choice = pl.precision_choice
    assert (choice["int8_ms"], choice["fp32_ms"], choice["ratio"], choice["chosen"]) == (4.0, 2.0, 2.0, "fp32")
    assert precision_choice.MIN_PAIRS <= clock.runs[INT8] == clock.runs[FP32] <= precision_choice.MAX_PAIRS
    assert choice["pairs"] == choice["int8_slower_in"] == clock.runs[INT8]
    assert f"litert:CPU:{INT8}" not in {s.candidate.label() for s in pl.skipped}  # not a failure: still a fallback

    monkeypatch.setattr(precision_choice, "time_run", _no_timing)
    again = _load(digits_bundle.bundle)
    assert again.artifact == FP32 and again.precision_choice == {**choice, "cached": True}


def test_int8_within_the_margin_keeps_its_place(digits_bundle, monkeypatch):
    # 3% slower is within the noise the margin allows for; INT8 is also the smaller model
    monkeypatch.setattr(precision_choice, "time_run", FakeRunClock(digits_bundle.bundle, {INT8: 0.00206, FP32: 0.002}))
    pl = _load(digits_bundle.bundle)
    assert pl.artifact == INT8
    assert pl.precision_choice["chosen"] == "int8" and pl.precision_choice["ratio"] == pytest.approx(1.03)


def test_int8_slower_in_only_half_the_pairs_keeps_its_place(digits_bundle, monkeypatch):
    # A burst of other work makes every other INT8 run slow: the median says "slower", the pairs disagree.
    clock = FakeRunClock(digits_bundle.bundle, {INT8: [0.004, 0.004, 0.001, 0.001], FP32: 0.002})
    monkeypatch.setattr(precision_choice, "time_run", clock)
    pl = _load(digits_bundle.bundle)
    choice = pl.precision_choice
    assert choice["ratio"] > 1 + precision_choice.MARGIN and choice["int8_slower_in"] == choice["pairs"] // 2
    assert choice["chosen"] == "int8" and pl.artifact == INT8


def test_a_decision_from_another_machine_is_not_reused(digits_bundle, monkeypatch):
    clock = FakeRunClock(digits_bundle.bundle, {INT8: 0.004, FP32: 0.002})
    monkeypatch.setattr(precision_choice, "time_run", clock)
    assert _load(digits_bundle.bundle).precision_choice["cached"] is False
    first_runs = clock.runs[INT8]
    monkeypatch.setattr(autotune, "machine_id", lambda: "Linux-x86_64-Another CPU-8cpu")
    other = _load(digits_bundle.bundle).precision_choice
    assert other["cached"] is False and clock.runs[INT8] > first_runs


def test_an_isa_cap_makes_another_machine(digits_bundle, monkeypatch):
    """OpenVINO honours ONEDNN_MAX_CPU_ISA: its kernels (and INT8's speed) change with it, so the decision does."""
    assert _load(digits_bundle.bundle).precision_choice["cached"] is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert _load(digits_bundle.bundle).precision_choice["cached"] is False
    assert _load(digits_bundle.bundle).precision_choice["cached"] is True


def test_threads_are_part_of_the_decision(digits_bundle, monkeypatch):
    assert _load(digits_bundle.bundle, threads=1).precision_choice["cached"] is False
    assert _load(digits_bundle.bundle, threads=2).precision_choice["cached"] is False
    assert _load(digits_bundle.bundle, threads=1).precision_choice["cached"] is True


@pytest.mark.parametrize("options", [{"artifact": INT8}, {"engine": "litert", "artifact": INT8},
                                     {"policy": "autotune"}, {"policy": "max-efficiency"}])
def test_explicit_choices_and_other_policies_are_not_overridden(digits_bundle, monkeypatch, options):
    monkeypatch.setattr(precision_choice, "time_run", FakeRunClock(digits_bundle.bundle, {INT8: 0.004, FP32: 0.002}))
    pl = _load(digits_bundle.bundle, **options)
    assert pl.precision_choice is None
    if "artifact" in options:
        assert pl.artifact == INT8


def test_an_engine_choice_still_times_its_own_pair(digits_bundle, monkeypatch):
    ids = ("onnxruntime-int8", "onnxruntime-fp32")
    monkeypatch.setattr(precision_choice, "time_run",
                        FakeRunClock(digits_bundle.bundle, dict(zip(ids, (0.004, 0.002)))))
    pl = _load(digits_bundle.bundle, engine="onnxruntime")
    assert pl.artifact == "onnxruntime-fp32"
    assert pl.precision_choice["int8"] == "onnxruntime:CPUExecutionProvider:onnxruntime-int8"


def _fail_numerics(manifest: dict, aid: str) -> None:
    """Make ``aid`` fail its golden check: every tolerance the manifest holds for it (pooled, and per output) set to
    1e-12."""
    golden = manifest["golden"]
    golden["tolerance"][aid] = 1e-12
    for key in ("tolerance_per_output", "mean_tolerance_per_output"):
        if aid in (golden.get(key) or {}):
            golden[key][aid] = [1e-12] * len(golden[key][aid])


def test_fp32_that_does_not_load_leaves_int8_serving_unmeasured(bundle_copy, cache_dir):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    _fail_numerics(manifest, FP32)  # the float artifact now fails its numerics check
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    pl = _load(bundle_copy)
    assert pl.artifact == INT8
    choice = pl.precision_choice
    assert choice["chosen"] == "int8" and choice["int8_ms"] is None and choice["cached"] is False
    assert "numerics_mismatch" in choice["method"]
    assert any(s.candidate.artifact == FP32 and s.reason == "numerics_mismatch" for s in pl.skipped)
    assert not (cache_dir / "precision.json").exists()  # nothing measured, nothing remembered


def test_a_cached_fp32_choice_that_does_not_load_falls_back_to_int8(bundle_copy, monkeypatch):
    monkeypatch.setattr(precision_choice, "time_run", FakeRunClock(bundle_copy, {INT8: 0.004, FP32: 0.002}))
    assert _load(bundle_copy).artifact == FP32
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    _fail_numerics(manifest, FP32)  # the same files (the same cache key); FP32 now fails its check
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(precision_choice, "time_run", _no_timing)
    pl = _load(bundle_copy)
    assert pl.artifact == INT8
    assert pl.precision_choice["cached"] is True and pl.precision_choice["chosen"] == "int8"
    assert "the cached choice, fp32, did not load this time" in pl.precision_choice["method"]
    assert any(s.candidate.artifact == FP32 and s.reason == "numerics_mismatch" for s in pl.skipped)


def test_thermal_budget_may_still_move_an_fp32_choice_to_int8(digits_bundle, monkeypatch, tmp_path):
    from edgesdk.budgets.thermal import LinuxThermalZones, ThermalGovernor

    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("40000\n")
    governor = ThermalGovernor(LinuxThermalZones(tmp_path / "sys"), warm_c=70, hot_c=78, critical_c=90)
    monkeypatch.setattr(precision_choice, "time_run", FakeRunClock(digits_bundle.bundle, {INT8: 0.004, FP32: 0.002}))
    with edgesdk.load(digits_bundle.bundle, thermal=governor, speed_check="precision") as model:
        assert model.placement.artifact == FP32
        # private: where a hot device would move is not exposed until it moves
        # private: the thermal switch's target, chosen at load, used only when hot
        assert model._thermal.lower_power.artifact == INT8


def test_run_json_shows_the_choice(digits_bundle, tmp_path):
    import numpy as np

    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 1, 8, 8), np.float32))
    env = {**os.environ, "EDGESDK_CACHE_DIR": str(tmp_path / "c")}
    script = Path(sys.executable).parent / "edgesdk"
    proc = subprocess.run([str(script), "run", str(digits_bundle.bundle), str(npy), "--json"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    placement = json.loads(proc.stdout)["placement"]
    choice = placement["precision_choice"]
    assert choice["cached"] is False and choice["chosen"] in ("int8", "fp32") and choice["int8_ms"] > 0
    race = placement["engine_choice"]  # the child's race is really timed: any candidate may win, but it is this one
    assert race["cached"] is False and race["chosen"].endswith(":" + placement["artifact"])
    assert len(race["timings_ms"]) == 6
    text = subprocess.run([str(script), "run", str(digits_bundle.bundle), str(npy)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert text.returncode == 0 and f"  speed: {race['chosen']} (cached; " in text.stdout


# -- the race: every candidate of the first device kind, each timed alone (speed_check="full", the default) -------

ALL = {"litert-int8": 0.002, "litert-fp32": 0.003, "openvino-int8": 0.001, "openvino-fp32": 0.003,
       "onnxruntime-int8": 0.0015, "onnxruntime-fp32": 0.003}


def test_a_clearly_faster_candidate_displaces_the_profiles_first_and_is_cached(digits_bundle, monkeypatch):
    clock = FakeRunClock(digits_bundle.bundle, ALL)
    monkeypatch.setattr(precision_choice, "race_time_run", clock)
    monkeypatch.setattr(precision_choice, "time_run", _no_timing)  # the race decides the precision too
    pl = _load(digits_bundle.bundle, speed_check="full")
    race = pl.engine_choice
    assert race["chosen"] == "openvino:CPU:openvino-int8" and race["incumbent"] == "litert:CPU:litert-int8"
    assert race["cached"] is False and race["kind"] == "CPU" and race["leader_ratio"] == [0.5, 0.5]
    assert set(race["timings_ms"]) == {f"{a.split('-')[0]}:{'CPUExecutionProvider' if a.startswith('onnx') else 'CPU'}"
                                       f":{a}" for a in ALL}
    # every candidate once; the leader and the profile's first once more (each pass: RACE_MAX_RUNS fake runs, whose
    # fake times never reach the time cap)
    passes = {a: n / precision_choice.RACE_MAX_RUNS for a, n in clock.runs.items()}
    assert passes == {**{a: 1 for a in ALL}, "openvino-int8": 2, "litert-int8": 2}
    assert (pl.engine, pl.artifact) == ("openvino", "openvino-int8")
    assert pl.precision_choice["chosen"] == "int8" and pl.precision_choice["ratio"] == pytest.approx(1 / 3, abs=1e-3)
    assert "from the race" in pl.precision_choice["method"]
    assert pl.to_dict()["engine_choice"] == race
    monkeypatch.setattr(precision_choice, "race_time_run", _no_timing)
    again = _load(digits_bundle.bundle, speed_check="full")
    assert again.artifact == "openvino-int8" and again.engine_choice == {**race, "cached": True}


def test_another_engines_fp32_can_win(digits_bundle, monkeypatch):
    """INT8 slower than FP32 on LiteRT, and OpenVINO's INT8 in between (an AVX2 CPU without VNNI, say): the fastest
    artifact serves, whatever its engine and precision."""
    times = {"litert-int8": 0.010, "litert-fp32": 0.007, "openvino-int8": 0.009, "openvino-fp32": 0.011,
             "onnxruntime-int8": 0.012, "onnxruntime-fp32": 0.013}
    monkeypatch.setattr(precision_choice, "race_time_run", FakeRunClock(digits_bundle.bundle, times))
    pl = _load(digits_bundle.bundle, speed_check="full")
    assert pl.artifact == "litert-fp32" and pl.engine_choice["chosen"] == "litert:CPU:litert-fp32"
    assert pl.precision_choice["chosen"] == "fp32" and pl.precision_choice["ratio"] == pytest.approx(10 / 7, abs=1e-3)


def test_a_candidate_within_the_margin_does_not_displace_the_first(digits_bundle, monkeypatch):
    times = {a: 0.001 for a in ALL} | {"openvino-int8": 0.00097}
    monkeypatch.setattr(precision_choice, "race_time_run", FakeRunClock(digits_bundle.bundle, times))
    pl = _load(digits_bundle.bundle, speed_check="full")
    assert pl.engine_choice["chosen"] == "litert:CPU:litert-int8" and pl.artifact == "litert-int8"


@pytest.mark.parametrize("options", [{"engine": "onnxruntime"}, {"device": "CPU"}, {"performance": "throughput"},
                                     {"policy": "max-efficiency"}, {"speed_check": "off"},
                                     {"speed_check": "precision"}, {"artifact": "litert-int8"}])
def test_no_race_when_the_choice_is_given_or_off(digits_bundle, monkeypatch, options):
    monkeypatch.setattr(precision_choice, "race_time_run", _no_timing)
    options = {"speed_check": "full", **options}
    assert _load(digits_bundle.bundle, **options).engine_choice is None


def test_speed_check_off_times_nothing(digits_bundle, monkeypatch):
    monkeypatch.setattr(precision_choice, "race_time_run", _no_timing)
    monkeypatch.setattr(precision_choice, "time_run", _no_timing)
    pl = _load(digits_bundle.bundle, speed_check="off")
    assert pl.precision_choice is None and pl.engine_choice is None and pl.artifact == INT8


def test_speed_check_is_checked(digits_bundle):
    with pytest.raises(edgesdk.InputError, match=r"speed_check must be one of full, precision, off, got 'fast'"):
        _load(digits_bundle.bundle, speed_check="fast")


def test_a_candidate_that_fails_in_the_race_is_not_opened_again(bundle_copy, monkeypatch):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    for aid in ("litert-int8", "openvino-int8"):
        _fail_numerics(manifest, aid)  # these now fail their numerics check
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    pl = _load(bundle_copy, speed_check="full")
    failed = [s.candidate.artifact for s in pl.skipped if s.reason == "numerics_mismatch"]
    assert sorted(failed) == ["litert-int8", "openvino-int8"]  # once each
    assert pl.artifact not in failed


def test_the_race_moves_only_its_own_device_kind():
    from edgesdk.runtime.placement import Candidate

    gpu = Candidate("openvino", "GPU", "GPU", "openvino-int8", "int8")
    cpu = [Candidate(e, "CPU", "CPU", f"{e}-{p}", p) for e in ("litert", "openvino") for p in ("int8", "fp32")]
    order = precision_choice.put_first([gpu, *cpu], {"kind": "CPU", "chosen": cpu[3].label()})
    assert order == [gpu, cpu[3], cpu[2], cpu[0], cpu[1]]
    assert precision_choice.shortlist([gpu, *cpu], unverified={("openvino", "GPU")}) == cpu
    assert precision_choice.shortlist([gpu, *cpu]) == [gpu]


def test_a_backend_that_throws_when_timed_is_skipped_not_served(digits_bundle):
    """A fake NPU (hardware this machine lacks) whose delegate throws at run time, numerics check off: the race runs
    it, records run_failed, and the CPU serves; without the race it would be served and fail at predict."""
    from edgesdk.engines import register_backend, unregister_backend
    from fakes import NAME, ThrowingNPUEngine

    register_backend(NAME, ThrowingNPUEngine)
    try:
        pl = _load(digits_bundle.bundle, speed_check="full", check_numerics=False)
    finally:
        unregister_backend(NAME)
    assert pl.kind == "CPU"
    thrown = [s for s in pl.skipped if s.candidate.engine == NAME]
    assert thrown and all(s.reason == "run_failed" and "failed while timed" in s.detail for s in thrown)
    assert len(thrown) == len({s.candidate for s in thrown})  # each once: not opened again by the load walk
