"""The LiteRT probe: a float ``.tflite`` (litert-torch) or its INT8 twin (AI Edge Quantizer), layer by layer.

The flatbuffer is read with the schema ai-edge-litert ships (as :mod:`edgesdk_converters.tflite_model` reads it). A
layer is an op of the main subgraph that computes from the sample: QUANTIZE/DEQUANTIZE ops between activations are
plumbing, and an op that reads constants only (the DEQUANTIZE of a float16 weight) computes a constant. AI Edge
Quantizer keeps the float model's tensor names on the int8 tensors, and a layer names each input by the tensor
behind its quantize/dequantize ops, so the INT8 model's layers read the float model's names (only the graph's
float output, ``<name>_dequant``, and input copy, ``<name>_quantized``, are new; both are plumbing).

:meth:`LiteRTProbe.capture` runs the interpreter with every tensor preserved and without the default XNNPACK
delegate (a delegated graph keeps its intermediates inside the delegate): the builtin kernels, whose arithmetic
XNNPACK reproduces to float rounding. :meth:`LiteRTProbe.isolated` runs a small model cut out of the artifact's
flatbuffer: the ops from the layer's input tensors to its output, with the artifact's constants and quantization,
so an int8 input is quantized with its own scale and zero point, as the artifact's producer would have written it.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Layer

_PLUMBING = {"QUANTIZE", "DEQUANTIZE"}
_QUANTIZED_TYPES = {"INT8", "INT16"}  # an op writing one of these runs on integers
_WEIGHTED = {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "FULLY_CONNECTED": 1, "TRANSPOSE_CONV": 1}  # op -> weight input
MAX_THREADS = 256  # runtime["num_threads"] above this is refused


def open_probe(path: Path, runtime: dict) -> "LiteRTProbe":
    return LiteRTProbe(path, runtime)


class LiteRTProbe:
    """A ``.tflite`` artifact opened for looking inside (see the module docstring). ``runtime["num_threads"]``
    (default: every CPU) sets the interpreters' threads. Not thread-safe: one caller at a time."""

    def __init__(self, path: Path, runtime: dict | None = None) -> None:
        from ai_edge_litert import schema_py_generated as schema
        from ai_edge_litert.tools import flatbuffer_utils

        self.path = Path(path)
        self._threads = _threads(dict(runtime or {}))
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ConversionError(f"cannot read {self.path}: {exc}") from exc
        if len(data) < 8 or data[4:8] != b"TFL3":
            raise ConversionError(f"{self.path} is not a loadable TFLite model: no 'TFL3' flatbuffer identifier")
        # The interpreter verifies the flatbuffer before the Python reader walks its offsets.
        self._interpreter = self._open(data, str(self.path))
        try:
            self._model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
            self._data = data  # buffers kept past the flatbuffer (offset/size) are read from here
        except Exception as exc:  # struct.error, IndexError...: the verifier passed what the reader cannot read
            raise ConversionError(f"{self.path} is not a loadable TFLite model: its flatbuffer does not parse "
                                  f"({type(exc).__name__}: {exc})") from exc
        if not self._model.subgraphs:
            raise ConversionError(f"{self.path} is not a loadable TFLite model: it has no subgraph")
        self._graph = self._model.subgraphs[0]
        opnames = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
        self._types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
        self._ops = [_op_name(self._model.operatorCodes[op.opcodeIndex], opnames) for op in self._graph.operators]
        self._names = _unique_names(self._graph.tensors)
        self._tensor = {name: i for i, name in enumerate(self._names)}
        self._producer = {t: k for k, op in enumerate(self._graph.operators) for t in _ids(op.outputs)}
        self._fixed = self._constants()
        self._layers = self._find_layers()
        self._inputs = [int(i) for i in self._graph.inputs]
        self._read = list(dict.fromkeys([self._tensor[l.name] for l in self._layers] + self._inputs
                                        + [self._tensor[i] for l in self._layers for i in l.inputs]))
        self._runners: dict[tuple[str, tuple[str, ...]], object] = {}

    # -- reading the graph ------------------------------------------------------------------------------------
    def _constants(self) -> set[int]:
        """Tensors that do not depend on the sample: weights (a buffer with data, or stored past the flatbuffer),
        variables, and what ops compute from those alone (a float16 weight's DEQUANTIZE)."""
        fixed = set()
        for i, tensor in enumerate(self._graph.tensors):
            buffer = self._model.buffers[tensor.buffer] if 0 < tensor.buffer < len(self._model.buffers) else None
            stored = buffer is not None and (buffer.data is not None and len(buffer.data) or (buffer.offset or 0) > 1)
            if stored or tensor.isVariable:
                fixed.add(i)
        for op in self._graph.operators:
            if all(i in fixed for i in _ids(op.inputs)):
                fixed.update(_ids(op.outputs))
        return fixed

    def _source(self, tensor: int) -> int:
        """The activation behind ``tensor``: through QUANTIZE/DEQUANTIZE ops to the tensor they convert."""
        for _ in range(len(self._graph.operators)):
            k = self._producer.get(tensor)
            if k is None or self._ops[k] not in _PLUMBING or not _ids(self._graph.operators[k].inputs):
                break
            tensor = _ids(self._graph.operators[k].inputs)[0]
        return tensor

    def _find_layers(self) -> list[Layer]:
        layers = []
        for k, op in enumerate(self._graph.operators):
            outputs = _ids(op.outputs)
            if self._ops[k] in _PLUMBING or not outputs or outputs[0] in self._fixed:
                continue
            out = outputs[0]
            inputs = tuple(dict.fromkeys(self._names[self._source(i)] for i in _ids(op.inputs) if i not in self._fixed))
            tensor = self._graph.tensors[out]
            shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
            layers.append(Layer(self._names[out], self._ops[k], f"op {k}", inputs, self._macs(k, shape),
                                self._types.get(tensor.type) in _QUANTIZED_TYPES, shape))
        return layers

    def _macs(self, k: int, out_shape: tuple[int, ...]) -> int:
        """Output elements x weight elements / output channels (a BATCH_MATMUL: x its reduction length)."""
        op, name = self._graph.operators[k], self._ops[k]
        if not out_shape or any(d <= 0 for d in out_shape) or name not in {*_WEIGHTED, "BATCH_MATMUL"}:
            return 0
        out = int(np.prod(out_shape))
        inputs = list(op.inputs)
        if name == "BATCH_MATMUL":
            a = self._graph.tensors[inputs[0]].shape
            if a is None or len(a) < 2:
                return 0
            return out * max(int(a[-2] if getattr(op.builtinOptions, "adjX", False) else a[-1]), 0)
        weight = self._graph.tensors[inputs[_WEIGHTED[name]]].shape
        if weight is None or not len(weight) or any(d <= 0 for d in weight):
            return 0
        channels = weight[-1] if name == "DEPTHWISE_CONV_2D" else weight[0]
        return out * int(np.prod(weight)) // max(1, int(channels))

    # -- the Probe interface ----------------------------------------------------------------------------------
    def layers(self) -> list[Layer]:
        return list(self._layers)

    def capture(self, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Every layer's value, every graph input's and every other tensor a layer reads, as float32 (int8/int16
        dequantized). A float sample for an int8 input is quantized with the input's scale and zero point."""
        if len(sample) != len(self._inputs):
            names = ", ".join(self._names[i] for i in self._inputs)
            raise ConversionError(f"{self.path.name} has {len(self._inputs)} inputs ({names}); the sample has "
                                  f"{len(sample)}")
        what = f"running {self.path.name} with every tensor kept"
        self._run(self._interpreter, [(self._names[i], i, v) for i, v in zip(self._inputs, sample)], what)
        with _engine_errors(what):
            return {self._names[i]: self._float(self._interpreter.get_tensor(i), i) for i in self._read}

    def isolated(self, layer: Layer, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """``layer.name`` computed by the artifact's ops from ``layer.inputs`` (taken from ``inputs``, which may hold
        more, e.g. a whole capture) alone. ``layer.inputs`` may be any tensors upstream that cut the layer off the
        graph's inputs: the ops between them run. The interpreter built is kept for the next call."""
        out = self._tensor.get(layer.name)
        if out is None or out in self._fixed or out not in self._producer:
            raise ConversionError(f"{self.path.name} has no layer named {layer.name!r}")
        unknown = [i for i in layer.inputs if i not in self._tensor]
        if unknown:
            raise ConversionError(f"layer {layer.name!r} ({layer.node}) reads {', '.join(map(repr, unknown))}, which "
                                  f"{self.path.name} has no tensor named")
        missing = [i for i in layer.inputs if i not in inputs]
        if missing:
            raise ConversionError(f"layer {layer.name!r} ({layer.node}) reads {', '.join(map(repr, missing))}, which "
                                  f"were not given (given: {', '.join(map(repr, inputs)) or 'nothing'})")
        key = (layer.name, tuple(layer.inputs))
        runner = self._runners.get(key)
        if runner is None:
            content = self._extract(out, [self._tensor[i] for i in layer.inputs], layer)
            runner = self._runners[key] = self._open(content, f"layer {layer.name!r} ({layer.node}) alone")
        what = f"running layer {layer.name!r} ({layer.node}) alone"
        feeds = [(name, self._tensor[name], inputs[name]) for name in layer.inputs]
        self._run(runner, feeds, what)
        with _engine_errors(what):
            return self._float(runner.get_tensor(runner.get_output_details()[0]["index"]), out)

    def close(self) -> None:
        self._runners.clear()
        self._interpreter = None

    def __enter__(self) -> "LiteRTProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- models built for reading -----------------------------------------------------------------------------
    def _extract(self, out: int, boundary: list[int], layer: Layer) -> bytes:
        """A model of the ops from ``boundary`` to ``out``: the artifact's operator codes, the buffers those ops
        read, the other subgraphs (control flow calls them by index); no signature, no metadata."""
        from ai_edge_litert import schema_py_generated as schema
        from ai_edge_litert.tools import flatbuffer_utils

        graph, stop = self._graph, set(boundary)
        if out in stop:
            raise ConversionError(f"layer {layer.name!r} ({layer.node}) names its own output among its inputs")
        needed, todo = set(), [out]
        while todo:
            tensor = todo.pop()
            if tensor in stop:
                continue
            k = self._producer.get(tensor)
            if k is None:
                if tensor not in self._fixed:
                    raise ConversionError(f"layer {layer.name!r} ({layer.node}) depends on {self._names[tensor]!r}, "
                                          f"which is none of its inputs ({', '.join(layer.inputs)}): it cannot be "
                                          f"run alone")
                continue
            if k not in needed:
                needed.add(k)
                todo.extend(_ids(graph.operators[k].inputs))
        buffers, moved = [schema.BufferT()], {}

        def buffer(index: int) -> int:
            old = self._model.buffers[index] if 0 < index < len(self._model.buffers) else None
            if old is not None and (old.data is None or not len(old.data)) and (old.offset or 0) > 1:
                # weights stored after the flatbuffer (AI Edge Quantizer writes them so): inline them
                end = old.offset + (old.size or 0)
                if end > len(self._data):
                    raise ConversionError(f"{self.path.name}: buffer {index} points past the end of the file "
                                          f"({end} > {len(self._data)} bytes): layer {layer.name!r} cannot be cut out")
                inlined = schema.BufferT()
                inlined.data = np.frombuffer(self._data, np.uint8, old.size, old.offset)
                old = inlined
            if old is None or old.data is None or not len(old.data):
                return 0
            if index not in moved:
                moved[index] = len(buffers)
                buffers.append(old)
            return moved[index]

        def tensor_copy(tensor):
            tensor = copy.copy(tensor)
            tensor.buffer = buffer(tensor.buffer)
            return tensor

        ops = [graph.operators[k] for k in sorted(needed)]
        used = list(dict.fromkeys([*boundary, out] + [t for op in ops for t in _ids(op.inputs) + _ids(op.outputs)
                                                      + _ids(op.intermediates)]))
        remap = {t: n for n, t in enumerate(used)}
        sub = schema.SubGraphT()
        sub.tensors = [tensor_copy(graph.tensors[t]) for t in used]
        sub.inputs, sub.outputs, sub.name = [remap[t] for t in boundary], [remap[out]], f"layer {layer.node}"
        sub.operators = []
        for op in ops:
            op = copy.copy(op)
            op.inputs = [remap[t] if t >= 0 else t for t in op.inputs]
            op.outputs = [remap[t] for t in op.outputs]
            if op.intermediates is not None:
                op.intermediates = [remap[t] for t in op.intermediates]
            sub.operators.append(op)
        others = []
        for g in self._model.subgraphs[1:]:
            g = copy.copy(g)
            g.tensors = [tensor_copy(t) for t in g.tensors]
            others.append(g)
        model = schema.ModelT()
        model.version, model.description = self._model.version, self._model.description
        model.operatorCodes, model.subgraphs, model.buffers = self._model.operatorCodes, [sub, *others], buffers
        with _engine_errors(f"writing layer {layer.name!r} ({layer.node}) as a model of its own"):
            return bytes(flatbuffer_utils.convert_object_to_bytearray(model))

    def _open(self, content: bytes, what: str):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        with _engine_errors(f"opening {what}"):
            interpreter = Interpreter(model_content=bytes(content), num_threads=self._threads,
                                      experimental_preserve_all_tensors=True,
                                      experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
            interpreter.allocate_tensors()
        return interpreter

    def _run(self, interpreter, feeds: list[tuple[str, int, np.ndarray]], what: str) -> None:
        """Set the interpreter's inputs, in its order, from ``feeds`` (name, the artifact's tensor index, value),
        resizing them to the values' shapes where they differ, and invoke."""
        if interpreter is None:
            raise ConversionError(f"the probe of {self.path.name} is closed")
        with _engine_errors(what):
            details = interpreter.get_input_details()
            values = [self._typed(np.asarray(value), tensor, name) for name, tensor, value in feeds]
            resized = [(d["index"], v.shape) for d, v in zip(details, values) if tuple(v.shape) != tuple(d["shape"])]
            for index, shape in resized:
                interpreter.resize_tensor_input(index, list(shape), strict=True)
            if resized:
                interpreter.allocate_tensors()
            for d, value in zip(details, values):
                interpreter.set_tensor(d["index"], value)
            interpreter.invoke()

    def _typed(self, value: np.ndarray, tensor: int, name: str) -> np.ndarray:
        """``value`` in the dtype of the artifact's tensor: quantized with its parameters when the tensor is
        quantized and the value is float."""
        t = self._graph.tensors[tensor]
        dtype = np.dtype(_NUMPY.get(self._types.get(t.type), np.float32))
        scale, zero, axis = _quantization(t)
        if scale is not None and dtype.kind in "iu" and value.dtype.kind == "f":
            q = value.astype(np.float32) / _along(scale, axis, value.ndim)
            q = np.sign(q) * np.floor(np.abs(q) + np.float32(0.5)) + _along(zero, axis, value.ndim)  # TfLiteRound
            info = np.iinfo(dtype)
            return np.clip(q, info.min, info.max).astype(dtype)
        if value.dtype == dtype:
            return value
        if dtype.kind == value.dtype.kind or (dtype.kind == "f" and value.dtype.kind in "iub"):
            return value.astype(dtype)
        raise ConversionError(f"{self.path.name}'s tensor {name!r} is {dtype} without quantization parameters; the "
                              f"value given is {value.dtype}")

    def _float(self, value: np.ndarray, tensor: int) -> np.ndarray:
        """``value`` of the artifact's tensor as float32, dequantized when it carries quantization parameters."""
        value = np.asarray(value)
        scale, zero, axis = _quantization(self._graph.tensors[tensor])
        if scale is None or value.dtype.kind not in "iu":
            return value.astype(np.float32)
        centred = (value.astype(np.int64) - _along(zero, axis, value.ndim)).astype(np.float32)
        return centred * _along(scale, axis, value.ndim)


_NUMPY = {"FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64, "INT8": np.int8, "UINT8": np.uint8,
          "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
          "BOOL": np.bool_}


@contextmanager
def _engine_errors(what: str):
    """LiteRT's exceptions (ValueError, RuntimeError from the C++ side) as ConversionError, the original chained."""
    try:
        yield
    except ConversionError:
        raise
    except (ValueError, RuntimeError, TypeError, IndexError) as exc:
        raise ConversionError(f"LiteRT failed {what}: {exc}") from exc


def _threads(runtime: dict) -> int:
    threads = runtime.get("num_threads", os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ConversionError(f"runtime num_threads must be an integer from 1 to {MAX_THREADS}, not {threads!r}")
    return threads


def _op_name(code, names: dict[int, str]) -> str:
    """The builtin operator's name (``CONV_2D``), or a custom op's own code (which the interpreter must know)."""
    builtin = max(code.builtinCode, code.deprecatedBuiltinCode)  # old files set only the deprecated field
    if names.get(builtin) == "CUSTOM" and code.customCode:
        return code.customCode.decode("utf-8", "replace") if isinstance(code.customCode, bytes) else code.customCode
    return names.get(builtin, f"builtin operator {builtin}")


def _ids(tensors) -> list[int]:
    """The tensor indices of an op's inputs/outputs, without the -1 of an absent optional input."""
    return [int(t) for t in (tensors if tensors is not None else ()) if t >= 0]


def _unique_names(tensors) -> list[str]:
    """Each tensor's name; an empty or repeated one gets its index, so that names identify tensors
    (:func:`tensor_name` reads the model's name back)."""
    names, seen = [], set()
    for i, tensor in enumerate(tensors):
        name = tensor.name.decode("utf-8", "replace") if isinstance(tensor.name, bytes) else (tensor.name or "")
        if not name or name in seen:
            name = f"{name or 'tensor'} #{i}"
        seen.add(name)
        names.append(name)
    return names


def tensor_name(layer_name: str) -> str:
    """The name a layer's output tensor has in the model (what AI Edge Quantizer matches): the probe's name without
    the ``" #index"`` it adds to a repeated one; "" for a tensor that has none."""
    base, sep, index = layer_name.rpartition(" #")
    if not sep or not index.isdigit():
        return layer_name
    return "" if base == "tensor" else base


def _quantization(tensor) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    """A tensor's (scale, zero point, axis), or (None, None, 0) when it has none."""
    q = tensor.quantization
    if q is None or q.scale is None or not len(q.scale):
        return None, None, 0
    scale = np.asarray(q.scale, np.float32)
    zero = np.asarray(q.zeroPoint if q.zeroPoint is not None and len(q.zeroPoint) else np.zeros(len(scale)), np.int64)
    return scale, zero, int(q.quantizedDimension or 0)


def _along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """One value per tensor (a scalar) or per channel along ``axis`` (broadcastable to a rank-``ndim`` tensor)."""
    if values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)
