"""Preparing an ONNX model from the wild for a route: its opset, its dynamic dims, its constant control flow.

Real exporters write what not every toolchain here takes. Paddle (paddle2onnx) and older tf2onnx exports are
opset 11/12, below the 13 that per-channel QuantizeLinear/DequantizeLinear need (ONNX Runtime's quantizer writes
an ``axis`` attribute opset 12 does not have, and the graph it writes does not load): :func:`upgrade_opset`.
Paddle declares a dynamic batch as ``dim_value: -1`` instead of a ``dim_param``: :func:`dynamic_dims_named`.
Silero VAD branches (``If``) on its sample-rate input; when the condition is known for the inputs a bundle is
built for, :func:`fold_constant_branches` replaces the ``If`` by the branch taken, and :func:`control_flow`
names what is left. Every function returns a new model and leaves its argument alone.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgesdk.errors import ConversionError

MIN_OPSET = 7  # the oldest opset ONNX Runtime supports and onnx's version converter upgrades from
PER_AXIS_QDQ_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear (their ``axis`` attribute)
DEFAULT_DOMAINS = ("", "ai.onnx")
CONTROL_FLOW = ("If", "Loop", "Scan")
# Ops whose result is not a function of their inputs: never evaluated ahead of time.
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return entry.version
    raise ConversionError("the model imports no version of the default ONNX domain (opset_import)")


def check_opset(model: onnx.ModelProto, name: str) -> int:
    """The model's default-domain opset, refused when no route here can take it."""
    opset, newest = default_opset(model), onnx.defs.onnx_opset_version()
    if opset < MIN_OPSET:
        raise ConversionError(f"{name} is ONNX opset {opset}; opsets {MIN_OPSET}-{newest} are supported (ONNX Runtime "
                              f"and onnx's version converter start at {MIN_OPSET}): re-export it with a newer opset")
    if opset > newest:
        raise ConversionError(f"{name} is ONNX opset {opset}, newer than the installed onnx {onnx.__version__} knows "
                              f"(up to {newest}): upgrade onnx, or re-export with opset {newest} or older")
    return opset


def upgrade_opset(model: onnx.ModelProto, opset: int, name: str) -> onnx.ModelProto:
    """``model`` converted to default-domain ``opset`` with ``onnx.version_converter``; a ConversionError naming
    both opsets when an op has no adapter."""
    from onnx import version_converter

    current = default_opset(model)
    try:
        upgraded = version_converter.convert_version(model, opset)
        onnx.checker.check_model(upgraded)
    except Exception as exc:  # the converter raises RuntimeError/IndexError from C++ assertions
        raise ConversionError(f"{name}: onnx.version_converter could not upgrade opset {current} to {opset}: "
                              f"{exc}") from exc
    return upgraded


