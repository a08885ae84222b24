"""The tflite target fuses stand-alone RELU / RELU6 into the op that writes their input before AI Edge Quantizer reads
the model (``tflite_model.fuse_activations``, through ``prepare_for_quantizer``), so that no lone int8 activation is
left outside XNNPACK.

litert-torch fuses activations itself, so the stand-alone ones are made here by editing its flatbuffer: a conv's
fused RELU and an ADD's fused RELU6 are split back into ops of their own (what MediaPipe's files hold: BlazeFace, from
its pip wheel, ends 17 blocks that way). Activations that must stay are made by litert-torch itself: a RELU whose
input another op reads too, and one whose input is a graph output. Outputs are compared on the real LiteRT interpreter.
"""

from __future__ import annotations

import copy
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import zoo
from edgesdk.bench.ops.litert import ops_outside_xnnpack
from edgesdk.bundle.reader import Bundle
from edgesdk_converters.tflite_model import fuse_activations, operators, prepare_for_quantizer
from support import quantize

FUSED_CODES = {1: "RELU", 3: "RELU6"}  # the schema's ActivationFunctionType -> the stand-alone op computing it
CONVERSIONS = {"QUANTIZE", "DEQUANTIZE"}


def split_activations(src: Path, dst: Path, kinds=("RELU", "RELU6")) -> Counter:
    """Write ``src`` to ``dst`` with each fused RELU / RELU6 of the main graph made an op of its own: the op writes a
    new tensor, the activation reads it and writes the op's old output. Returns the count by kind."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(src))
    graph = model.subgraphs[0]
    split: Counter[str] = Counter()
    ops = []
    for op in graph.operators:
        ops.append(op)
        kind = FUSED_CODES.get(getattr(op.builtinOptions, "fusedActivationFunction", None))
        if kind not in kinds:
            continue
        op.builtinOptions.fusedActivationFunction = 0
        before = copy.deepcopy(graph.tensors[op.outputs[0]])
        before.name = before.name + b"/before_" + kind.lower().encode()
        graph.tensors.append(before)
        ops.append(_activation(model, schema, kind, len(graph.tensors) - 1, op.outputs[0]))
        op.outputs = [len(graph.tensors) - 1]
        split[kind] += 1
    graph.operators = ops
    flatbuffer_utils.write_model(model, str(dst))
    return split


def _activation(model, schema, kind: str, source: int, target: int):
    code = getattr(schema.BuiltinOperator, kind)
    index = next((i for i, c in enumerate(model.operatorCodes) if max(c.builtinCode, c.deprecatedBuiltinCode) == code),
                 None)
    if index is None:
        entry = schema.OperatorCodeT()
        entry.builtinCode, entry.deprecatedBuiltinCode, entry.version = code, code, 1
        model.operatorCodes.append(entry)
        index = len(model.operatorCodes) - 1
    act = schema.OperatorT()
    act.opcodeIndex, act.inputs, act.outputs = index, [source], [target]
    return act


def op_names(path: Path) -> list[str]:
    return [op.name for op in operators(path) if op.subgraph == 0]


def run(path: Path, x: np.ndarray) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def convert(module, shape: tuple[int, ...], path: Path) -> Path:
    import litert_torch
    import torch

    litert_torch.convert(module.eval(), (torch.zeros(*shape),)).export(str(path))
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, Path]:
    """(litert-torch's model, the same with its two fused activations split off). The graph:
    CONV_2D+RELU -> ADD(x)+RELU6 =: b;  ADD(b, 1) =: y -> RELU(y) * y;  SUB(b, x) =: z -> RELU(z), z an output."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            b = F.relu6(torch.relu(self.conv(x)) + x)
            y = b + 1.0
            z = b - x
            return torch.relu(y) * y, torch.relu(z), z

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("fuse")
    original = convert(Mixed(), (1, 4, 8, 8), out / "mixed.tflite")
    # litert-torch fused the first two activations and had to leave the last two on their own
    assert op_names(original).count("RELU") == 2 and "RELU6" not in op_names(original), op_names(original)
    split = out / "mixed_split.tflite"
    assert split_activations(original, split) == {"RELU": 1, "RELU6": 1}
    return original, split


def test_standalone_relu_and_relu6_are_fused_into_their_producer(mixed, tmp_path):
    from ai_edge_litert.tools import flatbuffer_utils

    original, split = mixed
    model = flatbuffer_utils.read_model(str(split))
    before = len(model.subgraphs[0].operators)
    assert fuse_activations(model) == {"RELU": 1, "RELU6": 1}
    assert len(model.subgraphs[0].operators) == before - 2
    changes = prepare_for_quantizer(split, tmp_path / "prepared.tflite")
    assert any("2 stand-alone activations fused into their producer (1 RELU, 1 RELU6)" in c for c in changes), changes
    assert op_names(tmp_path / "prepared.tflite") == op_names(original)  # what litert-torch wrote in the first place


def test_the_fused_model_computes_the_same(mixed, tmp_path):
    original, split = mixed
    prepare_for_quantizer(split, tmp_path / "prepared.tflite")
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32) * 3  # RELU6 clips some
    reference = run(split, x)
    assert any(np.any(r == 0) for r in reference) and np.any(reference[0] > 0)  # the activations clip something
    for name, ref, got, first in zip("abc", reference, run(tmp_path / "prepared.tflite", x), run(original, x)):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(first, ref, rtol=0, atol=1e-6, err_msg=name)  # the split changed nothing either


