"""Stateful models on the device (issue 16): several inputs each in its own dtype, a scalar input, golden data in the
stacked layout, and ``model.stream()`` carrying the state from one call to the next as the manifest says.

The bundle is written here by hand (a tiny recurrent ONNX model, its golden data made with ONNX Runtime), so these
tests need no converter; the quantized Silero VAD bundle is tests/workstation/test_multi_input.py's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.errors import BundleError, InputError
from support import file_entry, rehash, write_manifest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

INPUTS = [{"name": "x", "shape": [1, 4], "dtype": "float32"}, {"name": "state", "shape": [2, 1, 4], "dtype": "float32"},
          {"name": "sr", "shape": [], "dtype": "int64"}]
OUTPUTS = [{"name": "y", "shape": [1, 4], "dtype": "float32"}, {"name": "stateN", "shape": [2, 1, 4], "dtype": "float32"}]


def recurrent_model(path: Path) -> Path:
    """stateN = tanh(0.5 * state + x); y = sum(stateN over its first axis) * sr / 16000 (sr: an int64 scalar)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Mul", ["state", "half"], ["scaled"]),
        helper.make_node("Add", ["scaled", "x"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["stateN"]),
        helper.make_node("ReduceSum", ["stateN", "axis0"], ["summed"], keepdims=0),
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["srf", "base"], ["ratio"]),
        helper.make_node("Mul", ["summed", "ratio"], ["y"]),
    ]
    inits = [helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
             helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
             helper.make_tensor("base", TensorProto.FLOAT, [], [16000.0])]
    graph = helper.make_graph(
        nodes, "recurrent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, 1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def by_hand(model: Path, xs: list[np.ndarray], sr: int = 16000) -> list[np.ndarray]:
    """The y of each step, the state carried by hand through ONNX Runtime."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    state, ys = np.zeros((2, 1, 4), np.float32), []
    for x in xs:
        y, state = session.run(None, {"x": x, "state": state, "sr": np.array(sr, np.int64)})
        ys.append(y)
    return ys


@pytest.fixture(scope="module")
def stateful_bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stateful") / "b"
    root.mkdir()
    model = recurrent_model(root / "model.onnx")
    rng = np.random.default_rng(0)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    feeds = [[rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((2, 1, 4)).astype(np.float32),
              np.array(16000, np.int64)] for _ in range(3)]
    outs = [session.run(None, dict(zip(["x", "state", "sr"], f))) for f in feeds]
    np.savez(root / "golden.npz", **{f"input_{j}": np.stack([f[j] for f in feeds]) for j in range(3)},
             **{f"output_{j}": np.stack([o[j] for o in outs]) for j in range(2)})
    write_manifest(root, {
        "format_version": 1, "name": "recurrent", "version": "1", "created_with": {"edgesdk": "test"},
        "inputs": INPUTS, "outputs": OUTPUTS, "postprocess": {"type": "none"},
        "artifacts": [{"id": "onnxruntime-fp32", "engine": "onnxruntime", "precision": "fp32",
                       "files": [file_entry(root, model)]}],
        "state": [{"output": "stateN", "input": "state", "initial": "zeros"}],
        "golden": {"files": [file_entry(root, root / "golden.npz")], "layout": "stacked", "count": 3,
                   "tolerance": {"onnxruntime-fp32": 1e-5}},
    })
    return root


def _copy(bundle: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, tmp_path / "copy"))


def _edit_manifest(bundle: Path, change) -> None:
    m = json.loads((bundle / "manifest.json").read_text())
    change(m)
    (bundle / "manifest.json").write_text(json.dumps(m))


def test_stream_gives_what_carrying_the_state_by_hand_gives(stateful_bundle):
    xs = [np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32) for i in range(20)]
    want = by_hand(stateful_bundle / "model.onnx", xs)
    with edgesdk.load(stateful_bundle) as model:
        assert model.placement.numerics["checked"] is True  # the golden check ran on the stacked golden data
        stream = model.stream()
        assert stream.inputs == ["x", "sr"]
        got = [stream.predict({"x": x, "sr": 16000}).outputs[0] for x in xs]
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-6)


def test_reset_starts_over_from_zeros(stateful_bundle):
    x = np.ones((1, 4), np.float32)
    with edgesdk.load(stateful_bundle) as model:
        stream = model.stream()
        first = stream.predict({"x": x, "sr": 16000}).outputs[0]
        second = stream.predict({"x": x, "sr": 16000}).outputs[0]
        assert not np.allclose(first, second)  # the state moved on
        assert np.abs(stream.state["state"]).sum() > 0
        stream.reset()
        np.testing.assert_array_equal(stream.state["state"], np.zeros((2, 1, 4), np.float32))
        np.testing.assert_allclose(stream.predict({"x": x, "sr": 16000}).outputs[0], first, atol=1e-7)


def test_state_property_is_a_copy(stateful_bundle):
    with edgesdk.load(stateful_bundle) as model:
        stream = model.stream()
        stream.state["state"][...] = 5.0
        assert not stream.state["state"].any()


def test_streams_are_independent(stateful_bundle):
    x = np.ones((1, 4), np.float32)
    with edgesdk.load(stateful_bundle) as model:
        a, b = model.stream(), model.stream()
        a.predict({"x": x, "sr": 16000})
        np.testing.assert_allclose(b.predict({"x": x, "sr": 16000}).outputs[0],
                                   model.stream().predict({"x": x, "sr": 16000}).outputs[0])


def test_stream_refuses_the_state_it_carries(stateful_bundle):
    with edgesdk.load(stateful_bundle) as model, pytest.raises(InputError, match=r"the stream carries input\(s\) "
                                                                                r"'state' itself"):
        model.stream().predict({"x": np.zeros((1, 4), np.float32), "sr": 16000,
                                "state": np.zeros((2, 1, 4), np.float32)})


def test_stream_of_several_inputs_needs_a_dict(stateful_bundle):
    with edgesdk.load(stateful_bundle) as model, pytest.raises(InputError, match=r"streams 2 inputs \(x, sr\) "
                                                                                r"besides its state"):
        model.stream().predict(np.zeros((1, 4), np.float32))


def test_stream_on_a_model_without_state_is_refused(digits_bundle):
    with edgesdk.load(digits_bundle.bundle) as model, pytest.raises(InputError, match="declares no state"):
        model.stream()


def test_predict_takes_each_input_in_its_own_dtype(stateful_bundle):
    x, state = np.ones((1, 4), np.float32), np.zeros((2, 1, 4), np.float32)
    with edgesdk.load(stateful_bundle) as model:
        feeds = model.io.feeds({"x": x, "state": state, "sr": 8000})
        assert [f.dtype for f in feeds] == [np.float32, np.float32, np.int64] and feeds[2].shape == ()
        assert model.io.feeds({"x": x, "state": state, "sr": np.float32(8000.0)})[2].dtype == np.int64
        y = model.predict({"x": x, "state": state, "sr": np.array(8000)}).outputs[0]
        np.testing.assert_allclose(y, 2 * np.tanh(1.0) * 0.5 * np.ones((1, 4)), rtol=1e-6)
        y16 = model.predict([x, state, 16000]).outputs[0]  # a list in input order
        np.testing.assert_allclose(y16, 2 * y, rtol=1e-6)


@pytest.mark.parametrize(("sr", "match"), [
    (16000.5, r"input 'sr' is int64; the values given \(float64\) are not all int64 values"),
    (np.array([16000]), r"input 'sr' must have shape \[\] \(a scalar\); got \[1\]"),
    ("16000", r"input 'sr' must be numeric"),
])
def test_bad_scalar_is_refused(stateful_bundle, sr, match):
    with edgesdk.load(stateful_bundle) as model, pytest.raises(InputError, match=match):
        model.predict({"x": np.ones((1, 4), np.float32), "state": np.zeros((2, 1, 4), np.float32), "sr": sr})


def test_unknown_input_name_is_named(stateful_bundle):
    with edgesdk.load(stateful_bundle) as model, pytest.raises(InputError, match=r"missing \['sr'\]; it has no input "
                                                                                r"'SR'"):
        model.predict({"x": np.ones((1, 4), np.float32), "state": np.zeros((2, 1, 4), np.float32), "SR": 16000})


def test_golden_samples_keep_each_tensor_shape(stateful_bundle):
    golden = edgesdk.Bundle.open(stateful_bundle).golden()
    assert golden.count == 3
    assert [golden.samples[f"input_{j}"].shape for j in range(3)] == [(3, 1, 4), (3, 2, 1, 4), (3,)]
    assert golden["input_1"].shape == (6, 1, 4)  # the joined view: samples on the tensor's first axis
    from edgesdk.runtime.numerics import golden_feeds

    feeds = golden_feeds(golden, 3)
    assert [f.shape for f in feeds[0]] == [(1, 4), (2, 1, 4), ()] and feeds[0][2].dtype == np.int64


def test_golden_member_without_the_sample_axis_is_refused(stateful_bundle, tmp_path):
    bundle = _copy(stateful_bundle, tmp_path)
    with np.load(bundle / "golden.npz") as data:
        members = {k: data[k] for k in data.files}
    members["input_1"] = members["input_1"].reshape(6, 1, 4)  # joined, in a bundle that says stacked
    np.savez(bundle / "golden.npz", **members)
    rehash(bundle)
    with pytest.raises(BundleError, match=r"member 'input_1' has shape \[6, 1, 4\]; the manifest's tensor is "
                                          r"\[2, 1, 4\] \(golden layout stacked"):
        edgesdk.Bundle.open(bundle).golden()


@pytest.mark.parametrize(("state", "match"), [
    ([{"output": "stateX", "input": "state"}], r"state\[0\]\.output \"stateX\" is not one of the outputs"),
    ([{"output": "stateN", "input": "sr"}], r"state\[0\]: output \"stateN\" \(float32 \[2, 1, 4\]\) cannot feed "
                                            r"input \"sr\" \(int64 \[\]\)"),
    ([{"output": "stateN", "input": "state", "initial": "ones"}], r"state\[0\]\.initial must be one of \"zeros\""),
    ([{"output": "stateN", "input": "state"}, {"output": "y", "input": "state"}],
     r"state\[1\]\.input \"state\" is fed by more than one output"),
], ids=["unknown-output", "shape", "initial", "twice"])
def test_bad_state_section_is_refused_at_open(stateful_bundle, tmp_path, state, match):
    bundle = _copy(stateful_bundle, tmp_path)
    _edit_manifest(bundle, lambda m: m.update(state=state))
    with pytest.raises(BundleError, match=match):
        edgesdk.Bundle.open(bundle)
