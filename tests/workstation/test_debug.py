"""``edgesdk debug``: each INT8 artifact of a bundle against its float reference, layer by layer, named by the
source model's nodes, on real engines; and :mod:`edgesdk_converters.layers.align` on hand-made arrays.

Two bundles: the digits CNN from ONNX (session fixture ``onnx_bundle``: convolutions whose bias and activation
each engine folds its own way), and a three-MatMul model whose "hidden" layer has one output channel 300x the others
that "head" ignores, so per-tensor INT8 activations break "head" on every engine (built here, recover="off").
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from edgesdk import Bundle
from edgesdk.errors import ConversionError, ValidationFailed
from edgesdk.runtime.numerics import golden_feeds
from edgesdk_converters.layers import Layer, probe_for
from edgesdk_converters.layers.align import SAME, align
from edgesdk_converters.layers.debug import SourceNames, debug_bundle, text
from onnx_graphs import save_graph
from support import DIGITS_ONNX, quantize, rehash

SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
INT8 = ("litert-int8", "openvino-int8", "onnxruntime-int8")
CHAIN = ("embed", "hidden", "head")  # the outlier model's nodes, in order; their tensors: e, h, logits


def edgesdk(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300)


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    w1 = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    w1[:, 15] = 0.0
    w1[0, 15] = 300.0  # channel 15 of "hidden" is ~300x the others
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    w2[15] = 0.0  # "head" ignores it
    return {"w0": w0, "w1": w1, "w2": w2}


@pytest.fixture(scope="module")
def outlier(tmp_path_factory) -> Path:
    """The three-engine bundle of the outlier model, its INT8 artifacts as quantized (failing their gate)."""
    root = tmp_path_factory.mktemp("debug-outlier")
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w1"], ["h"], name="hidden"),
             helper.make_node("MatMul", ["h", "w2"], ["logits"], name="head")]
    save_graph(root / "outlier.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], weights())
    np.savez(root / "x.npz", x=np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32))
    with pytest.raises(ValidationFailed):
        quantize(root / "outlier.onnx", root / "x.npz", root / "outlier.bundle", samples=100, recover="off")
    return root / "outlier.bundle"


@pytest.fixture(scope="module")
def outlier_json(outlier, tmp_path_factory) -> tuple[dict, Path]:
    """``edgesdk debug --json --plot`` on the outlier bundle: the parsed report and the PNG's path."""
    png = tmp_path_factory.mktemp("debug-plot") / "snr.png"
    proc = edgesdk("debug", outlier, "--json", "--plot", png, "--top", "2")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), png


@pytest.fixture(scope="module")
def digits_report(onnx_bundle):
    return debug_bundle(onnx_bundle.bundle)


# -- the command on the outlier bundle ----------------------------------------------------------------------

