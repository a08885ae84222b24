"""ONNX -> torch importer: each op against onnxruntime, the LiteRT float path, and the misuse errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import ConversionError
from edgesdk_converters.onnx_import import SUPPORTED_OPS, import_onnx, unsupported_ops
from onnx_graphs import (Const, SideBySide, assert_close, chain_model, make_model, node_model, rand, run_litert,
                         run_module, run_ort)

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
