"""Per-op time of a LiteRT model on the CPU, and which ops ran inside XNNPACK.

The Python interpreter has no op profiler, so each op of the main subgraph is cut out into a model of its own (its
constant inputs kept, its other inputs made graph inputs), fed the values it meets in the whole model (one run on
LiteRT's builtin kernels with every tensor kept) and timed on the interpreter as edgesdk runs it (XNNPACK applied,
the same threads). Which ops run inside XNNPACK is read from the whole model: after the delegate is applied, every
op that a ``DELEGATE`` node's outputs depend on (back to its inputs) is inside it; the rest run on LiteRT's builtin
kernels, one op at a time, with a copy at each partition edge. An op alone and the same op inside a partition can
differ (XNNPACK fuses and keeps data in its own layout), so the ops' sum is shown beside the whole model's time.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from pathlib import Path

import numpy as np

from ...choices import BackendReason
from ...errors import BackendUnavailable
from .timing import time_call

KERNEL_FAST = "XNNPACK"
KERNEL_BUILTIN = "LiteRT builtin"


def profile(model_path: Path, feeds: list[np.ndarray], threads: int | None, min_runs: int, min_seconds: float) -> dict:
    """Every op of the main subgraph: name (its first output tensor), type, kernel, precision, ms; plus the whole
    model's time, the number of XNNPACK partitions and notes."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    from ai_edge_litert.tools import flatbuffer_utils

    threads = threads or os.cpu_count() or 1
    try:
        whole = Interpreter(model_path=str(model_path), num_threads=threads)
        whole.allocate_tensors()
        values_run = Interpreter(model_path=str(model_path), num_threads=threads,
                                 experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                                 experimental_preserve_all_tensors=True)
        values_run.allocate_tensors()
    except Exception as exc:  # the interpreter's ValueError/RuntimeError on a model it cannot take
        raise BackendUnavailable(BackendReason.LOAD_FAILED, f"LiteRT cannot load {model_path.name}: {exc}") from exc
    for run in (whole, values_run):
        for detail, x in zip(run.get_input_details(), feeds):
            run.set_tensor(detail["index"], _as_input(x, detail))
    values_run.invoke()
    whole_ms = time_call(whole.invoke, min_runs, min_seconds)
    inside, partitions = _delegated(whole)

    model = flatbuffer_utils.read_model(str(model_path))
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    graph = model.subgraphs[0]
    static = _static_producers(model, graph)
    rows, notes = [], []
    for index, op in enumerate(graph.operators):
        code = model.operatorCodes[op.opcodeIndex]
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        kind = (code.customCode.decode() if isinstance(code.customCode, bytes) else str(code.customCode)) \
            if builtin == schema.BuiltinOperator.CUSTOM else names.get(builtin, str(builtin))
        out = next((i for i in op.outputs if i >= 0), None)
        row = {"index": index, "name": _name(graph.tensors[out]) if out is not None else f"#{index}", "type": kind,
               "kernel": KERNEL_FAST if index in inside else KERNEL_BUILTIN,
               "precision": _precision(model, graph, op), "ms": None}
        try:
            if any(o in static for o in op.outputs):
                row["note"] = "computes a constant (a weight's DEQUANTIZE): timed with the op that reads it"
                row["ms"] = 0.0
                rows.append(row)
                continue
            alone, sources = _single_op_model(schema, model, graph, op, static)
            row["ms"] = _time_alone(Interpreter, flatbuffer_utils.convert_object_to_bytearray(alone), sources,
                                    values_run, threads, min_runs, min_seconds)
        except Exception as exc:  # an op that cannot run alone (control flow, state, custom): named, not timed
            row["note"] = f"not timed alone: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        rows.append(row)
    outside = [r for r in rows if r["kernel"] != KERNEL_FAST]
    if outside:
        notes.append(f"{len(outside)} of {len(rows)} ops run outside XNNPACK on LiteRT's builtin kernels "
                     f"({', '.join(sorted({r['type'] for r in outside}))}), in {partitions} XNNPACK partition(s)")
    return {"whole_ms": whole_ms, "ops": rows, "partitions": partitions, "notes": notes,
            "method": "each op cut out into a model of its own, fed the values it meets in the whole model, timed "
                      "on the interpreter with XNNPACK; XNNPACK coverage read from the whole model's DELEGATE nodes"}


def outside_xnnpack(model_path: Path, threads: int | None = None) -> Counter:
    """The op types of ``model_path`` that run outside XNNPACK on this interpreter (LiteRT's builtin kernels), with
    their counts, read from the DELEGATE nodes after the delegate is applied (see :func:`_delegated`)."""
    return Counter(kind for kind, _, _ in ops_outside_xnnpack(model_path, threads))


