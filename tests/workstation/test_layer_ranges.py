"""``layer_ranges`` of the tflite and onnx targets on the real AI Edge Quantizer and ONNX Runtime quantizer: the
activations the named layer reads take their quantization parameters from the other range choice, every other
activation keeps the default's (a layer's output is its consumers' input; the model's output keeps its own range).

Each target builds the digits CNN three ways: the default ranges (running min/max; MinMax), the other choice on the
whole model (mean of per-sample min/max; Percentile 99.99) and the default with ``layer_ranges`` naming one layer.
What the named layer reads must carry the whole-model build's parameters, every other activation the default build's.
Tensors an int8 kernel makes share parameters (the input and output of MAX_POOL_2D, RESHAPE, TRANSPOSE in LiteRT; ONNX
Runtime's MaxPool and Reshape reuse their input's scale initializer) count as one. The float models are converted once
for the module (seconds); each INT8 build takes well under a second.

A layer reading the output of an op the quantizer gives its input's parameters (a pool, a reshape) gets the other
ranges up that chain: its producer's output changes with it, and the check allows that.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from edgesdk.errors import ConversionError
from edgesdk_converters.targets import onnx as onnx_target
from edgesdk_converters.targets import ranges_text, tflite

# the digits CNN's Conv nodes (torch.onnx names): the second reads what the first writes (through a Relu ONNX
# Runtime folds into the first's output), the third what a MaxPool writes
CONV, CONV_AFTER_POOL = "node_conv2d_1", "node_conv2d_2"


# -- tflite ------------------------------------------------------------------------------------------------------------

def _code(model, op) -> int:
    code = model.operatorCodes[op.opcodeIndex]
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _tflite_activations(path) -> dict[str, tuple]:
    """Every quantized tensor without constant data (an activation) of a .tflite: name -> (scales, zero points)."""
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    found = {}
    for graph in model.subgraphs:
        for t in graph.tensors:
            q = t.quantization
            buffer = model.buffers[t.buffer].data if t.buffer < len(model.buffers) else None
            if q is not None and q.scale is not None and len(q.scale) and (buffer is None or not len(buffer)):
                found[t.name.decode()] = (tuple(np.asarray(q.scale).tolist()), tuple(np.asarray(q.zeroPoint).tolist()))
    return found


def _tflite_layer(path, output: str) -> tuple[set[str], set[str]]:
    """(the activations the op writing ``output`` reads, those plus every activation an int8 kernel makes share
    parameters with one of them) in the INT8 .tflite at ``path``."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    same_scale = {schema.BuiltinOperator.MAX_POOL_2D, schema.BuiltinOperator.RESHAPE, schema.BuiltinOperator.TRANSPOSE}
    activations = _tflite_activations(path)
    model = flatbuffer_utils.read_model(str(path))
    graph = model.subgraphs[0]
    name = lambda i: graph.tensors[i].name.decode()  # noqa: E731
    [op] = [op for op in graph.operators if output in {name(i) for i in op.outputs}]
    reads = {name(i) for i in op.inputs if i != -1 and name(i) in activations}
    tied, grown = set(reads), True
    while grown:  # a same-scale op's input and output have one set of parameters, up and down the graph
        more = {name(t) for other in graph.operators if _code(model, other) in same_scale
                for t in (other.inputs[0], *other.outputs)
                if {name(other.inputs[0]), *map(name, other.outputs)} & tied}
        grown = not more <= tied
        tied |= more
    return reads, tied & set(activations)