def test_text_shows_the_worst_layers_of_every_engine_by_source_name(outlier):
    proc = edgesdk("debug", outlier, "--top", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for aid in INT8:
        assert f"[{aid}] against {aid.replace('int8', 'fp32')}, 4 samples" in proc.stderr  # progress on stderr
        section = out.split(f"{aid} against {aid.replace('int8', 'fp32')}: 3 layers, ", 1)[1].split("\n\n")[0]
        rows = [line.split() for line in section.splitlines()[2:]]
        assert [r[0] for r in rows] == ["1", "2"], section  # --top 2
        assert [r[1] for r in rows] == ["head", "hidden"], section  # source names, worst first, on every engine
    assert out.rstrip().endswith("in every artifact's worst 2: head, hidden"), out


def test_json_has_worst_and_along_with_added_and_accumulated_numbers(outlier_json):
    report, _ = outlier_json
    assert report["source_reference"] == "onnxruntime-fp32" and report["samples"] == 4
    assert [a["artifact"] for a in report["artifacts"]] == list(INT8)
    for a in report["artifacts"]:
        assert a["reference"] == a["artifact"].replace("int8", "fp32")
        assert a["layers"] == 3 and a["unmatched_layers"] == 0, a
        assert a["macs"] == a["int8_macs"] == 16 * 16 * 2 + 16 * 4
        assert [r["source_node"] for r in a["along"]] == list(CHAIN), a["along"]
        assert [r["position"] for r in a["along"]] == [0, 1, 2]
        assert [r["source_node"] for r in a["worst"]] == ["head", "hidden"]  # --top 2, by added error
        for row in a["along"]:
            assert row["quantized"] is True and row["layer"] == row["source_node"]
            for kind in ("added", "accumulated"):
                numbers = row[kind]
                assert set(numbers) == {"snr_db", "cosine", "max_abs_error", "mean_abs_error"}, numbers
                assert numbers["snr_db"] is not None and numbers["max_abs_error"] >= numbers["mean_abs_error"] > 0
        head = a["along"][2]
        assert head["added"]["snr_db"] < 5 and head["accumulated"]["cosine"] < 0.8  # broken, on every engine
        assert a["along"][0]["added"]["snr_db"] > 30  # "embed" quantizes well


def test_litert_rows_are_named_by_value(outlier_json):
    """LiteRT's tensors have litert-torch's names, not the ONNX ones: its rows get the source's names by value."""
    report, _ = outlier_json
    litert = next(a for a in report["artifacts"] if a["engine"] == "litert")
    assert [r["source_tensor"] for r in litert["along"]] == ["e", "h", "logits"]
    assert all(r["tensor"] != r["source_tensor"] for r in litert["along"]), litert["along"]
    assert [r["op"] for r in litert["along"]] == ["FULLY_CONNECTED"] * 3
    ort = next(a for a in report["artifacts"] if a["engine"] == "onnxruntime")
    assert [r["engine_node"] for r in ort["along"]] == list(CHAIN)  # ORT keeps the source's names


def test_plot_writes_a_png(outlier_json):
    _, png = outlier_json
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        assert image.size[0] > 600 and image.size[1] > 300


def test_numbers_are_onnx_runtimes_qdq_arithmetic(outlier_json, outlier):
    """ONNX Runtime's rows recomputed with numpy from the INT8 graph's own scales and zero points on the bundle's
    golden inputs: a layer's value is its dequantized output (what the next layer reads); "added" runs it on the
    float model's input values, "accumulated" on the INT8 model's."""
    report, _ = outlier_json
    rows = {r["source_node"]: r for r in next(a for a in report["artifacts"] if a["engine"] == "onnxruntime")["along"]}
    bundle = Bundle.open(outlier)
    x = np.concatenate([feed[0] for feed in golden_feeds(bundle.golden(), 1)[:4]])
    graph = onnx.load(str(outlier / "onnx" / "model_int8.onnx")).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def weight(dq_output: str) -> np.ndarray:
        node = producer[dq_output]
        q, scale, zero = (inits[i] for i in node.input[:3])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        shape[axis] = -1
        return (q.astype(np.float32) - zero.reshape(shape).astype(np.float32)) * scale.reshape(shape)

    def qdq(dq_output: str, value: np.ndarray) -> np.ndarray:
        node = producer[dq_output]
        scale, zero = inits[node.input[1]], inits[node.input[2]]
        info = np.iinfo(zero.dtype)
        q = np.clip(np.rint(value / scale) + np.float32(zero), info.min, info.max)
        return ((q - np.float32(zero)) * scale).astype(np.float32)

    w = weights()
    floats = {"x": x}
    floats["e"] = x @ w["w0"]
    floats["h"] = floats["e"] @ w["w1"]
    floats["logits"] = floats["h"] @ w["w2"]
    inputs = {"embed": ("x", "w0", "e"), "hidden": ("e", "w1", "h"), "head": ("h", "w2", "logits")}
    out_dq = {"e": "e_DequantizeLinear_Output", "h": "h_DequantizeLinear_Output", "logits": "logits"}
    int8 = {"x": x}
    for name in CHAIN:
        src, w_name, out = inputs[name]
        layer = lambda value: qdq(out_dq[out], qdq(f"{src}_DequantizeLinear_Output", value)  # noqa: E731
                                  @ weight(f"{w_name}_DequantizeLinear_Output"))
        int8[out] = layer(int8[src])
        for kind, got in (("added", layer(floats[src])), ("accumulated", int8[out])):
            want = rows[name][kind]
            ref = floats[out].astype(np.float64)
            err = got.astype(np.float64) - ref
            assert math.isclose(want["snr_db"], 10 * math.log10(np.sum(ref ** 2) / np.sum(err ** 2)),
                                abs_tol=1e-3), (name, kind)
            assert math.isclose(want["max_abs_error"], float(np.max(np.abs(err))), rel_tol=1e-4), (name, kind)
            assert math.isclose(want["mean_abs_error"], float(np.mean(np.abs(err))), rel_tol=1e-4), (name, kind)


def test_val_compares_on_the_given_inputs(outlier):
    proc = edgesdk("debug", outlier, "--val", outlier.parent / "x.npz", "--samples", "3", "--json", "-q",
                   "--artifact", "onnxruntime-int8")
    assert proc.returncode == 0, proc.stderr[-600:]
    assert json.loads(proc.stdout)["samples"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (("--artifact", "onnxruntime-fp32"), r"error: ConversionError: onnxruntime-fp32 is not an INT8 artifact: debug "
                                         r"compares an INT8 artifact with its float reference \(INT8 artifacts: "
                                         r"litert-int8, openvino-int8, onnxruntime-int8\)"),
    (("--artifact", "nope"), r"error: ConversionError: bundle 'outlier' has no artifact 'nope' \(artifacts: "
                             r"litert-fp32, litert-int8, .*onnxruntime-int8\)"),
], ids=["float", "unknown"])
def test_refuses_an_artifact_it_cannot_debug_in_one_line(outlier, args, message):
    proc = edgesdk("debug", outlier, *args)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(message, lines[0]), proc.stderr


