"""The op converters, by ONNX op type: each takes a NodeContext and returns the node's output(s)."""

from __future__ import annotations

from . import ops_math, ops_nn, ops_resize, ops_tensor

OPS = {**ops_nn.OPS, **ops_math.OPS, **ops_tensor.OPS, **ops_resize.OPS}
SUPPORTED_OPS = tuple(sorted(OPS))
