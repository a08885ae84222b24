"""``keep_float`` of the tflite target on the real AI Edge Quantizer and the real LiteRT interpreter: a kept op is
matched by its whole scope, never by a name that other ops' scopes merely end in.

AI Edge Quantizer matches a recipe's regex with ``re.search`` against an op's scope (its output tensor names joined
by ``;``, with a ``;`` after the last), and litert-torch's tensor names carry ``;`` themselves (``W;;W;65`` and
``W;;W;;W;65`` name two different ops). The digits CNN's float .tflite is given that kind of collision by hand: its
first CONV_2D writes ``W;1`` and its second ``W;;W;1``, whose scope ``W;;W;1;`` contains ``;W;1;``. A ``;``-bounded
pattern of ``W;1`` (what the target built before) keeps both convolutions in float; the scope pattern keeps one.
litert-torch converts the model once for the module (seconds); each INT8 build takes about a second.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from edgesdk.errors import ConversionError
from edgesdk_converters.layers import probe_for
from edgesdk_converters.targets import tflite

KEPT, NEIGHBOUR = "W;1", "W;;W;1"  # the scope of NEIGHBOUR's op, "W;;W;1;", contains ";W;1;"


def _old_pattern(name: str) -> str:
    """The recipe regex the tflite target built per kept name before it matched whole scopes."""
    return f"(^|;){re.escape(name)}($|;)"


@pytest.fixture(scope="module")
def models(tmp_path_factory, digits_source):
    """(float .tflite from litert-torch, the same with the two CONV_2D outputs renamed KEPT and NEIGHBOUR)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    out = tmp_path_factory.mktemp("keep-float")
    fp32 = digits_source.float_tflite(out / "fp32.tflite")
    model = flatbuffer_utils.read_model(str(fp32))
    graph = model.subgraphs[0]
    convs = [op for op in graph.operators
             if max(model.operatorCodes[op.opcodeIndex].builtinCode,
                    model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == schema.BuiltinOperator.CONV_2D]
    assert len(convs) == 2, "the digits CNN has two CONV_2D ops"
    for op, name in zip(convs, (KEPT, NEIGHBOUR)):
        assert op.outputs[0] not in graph.outputs  # the graph's inputs, outputs and signature keep their names
        graph.tensors[op.outputs[0]].name = name.encode()
    renamed = out / "renamed_fp32.tflite"
    flatbuffer_utils.write_model(model, str(renamed))
    return fp32, renamed


def _run(path, x):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    return next(iter(runner(args_0=x).values()))


def _int8_layers(digits_source, digits_calib32, renamed, out, keep_float):
    out.mkdir()
    built = tflite.build(digits_source, digits_calib32, out, keep_float=keep_float, float_model=renamed)
    int8 = next(b for b in built if b.id == "litert-int8")
    with probe_for("litert", int8.files[0]) as probe:
        return {layer.name: layer for layer in probe.layers()}


def test_renamed_float_model_computes_what_the_float_model_computes(models, digits_calib32):
    fp32, renamed = models
    x = digits_calib32[0][0]
    np.testing.assert_array_equal(_run(renamed, x), _run(fp32, x))
    with probe_for("litert", renamed) as probe:
        assert [l.name for l in probe.layers() if l.op == "CONV_2D"] == [KEPT, NEIGHBOUR]


def test_old_pattern_matched_both_scopes_the_scope_pattern_one(models):
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    _, renamed = models
    graph = tfl.read_model(str(renamed)).subgraphs[0]
    scopes = {tfl.get_tensor_name(graph.tensors[op.outputs[0]]): tfl.get_op_scope(op, graph.tensors)
              for op in graph.operators}
    assert (scopes[KEPT], scopes[NEIGHBOUR]) == ("W;1;", "W;;W;1;")
    assert re.search(_old_pattern(KEPT), scopes[KEPT]) and re.search(_old_pattern(KEPT), scopes[NEIGHBOUR])
    [entry] = tflite.kept_scopes(renamed, (KEPT,))
    assert entry["algorithm_key"] == "no_quantize"
    assert [name for name, scope in scopes.items() if re.search(entry["regex"], scope)] == [KEPT]


def test_keeping_one_op_leaves_the_op_whose_scope_ends_in_its_name_int8(models, digits_source, digits_calib32,
                                                                        tmp_path):
    _, renamed = models
    layers = _int8_layers(digits_source, digits_calib32, renamed, tmp_path / "kept", (KEPT,))
    macs = [layer for layer in layers.values() if layer.macs]
    assert len(macs) == 5 and {KEPT, NEIGHBOUR} <= {layer.name for layer in macs}
    assert not layers[KEPT].quantized
    assert layers[NEIGHBOUR].quantized
    assert [layer.name for layer in macs if not layer.quantized] == [KEPT]  # every other MAC layer stays INT8


def test_probe_name_with_a_duplicate_suffix_keeps_the_op_of_that_name(models, digits_source, digits_calib32, tmp_path):
    _, renamed = models
    layers = _int8_layers(digits_source, digits_calib32, renamed, tmp_path / "suffixed", (f"{NEIGHBOUR} #12",))
    assert not layers[NEIGHBOUR].quantized
    assert [layer.name for layer in layers.values() if layer.macs and not layer.quantized] == [NEIGHBOUR]


def test_name_no_op_outputs_is_refused(models, digits_source, digits_calib32, tmp_path):
    _, renamed = models
    before = renamed.read_bytes()
    with pytest.raises(ConversionError, match=r"keep_float names no op's output tensor: W;2\b"):
        tflite.build(digits_source, digits_calib32, tmp_path, keep_float=(KEPT, "W;2"), float_model=renamed)
    assert not (tmp_path / "model_int8.tflite").exists()
    assert renamed.read_bytes() == before