@pytest.mark.parametrize("option", ["--samples", "--top"])
def test_refuses_counts_below_one(outlier, option):
    proc = edgesdk("debug", outlier, option, "0")
    assert proc.returncode == 2 and "must be at least 1" in proc.stderr and "Traceback" not in proc.stderr


def test_a_bundle_without_int8_artifacts_is_refused(outlier, tmp_path):
    copy = tmp_path / "float-only.bundle"
    shutil.copytree(outlier, copy)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["precision"] != "int8"]
    manifest["validation"] = {k: v for k, v in manifest["validation"].items() if not k.endswith("-int8")}
    path.write_text(json.dumps(manifest))
    rehash(copy)
    with pytest.raises(ConversionError, match="bundle 'outlier' has no INT8 artifact to debug"):
        debug_bundle(copy)


# -- the digits CNN: engines that fold convolutions differently line up ------------------------------------

def test_digits_rows_of_onnxruntime_and_openvino_are_source_nodes(digits_report):
    source = {n.name: n.op_type for n in onnx.load(str(DIGITS_ONNX)).graph.node}
    report = digits_report.as_dict(top=5)
    by_engine = {a["engine"]: a for a in report["artifacts"]}
    assert {"onnxruntime", "openvino"} <= set(by_engine)
    tops = {}
    for engine in ("onnxruntime", "openvino"):
        a = by_engine[engine]
        assert a["unmatched_layers"] == 0, a
        assert len(a["worst"]) == 5
        for row in a["along"]:
            assert row["source_node"] in source, row
            if row["macs"]:  # a convolution or matrix product is named by the source's, whatever the engine folded
                assert source[row["source_node"]] in ("Conv", "Gemm"), row
        tops[engine] = [r["source_node"] for r in a["worst"]]
    assert set(tops["onnxruntime"]) & set(tops["openvino"]), tops
    # OpenVINO splits each convolution into a bias-free Convolution and an Add: both carry the source's name
    assert {r["engine_node"] for r in by_engine["openvino"]["along"] if r["source_node"] == "node_conv2d"} == {
        "node_conv2d/WithoutBiases", "node_conv2d"}


def test_digits_text_prints_the_worst_per_artifact_and_the_shared_names(digits_report):
    out = text(digits_report, 5)
    sections = out.split("\n\n")[1:-1]
    assert len(sections) == len(digits_report.engines)
    source = {n.name for n in onnx.load(str(DIGITS_ONNX)).graph.node}
    for section, engine in zip(sections, digits_report.engines):
        assert section.startswith(f"{engine.artifact} against {engine.reference}: "), section
        rows = section.splitlines()[2:]
        assert len(rows) == 5
        if engine.engine in ("onnxruntime", "openvino"):
            assert all(row.split()[1] in source for row in rows), section
    shared = out.splitlines()[-1]
    assert shared.startswith("in every artifact's worst 5: ") and shared.split(": ", 1)[1] != "none", shared
    assert set(shared.split(": ", 1)[1].split(", ")) <= source


def test_digits_litert_multiplying_layers_are_named_by_value(digits_report):
    source = {n.name: n.op_type for n in onnx.load(str(DIGITS_ONNX)).graph.node}
    litert = next((e for e in digits_report.engines if e.engine == "litert"), None)
    if litert is None:
        pytest.skip("the onnx_bundle fixture has no LiteRT artifact")
    weighted = [r for r in litert.rows if r.macs]
    assert [r.op for r in weighted] == ["DEPTHWISE_CONV_2D", "CONV_2D", "CONV_2D", "FULLY_CONNECTED",
                                        "FULLY_CONNECTED"]
    assert [r.source for r in weighted] == ["node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_linear",
                                            "node_linear_1"]
    assert all(r.name != r.source_tensor for r in weighted)
    assert all(source[r.source] in ("Conv", "Gemm") for r in weighted)


# -- the ONNX Runtime probe on a partly-float QDQ model ----------------------------------------------------

