"""The bundle: manifest keys other tools rely on, and refusing missing, altered or escaping files."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle
from edgesdk.errors import BundleError
from support import DIGITS_TOML

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _write_manifest(root: Path, manifest: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(manifest))


# -- manifest content ------------------------------------------------------------------------------------

def test_manifest_top_level_keys(digits_bundle):
    m = _manifest(digits_bundle.bundle)
    assert m == digits_bundle.manifest
    for key in ("format_version", "name", "version", "created_with", "inputs", "outputs", "preprocess",
                "postprocess", "labels", "artifacts", "calibration", "validation", "golden"):
        assert key in m, key
    assert m["format_version"] == 1
    assert m["name"] == "digits"
    assert isinstance(m["version"], str)


def test_manifest_created_with_names_edgesdk_engines_and_converters(digits_bundle):
    cw = digits_bundle.manifest["created_with"]
    assert cw["edgesdk"] == edgesdk.__version__
    assert set(cw["engines"]) == {"litert", "openvino", "onnxruntime"}
    assert all(cw["engines"].values())
    for dist in ("torch", "litert-torch", "ai-edge-quantizer", "nncf", "onnx"):
        assert cw["converters"][dist], dist


def test_manifest_inputs_outputs_labels_postprocess(digits_bundle):
    m = digits_bundle.manifest
    assert m["inputs"] == [{"name": m["inputs"][0]["name"], "shape": [1, 1, 8, 8], "dtype": "float32"}]
    assert len(m["outputs"]) == 1
    assert m["outputs"][0]["shape"] == [1, 10] and m["outputs"][0]["dtype"] == "float32"
    assert m["labels"] == [str(d) for d in range(10)]
    # the digits CNN returns logits: the device must apply softmax
    assert m["postprocess"] == {"type": "classification", "softmax": True, "top_k": 5}


def test_manifest_preprocess_is_the_toml(digits_bundle):
    declared = tomllib.loads(DIGITS_TOML.read_text())
    stored = digits_bundle.manifest["preprocess"]
    for key, value in declared.items():
        assert stored[key] == value, key


def test_manifest_artifact_entries_match_files(digits_bundle):
    root = digits_bundle.bundle
    for art in digits_bundle.manifest["artifacts"]:
        assert set(art) >= {"id", "engine", "precision", "files"}
        assert art["engine"] in ("litert", "openvino", "onnxruntime")
        assert art["precision"] in ("int8", "fp32")
        for f in art["files"]:
            path = root / f["path"]
            assert path.is_file() and not Path(f["path"]).is_absolute()
            assert f["bytes"] == path.stat().st_size
            assert f["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    ov = {a["id"]: [Path(f["path"]).suffix for f in a["files"]] for a in digits_bundle.manifest["artifacts"]}
    assert ov["openvino-int8"] == [".xml", ".bin"]  # the IR weights are covered by the checksums too


def test_manifest_calibration(digits_bundle):
    cal = digits_bundle.manifest["calibration"]
    assert cal["samples"] == 300
    assert len(cal["fingerprint"]) == 64 and int(cal["fingerprint"], 16) >= 0
    assert set(cal["method"]) == {"litert-int8", "openvino-int8", "onnxruntime-int8"}
    assert all(cal["method"].values())


def test_manifest_validation_per_artifact(digits_bundle):
    m = digits_bundle.manifest
    validation = m["validation"]
    for art in m["artifacts"]:
        v = validation[art["id"]]
        assert isinstance(v["passed"], bool)
        if art["precision"] == "int8":
            for key in ("top1_agreement", "accuracy", "reference_accuracy", "accuracy_drop_points",
                        "cosine_similarity", "max_abs_error", "latency_ms", "reference_latency_ms",
                        "latency_ratio", "slower_than_float"):
                assert key in v, (art["id"], key)
            assert v["reference"] == art["id"].replace("int8", "fp32")
            assert 0.99 <= v["cosine_similarity"] <= 1.0 + 1e-6
            assert v["latency_ms"] > 0 and v["latency_ratio"] > 0


def test_manifest_golden_inside_bundle_with_tolerance_per_int8_artifact(digits_bundle):
    m = digits_bundle.manifest
    golden = m["golden"]
    path = digits_bundle.bundle / golden["files"][0]["path"]
    assert path.suffix == ".npz" and path.parent == digits_bundle.bundle
    arrays = Bundle.open(digits_bundle.bundle).golden()
    assert arrays["input_0"].shape == (golden["count"], 1, 8, 8)
    assert arrays["output_0"].shape == (golden["count"], 10)
    assert golden["count"] >= 1
    for aid in ("litert-int8", "openvino-int8", "onnxruntime-int8"):
        # derived from the validated error: at least the worst error seen, not an arbitrary constant
        assert golden["tolerance"][aid] >= m["validation"][aid]["max_abs_error"] > 0
    assert golden["reference"] in {a["id"] for a in m["artifacts"] if a["precision"] == "fp32"}


def test_artifact_lookup(digits_bundle):
    bundle = Bundle.open(digits_bundle.bundle)
    art = bundle.artifact("onnxruntime-int8")
    assert (art.engine, art.precision) == ("onnxruntime", "int8")
    assert art.model_path.suffix == ".onnx" and art.model_path.is_file()
    assert [a.id for a in bundle.artifacts] == [a["id"] for a in digits_bundle.manifest["artifacts"]]
    assert bundle.preprocess.size == (8, 8)
    assert bundle.labels == [str(d) for d in range(10)]
    with pytest.raises(BundleError, match=r"no artifact 'coreml-int8' \(artifacts: litert-fp32"):
        bundle.artifact("coreml-int8")


# -- refusing bad bundles --------------------------------------------------------------------------------

def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("rel", ["tflite/model_int8.tflite", "openvino/model_int8.bin", "onnx/model_int8.onnx",
                                 "golden.npz"])
def test_tampered_file_is_named(bundle_copy, rel):
    _flip_byte(bundle_copy / rel)
    with pytest.raises(BundleError, match=rf"bundle file '{rel}' was altered: its sha256"):
        Bundle.open(bundle_copy)


def test_truncated_file_is_named(bundle_copy):
    path = bundle_copy / "onnx/model_fp32.onnx"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(BundleError, match=r"'onnx/model_fp32.onnx' was altered: \d+ bytes, manifest says"):
        Bundle.open(bundle_copy)


def test_missing_file_is_named(bundle_copy):
    (bundle_copy / "openvino/model_int8.xml").unlink()
    with pytest.raises(BundleError, match=r"bundle file 'openvino/model_int8.xml' is missing"):
        Bundle.open(bundle_copy)


def test_verify_false_skips_checksums(bundle_copy):
    _flip_byte(bundle_copy / "onnx/model_int8.onnx", offset=-1)
    assert Bundle.open(bundle_copy, verify=False).name == "digits"


@pytest.mark.parametrize("bad", ["../outside.onnx", "onnx/../../outside.onnx", "/etc/hostname", "C:/model.onnx"])
def test_path_escaping_the_bundle_is_refused(bundle_copy, bad):
    (bundle_copy.parent / "outside.onnx").write_bytes(b"x")
    m = _manifest(bundle_copy)
    m["artifacts"][0]["files"][0]["path"] = bad
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=r"escapes the bundle directory") as info:
        Bundle.open(bundle_copy)
    assert repr(bad) in str(info.value)


def test_symlink_leading_outside_is_refused(bundle_copy, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = bundle_copy / "onnx" / "model_int8.onnx"
    (outside / "model_int8.onnx").write_bytes(target.read_bytes())  # same bytes: the checksum would pass
    os.symlink(outside, bundle_copy / "linked")
    m = _manifest(bundle_copy)
    entry = next(a for a in m["artifacts"] if a["id"] == "onnxruntime-int8")
    entry["files"][0]["path"] = "linked/model_int8.onnx"
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=r"'linked/model_int8.onnx' resolves outside the bundle"):
        Bundle.open(bundle_copy)


def test_golden_path_escaping_is_refused(bundle_copy):
    m = _manifest(bundle_copy)
    m["golden"]["files"][0]["path"] = "../golden.npz"
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=r"'../golden.npz' escapes"):
        Bundle.open(bundle_copy)


def test_unknown_format_version(bundle_copy):
    m = _manifest(bundle_copy)
    m["format_version"] = 99
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=r"unknown format_version 99 \(this edgesdk reads 1\)"):
        Bundle.open(bundle_copy)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.pop("artifacts"), r"missing key\(s\) artifacts"),
    (lambda m: m.update(artifacts={}), r"artifacts must be a non-empty list, got \{\}"),
    (lambda m: m["artifacts"][0].pop("files"), r"artifacts\[0\] is missing key\(s\) files"),
    (lambda m: m["artifacts"][1].update(engine="tensorrt"),
     r'artifacts\[1\].engine must be one of "litert", "openvino", "onnxruntime", got "tensorrt"'),
    (lambda m: m["artifacts"][1].update(precision="int4"),
     r'artifacts\[1\].precision must be one of "int8", "fp32", got "int4"'),
    (lambda m: m["artifacts"][1].update(files=[]), r"artifacts\[1\].files must be a non-empty list, got \[\]"),
    (lambda m: m["artifacts"][1]["files"][0].pop("sha256"), r"artifacts\[1\].files\[0\] is missing key\(s\) sha256"),
], ids=["no-artifacts", "artifacts-not-list", "artifact-no-files", "engine", "precision", "empty-files",
        "no-sha256"])
def test_malformed_manifest(bundle_copy, edit, message):
    m = _manifest(bundle_copy)
    edit(m)
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=message):
        Bundle.open(bundle_copy)


def test_manifest_not_json(bundle_copy):
    (bundle_copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"manifest.json is not valid JSON"):
        Bundle.open(bundle_copy)


def test_manifest_not_an_object(bundle_copy):
    (bundle_copy / "manifest.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match=r"the manifest must be a JSON object"):
        Bundle.open(bundle_copy)


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match=r"is not a directory"):
        Bundle.open(tmp_path / "nothing-here")
    with pytest.raises(BundleError, match=r"is not a bundle: it has no manifest.json"):
        Bundle.open(tmp_path)


def test_golden_is_never_unpickled(bundle_copy):
    """A golden file holding a pickled object array is refused, not executed."""
    path = bundle_copy / "golden.npz"
    np.savez(path, input_0=np.array([object()], dtype=object))
    m = _manifest(bundle_copy)
    m["golden"]["files"][0].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), bytes=path.stat().st_size)
    _write_manifest(bundle_copy, m)
    with pytest.raises(BundleError, match=r"golden file 'golden.npz' is unreadable"):
        Bundle.open(bundle_copy).golden()