@pytest.fixture(scope="module")
def tflite_builds(tmp_path_factory, digits_source, digits_calib32):
    """The digits CNN through the tflite target: the default, ``mean_minmax`` on the whole model, and the default with
    ``layer_ranges`` on the first CONV_2D (calibration statistics kept in one dict across the first and last builds)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    out = tmp_path_factory.mktemp("tflite-layer-ranges")
    statistics = {}
    (out / "minmax").mkdir()
    fp32, base = tflite.build(digits_source, digits_calib32, out / "minmax", statistics=statistics)
    keys_after_default = sorted(statistics)
    minmax_stats = statistics["minmax"]
    (out / "whole").mkdir()
    whole_statistics = {}
    whole = tflite.build(digits_source, digits_calib32, out / "whole", float_model=fp32.files[0],
                         statistics=whole_statistics,
                         calibration="mean_minmax")[1]
    model = flatbuffer_utils.read_model(str(fp32.files[0]))
    graph = model.subgraphs[0]
    convs = [graph.tensors[op.outputs[0]].name.decode() for op in graph.operators
             if _code(model, op) == schema.BuiltinOperator.CONV_2D]
    assert len(convs) == 2, "the digits CNN has two CONV_2D ops"
    (out / "layer").mkdir()
    layer = tflite.build(digits_source, digits_calib32, out / "layer", float_model=fp32.files[0], statistics=statistics,
                         layer_ranges=(convs[0],))[1]
    return {"fp32": fp32.files[0], "base": base, "whole": whole, "layer": layer, "convs": convs, "out": out,
            "statistics": statistics, "keys_after_default": keys_after_default, "minmax_stats": minmax_stats,
            "whole_statistics": whole_statistics}


def _check_tflite_layer(base_path, whole_path, layer_path, output: str) -> None:
    base, whole, layer = (_tflite_activations(p) for p in (base_path, whole_path, layer_path))
    reads, moved = _tflite_layer(layer_path, output)
    assert reads and output not in moved
    assert set(base) == set(whole) == set(layer)
    differs = {t for t in moved if whole[t] != base[t]}
    assert differs == moved, f"the two range choices agree on {sorted(moved - differs)}: the test could not fail there"
    assert {t: layer[t] for t in moved} == {t: whole[t] for t in moved}
    assert {t: layer[t] for t in set(base) - moved} == {t: base[t] for t in set(base) - moved}


def test_tflite_layer_reads_with_the_other_ranges(tflite_builds):
    b = tflite_builds
    reads, _ = _tflite_layer(b["layer"].files[0], b["convs"][0])
    swapped = tflite.layer_tensors(b["fp32"], (b["convs"][0],))
    assert reads < set(swapped) and b["convs"][0] not in swapped  # what the op reads (its weight and bias too)
    _check_tflite_layer(b["base"].files[0], b["whole"].files[0], b["layer"].files[0], b["convs"][0])


def test_tflite_layer_reading_a_max_pool_reads_with_the_other_ranges(tflite_builds, digits_source, digits_calib32):
    b = tflite_builds
    out = b["out"] / "second-conv"
    out.mkdir()
    layer = tflite.build(digits_source, digits_calib32, out, float_model=b["fp32"], statistics=b["statistics"],
                         layer_ranges=(b["convs"][1],))[1]
    _check_tflite_layer(b["base"].files[0], b["whole"].files[0], layer.files[0], b["convs"][1])


def test_tflite_statistics_are_kept_per_range_choice(tflite_builds):
    b = tflite_builds
    assert b["keys_after_default"] == ["minmax"]
    assert sorted(b["statistics"]) == ["mean_minmax", "minmax"]
    assert b["statistics"]["minmax"] is b["minmax_stats"]  # read back, not calibrated again
    assert sorted(b["whole_statistics"]) == ["mean_minmax"]
    reads, _ = _tflite_layer(b["layer"].files[0], b["convs"][0])
    for t in reads:  # the two dicts' mean_minmax statistics are the same calibration
        for side in ("min", "max"):
            np.testing.assert_array_equal(b["statistics"]["mean_minmax"][t][side],
                                          b["whole_statistics"]["mean_minmax"][t][side])


def test_tflite_method_counts_the_layers(tflite_builds, digits_source, digits_calib32):
    b = tflite_builds
    assert b["layer"].method == b["base"].method + ranges_text((b["convs"][0],), "mean of per-sample min/max")
    assert re.search(r"; 1 layer [^;]*mean of per-sample min/max ranges$", b["layer"].method)
    assert not re.search(r"; \d+ layers? ", b["whole"].method)
    out = b["out"] / "both-convs"
    out.mkdir()
    both = tflite.build(digits_source, digits_calib32, out, float_model=b["fp32"], statistics=b["statistics"],
                        layer_ranges=tuple(b["convs"]), layer_calibration="minmax", calibration="mean_minmax")[1]
    assert both.method == b["whole"].method + ranges_text(tuple(b["convs"]), "running min/max")
    assert re.search(r"; 2 layers [^;]*running min/max ranges$", both.method)


def test_tflite_name_no_op_outputs_is_refused(tflite_builds, digits_source, digits_calib32, tmp_path):
    b = tflite_builds
    with pytest.raises(ConversionError, match=r"layer_ranges names no op's output tensor: W;404$"):
        tflite.build(digits_source, digits_calib32, tmp_path, float_model=b["fp32"], statistics=b["statistics"],
                     layer_ranges=(b["convs"][0], "W;404"))
    assert not (tmp_path / "model_int8.tflite").exists()
    with pytest.raises(ConversionError, match=r"layer_ranges names no op's output tensor: W;404$"):
        tflite.layer_tensors(b["fp32"], ("W;404",))


# -- onnx --------------------------------------------------------------------------------------------------------------

def _qdq_activations(path) -> dict[str, list]:
    """Every scale and zero-point initializer a QuantizeLinear of an activation uses: name -> value."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i).tolist() for i in model.graph.initializer}
    return {name: inits[name] for node in model.graph.node if node.op_type == "QuantizeLinear"
            for name in node.input[1:3]}


