"""What an op converter sees of one ONNX node: its attributes, its inputs, and a way to add constants.

Converters write ordinary torch code on :class:`torch.fx.Proxy` values; :class:`MetaTracer`
records it into the graph and runs each recorded call on meta tensors, so every value's
static shape and dtype is known while the graph is being built (Resize sizes, SAME padding,
Softmax coercion and the like are computed from them, never at run time).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import torch
import torch.fx as fx
from onnx import TensorProto

from edgesdk.errors import ConversionError

TORCH_DTYPES = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT8: torch.int8,
    TensorProto.UINT8: torch.uint8,
    TensorProto.INT16: torch.int16,
    TensorProto.INT32: torch.int32,
    TensorProto.INT64: torch.int64,
    TensorProto.BOOL: torch.bool,
}


def torch_dtype(onnx_type: int, where: str) -> torch.dtype:
    if onnx_type not in TORCH_DTYPES:
        name = TensorProto.DataType.Name(onnx_type) if onnx_type in TensorProto.DataType.values() else onnx_type
        supported = ", ".join(TensorProto.DataType.Name(t) for t in TORCH_DTYPES)
        raise ConversionError(f"{where}: element type {name} is not supported (supported: {supported})")
    return TORCH_DTYPES[onnx_type]


def python_name(name: str, taken: set[str]) -> str:
    """A Python identifier made from an ONNX name, unique within ``taken`` (which it joins)."""
    base = re.sub(r"\W", "_", name) or "v"
    if base[0].isdigit():
        base = "v_" + base
    candidate, n = base, 1
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate


class MetaTracer(fx.proxy.GraphAppendingTracer):
    """Appends to a graph and gives every new node ``meta['val']``: a meta tensor of its result."""

    def __init__(self, graph: fx.Graph, root: torch.nn.Module):
        super().__init__(graph)
        self.root = root

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        meta_args = fx.node.map_arg(args, lambda n: n.meta["val"])
        meta_kwargs = fx.node.map_arg(kwargs, lambda n: n.meta["val"])
        if kind == "call_function":
            node.meta["val"] = target(*meta_args, **meta_kwargs)
        elif kind == "call_method":
            node.meta["val"] = getattr(meta_args[0], target)(*meta_args[1:], **meta_kwargs)
        elif kind == "get_attr":
            node.meta["val"] = getattr(self.root, target).to("meta")
        return node


class NodeContext:
    """One ONNX node as its converter sees it.

    Inputs are either constants (numpy arrays known at import time: initializers, Constant
    nodes and everything folded from them and from static shapes) or run-time tensors
    (proxies). ``const(i)`` insists on the first, ``tensor(i)`` turns either into a tensor.
    """

    def __init__(self, node: onnx.NodeProto, opset: int, values: dict, builder):
        self.node = node
        self.opset = opset
        self.op = node.op_type
        self.name = node.name or (node.output[0] if node.output else node.op_type)
        self._values = values
        self._builder = builder

    # ---- attributes
    def attr(self, name: str, default=None):
        for a in self.node.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, onnx.TensorProto):
                    return onnx.numpy_helper.to_array(value)
                return value
        return default

    def refuse(self, attribute: str, value, reason: str = "") -> ConversionError:
        """The error for an attribute value this importer does not handle (raise it)."""
        why = f": {reason}" if reason else ""
        return ConversionError(f"node {self.name!r} ({self.op}): {attribute}={value!r} is not supported{why}")

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"node {self.name!r} ({self.op}): {message}")

    # ---- inputs
    @property
    def n_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def is_const(self, i: int) -> bool:
        return self.has_input(i) and isinstance(self._values[self.node.input[i]], np.ndarray)

    def const(self, i: int, what: str = "") -> np.ndarray:
        """Input ``i`` as a numpy array; a ConversionError when it is only known at run time."""
        if not self.has_input(i):
            raise self.error(f"input {i} ({what or 'required'}) is missing")
        value = self._values[self.node.input[i]]
        if not isinstance(value, np.ndarray):
            label = f" ({what})" if what else ""
            raise self.error(f"input {i} '{self.node.input[i]}'{label} must be a constant known at import time; "
                             "it is computed from the model's inputs at run time")
        return value

    def tensor(self, i: int) -> fx.Proxy:
        value = self._values[self.node.input[i]]
        if isinstance(value, np.ndarray):
            return self._builder.buffer(value, self.node.input[i])
        return value

    def shape(self, i: int) -> tuple[int, ...]:
        value = self._values[self.node.input[i]]
        return tuple(value.shape) if isinstance(value, np.ndarray) else tuple(value.node.meta["val"].shape)

    def dtype(self, i: int) -> torch.dtype:
        value = self._values[self.node.input[i]]
        if isinstance(value, np.ndarray):
            return torch.from_numpy(np.zeros(0, value.dtype)).dtype
        return value.node.meta["val"].dtype

    def constant(self, array: np.ndarray, hint: str = "c") -> fx.Proxy:
        """A new constant (made by the converter, e.g. a transposed weight) as a buffer of the module."""
        return self._builder.buffer(np.asarray(array), f"{self.name}_{hint}", dedupe=False)

    # ---- outputs
    def output_used(self, i: int) -> bool:
        return i < len(self.node.output) and self.node.output[i] != "" and self.node.output[i] in self._builder.consumed


def scalar_or_tensor(ctx: NodeContext, i: int, other_rank: int):
    """A constant single-element input as a Python number when that cannot change the result's shape."""
    if ctx.is_const(i):
        value = ctx.const(i)
        if value.size == 1 and value.ndim <= other_rank:
            if value.dtype == np.bool_:
                return bool(value.reshape(()))
            if np.issubdtype(value.dtype, np.integer):
                return int(value.reshape(()))
            return float(value.reshape(()))
    return ctx.tensor(i)


def normalize_axis(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.error(f"{what}={axis} is out of range for a rank-{rank} input")
    return axis % rank if rank else 0
