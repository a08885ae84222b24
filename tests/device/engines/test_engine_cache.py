"""Engine compile caches (``cache_dir``) and the fresh-process cold start measurement.

A cache may only save load time: outputs with and without it are identical, and a damaged, stale or
unwritable cache is rebuilt or bypassed, never served.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk import Bundle
from edgesdk.bench.cold import TIMINGS, cold_start
from edgesdk.engines import engine_class, open_engine
from edgesdk.errors import BackendUnavailable, BundleError

CACHED_IDS = ["openvino-fp32", "openvino-int8", "onnxruntime-fp32", "onnxruntime-int8"]
ALL_IDS = CACHED_IDS + ["litert-fp32", "litert-int8"]
KINDS = {"openvino": "CACHE_DIR", "onnxruntime": "optimized model", "litert": None}


@pytest.fixture(scope="module")
def bundle(digits_bundle) -> Bundle:
    return Bundle.open(digits_bundle.bundle)


def _outputs(bundle: Bundle, model_path: Path, engine: str, runtime: dict, **options) -> tuple[np.ndarray, object]:
    """Every golden input's first output, and the engine's cache report (kind, state)."""
    golden = bundle.golden()
    with open_engine(engine, model_path, **{**runtime, **options}) as eng:
        outs = np.concatenate([eng.run([golden["input_0"][i : i + 1]])[0] for i in range(len(golden["input_0"]))])
        return outs, (eng.cache, eng.cache_state)


def _cache_files(cache: Path, engine: str) -> list[Path]:
    return sorted(p for p in (cache / engine).rglob("*") if p.is_file()) if (cache / engine).is_dir() else []


# -- identical outputs, files where expected -------------------------------------------------------------

@pytest.mark.parametrize("aid", ALL_IDS)
def test_outputs_identical_with_and_without_cache(bundle, tmp_path, aid):
    art = bundle.artifact(aid)
    plain, plain_cache = _outputs(bundle, art.model_path, art.engine, art.runtime)
    assert plain_cache == (None, None)
    kind = KINDS[art.engine]
    first, first_cache = _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=tmp_path)
    again, again_cache = _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=tmp_path)
    np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(again, plain)
    if kind is None:
        assert first_cache == again_cache == (None, None)
        assert list(tmp_path.iterdir()) == []  # LiteRT's interpreter has no cache: nothing is written
    else:
        assert first_cache == (kind, "stored") and again_cache == (kind, "hit")


def test_cache_kind_per_engine_and_device():
    assert engine_class("openvino").compile_cache("CPU") == "CACHE_DIR"
    assert engine_class("onnxruntime").compile_cache("CPU") == "optimized model"
    assert engine_class("onnxruntime").compile_cache("CPUExecutionProvider") == "optimized model"
    assert engine_class("onnxruntime").compile_cache("QNNExecutionProvider") is None  # has its own EP context cache
    assert engine_class("litert").compile_cache("CPU") is None


def test_openvino_cache_folder_lists_its_blobs(bundle, tmp_path):
    art = bundle.artifact("openvino-int8")
    _outputs(bundle, art.model_path, "openvino", art.runtime, cache_dir=tmp_path)
    (folder,) = (tmp_path / "openvino").iterdir()
    blobs = sorted(p.name for p in folder.glob("*.blob"))
    assert blobs and sorted(p.name for p in folder.iterdir()) == sorted(blobs + ["integrity.json"])
    assert not [p for p in (tmp_path / "openvino").iterdir() if p.name.endswith(".tmp")]  # no build left behind


def test_onnxruntime_cache_file_is_named_by_model_and_content(bundle, tmp_path):
    art = bundle.artifact("onnxruntime-int8")
    _outputs(bundle, art.model_path, "onnxruntime", art.runtime, cache_dir=tmp_path)
    (saved,) = _cache_files(tmp_path, "onnxruntime")
    match = re.fullmatch(r"model_int8-([0-9a-f]{32})\.([0-9a-f]{32})\.onnx", saved.name)
    assert match and hashlib.sha256(saved.read_bytes()).hexdigest()[:32] == match.group(2)


def test_options_are_part_of_the_key(bundle, tmp_path):
    """Another thread count or precision hint is another compile: it does not hit the first one's entry."""
    art = bundle.artifact("openvino-fp32")
    _outputs(bundle, art.model_path, "openvino", art.runtime, cache_dir=tmp_path)
    _, state = _outputs(bundle, art.model_path, "openvino", art.runtime, cache_dir=tmp_path, num_threads=1)
    assert state == ("CACHE_DIR", "stored")
    assert len(list((tmp_path / "openvino").iterdir())) == 2


# -- damaged, stale and unwritable caches ----------------------------------------------------------------

