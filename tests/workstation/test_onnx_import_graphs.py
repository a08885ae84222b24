"""ONNX -> torch importer on whole graphs: shape folding and input shapes, unsupported ops and attributes, models
exported by torch.onnx.export, and the float LiteRT path against onnxruntime. The per-op tests are in
test_onnx_import.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import ConversionError
from edgesdk_converters.onnx_import import import_onnx, unsupported_ops
from onnx_graphs import (Const, SideBySide, assert_close, chain_model, make_model, node_model, rand, run_litert,
                         run_module, run_ort)
from test_onnx_import import CONV, DENSE, ELEMENTWISE, POOLS, REDUCE, RESIZE, SHAPES, W33, X4, X4B  # the op cases


# ---- shape folding and input shapes

def dynamic_conv_reshape_model():
    """Conv on a [N, 3, H, W] input, then Reshape to [N, -1] with the target computed by Shape -> Gather ->
    Unsqueeze -> Concat, times ConstantOfShape([N, 1]) and plus a Range over the folded width."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["y"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["y", "target"], ["flat"], name="reshape"),
        helper.make_node("Concat", ["n1", "one"], ["half_shape"], name="half_shape", axis=0),
        helper.make_node("ConstantOfShape", ["half_shape"], ["half"], name="half",
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Mul", ["flat", "half"], ["scaled"], name="scale"),
        helper.make_node("Shape", ["scaled"], ["s2"], name="shape2", start=1),
        helper.make_node("Squeeze", ["s2"], ["width"], name="width"),
        helper.make_node("Range", ["zero", "width", "one_scalar"], ["ramp_i"], name="ramp"),
        helper.make_node("Cast", ["ramp_i"], ["ramp"], name="ramp_float", to=TensorProto.FLOAT),
        helper.make_node("Add", ["scaled", "ramp"], ["out"], name="add"),
    ]
    inits = [
        numpy_helper.from_array(rand(4, 3, 3, 3, seed=11), "w"),
        numpy_helper.from_array(rand(4, seed=12), "b"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_axes"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(1, np.int64), "one_scalar"),
    ]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["batch", 3, "height", "width"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", None])],
                              initializer=inits)
    return make_model(graph, 15)


@pytest.mark.parametrize("shape", [(2, 3, 6, 10), (1, 3, 5, 4)])
def test_dynamic_dims_fixed_by_input_shapes_fold_the_shape_subgraph(shape):
    model = dynamic_conv_reshape_model()
    module = import_onnx(model, input_shapes={"x": shape})
    feeds = {"x": rand(*shape, seed=13)}
    assert_close(run_module(module, model, feeds), run_ort(model, feeds))
    computed = [n.target for n in module.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(computed) == 4, computed  # conv, reshape, mul, add: the shape arithmetic is gone


def test_dynamic_dims_module_exports_with_torch_export():
    import torch

    module = import_onnx(dynamic_conv_reshape_model(), input_shapes={"x": (2, 3, 6, 10)})
    x = rand(2, 3, 6, 10, seed=14)
    exported = torch.export.export(module, (torch.from_numpy(x),))
    np.testing.assert_allclose(exported.module()(torch.from_numpy(x)).numpy(), module(torch.from_numpy(x)).numpy())


def test_dynamic_dims_without_input_shapes_name_the_input():
    with pytest.raises(ConversionError, match=r"input 'x' has dynamic shape \[batch, 3, height, width\].*input_shapes"
                                              r".*--input-shape x:Nx3xNxN"):
        import_onnx(dynamic_conv_reshape_model())


def test_partial_input_shapes_still_refused():
    model, _ = node_model("Relu", [X4])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    with pytest.raises(ConversionError, match="input 'in0' has dynamic shape \\[n, 3, 8, 8\\]"):
        import_onnx(model)
    assert import_onnx(model, input_shapes={"in0": (2, 3, 8, 8)}) is not None


@pytest.mark.parametrize("given,message", [
    ((1, 4, 8, 8), r"input 'in0' has declared shape \[1, 3, 8, 8\]; input_shapes gives \[1, 4, 8, 8\].*dim\(s\) \[1\]"),
    ((1, 3, 8), r"input 'in0' has rank 4 .* input_shapes gives rank 3"),
    ((1, 3, 8, -8), r"must be a tuple of positive ints"),
])
def test_input_shapes_that_disagree_are_refused(given, message):
    model, _ = node_model("Relu", [X4])
    with pytest.raises(ConversionError, match=message):
        import_onnx(model, input_shapes={"in0": given})


def test_input_shapes_for_an_unknown_input_are_refused():
    model, _ = node_model("Relu", [X4])
    with pytest.raises(ConversionError, match=r"\['image'\], which the model does not have \(inputs: in0\)"):
        import_onnx(model, input_shapes={"image": (1, 3, 8, 8)})


# ---- unsupported ops and attributes

def unsupported_model():
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 10, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 10])
    feat = helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 3, 8, 8])
    nodes = [
        helper.make_node("Relu", ["feat"], ["r"], name="relu"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel1"], name="nms_1"),
        helper.make_node("RoiAlign", ["r", "rois", "idx"], ["roi_out"], name="roi"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel2"], name="nms_2"),
    ]
    outputs = [helper.make_empty_tensor_value_info(n) for n in ("sel1", "roi_out", "sel2")]
    inits = [numpy_helper.from_array(np.zeros((1, 4), np.float32), "rois"),
             numpy_helper.from_array(np.zeros(1, np.int64), "idx")]
    return helper.make_model(helper.make_graph(nodes, "nms", [boxes, scores, feat], outputs, initializer=inits),
                             opset_imports=[helper.make_opsetid("", 13)])


def test_unsupported_ops_are_listed_all_at_once():
    model = unsupported_model()
    assert unsupported_ops(model) == [("NonMaxSuppression", 2, "nms_1"), ("RoiAlign", 1, "roi")]
    with pytest.raises(ConversionError, match=r"^2 ops are not supported: NonMaxSuppression \(2 nodes, first 'nms_1'\), "
                                              r"RoiAlign \(1 node, first 'roi'\); supported: .*Conv"):
        import_onnx(model)


def test_folded_shape_ops_are_not_reported_unsupported():
    assert unsupported_ops(dynamic_conv_reshape_model()) == []  # Range computes a shape constant


def test_unsupported_ops_accepts_a_path(tmp_path):
    import onnx

    path = tmp_path / "nms.onnx"
    onnx.save(unsupported_model(), str(path))
    assert [op for op, _, _ in unsupported_ops(path)] == ["NonMaxSuppression", "RoiAlign"]
    with pytest.raises(ConversionError, match="does not exist"):
        import_onnx(tmp_path / "missing.onnx")


@pytest.mark.parametrize("op,inputs,opset,attrs,message", [
    ("Resize", [X4, None, Const(np.array([1, 1, 2, 2], np.float32))], 13, {"mode": "cubic"},
     r"node 'resize_node' \(Resize\): mode='cubic' is not supported"),
    ("Resize", [X4, None, Const(np.array([1, 1, 2, 2], np.float32))], 13,
     {"coordinate_transformation_mode": "tf_crop_and_resize"}, "coordinate_transformation_mode='tf_crop_and_resize'"),
    ("TopK", [rand(3, 10), np.array([2], np.int64)], 11, {}, r"node 'topk_node' \(TopK\): K='in1' is not supported"),
    ("Conv", [X4, W33], 13, {"auto_pad": "SAME"}, r"\(Conv\): auto_pad='SAME' is not supported"),
    ("Pad", [X4, Const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], 19, {"mode": "wrap"}, "mode='wrap'"),
    ("AveragePool", [X4], 19, {"kernel_shape": [2, 2], "dilations": [2, 2]}, r"dilations=\[2, 2\]"),
    ("Reshape", [X4, np.array([3, -1], np.int64)], 13, {}, r"input 1 'in1' \(shape\) must be a constant"),
    ("Resize", [rand(1, 1, 4, 4, dtype=np.uint8, low=0, high=255), None, Const(np.array([1, 1, 2, 2], np.float32))],
     13, {"mode": "linear"}, r"node 'resize_node' \(Resize\): linear resizing of uint8 tensors is not supported"),
    ("Upsample", [rand(1, 1, 4, 4, dtype=np.int32, low=0, high=9), Const(np.array([1, 1, 2, 2], np.float32))],
     9, {"mode": "linear"}, r"node 'upsample_node' \(Upsample\): linear resizing of int32 tensors"),
    ("Concat", [X4, X4B], 13, {}, r"node 'concat_node' \(Concat\): the axis attribute is required"),
    ("ReduceMean", [np.zeros((0, 3), np.int32)], 13, {"axes": [0]}, r"\(ReduceMean\): the mean of zero int32 elements"),
])
def test_attribute_values_not_handled_are_refused(op, inputs, opset, attrs, message):
    model, _ = node_model(op, inputs, opset, outputs=2 if op == "TopK" else 1, **attrs)
    with pytest.raises(ConversionError, match=message):
        import_onnx(model)


# ---- models exported by torch.onnx.export

def mobilenet_block():
    """A MobileNetV2-like net: stem, inverted residual (1x1 expand, depthwise 3x3, 1x1 project), pool, linear."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, groups=1, relu6=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.ReLU6()) if relu6 else nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv_bn(3, 16, 3, 2)
            self.expand, self.depthwise = conv_bn(16, 48, 1), conv_bn(48, 48, 3, groups=48)
            self.project = conv_bn(48, 16, 1, relu6=False)
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.project(self.depthwise(self.expand(x)))
            return self.fc(torch.flatten(self.pool(x), 1))

    torch.manual_seed(0)
    net = Block().eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):  # statistics that make BatchNorm matter
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return net


def export_block(path, dynamo: bool, opset: int):
    import onnx
    import torch

    net, x = mobilenet_block(), torch.randn(2, 3, 32, 32)
    if dynamo:
        torch.onnx.export(net, (x,), str(path), dynamo=True, opset_version=opset, input_names=["image"],
                          dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    else:
        torch.onnx.export(net, (x,), str(path), dynamo=False, opset_version=opset, input_names=["image"],
                          dynamic_axes={"image": {0: "batch"}})
    model = onnx.load(str(path))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the batch really is dynamic
    return model


@pytest.mark.parametrize("dynamo,opset", [(False, 13), (True, 17), (True, 18)])
def test_torch_onnx_export_mobilenet_block(tmp_path, dynamo, opset):
    model = export_block(tmp_path / "block.onnx", dynamo, opset)
    module = import_onnx(tmp_path / "block.onnx", input_shapes={"image": (3, 3, 32, 32)})
    feeds = {"image": rand(3, 3, 32, 32, seed=21)}
    assert_close(run_module(module, model, feeds), run_ort(model, feeds))


# ---- the float LiteRT path: litert-torch conversion, run by the LiteRT interpreter, against onnxruntime

FAMILIES = {"conv": CONV, "dense": DENSE, "elementwise": ELEMENTWISE, "pools": POOLS, "shapes": SHAPES,
            "reduce": REDUCE, "resize": RESIZE}


def litert_float(module, feeds: list[np.ndarray], path) -> list[np.ndarray]:
    import litert_torch
    import torch

    litert_torch.convert(module, tuple(torch.from_numpy(np.array(f)) for f in feeds)).export(str(path))
    return run_litert(path, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_litert_float_matches_onnxruntime(family, tmp_path):
    """Every op case of a family imported, placed side by side in one module, converted once."""
    modules, counts, feeds, expected = [], [], [], []
    for param in FAMILIES[family]:
        op, inputs, opset, outputs, attrs = param.values
        model, case_feeds = node_model(op, inputs, opset, outputs, **attrs)
        modules.append(import_onnx(model))
        counts.append(len(case_feeds))
        feeds.extend(case_feeds.values())
        expected.extend(run_ort(model, case_feeds))
    actual = litert_float(SideBySide(modules, counts).eval(), feeds, tmp_path / f"{family}.tflite")
    assert_close(actual, expected, rel=1e-4, exact_int_width=False)


@pytest.mark.slow
def test_litert_float_chain_matches_onnxruntime(tmp_path):
    model = chain_model()
    feeds = {"x": rand(1, 4, 8, 8, seed=30)}
    actual = litert_float(import_onnx(model), list(feeds.values()), tmp_path / "chain.tflite")
    assert_close(actual, run_ort(model, feeds), rel=1e-4)


@pytest.mark.slow
def test_litert_float_torch_exported_block_matches_onnxruntime(tmp_path):
    model = export_block(tmp_path / "block.onnx", dynamo=False, opset=13)
    feeds = [rand(1, 3, 32, 32, seed=22)]
    actual = litert_float(import_onnx(model, input_shapes={"image": (1, 3, 32, 32)}), feeds, tmp_path / "b.tflite")
    assert_close(actual, run_ort(model, {"image": feeds[0]}), rel=1e-4)