def dynamic_dims_named(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every input/output dim declared as ``dim_value`` <= 0 (Paddle's -1) made a ``dim_param``,
    the form every toolchain reads as dynamic."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in [*fixed.graph.input, *fixed.graph.output]:
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.dim_param = f"{value.name}_dim{i}"  # setting the oneof clears dim_value
    return fixed


def control_flow(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(op_type, node name)`` of each control-flow node in the main graph."""
    return [(n.op_type, n.name or n.output[0]) for n in model.graph.node
            if n.domain in DEFAULT_DOMAINS and n.op_type in CONTROL_FLOW]


def fold_constant_branches(model: onnx.ModelProto, constants: dict[str, np.ndarray] | None = None,
                           input_shapes: dict[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """``model`` with each ``If`` whose condition is known replaced by the branch it takes.

    A condition is known when it is computed only from initializers, ``Constant`` nodes, the ``Shape`` of an
    input of fixed shape (``input_shapes``, or as declared) and the values given in ``constants`` ({graph input
    name: array}, e.g. ``{"sr": np.array(16000)}``). The graph keeps all its inputs (an input that only fed the
    condition is left unused), so the folded model is correct for those constant values only. Nodes left with
    no consumer are dropped. Nested ``If`` nodes fold as they come to the top; ``Loop``/``Scan`` stay
    (see :func:`control_flow`).
    """
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    graph = folded.graph
    given = {name: np.asarray(v) for name, v in (constants or {}).items()}
    inputs = [v.name for v in graph.input]
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise ConversionError(f"constants name {', '.join(map(repr, unknown))}, which the model does not have "
                              f"(inputs: {', '.join(inputs)})")
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in graph.input
              if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                                               for d in v.type.tensor_type.shape.dim)}
    shapes |= {name: tuple(s) for name, s in (input_shapes or {}).items()}
    shapes |= {name: v.shape for name, v in given.items()}
    changed = True
    while changed and any(n.op_type == "If" for n in graph.node):
        known = _known_values(folded, given, shapes)
        changed = False
        nodes = []
        for node in graph.node:
            if node.op_type == "If" and node.domain in DEFAULT_DOMAINS and node.input[0] in known:
                nodes += _inline_branch(graph, node, bool(np.asarray(known[node.input[0]]).reshape(-1)[0]))
                changed = True
            else:
                nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
    _drop_dead_nodes(graph)
    try:
        onnx.checker.check_model(folded)
    except Exception as exc:  # a branch that does not fit its graph: say which model, keep the cause
        raise ConversionError(f"folding the constant If branches left an invalid model: {exc}") from exc
    return folded


def _known_values(model: onnx.ModelProto, given: dict, inputs: dict) -> dict[str, np.ndarray]:
    """Every value computable before run time. Values and shapes feed each other (a computed Pad width gives
    a static shape, whose Shape gives a value): passes repeat until nothing new is found."""
    known: dict[str, np.ndarray] = {}
    while True:
        found = _known_pass(model, given, _static_shapes(model, inputs, known))
        if len(found) <= len(known):
            return found
        known = found


def _known_pass(model: onnx.ModelProto, given: dict, shapes: dict) -> dict[str, np.ndarray]:
    """One pass in (topological) node order over what the given values and static shapes determine."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    opsets = {e.domain or "": e.version for e in model.opset_import}
    known: dict[str, np.ndarray] = dict(given)
    inits = {i.name: i for i in graph.initializer}

    def value(name):
        if name not in known and name in inits:
            known[name] = onnx.numpy_helper.to_array(inits[name])
        return known.get(name)

    for node in graph.node:
        if node.domain not in DEFAULT_DOMAINS or node.op_type in _RANDOM or node.op_type in CONTROL_FLOW:
            continue
        if node.op_type == "Shape" and node.input[0] in shapes and value(node.input[0]) is None:
            shape = np.array(shapes[node.input[0]], dtype=np.int64)
            attrs = {a.name: a.i for a in node.attribute}
            known[node.output[0]] = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
            continue
        feeds = [value(name) if name else None for name in node.input]
        if any(f is None for f, name in zip(feeds, node.input) if name):
            continue
        single = onnx.NodeProto()
        single.CopyFrom(node)
        del single.input[:]
        names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
        single.input.extend(names)
        try:
            results = ReferenceEvaluator(single, opsets=opsets).run(
                None, {n: f for n, f in zip(names, feeds) if n})
        except Exception:  # noqa: BLE001 - a value that cannot be evaluated ahead is simply not known
            continue
        known.update((out, np.asarray(r)) for out, r in zip(node.output, results) if out)
    return known


def _static_shapes(model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]],
                   known: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The static shape of every value onnx's shape inference finds once the inputs' shapes are fixed and the
    ``known`` values are constants."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    computed = [n.output and all(o in known for o in n.output if o) for n in fixed.graph.node]
    if any(computed):
        outputs = {o for n, c in zip(fixed.graph.node, computed) if c for o in n.output if o}
        kept = [n for n, c in zip(fixed.graph.node, computed) if not c]
        del fixed.graph.node[:]
        fixed.graph.node.extend(kept)
        fixed.graph.initializer.extend(onnx.numpy_helper.from_array(known[o], o) for o in outputs)
    for value in fixed.graph.input:
        if value.name in inputs:
            value.type.tensor_type.ClearField("shape")
            value.type.tensor_type.shape.dim.extend(
                onnx.TensorShapeProto.Dimension(dim_value=int(d)) for d in inputs[value.name])
    try:
        fixed = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes only widen what is known; without them fewer conditions fold
        return dict(inputs)
    found = dict(inputs)
    for value in [*fixed.graph.value_info, *fixed.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                                            for d in dims):
            found.setdefault(value.name, tuple(d.dim_value for d in dims))
    return found


def _inline_branch(graph: onnx.GraphProto, node: onnx.NodeProto, condition: bool) -> list[onnx.NodeProto]:
    """The nodes replacing ``node`` (an If): its taken branch, and an Identity per output."""
    branch = next(onnx.helper.get_attribute_value(a) for a in node.attribute
                  if a.name == ("then_branch" if condition else "else_branch"))
    taken = {v.name for v in graph.input} | {i.name for i in graph.initializer} | \
        {o for n in graph.node for o in n.output}
    prefix = node.name or node.output[0]
    renames = {}
    for name in [i.name for i in branch.initializer] + [o for n in branch.node for o in n.output if o]:
        if name in taken:  # exporters do not all keep subgraph names apart from the main graph's
            renames[name] = f"{prefix}/{name}"
    for init in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = renames.get(init.name, init.name)
        graph.initializer.append(copy)
    nodes = []
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        for field in (copy.input, copy.output):
            for i, name in enumerate(field):
                field[i] = renames.get(name, name)
        nodes.append(copy)
    for out, branch_out in zip(node.output, branch.output):
        if out:
            nodes.append(onnx.helper.make_node("Identity", [renames.get(branch_out.name, branch_out.name)], [out],
                                               name=f"{prefix}/{branch_out.name}/out"))
    return nodes


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    while True:
        used = {o.name for o in graph.output} | {name for n in graph.node for name in n.input} | \
            {name for n in graph.node for g in _subgraphs(n) for name in _outer_names(g)}
        keep = [n for n in graph.node if any(o in used for o in n.output if o)]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    used = {name for n in graph.node for name in n.input} | {name for n in graph.node for g in _subgraphs(n)
                                                              for name in _outer_names(g)}
    kept = [i for i in graph.initializer if i.name in used or i.name in {o.name for o in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    found = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            found.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            found.extend(a.graphs)
    return found


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads (its own and from outer scopes; over-approximating keeps nodes, never drops one)."""
    names = {name for n in graph.node for name in n.input}
    for n in graph.node:
        for g in _subgraphs(n):
            names |= _outer_names(g)
    return names