def _flip(path: Path, at: float = 0.5, count: int = 64) -> None:
    path.chmod(0o644)  # OpenVINO writes its blobs read-only
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("aid", CACHED_IDS)
@pytest.mark.parametrize("damage", [_flip, _truncate], ids=["flipped", "truncated"])
def test_damaged_cache_is_rebuilt_not_served(bundle, tmp_path, aid, damage):
    art = bundle.artifact(aid)
    plain, _ = _outputs(bundle, art.model_path, art.engine, art.runtime)
    _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=tmp_path)
    (target,) = [p for p in _cache_files(tmp_path, art.engine) if p.suffix in (".blob", ".onnx")]
    damage(target)
    outs, (kind, state) = _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=tmp_path)
    assert state == "rebuilt"
    np.testing.assert_array_equal(outs, plain)
    _, (_, state) = _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=tmp_path)
    assert state == "hit"


def test_openvino_folder_without_its_list_is_rebuilt(bundle, tmp_path):
    art = bundle.artifact("openvino-int8")
    _outputs(bundle, art.model_path, "openvino", art.runtime, cache_dir=tmp_path)
    (folder,) = (tmp_path / "openvino").iterdir()
    (folder / "integrity.json").unlink()
    _, (_, state) = _outputs(bundle, art.model_path, "openvino", art.runtime, cache_dir=tmp_path)
    assert state == "rebuilt"


def test_onnxruntime_intact_but_unloadable_file_is_replaced(bundle, tmp_path):
    """A file whose digest matches its name but that ORT cannot load (another build's format) is replaced."""
    art = bundle.artifact("onnxruntime-fp32")
    plain, _ = _outputs(bundle, art.model_path, "onnxruntime", art.runtime)
    _outputs(bundle, art.model_path, "onnxruntime", art.runtime, cache_dir=tmp_path)
    (saved,) = _cache_files(tmp_path, "onnxruntime")
    junk = b"not an onnx model" * 100
    saved.unlink()
    stem = saved.name.split(".")[0]
    (saved.parent / f"{stem}.{hashlib.sha256(junk).hexdigest()[:32]}.onnx").write_bytes(junk)
    outs, (_, state) = _outputs(bundle, art.model_path, "onnxruntime", art.runtime, cache_dir=tmp_path)
    assert state == "rebuilt"
    np.testing.assert_array_equal(outs, plain)
    assert len(_cache_files(tmp_path, "onnxruntime")) == 1


def _negate_largest_f32_constant(xml: Path) -> None:
    """New weights under the same .xml: the largest f32 constant of the .bin changes sign."""
    consts = [(int(size), int(offset)) for offset, size in
              re.findall(r'element_type="f32" shape="[^"]*" offset="(\d+)" size="(\d+)"', xml.read_text())]
    size, offset = max(consts)
    weights = xml.with_suffix(".bin")
    data = bytearray(weights.read_bytes())
    block = np.frombuffer(bytes(data[offset : offset + size]), np.float32)
    data[offset : offset + size] = (-block).tobytes()
    weights.write_bytes(bytes(data))


def test_openvino_new_weights_under_the_same_path_are_not_served_stale(bundle, tmp_path):
    """OpenVINO's own CACHE_DIR would import the old blob here (it keys by path): the folder key has the digests."""
    art = bundle.artifact("openvino-fp32")
    model = tmp_path / "model" / "m.xml"
    model.parent.mkdir()
    shutil.copy(art.model_path, model)
    shutil.copy(art.model_path.with_suffix(".bin"), model.with_suffix(".bin"))
    old, _ = _outputs(bundle, model, "openvino", art.runtime, cache_dir=tmp_path / "cache")
    _negate_largest_f32_constant(model)
    plain, _ = _outputs(bundle, model, "openvino", art.runtime)
    assert not np.array_equal(plain, old)
    outs, (_, state) = _outputs(bundle, model, "openvino", art.runtime, cache_dir=tmp_path / "cache")
    assert state == "stored"
    np.testing.assert_array_equal(outs, plain)


def test_onnxruntime_new_model_under_the_same_path_is_not_served_stale(bundle, tmp_path):
    fp32, int8 = bundle.artifact("onnxruntime-fp32"), bundle.artifact("onnxruntime-int8")
    model = tmp_path / "model.onnx"
    shutil.copy(fp32.model_path, model)
    _outputs(bundle, model, "onnxruntime", {}, cache_dir=tmp_path / "cache")
    shutil.copy(int8.model_path, model)
    plain, _ = _outputs(bundle, model, "onnxruntime", {})
    outs, (_, state) = _outputs(bundle, model, "onnxruntime", {}, cache_dir=tmp_path / "cache")
    assert state == "stored"
    np.testing.assert_array_equal(outs, plain)


@pytest.mark.parametrize("aid", ["openvino-int8", "onnxruntime-int8"])
def test_unusable_cache_dir_loads_without_cache(bundle, tmp_path, aid):
    art = bundle.artifact(aid)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("a file where the cache folder should be")
    plain, _ = _outputs(bundle, art.model_path, art.engine, art.runtime)
    outs, (kind, state) = _outputs(bundle, art.model_path, art.engine, art.runtime, cache_dir=not_a_dir)
    assert (kind, state) == (KINDS[art.engine], "unavailable")
    np.testing.assert_array_equal(outs, plain)


