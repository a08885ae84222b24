"""ONNX -> torch importer: each op against onnxruntime (whole graphs, misuse and the LiteRT path are in
test_onnx_import_graphs.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from edgesdk_converters.onnx_import import SUPPORTED_OPS, import_onnx
from onnx_graphs import (Const, assert_close, node_model, rand, run_module, run_ort)

INT_MAX = np.iinfo(np.int64).max


def case(case_id: str, op: str, inputs: list, opset: int = 13, outputs: int = 1, **attrs):
    return pytest.param(op, inputs, opset, outputs, attrs, id=case_id)


X4 = rand(1, 3, 8, 8)
X4B = rand(1, 3, 8, 8, seed=1)
W33 = Const(rand(4, 3, 3, 3, seed=2))
B4 = Const(rand(4, seed=3))
POS = rand(2, 3, 4, low=0.1, high=4.0)
TIES = np.array([[1, 3, 3, 2, 3, 1, 2, 3, 3, 1] * 3], np.float32)  # ONNX orders equal values by lower index
INTS = np.array([[-7, -3, -1, 0, 1, 2], [3, 4, 5, 7, 8, 9]], np.int32)

CONV = [
    case("conv-pad1-bias", "Conv", [X4, W33, B4], pads=[1, 1, 1, 1]),
    case("conv-stride2-nobias", "Conv", [X4, W33], strides=[2, 2]),
    case("conv-depthwise", "Conv", [rand(1, 4, 9, 9), Const(rand(4, 1, 3, 3, seed=4))], group=4, pads=[1, 1, 1, 1]),
    case("conv-groups2", "Conv", [rand(1, 4, 6, 6), Const(rand(6, 2, 3, 3, seed=4)), Const(rand(6))], group=2),
    case("conv-dilation2", "Conv", [X4, W33, B4], dilations=[2, 2], pads=[2, 2, 2, 2]),
    case("conv-asym-pads", "Conv", [X4, W33, B4], pads=[0, 1, 2, 0]),
    case("conv-same-upper", "Conv", [rand(1, 3, 9, 9), W33], auto_pad="SAME_UPPER", strides=[2, 2]),
    case("conv-same-lower-k4", "Conv", [X4, Const(rand(2, 3, 4, 4, seed=5))], auto_pad="SAME_LOWER", strides=[2, 2]),
    case("conv-valid", "Conv", [X4, W33, B4], auto_pad="VALID"),
    case("conv-1d", "Conv", [rand(1, 3, 10), Const(rand(2, 3, 3, seed=6))], pads=[1, 1]),
    case("conv-runtime-weight", "Conv", [X4, rand(4, 3, 3, 3, seed=7)], strides=[1, 2]),
    case("convT-s2-p1-op1", "ConvTranspose", [X4, Const(rand(3, 2, 3, 3, seed=8)), Const(rand(2))],
         strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
    case("convT-groups-dil", "ConvTranspose", [rand(1, 4, 5, 5), Const(rand(4, 3, 3, 3, seed=9))], group=2,
         dilations=[2, 2]),
    case("convT-asym-pads", "ConvTranspose", [X4, Const(rand(3, 2, 3, 3, seed=8)), Const(rand(2))],
         strides=[2, 2], pads=[0, 1, 1, 0]),
    case("convT-output-shape", "ConvTranspose", [X4, Const(rand(3, 2, 3, 3, seed=8))], strides=[2, 2],
         output_shape=[16, 16]),
    case("convT-same-upper", "ConvTranspose", [X4, Const(rand(3, 2, 3, 3, seed=8))], strides=[2, 2],
         auto_pad="SAME_UPPER"),
    case("convT-same-lower", "ConvTranspose", [X4, Const(rand(3, 2, 3, 3, seed=8))], strides=[2, 2],
         auto_pad="SAME_LOWER"),
    case("convT-k4-s2-p1", "ConvTranspose", [X4, Const(rand(3, 2, 4, 4, seed=8))], strides=[2, 2],
         pads=[1, 1, 1, 1]),
    case("bn-opset9", "BatchNormalization", [X4, Const(rand(3)), Const(rand(3, seed=1)), Const(rand(3, seed=2)),
                                             Const(rand(3, low=0.5, high=2))], opset=9, epsilon=1e-3),
    case("bn-opset15", "BatchNormalization", [X4, Const(rand(3)), Const(rand(3, seed=1)), Const(rand(3, seed=2)),
                                              Const(rand(3, low=0.5, high=2))], opset=15),
]

DENSE = [
    case("gemm-transB-bias", "Gemm", [rand(2, 5), Const(rand(4, 5, seed=1)), Const(rand(4, seed=2))], transB=1),
    case("gemm-transA-alpha-beta", "Gemm", [rand(5, 2), Const(rand(5, 4, seed=1)), Const(rand(2, 4, seed=2))],
         transA=1, alpha=0.5, beta=2.0),
    case("gemm-runtime-b", "Gemm", [rand(2, 5), rand(4, 5, seed=1), Const(rand(1, seed=2))], transB=1, beta=0.3),
    case("gemm-no-c", "Gemm", [rand(3, 5), Const(rand(5, 4, seed=1))]),
    case("matmul-const", "MatMul", [rand(2, 3, 5), Const(rand(5, 4, seed=1))]),
    case("matmul-batched-broadcast", "MatMul", [rand(2, 1, 4, 5), rand(3, 5, 6, seed=1)]),
]

ELEMENTWISE = [
    case("add-broadcast", "Add", [X4, Const(rand(3, 1, 1, seed=1))]),
    case("add-two-inputs", "Add", [X4, X4B]),
    case("sub-scalar-left", "Sub", [Const(np.float32(2.5)), X4]),
    case("mul-broadcast-rank", "Mul", [rand(4, 1, 3), rand(2, 1, seed=1)]),
    case("mul-const-rank-grows", "Mul", [rand(3), Const(np.full((1, 1, 1), 2.0, np.float32))]),
    case("div-float", "Div", [X4, Const(rand(1, 3, 1, 1, low=0.5, high=2))]),
    case("div-int", "Div", [rand(2, 5, dtype=np.int64, low=-20, high=20), Const(np.array([3, -4, 5, 7, -2]))]),
    case("pow-const-2", "Pow", [X4, Const(np.float32(2.0))]),
    case("pow-const-3", "Pow", [X4, Const(np.float32(3.0))]),
    case("pow-runtime", "Pow", [POS, rand(2, 3, 4, seed=1)]),
    case("pow-int-base-float-2", "Pow", [INTS, Const(np.float32(2.0))]),
    case("pow-int-base-float-1.5", "Pow", [np.abs(INTS), Const(np.float32(1.5))]),
    case("pow-int-base-int-5", "Pow", [INTS, Const(np.int64(5))]),
    case("pow-int-base-float-0", "Pow", [INTS, Const(np.float32(0.0))]),
    case("sqrt", "Sqrt", [POS]),
    case("relu", "Relu", [X4]),
    case("sigmoid", "Sigmoid", [X4 * 4]),
    case("tanh", "Tanh", [X4 * 3]),
    case("erf", "Erf", [X4 * 2]),
    case("neg", "Neg", [X4]),
    case("exp", "Exp", [X4]),
    case("log", "Log", [POS]),
    case("abs", "Abs", [X4]),
    case("not", "Not", [X4 > 0]),
    case("hardswish", "HardSwish", [X4 * 5], opset=14),
    case("hardsigmoid-default", "HardSigmoid", [X4 * 5]),
    case("hardsigmoid-sixth", "HardSigmoid", [X4 * 5], alpha=1 / 6, beta=0.5),
    case("leakyrelu", "LeakyRelu", [X4], alpha=0.1),
    case("prelu-c11", "PRelu", [X4, Const(rand(3, 1, 1, seed=1))]),
    case("prelu-scalar", "PRelu", [X4, Const(np.array([0.25], np.float32))]),
    case("prelu-runtime", "PRelu", [X4, rand(1, 3, 8, 8, seed=1)]),
    case("clip-0-6", "Clip", [X4 * 8, Const(np.float32(0)), Const(np.float32(6))], opset=11),
    case("clip-max-only", "Clip", [X4, None, Const(np.float32(0.3))], opset=13),
    case("clip-opset6-attrs", "Clip", [X4], opset=6, min=-0.5, max=0.25),
    case("clip-runtime-min", "Clip", [X4, rand(seed=3)], opset=13),
    case("softmax-opset11-axis1", "Softmax", [rand(2, 3, 4, 5)], opset=11, axis=1),
    case("softmax-opset13-axis1", "Softmax", [rand(2, 3, 4, 5)], opset=13, axis=1),
    case("softmax-default-13", "Softmax", [rand(2, 3, 4, 5)], opset=13),
    case("logsoftmax-opset11-axis2", "LogSoftmax", [rand(2, 3, 4, 5)], opset=11, axis=2),
    case("logsoftmax-opset13", "LogSoftmax", [rand(2, 3, 4, 5)], opset=13, axis=-2),
    case("min-three", "Min", [rand(2, 3), rand(3, seed=1), rand(1, 3, seed=2)]),
    case("max-scalar", "Max", [X4, Const(np.float32(0.1))]),
    case("where", "Where", [X4 > 0, X4, X4B]),
    case("where-scalars", "Where", [X4 > 0, Const(np.float32(1)), X4B]),
    case("equal-int", "Equal", [rand(3, 4, dtype=np.int64, low=0, high=3), Const(np.array([0, 1, 2, 1]))]),
    case("less", "Less", [X4, X4B]),
    case("greater-scalar", "Greater", [X4, Const(np.float32(0.2))]),
    case("less-or-equal", "LessOrEqual", [rand(3, 4, dtype=np.int64, low=0, high=3), Const(np.array([0, 1, 2, 1]))]),
    case("greater-or-equal", "GreaterOrEqual", [X4, X4B]),
    case("argmax-axis1", "ArgMax", [X4], axis=1, keepdims=0),
    case("argmax-last-index", "ArgMax", [rand(3, 6, dtype=np.float32, low=0, high=3).round()], axis=1,
         select_last_index=1),
    case("argmax-first-index", "ArgMax", [rand(3, 6, dtype=np.float32, low=0, high=3).round()], axis=-1),
    case("topk-largest", "TopK", [rand(3, 10), Const(np.array([4]))], opset=11, outputs=2, axis=-1),
    case("topk-smallest-axis0", "TopK", [rand(6, 4), Const(np.array([3]))], opset=11, outputs=2, axis=0, largest=0),
    case("topk-ties-largest", "TopK", [TIES, Const(np.array([5]))], opset=11, outputs=2),
    case("topk-ties-smallest", "TopK", [TIES, Const(np.array([5]))], opset=11, outputs=2, largest=0),
]

POOLS = [
    case("maxpool-k3s2p1", "MaxPool", [X4], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    case("maxpool-ceil", "MaxPool", [rand(1, 2, 9, 9)], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    case("maxpool-ceil-pads", "MaxPool", [rand(1, 2, 8, 8)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
         ceil_mode=1),
    case("maxpool-ceil-drops-last", "MaxPool", [rand(1, 2, 7, 7)], kernel_shape=[2, 2], strides=[2, 2],
         pads=[1, 1, 1, 1], ceil_mode=1),
    case("maxpool-asym", "MaxPool", [X4], kernel_shape=[3, 3], pads=[0, 1, 2, 0]),
    case("maxpool-same-upper", "MaxPool", [rand(1, 3, 7, 7)], kernel_shape=[2, 2], strides=[2, 2],
         auto_pad="SAME_UPPER"),
    case("maxpool-dilation", "MaxPool", [X4], kernel_shape=[2, 2], dilations=[2, 2], opset=12),
    case("maxpool-1d", "MaxPool", [rand(1, 3, 11)], kernel_shape=[3], strides=[2]),
    case("avgpool-exclude-pad", "AveragePool", [X4], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    case("avgpool-include-pad", "AveragePool", [X4], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    case("avgpool-ceil", "AveragePool", [rand(1, 2, 9, 9)], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    case("avgpool-ceil-pads-include", "AveragePool", [rand(1, 2, 8, 8)], kernel_shape=[3, 3], strides=[2, 2],
         pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
    case("avgpool-ceil-drops-last", "AveragePool", [rand(1, 2, 7, 7)], kernel_shape=[2, 2], strides=[2, 2],
         pads=[1, 1, 1, 1], ceil_mode=1),
    case("avgpool-asym", "AveragePool", [X4], kernel_shape=[2, 2], pads=[1, 0, 0, 1]),
    case("avgpool-same-lower", "AveragePool", [rand(1, 3, 7, 7)], kernel_shape=[3, 3], strides=[2, 2],
         auto_pad="SAME_LOWER"),
    case("global-avg", "GlobalAveragePool", [X4]),
    case("global-max", "GlobalMaxPool", [X4]),
]

SHAPES = [
    case("flatten-axis1", "Flatten", [X4]),
    case("flatten-axis0", "Flatten", [X4], axis=0),
    case("flatten-axis-neg", "Flatten", [X4], axis=-1),
    case("reshape-zero-minus1", "Reshape", [X4, Const(np.array([0, -1], np.int64))]),
    case("reshape-allowzero0", "Reshape", [X4, Const(np.array([0, 3, 0, -1, 2], np.int64))], opset=14),
    case("transpose-nhwc", "Transpose", [X4], perm=[0, 2, 3, 1]),
    case("transpose-default", "Transpose", [rand(2, 3, 4)]),
    case("squeeze-opset11-attr", "Squeeze", [rand(1, 3, 1, 4)], opset=11, axes=[0, -2]),
    case("squeeze-opset13-input", "Squeeze", [rand(1, 3, 1, 4), Const(np.array([2], np.int64))]),
    case("squeeze-all", "Squeeze", [rand(1, 3, 1, 4)]),
    case("unsqueeze-opset11", "Unsqueeze", [rand(3, 4)], opset=11, axes=[0, 3]),
    case("unsqueeze-opset13-neg", "Unsqueeze", [rand(3, 4), Const(np.array([-1, 0], np.int64))]),
    case("concat-with-const", "Concat", [X4, Const(rand(1, 2, 8, 8)), X4B], axis=1),
    case("concat-neg-axis", "Concat", [rand(2, 3), rand(2, 5)], axis=-1),
    case("split-opset11-attr", "Split", [rand(2, 6, 3)], opset=11, outputs=2, axis=1, split=[2, 4]),
    case("split-opset13-input", "Split", [rand(2, 6, 3), Const(np.array([1, 5], np.int64))], outputs=2, axis=1),
    case("split-equal", "Split", [rand(6, 3)], outputs=3),
    case("split-num-outputs-18", "Split", [rand(2, 7)], opset=18, outputs=3, axis=1, num_outputs=3),
    case("slice-steps", "Slice", [rand(4, 10), Const(np.array([1, 0])), Const(np.array([INT_MAX, 9])),
                                  Const(np.array([0, 1])), Const(np.array([2, 3]))]),
    case("slice-negative-step", "Slice", [rand(4, 10), Const(np.array([-2])), Const(np.array([-INT_MAX])),
                                          Const(np.array([1])), Const(np.array([-3]))]),
    case("slice-negative-starts", "Slice", [rand(3, 4, 5), Const(np.array([-3, 1])), Const(np.array([-1, 100])),
                                            Const(np.array([2, 0]))]),
    case("gather-scalar", "Gather", [rand(3, 4, 5), Const(np.array(2, np.int64))], axis=1),
    case("gather-2d-negative", "Gather", [rand(3, 4, 5), Const(np.array([[0, -1], [2, 1]], np.int64))], axis=2),
    case("gather-runtime-indices", "Gather", [Const(rand(10, 4)), np.array([[1, 9], [-1, 0]], np.int64)]),
    case("pad-constant", "Pad", [X4, Const(np.array([0, 0, 1, 2, 0, 0, 3, 0], np.int64)), Const(np.float32(0.5))],
         opset=13),
    case("pad-reflect", "Pad", [X4, Const(np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64))], opset=11, mode="reflect"),
    case("pad-edge", "Pad", [X4, Const(np.array([0, 0, 0, 2, 0, 0, 3, 1], np.int64))], opset=13, mode="edge"),
    case("pad-axes-18", "Pad", [X4, Const(np.array([1, 2, 3, 0], np.int64)), None, Const(np.array([-1, 1]))],
         opset=18),
    case("pad-negative", "Pad", [X4, Const(np.array([0, 0, -1, 2, 0, 0, 1, -2], np.int64))], opset=13),
    case("cast-to-int32", "Cast", [X4 * 5], to=TensorProto.INT32),
    case("castlike", "CastLike", [X4 * 5, Const(np.array([1], np.int32))], opset=15),
    case("cast-int-to-float", "Cast", [rand(2, 3, dtype=np.int64, low=-9, high=9)], to=TensorProto.FLOAT),
    case("identity", "Identity", [X4]),
    case("dropout-inference", "Dropout", [X4, Const(np.float32(0.3))], opset=13),
    case("expand", "Expand", [rand(3, 1), Const(np.array([2, 3, 4], np.int64))]),
    case("expand-lower-rank-shape", "Expand", [rand(2, 1, 4), Const(np.array([3, 1], np.int64))]),
]

REDUCE = [
    case("reducemean-13-keep", "ReduceMean", [X4], opset=13, axes=[2, 3]),
    case("reducemean-13-nokeep", "ReduceMean", [X4], opset=13, axes=[1], keepdims=0),
    case("reducemean-18-input", "ReduceMean", [X4, Const(np.array([-1], np.int64))], opset=18, keepdims=0),
    case("reducemean-all", "ReduceMean", [X4], opset=13),
    case("reducemean-int32-truncates", "ReduceMean", [INTS.reshape(4, 3)], opset=13, axes=[1]),
    case("reducesum-int32", "ReduceSum", [INTS, Const(np.array([1], np.int64))]),
    case("reducesum-11-attr", "ReduceSum", [X4], opset=11, axes=[1]),
    case("reducesum-13-input", "ReduceSum", [X4, Const(np.array([0, 2], np.int64))], keepdims=0),
    case("reducesum-13-noop", "ReduceSum", [X4], noop_with_empty_axes=1),
    case("reducemax-13", "ReduceMax", [X4], axes=[3], keepdims=0),
    case("reducemin-13", "ReduceMin", [X4], axes=[1, -1]),
    case("reducemax-18-input", "ReduceMax", [X4, Const(np.array([1, 2], np.int64))], opset=18),
    case("layernorm-last", "LayerNormalization", [rand(2, 5, 8), Const(rand(8)), Const(rand(8, seed=1))], opset=17),
    case("layernorm-axis1", "LayerNormalization", [rand(2, 3, 4), Const(rand(3, 4))], opset=17, axis=1,
         epsilon=1e-3),
]

RESIZE = [
    case("resize-nearest-asym-floor", "Resize", [X4, Const(np.zeros(0, np.float32)), Const(np.array([1, 1, 2, 2], np.float32))], opset=11,
         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    case("resize-nearest-asym-prefer-floor", "Resize", [X4, None, Const(np.array([1, 1, 2, 2], np.float32))],
         opset=13, coordinate_transformation_mode="asymmetric"),
    case("resize-nearest-default-up", "Resize", [X4, None, Const(np.array([1, 1, 2, 3], np.float32))], opset=13),
    case("resize-nearest-half-down", "Resize", [X4, None, Const(np.array([1, 1, 0.5, 0.5], np.float32))], opset=13),
    case("resize-nearest-prefer-ceil", "Resize", [X4, None, Const(np.array([1, 1, 0.5, 0.75], np.float32))],
         opset=13, nearest_mode="round_prefer_ceil"),
    case("resize-nearest-ceil-align", "Resize", [X4, None, None, Const(np.array([1, 3, 5, 11], np.int64))],
         opset=13, nearest_mode="ceil", coordinate_transformation_mode="align_corners"),
    case("resize-linear-half-pixel-sizes", "Resize", [X4, Const(np.zeros(0, np.float32)), Const(np.zeros(0, np.float32)),
                                                      Const(np.array([1, 3, 16, 12], np.int64))], opset=11, mode="linear"),
    case("resize-linear-align", "Resize", [X4, None, Const(np.array([1, 1, 2, 2], np.float32))], opset=13,
         mode="linear", coordinate_transformation_mode="align_corners"),
    case("resize-linear-pytorch-half", "Resize", [X4, None, None, Const(np.array([1, 3, 5, 1], np.int64))], opset=13,
         mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    case("resize-linear-asym", "Resize", [X4, None, Const(np.array([1, 1, 2, 2], np.float32))], opset=13,
         mode="linear", coordinate_transformation_mode="asymmetric"),
    case("resize-linear-scale-1.7", "Resize", [X4, None, Const(np.array([1, 1, 1.7, 1.7], np.float32))], opset=13,
         mode="linear"),
    case("resize-axes-18", "Resize", [X4, None, Const(np.array([2, 2], np.float32))], opset=18, mode="linear",
         axes=[2, 3]),
    # A channel scale that keeps the size but moves elements (ORT's linear mode takes it only with W unscaled).
    case("resize-nearest-channel-scale", "Resize", [rand(1, 4, 4, 4), None,
                                                    Const(np.array([1, 1.1, 2, 2], np.float32))],
         opset=13, coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    case("resize-linear-channel-scale", "Resize", [rand(1, 4, 4, 4), None,
                                                   Const(np.array([1, 1.1, 2, 1], np.float32))],
         opset=13, mode="linear"),
    case("resize-nearest-int8", "Resize", [rand(1, 2, 4, 4, dtype=np.int8, low=-9, high=9), None,
                                           Const(np.array([1, 1, 2, 2], np.float32))], opset=13),
    case("resize-opset10", "Resize", [X4, Const(np.array([1, 1, 2, 2], np.float32))], opset=10),
    case("upsample-opset9", "Upsample", [X4, Const(np.array([1, 1, 2, 2], np.float32))], opset=9),
    case("upsample-opset9-linear", "Upsample", [X4, Const(np.array([1, 1, 2, 2], np.float32))], opset=9,
         mode="linear"),
]

ALL_CASES = CONV + DENSE + ELEMENTWISE + POOLS + SHAPES + REDUCE + RESIZE


@pytest.mark.parametrize("op,inputs,opset,outputs,attrs", ALL_CASES)
def test_op_matches_onnxruntime(op, inputs, opset, outputs, attrs):
    model, feeds = node_model(op, inputs, opset, outputs, **attrs)
    expected = run_ort(model, feeds)
    module = import_onnx(model)
    assert_close(run_module(module, model, feeds), expected)


def test_every_listed_op_has_a_case():
    covered = {p.values[0] for p in ALL_CASES}
    folded_only = {"Constant", "ConstantOfShape", "Shape"}  # covered by the shape-folding tests
    assert set(SUPPORTED_OPS) - covered - folded_only == set()
