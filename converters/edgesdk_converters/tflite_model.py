"""What edgesdk reads and writes inside a ``.tflite`` flatbuffer, before and after the toolchains see it.

- :func:`operators`: every node's operator, custom ones included (MediaPipe's ``Convolution2DTransposeBias``,
  TF Select's ``Flex*``), read without an interpreter so that the sources can name them for every route at once.
- :func:`add_signature`: a SignatureDef built from the main subgraph's inputs and outputs, for models exported
  without one (every MediaPipe model): AI Edge Quantizer calibrates through a signature, and LiteRT's
  accelerator API (``CompiledModel``) opens models by signature.
- :func:`prepare_for_quantizer`: the float model in the form AI Edge Quantizer 0.10 reads correctly (operator
  codes of old files, MediaPipe's float16 weights, rank-4 biases) and whose INT8 form XNNPACK runs whole (stand-alone
  ReLUs fused into their producer), without changing what it computes.

All of them use the flatbuffer schema ai-edge-litert ships (``ai_edge_litert.schema_py_generated``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ConversionError

SIGNATURE_KEY = "serving_default"  # the key litert-torch and the TF converter give their one signature
_CUSTOM = 32  # BuiltinOperator.CUSTOM


@dataclass(frozen=True)
class Operator:
    """One node of a TFLite model: the builtin operator's name (``CONV_2D``) or a custom op's code."""

    subgraph: int
    index: int
    name: str
    custom: bool


def operators(path: Path) -> list[Operator]:
    """Every node of every subgraph of ``path``, read from the flatbuffer (no interpreter, so custom ops do not
    stop it)."""
    from ai_edge_litert import schema_py_generated as schema

    builtin_names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    data = _read(path)
    try:
        model = schema.Model.GetRootAs(data, 0)
        names = []
        for i in range(_length(model.OperatorCodesLength(), data)):
            code = model.OperatorCodes(i)
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            names.append((code.CustomCode().decode("utf-8", "replace"), True) if builtin == _CUSTOM
                         else (builtin_names.get(builtin, f"builtin operator {builtin}"), False))
        found = []
        for g in range(_length(model.SubgraphsLength(), data)):
            graph = model.Subgraphs(g)
            for o in range(_length(graph.OperatorsLength(), data)):
                name, custom = names[graph.Operators(o).OpcodeIndex()]
                found.append(Operator(g, o, name, custom))
    except ConversionError as exc:
        raise ConversionError(f"{path} is not a loadable TFLite model: {exc}") from exc
    except Exception as exc:  # struct.error, IndexError...: the bytes are not a TFLite flatbuffer
        raise ConversionError(f"{path} is not a loadable TFLite model: its flatbuffer does not parse "
                              f"({type(exc).__name__}: {exc})") from exc
    return found


def has_signature(path: Path) -> bool:
    from ai_edge_litert import schema_py_generated as schema

    data = _read(path)
    return schema.Model.GetRootAs(data, 0).SignatureDefsLength() > 0


def add_signature(path: Path) -> str | None:
    """Give ``path`` (in place) a SignatureDef from its first subgraph's inputs and outputs when it has none.

    The signature's names are the tensors' own names, so calibration data keyed by input name needs no mapping.
    Returns what was done, for the build record, or None when the model already had a signature.
    """
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    if model.signatureDefs:
        return None
    graph = model.subgraphs[0]

    def entries(indices) -> list:
        result = []
        for i in indices:
            entry = schema.TensorMapT()
            name = graph.tensors[i].name
            entry.name = name.decode("utf-8") if isinstance(name, bytes) else name
            entry.tensorIndex = i
            result.append(entry)
        return result

    names = [e.name for e in entries(graph.inputs)] + [e.name for e in entries(graph.outputs)]
    if len(set(names)) != len(names) or not all(names):
        raise ConversionError(f"{path.name} has no signature and its inputs/outputs have no distinct names "
                              f"({names}) to build one from")
    signature = schema.SignatureDefT()
    signature.signatureKey = SIGNATURE_KEY
    signature.subgraphIndex = 0
    signature.inputs, signature.outputs = entries(graph.inputs), entries(graph.outputs)
    model.signatureDefs = [signature]
    flatbuffer_utils.write_model(model, str(path))
    return (f"SignatureDef {SIGNATURE_KEY!r} added from the subgraph's inputs ({', '.join(names[:len(graph.inputs)])}) "
            f"and outputs ({', '.join(names[len(graph.inputs):])}): the source had none")


def prepare_for_quantizer(path: Path, out: Path) -> list[str]:
    """Write ``path`` to ``out`` in the form AI Edge Quantizer reads correctly; return what was changed
    (nothing written when the list is empty). Neither change alters what the model computes.

    - Operator codes: files from before schema 3a keep the operator in ``deprecated_builtin_code`` only and
      leave ``builtin_code`` 0, which AI Edge Quantizer 0.10 reads as ADD: it then quantizes a convolution's
      weights as an activation (asymmetric, zero point != 0) and LiteRT refuses the result
      (``conv.cc: affine_quantization->zero_point->data[i] != 0``). ``builtin_code`` gets the real operator, as
      LiteRT's own reader resolves it (the larger of the two fields).
    - Biases of rank > 1: litert-torch 0.10 writes a TRANSPOSE_CONV's bias as ``[1, 1, 1, C]``; AI Edge Quantizer
      0.10 assumes every bias is 1-D, quantizes it per channel along axis 0 (of size 1), and LiteRT refuses the
      result (``num_scales must be 1 for per-layer quantization, or 1 for per-axis quantization, but got C``).
      Such a bias becomes ``[C]``, the shape LiteRT's kernels document, with the same bytes.
    - float16 weights: MediaPipe stores weights as float16 constants behind DEQUANTIZE ops, so the weight a
      convolution sees is a computed tensor, which AI Edge Quantizer 0.10 fails on (``AttributeError: 'NoneType'
      object has no attribute 'ndim'`` in ``fix_quantization_params_rank``). They become float32 constants
      (exact: every float16 is a float32) and their DEQUANTIZE ops go.
    - Stand-alone activations (:func:`fuse_activations`): MediaPipe models end each residual block in ``ADD`` then
      ``RELU``; AI Edge Quantizer keeps the RELU an op of its own, with a range of its own, which XNNPACK does not
      take in int8: on BlazeFace each of its 17 RELUs ran outside XNNPACK (18 partitions) and INT8 took 3.2 ms
      against float's 0.85. Fused, as TensorFlow's converter would have written them, the graph is one partition.
    """
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    changes = []
    stale = [c for c in model.operatorCodes if c.deprecatedBuiltinCode > c.builtinCode]
    for code in stale:
        code.builtinCode = code.deprecatedBuiltinCode
    if stale:
        changes.append(f"{len(stale)} operator codes given builtin_code (the file set only deprecated_builtin_code)")
    dequantize = {i for i, c in enumerate(model.operatorCodes) if c.builtinCode == schema.BuiltinOperator.DEQUANTIZE}
    unpacked = 0
    for graph in model.subgraphs:
        kept = []
        for op in graph.operators:
            weight = graph.tensors[op.inputs[0]] if op.opcodeIndex in dequantize else None
            data = model.buffers[weight.buffer].data if weight is not None else None
            if (weight is None or weight.type != schema.TensorType.FLOAT16 or data is None or not len(data)
                    or op.outputs[0] in graph.outputs):
                kept.append(op)
                continue
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(np.frombuffer(bytes(data), "<f2").astype("<f4").tobytes(), np.uint8)
            model.buffers.append(buffer)
            graph.tensors[op.outputs[0]].buffer = len(model.buffers) - 1
            unpacked += 1
        graph.operators = kept
    if unpacked:
        changes.append(f"{unpacked} float16 weight tensors unpacked to float32 (their DEQUANTIZE ops removed)")
    flattened = _flatten_biases(model)
    if flattened:
        changes.append(f"{flattened} convolution bias tensors reshaped to 1-D (AI Edge Quantizer takes biases as 1-D)")
    fused = fuse_activations(model)
    if fused:
        changes.append(f"{sum(fused.values())} stand-alone activations fused into their producer ("
                       + ", ".join(f"{n} {kind}" for kind, n in sorted(fused.items()))
                       + "): XNNPACK has no int8 kernel for a lone one")
    if changes:
        flatbuffer_utils.write_model(model, str(out))
    return changes


# Stand-alone activation -> its ActivationFunctionType (the schema's RELU, RELU_N1_TO_1, RELU6)
_ACTIVATIONS = {"RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}
# operators whose options carry a fused activation that XNNPACK and LiteRT's int8 kernels apply
_FUSES = ("ADD", "SUB", "MUL", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D")


def fuse_activations(model) -> Counter:
    """Fuse each RELU / RELU6 / RELU_N1_TO_1 whose input is written by an op of ``_FUSES`` with no activation of its
    own and read by nothing else (nor a graph output) into that op: the op writes the activation's output tensor and
    the activation op goes. Exact: the fused op computes max(0, y) (or the clamp) on the same y. Returns the count of
    fused activations by kind."""
    from ai_edge_litert import schema_py_generated as schema

    kinds = {getattr(schema.BuiltinOperator, name): name for name in _ACTIVATIONS}
    fusers = {getattr(schema.BuiltinOperator, name) for name in _FUSES}
    fused: Counter[str] = Counter()
    for graph in model.subgraphs:
        readers: Counter[int] = Counter(i for op in graph.operators for i in op.inputs if i >= 0)
        writer = {o: op for op in graph.operators for o in op.outputs if o >= 0}
        gone = set()
        for act in graph.operators:
            kind = kinds.get(model.operatorCodes[act.opcodeIndex].builtinCode)
            if kind is None or len(act.inputs) != 1 or len(act.outputs) != 1:
                continue
            y = act.inputs[0]
            producer = writer.get(y)
            options = getattr(producer, "builtinOptions", None)
            if (producer is None or id(producer) in gone or readers[y] != 1 or y in graph.outputs
                    or len(producer.outputs) != 1
                    or model.operatorCodes[producer.opcodeIndex].builtinCode not in fusers
                    or getattr(options, "fusedActivationFunction", None) != 0):
                continue
            options.fusedActivationFunction = _ACTIVATIONS[kind]
            producer.outputs = [act.outputs[0]]
            writer[act.outputs[0]] = producer
            gone.add(id(act))
            fused[kind] += 1
        if gone:
            graph.operators = [op for op in graph.operators if id(op) not in gone]
            _drop_unused_tensors(model, graph)
    return fused


def _drop_unused_tensors(model, graph) -> None:
    """Remove the tensors no op, graph input/output or signature names, renumbering every reference: AI Edge
    Quantizer's calibrator reads every tensor of the graph and fails on one that nothing writes."""
    g = model.subgraphs.index(graph)
    signatures = [entry for sig in (model.signatureDefs or []) if sig.subgraphIndex == g
                  for entry in (sig.inputs or []) + (sig.outputs or [])]
    used = {i for op in graph.operators for i in list(op.inputs) + list(op.outputs) if i >= 0}
    used |= set(graph.inputs) | set(graph.outputs) | {e.tensorIndex for e in signatures}
    new = {old: n for n, old in enumerate(i for i in range(len(graph.tensors)) if i in used)}
    if len(new) == len(graph.tensors):
        return
    graph.tensors = [t for i, t in enumerate(graph.tensors) if i in new]
    for op in graph.operators:
        op.inputs = [new[i] if i >= 0 else i for i in op.inputs]
        op.outputs = [new[i] if i >= 0 else i for i in op.outputs]
        if getattr(op, "intermediates", None) is not None and len(op.intermediates):
            op.intermediates = [new[i] for i in op.intermediates]
    graph.inputs = [new[i] for i in graph.inputs]
    graph.outputs = [new[i] for i in graph.outputs]
    for entry in signatures:
        entry.tensorIndex = new[entry.tensorIndex]