def test_bad_model_with_cache_still_names_the_model(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(BackendUnavailable, match=r"load_failed: .*garbage\.onnx"):
        open_engine("onnxruntime", path, cache_dir=tmp_path / "cache")
    xml = tmp_path / "garbage.xml"
    xml.write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(BackendUnavailable, match=r"load_failed: .*garbage\.xml"):
        open_engine("openvino", xml, cache_dir=tmp_path / "cache")


# -- cold start in a fresh process -----------------------------------------------------------------------

def _check_run(run: dict, tolerance: float) -> None:
    for key in TIMINGS:
        assert run[key] > 0, key
    assert run["open_to_first_result_ms"] < run["process_ms"]
    assert run["engine_import_ms"] <= run["engine_open_ms"]
    assert run["heavy_modules"] == []  # no torch, no converters in the device-side process
    assert run["max_abs_diff"] <= tolerance


def test_cold_start_without_cache(bundle, digits_bundle):
    result = cold_start(digits_bundle.bundle, "onnxruntime", "CPU", "onnxruntime-int8", runs=2)
    tolerance = bundle.manifest["golden"]["tolerance"]["onnxruntime-int8"]
    assert result["cache"] == "optimized model" and result["cached"] is False and result["priming"] is None
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        _check_run(run, tolerance)
        assert run["cache_state"] is None and run["executing"] == ["CPUExecutionProvider"]
    for key in TIMINGS:
        assert result[key] > 0
    assert result["median_ms"] == result["open_to_first_result_ms"]


def test_cold_start_with_cache_primes_then_hits(bundle, digits_bundle, tmp_path):
    result = cold_start(digits_bundle.bundle, "openvino", "CPU", "openvino-int8", cache_dir=tmp_path, runs=1,
                        threads=1)
    tolerance = bundle.manifest["golden"]["tolerance"]["openvino-int8"]
    assert result["cache"] == "CACHE_DIR" and result["cached"] is True and result["threads"] == 1
    assert result["priming"]["cache_state"] == "stored"
    (run,) = result["runs"]
    _check_run(run, tolerance)
    assert run["cache_state"] == "hit"
    assert (tmp_path / "openvino").is_dir()


def test_cold_start_with_cache_on_litert_is_not_applicable(digits_bundle, tmp_path):
    result = cold_start(digits_bundle.bundle, "litert", "CPU", "litert-int8", cache_dir=tmp_path, runs=3)
    assert result["cache"] == "n/a" and result["cached"] is False
    assert result["runs"] == [] and result["median_ms"] is None
    assert result["priming"]["cache_state"] is None


def test_cold_start_unknown_artifact(digits_bundle):
    with pytest.raises(BundleError, match=r"cold start of nope on onnxruntime:CPU: .*has no artifact 'nope'"):
        cold_start(digits_bundle.bundle, "onnxruntime", "CPU", "nope", runs=1)


def test_cold_start_unknown_engine(digits_bundle):
    with pytest.raises(BackendUnavailable, match=r"unknown engine 'tensorrt'") as info:
        cold_start(digits_bundle.bundle, "tensorrt", "CPU", "onnxruntime-int8", runs=1)
    assert info.value.reason == "engine_unknown"


def test_cold_start_child_timeout_is_killed(digits_bundle):
    with pytest.raises(BackendUnavailable, match=r"did not finish in 0.01 s \(killed\)") as info:
        cold_start(digits_bundle.bundle, "onnxruntime", "CPU", "onnxruntime-int8", runs=1, timeout=0.01)
    assert info.value.reason == "cold_start_timeout"


def test_cold_start_crashing_child_quotes_its_stderr(digits_bundle, tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Segmentation fault in the engine' >&2\nexit 139\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(BackendUnavailable, match=r"exited with status 139 and no result; "
                                                 r"stderr tail: Segmentation fault in the engine") as info:
        cold_start(digits_bundle.bundle, "onnxruntime", "CPU", "onnxruntime-int8", runs=1)
    assert info.value.reason == "cold_start_failed"


@pytest.mark.parametrize(("kwargs", "message"), [({"runs": 0}, r"runs >= 1, got 0"),
                                                 ({"threads": 0}, r"threads >= 1 or None, got 0")])
def test_cold_start_misuse(digits_bundle, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cold_start(digits_bundle.bundle, "onnxruntime", "CPU", "onnxruntime-int8", **kwargs)


def test_onnxruntime_model_with_external_data_is_not_cached(bundle, tmp_path):
    """Weights in a side file are not in the cache key, so such a model is loaded without the cache."""
    import onnx

    art = bundle.artifact("onnxruntime-fp32")
    model = tmp_path / "external" / "model.onnx"
    model.parent.mkdir()
    onnx.save_model(onnx.load(str(art.model_path)), str(model), save_as_external_data=True, location="model.data",
                    size_threshold=1024)
    assert (model.parent / "model.data").is_file()
    plain, _ = _outputs(bundle, art.model_path, "onnxruntime", {})
    outs, state = _outputs(bundle, model, "onnxruntime", {}, cache_dir=tmp_path / "cache")
    assert state == ("optimized model", "unavailable")
    np.testing.assert_array_equal(outs, plain)
    assert _cache_files(tmp_path / "cache", "onnxruntime") == []
