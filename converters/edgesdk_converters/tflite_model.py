"""What edgesdk reads and writes inside a ``.tflite`` flatbuffer, before and after the toolchains see it.

- :func:`operators`: every node's operator, custom ones included (MediaPipe's ``Convolution2DTransposeBias``,
  TF Select's ``Flex*``), read without an interpreter so that the sources can name them for every route at once.
- :func:`add_signature`: a SignatureDef built from the main subgraph's inputs and outputs, for models exported
  without one (every MediaPipe model): AI Edge Quantizer calibrates through a signature, and LiteRT's
  accelerator API (``CompiledModel``) opens models by signature.
- :func:`prepare_for_quantizer`: the float model in the form AI Edge Quantizer 0.10 reads correctly (operator
  codes of old files, MediaPipe's float16 weights, rank-4 biases), without changing what it computes.

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
    if changes:
        flatbuffer_utils.write_model(model, str(out))
    return changes


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