def ops_outside_xnnpack(model_path: Path, threads: int | None = None) -> list[tuple[str, str, str]]:
    """Each op of ``model_path`` that runs outside XNNPACK: (type, first output tensor's name, its element type)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(model_path), num_threads=threads or 1)
    interp.allocate_tensors()  # the delegate is applied here
    inside, _ = _delegated(interp)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    found = []
    for o in interp._get_ops_details():
        if o["op_name"] == "DELEGATE" or o["index"] in inside:
            continue
        out = tensors.get(next((i for i in o["outputs"] if i >= 0), -1))
        found.append((o["op_name"], out["name"] if out else "", np.dtype(out["dtype"]).name if out else "?"))
    return found


def _as_input(x: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if np.dtype(detail["dtype"]).kind in "iu" and scale and np.asarray(x).dtype.kind == "f":
        info = np.iinfo(detail["dtype"])
        return np.clip(np.rint(np.asarray(x) / scale) + zero_point, info.min, info.max).astype(detail["dtype"])
    return np.asarray(x, detail["dtype"]).reshape(detail["shape"]) if np.size(x) == np.prod(detail["shape"]) \
        else np.asarray(x, detail["dtype"])


def _delegated(interp) -> tuple[set[int], int]:
    """The indices of the ops inside a DELEGATE node of ``interp`` (delegates applied), and the delegate count."""
    ops = interp._get_ops_details()
    producer = {t: o for o in ops if o["op_name"] != "DELEGATE" for t in o["outputs"]}
    inside: set[int] = set()
    delegates = [o for o in ops if o["op_name"] == "DELEGATE"]
    for d in delegates:
        stop, stack, seen = set(d["inputs"]), list(d["outputs"]), set()
        while stack:
            t = stack.pop()
            if t in stop or t in seen or t not in producer:
                continue
            seen.add(t)
            inside.add(producer[t]["index"])
            stack.extend(i for i in producer[t]["inputs"] if i >= 0)
    return inside, len(delegates)


def _name(tensor) -> str:
    name = tensor.name
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _constant(model, tensor) -> bool:
    data = model.buffers[tensor.buffer].data if 0 < tensor.buffer < len(model.buffers) else None
    return data is not None and len(data) > 0


def _precision(model, graph, op) -> str:
    """The element type the op computes in: its first non-constant input's (its output's where it has none)."""
    from ai_edge_litert.tools.flatbuffer_utils import type_to_name

    ins = [graph.tensors[i] for i in op.inputs if i >= 0 and not _constant(model, graph.tensors[i])]
    tensor = ins[0] if ins else graph.tensors[op.outputs[0]]
    return type_to_name(tensor.type).lower()


def _static_producers(model, graph) -> dict[int, object]:
    """The ops whose every input is a constant or another such op's output (MediaPipe's DEQUANTIZE of a float16
    weight), by the tensor they write: an op cut out keeps them, so its weights stay weights."""
    static = {i for i, t in enumerate(graph.tensors) if _constant(model, t)}
    producers: dict[int, object] = {}
    for op in graph.operators:  # in execution order: a chain's earlier ops come first
        if op.inputs is not None and len(op.inputs) and all(i < 0 or i in static for i in op.inputs):
            for o in op.outputs:
                static.add(o)
                producers[o] = op
    return producers


def _single_op_model(schema, model, graph, op, static: dict[int, object]):
    """A model of ``op`` alone (with the constant-only ops that make its weights): its tensors (constants with their
    data), non-constant inputs as the graph's inputs, outputs as its outputs; and those inputs' indices in
    ``graph``."""
    chain, stack = [], [i for i in op.inputs if i in static]
    while stack:
        maker = static[stack.pop()]
        if maker not in chain and maker is not op:
            chain.insert(0, maker)
            stack.extend(i for i in maker.inputs if i in static)
    ops = chain + [op]
    used = list(dict.fromkeys(i for o in ops for i in list(o.inputs) + list(o.outputs) if i >= 0))
    alone = schema.ModelT()
    alone.version = model.version
    alone.operatorCodes = model.operatorCodes
    alone.buffers = [schema.BufferT()]
    tensors, new = [], {}
    for i in used:
        t = copy.copy(graph.tensors[i])
        if _constant(model, t):
            alone.buffers.append(model.buffers[t.buffer])
            t.buffer = len(alone.buffers) - 1
        else:
            t.buffer = 0
        new[i] = len(tensors)
        tensors.append(t)
    sub = schema.SubGraphT()
    sub.tensors = tensors
    sources = [i for i in dict.fromkeys(op.inputs)
               if i >= 0 and not _constant(model, graph.tensors[i]) and i not in static]
    sub.inputs = [new[i] for i in sources]
    sub.outputs = [new[i] for i in op.outputs if i >= 0]
    sub.operators = []
    for o in ops:
        one = copy.copy(o)
        one.inputs = [new[i] if i >= 0 else i for i in o.inputs]
        one.outputs = [new[i] if i >= 0 else i for i in o.outputs]
        one.intermediates = []
        sub.operators.append(one)
    sub.name = graph.name
    alone.subgraphs = [sub]
    return alone, sources


def _time_alone(interpreter_class, content: bytearray, sources: list[int], values_run, threads: int,
                min_runs: int, min_seconds: float) -> float:
    """The op alone on the interpreter as edgesdk runs it, fed the tensors ``sources`` (indices in the whole model)
    held after the whole model's run."""
    interp = interpreter_class(model_content=bytes(content), num_threads=threads)
    interp.allocate_tensors()
    for detail, source in zip(interp.get_input_details(), sources):
        interp.set_tensor(detail["index"], values_run.get_tensor(source).reshape(detail["shape"]))
    return time_call(interp.invoke, min_runs, min_seconds)
