"""edgesdk bench measures exactly the (engine, device, artifact) it is asked for (issue 26): an artifact that failed
its validation gate is measured as itself with allow_failed; one that cannot be loaded is reported in ``failed``
with its own reason, never replaced by another artifact of its engine; and a speed decision cached by an earlier
load (FP32 preferred) changes nothing. Real engines and bundles; each backend in its own child process, as the CLI
runs it. No timing asserts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgesdk
from edgesdk import Bundle
from edgesdk.bench.warm import BenchOptions, bench, viable_backends
from edgesdk.runtime import precision_choice
from support import fail_validation, rehash

QUICK = BenchOptions(scenario="single-stream", duration_s=0.05, cold_start=False)
ORT_INT8 = ("onnxruntime", "CPUExecutionProvider", "onnxruntime-int8")
ORT_FP32 = ("onnxruntime", "CPUExecutionProvider", "onnxruntime-fp32")
OV_INT8 = ("openvino", "CPU", "openvino-int8")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Speed decisions go to a private cache, which the bench children read too (they inherit the environment)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(path))
    return path


def _label(backend: tuple[str, str, str]) -> str:
    return ":".join(backend)


def test_an_int8_artifact_that_failed_its_gate_is_measured_as_itself_with_allow_failed(bundle_copy):
    fail_validation(bundle_copy, "openvino-int8", "onnxruntime-int8")
    viable, _ = viable_backends(bundle_copy, allow_failed=True)
    assert {OV_INT8, ORT_INT8} <= set(viable)
    report = bench(bundle_copy, [OV_INT8, ORT_INT8], BenchOptions(**{**vars(QUICK), "allow_failed": True}))
    assert report["failed"] == []
    assert [(r["engine"], r["artifact"], r["precision"]) for r in report["backends"]] == [
        ("openvino", "openvino-int8", "int8"), ("onnxruntime", "onnxruntime-int8", "int8")]


def test_an_artifact_that_cannot_load_is_reported_with_its_reason_and_the_others_are_measured(bundle_copy):
    # The bundle: INT8 artifacts that failed their gate, measured with allow_failed. One is refused by the
    # numerics check (its golden tolerance tightened, as a gate that failed on the error cap tightens it), the other
    # does not load at all (its weights file cut short). Each engine's FP32 artifact loads fine: neither may stand in.
    fail_validation(bundle_copy, "openvino-int8", "onnxruntime-int8")
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["golden"]["tolerance"]["onnxruntime-int8"] = 1e-6
    manifest["golden"]["tolerance_per_output"]["onnxruntime-int8"] = [1e-6]
    path.write_text(json.dumps(manifest, indent=2))
    weights = bundle_copy / "openvino" / "model_int8.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    rehash(bundle_copy)

    report = bench(bundle_copy, [ORT_INT8, OV_INT8, ORT_FP32], BenchOptions(**{**vars(QUICK), "allow_failed": True}))
    failed = {f["backend"]: f for f in report["failed"]}
    assert set(failed) == {_label(ORT_INT8), _label(OV_INT8)}, report["failed"]
    numerics = failed[_label(ORT_INT8)]
    assert numerics["reason"] == "numerics_mismatch"
    assert "onnxruntime-int8 on onnxruntime:CPUExecutionProvider is off by" in numerics["detail"]
    assert "fallback=False" in numerics["detail"] and "onnxruntime-fp32" not in numerics["detail"]
    broken = failed[_label(OV_INT8)]
    assert broken["reason"] in ("load_failed", "compile_failed") and "model_int8" in broken["detail"]
    assert "openvino-fp32" not in broken["detail"]
    assert [(r["engine"], r["artifact"]) for r in report["backends"]] == [("onnxruntime", "onnxruntime-fp32")]


class _Int8Slow:
    """A clock for the speed checks' timing seams: an INT8 inference "takes" 4 ms, an FP32 one 2 ms (LiteRT's
    1 ms, so the race has one clear winner). The engines really run; only the time they report is set."""

    def __init__(self, bundle_path: Path):
        bundle = Bundle.open(bundle_path)
        self._seconds = {bundle.artifact(a.id).model_path.resolve():
                         0.004 if a.precision == "int8" else 0.001 if a.id == "litert-fp32" else 0.002
                         for a in bundle.artifacts}

    def __call__(self, engine, feeds) -> float:
        engine.run(feeds)
        return self._seconds[Path(engine.model_path).resolve()]


def test_a_cached_decision_for_fp32_does_not_change_what_is_measured(digits_bundle, cache_dir, monkeypatch):
    path = digits_bundle.bundle
    clock = _Int8Slow(path)
    monkeypatch.setattr(precision_choice, "time_run", clock)
    monkeypatch.setattr(precision_choice, "race_time_run", clock)
    # Both speed checks decide for FP32 through their own code and cache it: the pair on LiteRT, then the race.
    with edgesdk.load(path, speed_check="precision") as model:
        assert model.placement.precision_choice["chosen"] == "fp32" and model.placement.artifact == "litert-fp32"
    with edgesdk.load(path) as model:
        assert model.placement.engine_choice["chosen"] == "litert:CPU:litert-fp32"
    cache = (cache_dir / precision_choice.CACHE_FILE).read_bytes()
    with edgesdk.load(path) as model:  # what a plain load does now: FP32, from the cache
        assert model.placement.artifact == "litert-fp32" and model.placement.engine_choice["cached"] is True

    asked = [("litert", "CPU", "litert-int8"), OV_INT8]
    report = bench(path, asked, QUICK)
    assert report["failed"] == []
    assert [(r["engine"], r["artifact"], r["precision"]) for r in report["backends"]] == [
        ("litert", "litert-int8", "int8"), ("openvino", "openvino-int8", "int8")]
    assert (cache_dir / precision_choice.CACHE_FILE).read_bytes() == cache  # nothing timed or stored by the bench