def _qdq_layer(path, node_name: str) -> tuple[set[str], set[str]]:
    """(the scale and zero-point initializers of the activations ``node_name`` reads: a DequantizeLinear of a
    QuantizeLinear's output feeding it, those of what it writes: a QuantizeLinear of its output) in the QDQ model."""
    import onnx

    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    [node] = [n for n in model.graph.node if n.name == node_name]
    reads = {name for i in node.input if i in producer and producer[i].op_type == "DequantizeLinear"
             and producer[i].input[0] in producer and producer[producer[i].input[0]].op_type == "QuantizeLinear"
             for name in producer[i].input[1:3]}
    writes = {name for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in node.output
              for name in n.input[1:3]}
    return reads, writes


@pytest.fixture(scope="module")
def onnx_builds(tmp_path_factory, digits_source, digits_calib32):
    """The digits CNN through the onnx target: MinMax, Percentile on the whole model, and MinMax with ``layer_ranges``
    on CONV, whose Percentile ranges are calibrated into a cache named before it exists."""
    out = tmp_path_factory.mktemp("onnx-layer-ranges")
    (out / "minmax").mkdir()
    fp32, base = onnx_target.build(digits_source, digits_calib32, out / "minmax")
    (out / "whole").mkdir()
    whole = onnx_target.build(digits_source, digits_calib32, out / "whole", float_model=fp32.files[0],
                              calibration="percentile")[1]
    cache = out / "percentile.json"
    assert not cache.exists()
    (out / "layer").mkdir()
    layer = onnx_target.build(digits_source, digits_calib32, out / "layer", float_model=fp32.files[0],
                              layer_ranges=(CONV,),
                              layer_calibration_cache=cache)[1]
    return {"fp32": fp32.files[0], "base": base, "whole": whole, "layer": layer, "cache": cache, "out": out}


def _check_qdq_layer(base_path, whole_path, layer_path, node_name: str) -> None:
    base, whole, layer = (_qdq_activations(p) for p in (base_path, whole_path, layer_path))
    reads, writes = _qdq_layer(layer_path, node_name)
    assert reads and writes and not reads & writes
    assert set(base) == set(whole) == set(layer)
    # Percentile on 32 digits_calib32 moves the scale of what the layer reads and of what it writes: the test can fail
    assert any(whole[k] != base[k] for k in reads) and any(whole[k] != base[k] for k in writes)
    assert {k: layer[k] for k in reads} == {k: whole[k] for k in reads}
    assert {k: layer[k] for k in set(base) - reads} == {k: base[k] for k in set(base) - reads}


def test_onnx_layer_reads_with_percentile_ranges(onnx_builds):
    b = onnx_builds
    _check_qdq_layer(b["base"].files[0], b["whole"].files[0], b["layer"].files[0], CONV)


def test_onnx_layer_reading_a_max_pool_reads_with_percentile_ranges(onnx_builds, digits_source, digits_calib32):
    b = onnx_builds
    out = b["out"] / "after-pool"
    out.mkdir()
    layer = onnx_target.build(digits_source, digits_calib32, out, float_model=b["fp32"],
                              layer_ranges=(CONV_AFTER_POOL,),
                              layer_calibration_cache=b["cache"])[1]
    _check_qdq_layer(b["base"].files[0], b["whole"].files[0], layer.files[0], CONV_AFTER_POOL)


def test_onnx_layer_calibration_cache_is_written_then_read(onnx_builds, digits_source, digits_calib32, tmp_path):
    b = onnx_builds
    written = json.loads(b["cache"].read_text())
    assert "Percentile" in json.dumps(written["calibration_method"])
    # a copy with one range moved: a build that reads the cache (and calibrates nothing) carries the moved range
    reads, _ = _qdq_layer(b["layer"].files[0], CONV)
    [scale] = [k for k in reads if k.endswith("_scale")]
    tensor = scale.removesuffix("_scale")
    entry = written["data"][tensor]
    assert float(entry["lowest"]) == 0.0  # a Relu's output: its scale is highest / 255
    entry["highest"] = 25.5
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(written))
    before = edited.read_bytes()
    (tmp_path / "build").mkdir()
    layer = onnx_target.build(digits_source, digits_calib32, tmp_path / "build", float_model=b["fp32"],
                              layer_ranges=(CONV,),
                              layer_calibration_cache=edited)[1]
    assert _qdq_activations(layer.files[0])[scale] == pytest.approx(0.1)
    assert _qdq_activations(b["layer"].files[0])[scale] != pytest.approx(0.1)
    assert edited.read_bytes() == before