def test_a_relu_whose_input_is_read_again_or_is_an_output_stays(mixed, tmp_path):
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    _, split = mixed
    prepare_for_quantizer(split, tmp_path / "prepared.tflite")
    model = flatbuffer_utils.read_model(str(tmp_path / "prepared.tflite"))
    graph = model.subgraphs[0]
    readers = Counter(i for op in graph.operators for i in op.inputs if i >= 0)
    relus = [op for op in graph.operators
             if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.RELU]
    assert len(relus) == 2
    # one reads the ADD output that the MUL reads too, the other the SUB output that is a graph output
    assert sorted((readers[op.inputs[0]], op.inputs[0] in graph.outputs) for op in relus) == [(1, True), (2, False)]


def test_an_op_with_an_activation_of_its_own_keeps_it(mixed, tmp_path):
    """A RELU6 after a CONV_2D that already applies RELU: fusing it would replace the conv's activation."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    original, _ = mixed
    model = flatbuffer_utils.read_model(str(original))
    graph = model.subgraphs[0]
    conv = next(op for op in graph.operators
                if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.CONV_2D)
    assert conv.builtinOptions.fusedActivationFunction == 1
    before = copy.deepcopy(graph.tensors[conv.outputs[0]])
    before.name = before.name + b"/before_relu6"
    graph.tensors.append(before)
    at = graph.operators.index(conv)
    graph.operators.insert(at + 1, _activation(model, schema, "RELU6", len(graph.tensors) - 1, conv.outputs[0]))
    conv.outputs = [len(graph.tensors) - 1]
    count = len(graph.operators)
    assert fuse_activations(model) == Counter()
    assert len(graph.operators) == count and conv.builtinOptions.fusedActivationFunction == 1


# -- the INT8 artifact -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def residual(tmp_path_factory) -> Path:
    """conv -> RELU -> conv -> ADD(residual) -> RELU6 with both activations stand-alone, 32 channels at 32x32 (large
    enough that XNNPACK's int8 convolutions are the fast ones)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(4, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)

        def forward(self, x):
            a = torch.relu(self.conv1(x))
            return F.relu6(self.conv2(a) + a)

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("residual")
    split = out / "residual_split.tflite"
    assert split_activations(convert(Residual(), (1, 4, 32, 32), out / "residual.tflite"), split) == {
        "RELU": 1, "RELU6": 1}
    return split


def test_without_fusion_a_lone_int8_relu_runs_outside_xnnpack(residual, tmp_path):
    """Why the fusion is there: AI Edge Quantizer on the split model leaves an int8 RELU XNNPACK does not take."""
    from ai_edge_quantizer import quantizer, recipe

    rng = np.random.default_rng(0)
    qt = quantizer.Quantizer(str(residual), recipe.static_wi8_ai8())
    ranges = qt.calibrate({"serving_default": [{"args_0": rng.standard_normal((1, 4, 32, 32)).astype(np.float32)}
                                               for _ in range(4)]})
    qt.quantize(ranges).export_model(str(tmp_path / "plain_int8.tflite"), overwrite=True)
    outside = ops_outside_xnnpack(tmp_path / "plain_int8.tflite")
    assert ("RELU", "int8") in {(kind, dtype) for kind, _, dtype in outside}, outside


def test_int8_artifact_of_stand_alone_activations_runs_whole_in_xnnpack(residual, tmp_path):
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((4, 32, 32)).astype(np.float32) for _ in range(16)]
    # random weights and data: the route is what is exercised, so the accuracy gates are opened
    result = quantize(residual, data, tmp_path / "residual.bundle", targets=["tflite"], recover="off", samples=8,
                      val_samples=8, max_drop=100.0, max_error_cap=10.0)
    art = Bundle.open(result.bundle).artifact("litert-int8")
    method = next(a["method"] for a in result.manifest["artifacts"] if a["id"] == "litert-int8")
    assert "2 stand-alone activations fused into their producer (1 RELU, 1 RELU6)" in method
    ops = op_names(art.model_path)
    assert "RELU" not in ops and "RELU6" not in ops and ops.count("CONV_2D") == 2 and "ADD" in ops, ops
    assert {kind for kind, _, _ in ops_outside_xnnpack(art.model_path)} <= CONVERSIONS


def test_blazeface_relus_are_fused_exactly_and_its_int8_graph_is_one_xnnpack_partition(tmp_path):
    from edgesdk.bench.ops.litert import profile

    source = zoo.model("blazeface")
    before = Counter(op_names(source))
    assert before["RELU"] == 17
    changes = prepare_for_quantizer(source, tmp_path / "prepared.tflite")
    assert any("17 stand-alone activations fused into their producer (17 RELU)" in c for c in changes), changes
    after = Counter(op_names(tmp_path / "prepared.tflite"))
    assert "RELU" not in after and after["ADD"] == before["ADD"] and after["CONV_2D"] == before["CONV_2D"]
    x = np.random.default_rng(0).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    for ref, got in zip(run(source, x), run(tmp_path / "prepared.tflite", x)):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)

    images = [np.random.default_rng(i).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32) for i in range(16)]
    shutil.copy(source, tmp_path / "blazeface.tflite")
    # random images: the route is what is exercised, so the accuracy gates are opened (as test_wild_tflite does)
    result = quantize(tmp_path / "blazeface.tflite", images, tmp_path / "blazeface.bundle", targets=["tflite"],
                      recover="off", samples=8, val_samples=8, max_drop=100.0, max_error_cap=1.0)
    int8 = Bundle.open(result.bundle).artifact("litert-int8").model_path
    assert "RELU" not in op_names(int8) and ops_outside_xnnpack(int8) == []
    assert profile(int8, [images[0]], 1, 1, 0.0)["partitions"] == 1