def test_onnxruntime_probe_says_a_layer_kept_in_float_is_not_quantized(outlier, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    x = np.load(outlier.parent / "x.npz")["x"]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter({"x": row[None]} for row in x[:50])

        def get_next(self):
            return next(self.rows, None)

    path = tmp_path / "partly_float.onnx"
    quantize_static(str(outlier / "onnx" / "model_fp32.onnx"), str(path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, nodes_to_exclude=["hidden", "head"])
    graph = onnx.load(str(path)).graph
    inits = {i.name for i in graph.initializer}
    assert {n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in inits} == {"hidden", "head"}
    probe = probe_for("onnxruntime", path)
    try:
        probe.capture([x[:1]])
        quantized = {l.node: l.quantized for l in probe.layers() if l.macs}
    finally:
        probe.close()
    assert quantized == {"embed": True, "hidden": False, "head": False}


def test_probe_for_an_engine_without_one_names_those_that_exist(tmp_path):
    with pytest.raises(ConversionError, match="no layer probe for engine 'tensorrt'; probes exist for onnxruntime, "
                                              "openvino, litert"):
        probe_for("tensorrt", tmp_path / "model.plan")


# -- align, on hand-made arrays -----------------------------------------------------------------------------

def _layer(name: str, inputs: tuple[str, ...] = ("x",), macs: int = 0) -> Layer:
    return Layer(name, "Op", f"node_{name}", inputs, macs)


def test_align_matches_an_nhwc_tensor_to_its_nchw_source():
    nchw = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    matched = align([_layer("conv")], {"conv": nchw}, [_layer("t")], {"t": nchw.transpose(0, 2, 3, 1).copy()})
    assert matched == {"t": "conv"}


def test_align_matches_a_flattened_copy_and_tolerates_rounding_but_not_error():
    src = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    scale = float(np.abs(src).max())
    layers = [_layer("flat"), _layer("close"), _layer("off")]
    values = {"flat": src.reshape(1, 24), "close": src + 0.5 * SAME * scale, "off": src + 3 * SAME * scale}
    source = [_layer("a"), _layer("b"), _layer("c")]
    same = {"a": src, "b": src.copy(), "c": src.copy()}
    matched = align(source, same, layers, values)
    assert matched == {"flat": "a", "close": "b"}  # "off" differs by 3x the tolerance: no source holds its numbers


def test_align_names_nothing_by_a_constant_tensor():
    ones = np.full((1, 2, 3, 4), 0.5, np.float32)
    varied = np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float32)
    matched = align([_layer("k"), _layer("v")], {"k": ones, "v": varied},
                    [_layer("const"), _layer("ints")], {"const": ones.copy(), "ints": (varied * 10).astype(np.int32)})
    assert matched == {}


def test_align_takes_the_earliest_free_source_among_equal_ones():
    """A Reshape's output holds its input's numbers: the first engine tensor with them is named by the op that
    computed them (the earliest source), the next by the next, and once all are taken the earliest again."""
    value = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    source = [_layer("conv"), _layer("reshape", ("conv",)), _layer("flatten", ("reshape",))]
    src_values = {"conv": value, "reshape": value.reshape(1, 2, 12), "flatten": value.reshape(1, 24)}
    layers = [_layer("e1"), _layer("e2"), _layer("e3"), _layer("e4")]
    values = {"e1": value.transpose(0, 2, 3, 1).copy(), "e2": value.reshape(1, 24), "e3": value.copy(),
              "e4": value.copy()}
    assert align(source, src_values, layers, values) == {"e1": "conv", "e2": "reshape", "e3": "flatten",
                                                         "e4": "conv"}


def test_align_by_name_comes_first_and_takes_the_name():
    value = np.random.default_rng(4).standard_normal((1, 8)).astype(np.float32)
    source = [_layer("a"), _layer("b")]
    # "b" is matched by its name although it holds "a"'s numbers; "z" then finds "a" free
    matched = align(source, {"a": value, "b": value * 2}, [_layer("z"), _layer("b")], {"z": value, "b": value})
    assert matched == {"b": "b", "z": "a"}


def test_source_names_give_a_folded_layer_the_source_op_that_multiplies():
    """An engine's convolution with the activation folded in holds the source Relu's numbers: it is named by the
    Conv behind the Relu (so a convolution has one name on every engine); one that multiplies nothing keeps the
    name it matched."""
    source = [Layer("conv", "Conv", "node_conv", ("x",), 100), Layer("relu", "Relu", "node_relu", ("conv",))]
    layers = [Layer("fused", "CONV_2D", "op 0", ("x",), 100), Layer("act", "RELU", "op 1", ("fused",))]
    names = SourceNames(source, {"fused": "relu", "act": "relu"}, layers)
    assert names(layers[0]) == ("node_conv", "conv")
    assert names(layers[1]) == ("node_relu", "relu")
    assert names(Layer("other", "ADD", "op 2", ("x",))) is None