def test_onnx_method_counts_the_layers(onnx_builds):
    b = onnx_builds
    assert b["layer"].method == b["base"].method + ranges_text((CONV,), f"Percentile {onnx_target.PERCENTILE}")
    assert re.search(rf"; 1 layer [^;]*Percentile {onnx_target.PERCENTILE} ranges$", b["layer"].method)
    assert not re.search(r"; \d+ layers? ", b["whole"].method)


def test_onnx_node_name_that_does_not_exist_is_refused(onnx_builds, digits_source, digits_calib32, tmp_path):
    b = onnx_builds
    cache = tmp_path / "percentile.json"
    shutil.copy(b["cache"], cache)
    with pytest.raises(ConversionError, match=r"layer_ranges names no node: node_nope$"):
        onnx_target.build(digits_source, digits_calib32, tmp_path, float_model=b["fp32"], layer_ranges=(CONV,
                          "node_nope"),
                          layer_calibration_cache=cache)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["percentile.json"]  # no INT8 model, no _prepared.onnx
    from onnxruntime.quantization.calibrate import load_tensors_data

    with pytest.raises(ConversionError, match=r"layer_ranges names no node: node_nope$"):
        onnx_target.range_overrides(b["fp32"], ("node_nope",), load_tensors_data(cache))


def test_tflite_walk_through_split_follows_its_data_not_its_axis(tmp_path):
    """TFLite's SPLIT reads (axis, data): a layer reading a SPLIT output gets the other ranges on the data the split
    cuts, not on its axis constant. litert-torch lowers ``torch.split`` to SLICE, so its first SLICE is rewritten as
    SPLIT(axis, data) here (the graph is only walked, never run)."""
    import litert_torch
    import torch
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c0, self.c1 = torch.nn.Linear(8, 8), torch.nn.Linear(4, 4)

        def forward(self, x):
            a, b = torch.split(self.c0(x), [4, 4], dim=-1)
            return self.c1(a) + b

    litert_torch.convert(Split().eval(), (torch.randn(1, 8),)).export(str(tmp_path / "sliced.tflite"))
    model = flatbuffer_utils.read_model(str(tmp_path / "sliced.tflite"))
    graph = model.subgraphs[0]
    code = lambda op: flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)  # noqa: E731
    name = lambda i: graph.tensors[i].name.decode()  # noqa: E731
    [fc0, fc1] = [op for op in graph.operators if code(op) == "FULLY_CONNECTED"]
    slice_op = next(op for op in graph.operators if code(op) == "SLICE" and fc1.inputs[0] in op.outputs)
    data = int(slice_op.inputs[0])
    assert data == int(fc0.outputs[0])
    split = schema.OperatorCodeT()
    split.builtinCode = split.deprecatedBuiltinCode = schema.BuiltinOperator.SPLIT
    split.version = 1
    model.operatorCodes.append(split)
    axis_buffer = schema.BufferT()
    axis_buffer.data = np.array([1], np.int32).tobytes()
    model.buffers.append(axis_buffer)
    axis = schema.TensorT()
    axis.shape, axis.type, axis.buffer, axis.name = np.array([], np.int32), schema.TensorType.INT32, \
        len(model.buffers) - 1, b"split_dim"
    graph.tensors.append(axis)
    slice_op.opcodeIndex = len(model.operatorCodes) - 1
    slice_op.inputs = np.array([len(graph.tensors) - 1, data], np.int32)
    slice_op.builtinOptionsType = schema.BuiltinOptions.SplitOptions
    options = schema.SplitOptionsT()
    options.numSplits = 1
    slice_op.builtinOptions = options
    flatbuffer_utils.write_model(model, str(tmp_path / "split.tflite"))

    read = tflite.layer_tensors(tmp_path / "split.tflite", (name(fc1.outputs[0]),))
    assert name(fc1.inputs[0]) in read and name(data) in read, read  # the split's output and the data it cuts
    assert "split_dim" not in read, read
