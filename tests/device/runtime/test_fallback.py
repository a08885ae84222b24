"""``load(..., fallback=False)``: only the named engine, device and artifact are tried; when they do not serve, load
raises their own reason instead of serving another artifact (what ``edgesdk bench`` needs to measure what it is
asked for). Real engines and bundles."""

from __future__ import annotations

import json

import pytest

import edgesdk
from edgesdk import BackendUnavailable, InputError, RuntimeOptions


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(path))
    return path


@pytest.fixture
def refused_int8(bundle_copy):
    """The digits bundle with onnxruntime-int8's golden tolerance so tight that its numerics check refuses it."""
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["golden"]["tolerance"]["onnxruntime-int8"] = 1e-6
    manifest["golden"]["tolerance_per_output"]["onnxruntime-int8"] = [1e-6]
    path.write_text(json.dumps(manifest, indent=2))
    return bundle_copy


def test_by_default_another_artifact_stands_in(refused_int8):
    with edgesdk.load(refused_int8, engine="onnxruntime", artifact="onnxruntime-int8") as model:
        assert model.placement.artifact != "onnxruntime-int8"


def test_without_fallback_load_raises_the_named_artifacts_own_reason(refused_int8):
    with pytest.raises(BackendUnavailable, match=r"as engine='onnxruntime', artifact='onnxruntime-int8' "
                                                 r"\(fallback=False: nothing else tried\).*is off by") as err:
        edgesdk.load(refused_int8, engine="onnxruntime", artifact="onnxruntime-int8", fallback=False)
    assert err.value.reason == "numerics_mismatch"
    assert "onnxruntime-fp32" not in err.value.detail and "litert" not in err.value.detail


def test_without_fallback_the_named_artifact_serves_and_only_it_is_tried(digits_bundle):
    opts = RuntimeOptions(engine="openvino", device="CPU", artifact="openvino-int8", fallback=False)
    with edgesdk.load(digits_bundle.bundle, opts) as model:
        pl = model.placement
    assert (pl.engine, pl.device, pl.artifact) == ("openvino", "CPU", "openvino-int8")
    assert all(s.candidate.engine == "openvino" and s.candidate.artifact == "openvino-int8" for s in pl.skipped)


def test_without_fallback_an_engine_alone_keeps_load_to_its_artifacts(digits_bundle):
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime", fallback=False) as model:
        assert model.placement.engine == "onnxruntime"


def test_without_fallback_an_artifact_the_engine_does_not_run_is_refused(digits_bundle):
    with pytest.raises(BackendUnavailable, match=r"no candidate of .* here is engine='litert', "
                                                 r"artifact='openvino-int8' \(fallback=False\)") as err:
        edgesdk.load(digits_bundle.bundle, engine="litert", artifact="openvino-int8", fallback=False)
    assert err.value.reason == "unsupported_artifact"


def test_misuse_fallback_false_names_nothing():
    with pytest.raises(InputError, match="fallback=False keeps load to the named engine, device or artifact"):
        RuntimeOptions(fallback=False)


def test_misuse_fallback_must_be_a_bool():
    with pytest.raises(InputError, match="fallback must be True or False, got 'no'"):
        RuntimeOptions(artifact="litert-int8", fallback="no")
