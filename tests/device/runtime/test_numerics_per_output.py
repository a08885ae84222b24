"""The device's golden check per output (issue 17): an artifact whose [0, 1] probability is flattened to a constant,
beside a wide output that is right, passes a pooled tolerance (set by the wide output's scale) and fails its
probability's own. The bundle is written here by hand: a two-output ONNX model whose golden outputs come from the
real model, while the artifact shipped is its flattened twin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.bundle.reader import Bundle
from edgesdk.engines import open_engine
from edgesdk.errors import BackendUnavailable, BundleError
from edgesdk.runtime import numerics
from support import file_entry, write_manifest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

OUTPUTS = [{"name": "prob", "shape": [1, 1], "dtype": "float32"}, {"name": "state", "shape": [1, 8], "dtype": "float32"}]


def two_outputs(path: Path, flat: bool) -> Path:
    """x [1, 4] -> prob = sigmoid(x . w) [1, 1] and state = 40 * x W [1, 8]; ``flat``: w = 0, prob always 0.5."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (4, 1)).astype(np.float32) * (0.0 if flat else 1.0)
    big = (40 * rng.normal(0, 1, (4, 8))).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["prob"]),
         helper.make_node("MatMul", ["x", "big"], ["state"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(big, "big")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def write_bundle(root: Path, golden: dict, flat: bool = True) -> Path:
    """The flattened artifact (``flat``; else the real model), with golden data from the real model and ``golden``
    (tolerances) in the manifest."""
    root.mkdir()
    real = two_outputs(root.parent / f"{root.name}-real.onnx", flat=False)
    shipped = two_outputs(root / "model.onnx", flat=flat)
    session = ort.InferenceSession(str(real), providers=["CPUExecutionProvider"])
    xs = np.random.default_rng(1).normal(0, 1, (4, 1, 4)).astype(np.float32)
    outs = [session.run(None, {"x": x}) for x in xs]
    np.savez(root / "golden.npz", input_0=np.concatenate(xs),
             **{f"output_{j}": np.concatenate([o[j] for o in outs]) for j in range(2)})
    write_manifest(root, {
        "format_version": 1, "name": "two", "version": "1", "created_with": {"edgesdk": "test"},
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}], "outputs": OUTPUTS,
        "artifacts": [{"id": "onnxruntime-int8", "engine": "onnxruntime", "precision": "int8",
                       "files": [file_entry(root, shipped)]}],
        "golden": {"files": [file_entry(root, root / "golden.npz")], "layout": "joined", "count": len(xs),
                   "reference": "onnxruntime-fp32", **golden},
    })
    return root


def _check(root: Path) -> dict:
    bundle = Bundle.open(root)
    engine = open_engine("onnxruntime", root / "model.onnx")
    try:
        return numerics.check(engine, bundle, "onnxruntime-int8")
    finally:
        engine.close()


def test_a_flattened_output_passes_the_pooled_tolerance_of_an_old_bundle(tmp_path):
    """What a bundle from before per-output tolerances says: one tolerance, set by the wide output."""
    result = _check(write_bundle(tmp_path / "b", {"tolerance": {"onnxruntime-int8": 2.0}}))
    assert result["checked"] is True and 0.05 < result["max_abs_error"] <= 2.0
    assert "tolerance_per_output" not in result


def test_a_flattened_output_fails_its_own_tolerance(tmp_path):
    root = write_bundle(tmp_path / "b", {"tolerance": {"onnxruntime-int8": 2.0},
                                         "tolerance_per_output": {"onnxruntime-int8": [0.01, 2.0]}})
    with pytest.raises(BackendUnavailable, match=r"onnxruntime-int8 on onnxruntime:\S+ is off by "
                                                 r"0\.\d+ on golden input \d output 0 \('prob'; tolerance 0.01, that "
                                                 r"output's own\)") as err:
        _check(root)
    assert err.value.reason == "numerics_mismatch"
    with pytest.raises(BackendUnavailable, match="output 0 \\('prob'"):  # and load refuses to serve it
        edgesdk.load(root, allow_failed=True)


def test_each_output_within_its_own_tolerance_passes(tmp_path):
    root = write_bundle(tmp_path / "b", {"tolerance": {"onnxruntime-int8": 2.0},
                                         "tolerance_per_output": {"onnxruntime-int8": [0.5, 1e-3]}})
    result = _check(root)
    assert result["checked"] is True and result["tolerance"] == 2.0 and result["tolerance_per_output"] == [0.5, 1e-3]
    errors = result["max_abs_error_per_output"]
    assert 0.05 < errors[0] <= 0.5 and errors[1] == 0.0


def test_per_output_tolerances_alone_are_enough(tmp_path):
    result = _check(write_bundle(tmp_path / "b", {"tolerance_per_output": {"onnxruntime-int8": [0.5, 1e-3]}}))
    assert result["checked"] is True and result["tolerance"] == 0.5


def test_a_flattened_output_fails_its_mean_tolerance_where_its_max_one_is_the_whole_range(tmp_path):
    """A map judged by its masks may flip a pixel from 0 to 1 (its max tolerance is then its range): the mean
    tolerance still refuses an output that moved as a whole."""
    root = write_bundle(tmp_path / "b", {"tolerance_per_output": {"onnxruntime-int8": [1.0, 2.0]},
                                         "mean_tolerance_per_output": {"onnxruntime-int8": [0.01, 1e-3]}})
    with pytest.raises(BackendUnavailable, match=r"is off by 0\.\d+ on average on golden input \d output 0 \('prob'; "
                                                 r"mean tolerance 0.01, that output's own\): the output moved as a "
                                                 r"whole"):
        _check(root)


def test_the_real_model_meets_its_mean_tolerances(tmp_path):
    root = write_bundle(tmp_path / "b", {"tolerance_per_output": {"onnxruntime-int8": [1e-4, 1e-3]},
                                         "mean_tolerance_per_output": {"onnxruntime-int8": [1e-4, 1e-3]}}, flat=False)
    result = _check(root)
    assert result["checked"] is True and result["mean_tolerance_per_output"] == [1e-4, 1e-3]
    assert result["mean_abs_error_per_output"] == [0.0, 0.0]


@pytest.mark.parametrize("key", ["tolerance_per_output", "mean_tolerance_per_output"])
def test_a_per_output_list_of_the_wrong_length_is_refused_when_the_bundle_opens(tmp_path, key):
    root = write_bundle(tmp_path / "b", {key: {"onnxruntime-int8": [0.5]}})
    with pytest.raises(BundleError, match=rf'golden.{key}\["onnxruntime-int8"\] has 1 value\(s\); the '
                                          r"model has 2 output\(s\)"):
        Bundle.open(root)


@pytest.mark.parametrize("key", ["tolerance_per_output", "mean_tolerance_per_output"])
def test_a_negative_per_output_tolerance_is_refused(tmp_path, key):
    root = write_bundle(tmp_path / "b", {key: {"onnxruntime-int8": [0.5, -1.0]}})
    with pytest.raises(BundleError, match=rf"golden.{key}.onnxruntime-int8\[1\] must be a non-negative "
                                          r"number, got -1.0"):
        Bundle.open(root)
    json.loads((root / "manifest.json").read_text())  # the file itself is fine JSON: the schema refused it