# Builtin operator -> the input index of its bias.
_BIAS_INPUT = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 2, "TRANSPOSE_CONV": 3}


def _flatten_biases(model) -> int:
    """Reshape the constant biases of convolution/fully-connected ops shaped ``[1, ..., 1, C]`` to ``[C]``."""
    from ai_edge_litert import schema_py_generated as schema

    codes = {getattr(schema.BuiltinOperator, name): index for name, index in _BIAS_INPUT.items()}
    flattened = 0
    for graph in model.subgraphs:
        readers: Counter[int] = Counter(i for op in graph.operators for i in op.inputs if i >= 0)
        for op in graph.operators:
            index = codes.get(model.operatorCodes[op.opcodeIndex].builtinCode)
            if index is None or len(op.inputs) <= index or op.inputs[index] < 0:
                continue
            bias = graph.tensors[op.inputs[index]]
            shape = list(bias.shape if bias.shape is not None else [])
            constant = model.buffers[bias.buffer].data is not None
            if (constant and len(shape) > 1 and all(d == 1 for d in shape[:-1]) and readers[op.inputs[index]] == 1
                    and op.inputs[index] not in graph.outputs):
                bias.shape = [shape[-1]]
                bias.shapeSignature = None
                flattened += 1
    return flattened


def _read(path: Path) -> bytearray:
    data = bytearray(Path(path).read_bytes())
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ConversionError(f"{path} is not a loadable TFLite model: no 'TFL3' flatbuffer identifier")
    return data


def _length(n: int, data: bytearray) -> int:
    # A vector entry takes at least 4 bytes: a longer count is a damaged file, not a loop to run.
    if n < 0 or n * 4 > len(data):
        raise ConversionError(f"the TFLite flatbuffer declares {n} entries in a {len(data)}-byte file")
    return n
