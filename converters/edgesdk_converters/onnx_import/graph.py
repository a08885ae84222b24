"""ONNX graph -> torch.fx.GraphModule: loading, fixing input shapes, constant folding, the op check.

Every shape is static once the input shapes are fixed, so each node whose inputs are all
constants (initializers, Constant, Shape/Size of any value, and what is computed from them) is
evaluated at import time with ``onnx.reference`` and never reaches the torch graph: Shape ->
Gather -> Concat -> Reshape chains, ConstantOfShape and Expand shapes become plain numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
import torch.fx as fx

from edgesdk.errors import ConversionError

from .context import MetaTracer, NodeContext, python_name, torch_dtype
from .registry import OPS, SUPPORTED_OPS

# Ops whose result is not a function of their inputs, or that run subgraphs: never folded.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}
_SHAPE_OPS = {"Shape", "Size"}
_DEFAULT_DOMAINS = ("", "ai.onnx")


def load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise ConversionError(f"ONNX model {str(path)!r} does not exist")
        try:
            return onnx.load(str(path))
        except Exception as exc:  # onnx raises DecodeError / OSError variants
            raise ConversionError(f"{str(path)!r} is not a readable ONNX model: {exc}") from exc
    raise ConversionError(f"expected an onnx.ModelProto or a path to a .onnx file, got {type(model).__name__}")


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return entry.version
    raise ConversionError("the model imports no version of the default ONNX domain (opset_import)")


def op_label(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def foldable_outputs(graph: onnx.GraphProto) -> set[str]:
    """Names of the values computable at import time once the input shapes are fixed."""
    known = {init.name for init in graph.initializer} | {""}
    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS or node.op_type in _NOT_FOLDABLE:
            continue
        if node.op_type in _SHAPE_OPS or all(name in known for name in node.input):
            known.update(node.output)
    return known


def unsupported_ops(model) -> list[tuple[str, int, str]]:
    """``(op_type, count, first node name)`` for each op the importer cannot turn into torch.

    Nodes that are folded to constants at import time (shape arithmetic) do not count, nor does an ``If`` whose
    condition is such a constant (the branch taken is imported in its place; both branches' ops are checked).
    """
    graph = load(model).graph
    found: dict[str, list] = {}
    _collect_unsupported(graph, foldable_outputs(graph), found)
    return [(op, count, first) for op, (count, first) in found.items()]


def _collect_unsupported(graph: onnx.GraphProto, known: set[str], found: dict[str, list]) -> None:
    for node in graph.node:
        label = op_label(node)
        if node.domain in _DEFAULT_DOMAINS and node.op_type in OPS:
            continue
        if node.domain in _DEFAULT_DOMAINS and node.op_type == "If" and node.input[0] in known:
            for attr in node.attribute:
                if attr.name in ("then_branch", "else_branch"):
                    _collect_unsupported(attr.g, known | foldable_outputs(attr.g), found)
            continue
        if node.op_type not in _NOT_FOLDABLE and node.domain in _DEFAULT_DOMAINS and \
                (node.op_type in _SHAPE_OPS or all(name in known for name in node.input)):
            continue
        entry = found.setdefault(label, [0, node.name or (node.output[0] if node.output else label)])
        entry[0] += 1


def check_supported(model: onnx.ModelProto) -> None:
    missing = unsupported_ops(model)
    if not missing:
        return
    listed = ", ".join(f"{op} ({count} node{'s' if count > 1 else ''}, first '{first}')" for op, count, first in missing)
    noun = "op is" if len(missing) == 1 else "ops are"
    raise ConversionError(f"{len(missing)} {noun} not supported: {listed}; supported: {', '.join(SUPPORTED_OPS)}")


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in graph.initializer}
    return [vi for vi in graph.input if vi.name not in initializers]


def _declared_dims(vi: onnx.ValueInfoProto) -> list | None:
    """The declared dims (int, or str/None for a dynamic one); None when the rank is unknown."""
    tensor_type = vi.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    # -1 is dynamic too: Paddle exports declare a batch as dim_value -1. (0 stays a size unless input_shapes gives
    # one: some exporters write 0 for "any", and an empty tensor is a shape too.)
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in tensor_type.shape.dim]


def _dims_text(dims: list) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in dims) + "]"


def fixed_input_shapes(model: onnx.ModelProto, input_shapes: dict | None) -> dict[str, tuple[int, ...]]:
    """Every graph input's static shape: the declared one, with dynamic dims taken from ``input_shapes``."""
    inputs = _graph_inputs(model.graph)
    names = [vi.name for vi in inputs]
    given = dict(input_shapes or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConversionError(f"input_shapes names {unknown}, which the model does not have (inputs: {', '.join(names)})")
    shapes, dynamic = {}, []
    for vi in inputs:
        dims = _declared_dims(vi)
        if vi.name in given:
            shape = given[vi.name]
            if not isinstance(shape, (tuple, list)) or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
                raise ConversionError(f"input_shapes[{vi.name!r}] must be a tuple of positive ints, got {shape!r}")
            shape = tuple(int(d) for d in shape)
            if dims is not None:
                if len(dims) != len(shape):
                    raise ConversionError(f"input {vi.name!r} has rank {len(dims)} {_dims_text(dims)}; "
                                          f"input_shapes gives rank {len(shape)} {list(shape)}")
                clashes = [i for i, (d, s) in enumerate(zip(dims, shape)) if isinstance(d, int) and d not in (0, s)]
                if clashes:
                    raise ConversionError(f"input {vi.name!r} has declared shape {_dims_text(dims)}; input_shapes gives "
                                          f"{list(shape)}, which differs at dim(s) {clashes}")
            shapes[vi.name] = shape
        elif dims is None or not all(isinstance(d, int) for d in dims):
            dynamic.append(vi)
        else:
            shapes[vi.name] = tuple(dims)
    if dynamic:
        described = "; ".join(
            f"input {vi.name!r} has " + ("no declared shape" if _declared_dims(vi) is None
                                          else f"dynamic shape {_dims_text(_declared_dims(vi))}")
            for vi in dynamic)
        example = " ".join(f"--input-shape {vi.name}:" + "x".join(
            str(d) if isinstance(d, int) else "N" for d in (_declared_dims(vi) or ["N"])) for vi in dynamic)
        raise ConversionError(f"{described}: fix every dynamic dim with input_shapes={{name: (d0, d1, ...)}} "
                              f"(CLI: {example}, with N replaced by sizes)")
    return shapes


def _fold(node: onnx.NodeProto, inputs: list, opsets: dict, ctx_name: str) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    try:
        names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
        single = onnx.NodeProto()
        single.CopyFrom(node)
        del single.input[:]
        single.input.extend(names)
        feeds = {n: v for n, v in zip(names, inputs) if n}
        results = ReferenceEvaluator(single, opsets=opsets).run(None, feeds)
    except Exception as exc:  # onnx.reference raises whatever numpy raises
        raise ConversionError(f"node {ctx_name!r} ({node.op_type}): folding it to a constant failed: {exc}") from exc
    return [np.asarray(r) for r in results]


class GraphBuilder:
    """Builds the fx graph node by node, folding constants as it goes."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]):
        self.model = model
        self.shapes = shapes
        self.opset = default_opset(model)
        self.opsets = {e.domain or "": e.version for e in model.opset_import}
        self.root = torch.nn.Module()
        self.graph = fx.Graph()
        self.tracer = MetaTracer(self.graph, self.root)
        self.values: dict[str, object] = {}
        self._buffers: dict[str, fx.Proxy] = {}
        self._names: set[str] = set()
        graph = model.graph
        self.consumed = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}

    def buffer(self, array: np.ndarray, name: str, dedupe: bool = True) -> fx.Proxy:
        if dedupe and name in self._buffers:
            return self._buffers[name]
        attr = python_name(f"c_{name}", self._names)
        tensor = torch.from_numpy(np.array(array, copy=True))
        self.root.register_buffer(attr, tensor)
        node = self.graph.get_attr(attr)
        node.meta["val"] = tensor.to("meta")
        proxy = fx.Proxy(node, self.tracer)
        if dedupe:
            self._buffers[name] = proxy
        return proxy

    def build(self) -> fx.GraphModule:
        graph = self.model.graph
        for init in graph.initializer:
            self.values[init.name] = onnx.numpy_helper.to_array(init)
        for vi in _graph_inputs(graph):
            dtype = torch_dtype(vi.type.tensor_type.elem_type or onnx.TensorProto.FLOAT, f"input {vi.name!r}")
            node = self.graph.placeholder(python_name(vi.name, self._names))
            node.meta["val"] = torch.empty(self.shapes[vi.name], dtype=dtype, device="meta")
            self.values[vi.name] = fx.Proxy(node, self.tracer)
        for node in graph.node:
            self._convert(node)
        outputs = []
        for out in graph.output:
            if out.name not in self.values:
                raise ConversionError(f"graph output {out.name!r} is produced by no node")
            value = self.values[out.name]
            if isinstance(value, np.ndarray):
                value = self.buffer(value, out.name)
            outputs.append(value.node)
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        self.graph.eliminate_dead_code()
        self.graph.lint()
        module = fx.GraphModule(self.root, self.graph, class_name="ImportedOnnx")
        return module.eval()

    def _convert(self, node: onnx.NodeProto) -> None:
        ctx = NodeContext(node, self.opset, self.values, self)
        missing = [name for name in node.input if name and name not in self.values]
        if missing:
            raise ConversionError(f"node {ctx.name!r} ({node.op_type}) reads {missing}, which no earlier node produces "
                                  "(the graph is not topologically sorted or refers to an outer scope)")
        if node.op_type in _SHAPE_OPS and node.domain in _DEFAULT_DOMAINS:
            shape = ctx.shape(0)
            if node.op_type == "Size":
                results = [np.array(int(np.prod(shape)), dtype=np.int64)]
            else:
                start, end = ctx.attr("start", 0), ctx.attr("end", None)
                results = [np.array(shape[start:end], dtype=np.int64)]
        elif node.op_type == "If" and node.domain in _DEFAULT_DOMAINS and ctx.is_const(0):
            results = self._taken_branch(node, bool(np.asarray(ctx.const(0)).reshape(-1)[0]))
        elif node.op_type not in _NOT_FOLDABLE and all(ctx.is_const(i) or not ctx.has_input(i)
                                                         for i in range(ctx.n_inputs)):
            inputs = [self.values[name] if name else None for name in node.input]
            results = _fold(node, inputs, self.opsets, ctx.name)
        else:
            try:
                results = OPS[node.op_type](ctx)
            except ConversionError:
                raise
            except Exception as exc:  # torch raises RuntimeError/TypeError/ValueError on bad shapes
                raise ConversionError(f"node {ctx.name!r} ({node.op_type}) could not be converted: {exc}") from exc
        if not isinstance(results, (list, tuple)):
            results = [results]
        for name, value in zip(node.output, results):
            if name:
                self.values[name] = value


    def _taken_branch(self, node: onnx.NodeProto, condition: bool) -> list:
        """An If with a constant condition: the branch it takes, converted in place (outer values stay visible)."""
        branch = next(onnx.helper.get_attribute_value(a) for a in node.attribute
                      if a.name == ("then_branch" if condition else "else_branch"))
        for init in branch.initializer:
            self.values[init.name] = onnx.numpy_helper.to_array(init)
        self.consumed |= {name for inner in branch.node for name in inner.input} | {o.name for o in branch.output}
        for inner in branch.node:
            self._convert(inner)
        return [self.values[out.name] for out in branch.output]


def import_graph(model: onnx.ModelProto, input_shapes: dict | None) -> fx.GraphModule:
    check_supported(model)
    shapes = fixed_input_shapes(model, input_shapes)
    return GraphBuilder(model, shapes).build()
