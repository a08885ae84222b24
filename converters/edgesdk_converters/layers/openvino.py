"""The OpenVINO probe: a float IR (``ov.convert_model``) or its INT8 twin (``nncf.quantize``: FakeQuantize ops on
activations, int8 weights decompressed by Convert/Multiply), layer by layer.

A layer is an op that computes a float activation: not a Parameter, Result or Constant, not a FakeQuantize or a
Convert hanging off one, not a constant subgraph (weight decompression included) and not a shape subgraph (ShapeOf
and what is computed from shapes alone). It is named by its output's tensor name where it has one (for a model
converted from ONNX, the ONNX tensor name: the Add that carries an ONNX Conv's bias has it, the bias-free
Convolution before it has none and goes by its friendly name ``<onnx node>/WithoutBiases``), else by the op's
friendly name; ``Layer.node`` is always the friendly name, the one ``nncf.IgnoredScope(names=[...])`` takes. NNCF
keeps names and inserts its FakeQuantize ops after the tensors it quantizes, so the INT8 IR's layers have the float
IR's names, and a layer's inputs (walked back through FakeQuantize and whatever is not a layer) are named alike in
both. An INT8 layer is ``quantized`` when it reads int8 weights or a quantized activation: one behind a FakeQuantize,
directly or through layers that pass quantized values on (a MaxPool, a Reshape: :data:`_PASS_QUANTIZED`).

Every reading compiles on CPU with ``INFERENCE_PRECISION_HINT=f32``, whatever the artifact's runtime options say: on
AMX CPUs OpenVINO runs "fp32" as bf16 otherwise, and the probe measures INT8 error against float, not bf16 noise.
:meth:`OpenVinoProbe.capture` makes every layer a model output; :meth:`OpenVinoProbe.isolated` runs one op of a
clone of the artifact whose activation inputs are new Parameters, any FakeQuantize between them and the op kept (and
one copied in where the op reads a value quantized before a MaxPool or Reshape), so an INT8 op quantizes its inputs
on entry as it does in the whole model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Layer

_NOT_LAYERS = {"Parameter", "Result", "Constant", "FakeQuantize"}
_SHAPE_OPS = {"ShapeOf"}  # what reads an activation's shape, never its values
# Layers that pass quantized values on unchanged, so FakeQuantize(op(x)) == op(FakeQuantize(x)) for a per-tensor
# FakeQuantize: a value they compute from a quantized one is quantized alike
_PASS_QUANTIZED = {"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "StridedSlice", "Slice", "Split",
                   "VariadicSplit", "DepthToSpace", "SpaceToDepth"}
_CONV = {"Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData"}

_Key = tuple[str, int]  # (the node's unique name in this model, output index): one tensor


def open_probe(path: Path, runtime: dict) -> "OpenVinoProbe":
    return OpenVinoProbe(path, runtime)


@contextlib.contextmanager
def _engine_errors(what: str):
    """OpenVINO's exceptions (RuntimeError and others from its Python layer) as ConversionError saying ``what``."""
    try:
        yield
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(f"{what}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc


class OpenVinoProbe:
    """An OpenVINO IR opened for looking inside (see the module docstring). Not thread-safe."""

    def __init__(self, path: Path, runtime: dict) -> None:
        from edgesdk.engines.openvino import core

        self.path = Path(path)
        # f32: see the module docstring. No dynamic quantization: the CPU plugin would quantize the activations of
        # an op with int8 weights and no FakeQuantize before it (a MatMul run alone, its input quantized upstream),
        # which the artifact does not ask for.
        self._config = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
        with _engine_errors(f"OpenVINO cannot read {self.path.name}"):
            self._model = core().read_model(str(self.path))
        self._ops = list(self._model.get_ordered_ops())
        self._index = {op.get_name(): k for k, op in enumerate(self._ops)}
        self._params = list(self._model.get_parameters())
        self._kinds = self._classify()
        self._names: dict[_Key, str] = {}  # every tensor a layer computes or reads -> its name
        self._layers = self._find_layers()
        self._by_name = {self._names[k]: k for k in self._names}
        self._shapes: dict[str, tuple[int, ...]] = {}  # from the last capture, for dynamic dimensions
        self._capture_model = None  # (compiled model, tensor name of each output)
        self._isolated: dict[str, tuple] = {}  # layer name -> (compiled model, tensor fed to each parameter)

    # -- reading the graph ------------------------------------------------------------------------------------
    @staticmethod
    def _key(output) -> _Key:
        return output.get_node().get_name(), output.get_index()

    def _classify(self) -> dict[_Key, str]:
        """Each tensor's kind: ``act`` (computed from graph inputs' values), ``shape`` (from shapes and constants
        only) or ``const``."""
        kinds: dict[_Key, str] = {}
        for op in self._ops:
            kind_of_inputs = {kinds.get(self._key(i.get_source_output()), "const") for i in op.inputs()}
            if op.get_type_name() == "Parameter":
                kind = "act"
            elif op.get_type_name() in _SHAPE_OPS:
                kind = "shape"
            elif "act" in kind_of_inputs:
                kind = "act"
            elif "shape" in kind_of_inputs:
                kind = "shape"
            else:
                kind = "const"
            for out in op.outputs():
                kinds[self._key(out)] = kind
        return kinds

    def _is_plumbing(self, op) -> bool:
        """A FakeQuantize, or a Convert of one (the integer hop of a quantize/dequantize pair)."""
        while op.get_type_name() == "Convert":
            op = op.input_value(0).get_node()
        return op.get_type_name() == "FakeQuantize"

    def _is_layer(self, op) -> bool:
        if op.get_type_name() in _NOT_LAYERS or op.get_output_size() == 0 or self._is_plumbing(op):
            return False
        out = op.output(0)
        return self._kinds[self._key(out)] == "act" and out.get_element_type().is_real()

    def _name(self, output, used: set[str]) -> str:
        """A tensor's name: its tensor name, else the friendly name (``:k`` for output k > 0), made unique."""
        friendly = output.get_node().get_friendly_name()
        if output.get_index():
            friendly = f"{friendly}:{output.get_index()}"
        name = output.get_any_name() if output.get_names() else friendly
        if name in used:
            name = friendly
        base, n = name, 1
        while name in used:
            n += 1
            name = f"{base}#{n}"
        used.add(name)
        return name

    def _find_layers(self) -> list[Layer]:
        used: set[str] = set()
        for param in self._params:
            self._names[self._key(param.output(0))] = self._name(param.output(0), used)
        layer_ops = [op for op in self._ops if self._is_layer(op)]
        for op in layer_ops:  # every float activation output: a consumer may read output k > 0 (a Split's)
            for out in op.outputs():
                if self._kinds[self._key(out)] == "act" and out.get_element_type().is_real():
                    self._names[self._key(out)] = self._name(out, used)
        layers = []
        for op in layer_ops:
            cuts = self._cuts(op)
            inputs = tuple(dict.fromkeys(self._names[k] for k, by_value in cuts if by_value))
            shape = _dims(op.get_output_partial_shape(0))
            layers.append(Layer(self._names[self._key(op.output(0))], op.get_type_name(), op.get_friendly_name(),
                                inputs, self._macs(op, shape), self._quantized(op), shape))
        return layers

    def _cuts(self, op) -> list[tuple[_Key, bool]]:
        """The tensors ``op`` computes from, found by walking back from its inputs through everything that is not a
        layer or a graph input (FakeQuantize, constants, shape subgraphs, integer ops): each with whether its values
        are read (False: only its shape, by a ShapeOf)."""
        cuts, seen, todo = [], set(), [(i, op) for i in op.inputs()]
        while todo:
            inp, reader = todo.pop(0)
            source = inp.get_source_output()
            key = self._key(source)
            if key in self._names:
                cuts.append((key, reader.get_type_name() not in _SHAPE_OPS))
                continue
            node = source.get_node()
            if node.get_name() not in seen:
                seen.add(node.get_name())
                todo.extend((i, node) for i in node.inputs())
        return cuts

    def _quantized(self, op) -> bool:
        """Whether ``op`` reads int8: a quantized activation (:meth:`_entry_quantize`), or weights stored as
        integers (int8 constants decompressed by Convert) or fake-quantized."""
        for inp in op.inputs():
            source = inp.get_source_output()
            if self._kinds[self._key(source)] == "act":
                if self._entry_quantize(source)[0] is not None:
                    return True
            elif inp.get_element_type().is_real() and self._integer_constant(source.get_node()):
                return True
        return False

    def _entry_quantize(self, source):
        """The FakeQuantize that makes activation ``source`` a quantized value, and whether it lies behind layers
        of :data:`_PASS_QUANTIZED` (a MaxPool of a quantized tensor is as quantized as its input); (None, False)."""
        behind = False
        for _ in range(64):
            node = source.get_node()
            if self._is_plumbing(node):
                while node.get_type_name() == "Convert":
                    node = node.input_value(0).get_node()
                return node, behind
            kind = node.get_type_name()
            if kind not in _PASS_QUANTIZED or source.get_index() > 0 and kind not in ("Split", "VariadicSplit"):
                return None, False
            source, behind = node.input_value(0), True
        return None, False

    def _integer_constant(self, node, depth: int = 6) -> bool:
        """Whether a constant subgraph holds quantized weights: a FakeQuantize, or a Convert from an integer of at
        most 8 bits (a Reshape's int64 shape is no weight)."""
        if node.get_type_name() == "FakeQuantize":
            return True
        if node.get_type_name() == "Convert":
            source = node.input_value(0)
            if source.get_element_type().is_integral() and source.get_element_type().bitwidth <= 8:
                return True
        return depth > 0 and any(self._integer_constant(i.get_source_output().get_node(), depth - 1)
                                 for i in node.inputs() if i.get_element_type().is_real())

    def _macs(self, op, out_shape: tuple[int, ...]) -> int:
        """Output elements x multiplies per output element: a convolution's weight elements per output channel, a
        MatMul's reduction length. 0 for other ops and for dynamic shapes."""
        kind = op.get_type_name()
        if kind not in _CONV and kind != "MatMul" or not out_shape or min(out_shape) < 0:
            return 0
        out = int(np.prod(out_shape))
        if kind in _CONV:
            weights = _dims(op.get_input_partial_shape(1))
            if not weights or min(weights) < 0 or len(out_shape) < 2 or out_shape[1] <= 0:
                return 0
            return out * int(np.prod(weights)) // out_shape[1]
        a, b = _dims(op.get_input_partial_shape(0)), _dims(op.get_input_partial_shape(1))
        attrs = op.get_attributes()
        if len(a) == 1:
            k = a[0]
        elif a:
            k = a[-2] if attrs.get("transpose_a") else a[-1]
        else:
            k = -1
        if k < 0 and b:  # the reduction length from the other side
            k = b[0] if len(b) == 1 else b[-1] if attrs.get("transpose_b") else b[-2]
        return out * k if k > 0 else 0

    # -- the Probe interface ----------------------------------------------------------------------------------
    def layers(self) -> list[Layer]:
        return list(self._layers)

    def capture(self, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Every layer's value, every value a layer reads and every graph input (float as float32, integer inputs
        in their dtype)."""
        self._check_sample(sample)
        if self._capture_model is None:
            wanted = [self._by_name[l.name] for l in self._layers]
            wanted += [self._by_name[i] for l in self._layers for i in l.inputs]
            self._capture_model = self._compile_with_outputs(list(dict.fromkeys(wanted)))
        compiled, names = self._capture_model
        with _engine_errors(f"running {self.path.name} with its layers read failed"):
            request = compiled.create_infer_request()
            request.infer({k: np.asarray(v) for k, v in enumerate(sample)})
            found = {}
            for k, name in enumerate(names):
                if name is not None:
                    found[name] = _as_float(np.array(request.get_output_tensor(k).data, copy=True))
        for param, value in zip(self._params, sample):
            found[self._names[self._key(param.output(0))]] = _as_float(np.array(value, copy=True))
        self._shapes = {n: tuple(v.shape) for n, v in found.items()}
        return found

    def isolated(self, layer: Layer, inputs: dict[str, np.ndarray]) -> np.ndarray:
        missing = [i for i in layer.inputs if i not in inputs]
        if missing:
            raise ConversionError(f"layer {layer.node!r} ({layer.name}) reads {', '.join(missing)}, which were not "
                                  f"given (given: {', '.join(inputs) or 'nothing'})")
        if layer.name not in self._isolated:
            self._isolated[layer.name] = self._compile_alone(layer)
        compiled, fed = self._isolated[layer.name]
        feeds = {}
        for k, (name, dtype) in enumerate(fed):
            if name in inputs:
                feeds[k] = np.asarray(inputs[name], dtype=dtype)
            else:  # read for its shape only (by a ShapeOf): any values of that shape do
                partial = self._model_output(name).get_partial_shape()
                shape = self._shapes.get(name, tuple(partial.to_shape()) if partial.is_static else None)
                if shape is None:
                    raise ConversionError(f"layer {layer.node!r} ({layer.name}) reads the shape of {name!r}, which "
                                          "is dynamic: run capture() first or give its value")
                feeds[k] = np.zeros(shape, dtype=dtype)
        with _engine_errors(f"running layer {layer.node!r} ({layer.name}) of {self.path.name} alone failed"):
            request = compiled.create_infer_request()
            request.infer(feeds)
            return np.array(request.get_output_tensor(0).data, dtype=np.float32, copy=True)

    def close(self) -> None:
        self._isolated.clear()
        self._capture_model = None

    def __enter__(self) -> "OpenVinoProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- models built for reading -----------------------------------------------------------------------------
    def _model_output(self, name: str):
        node, index = self._by_name[name]
        return self._ops[self._index[node]].output(index)

    def _check_sample(self, sample: list[np.ndarray]) -> None:
        names = [self._names[self._key(p.output(0))] for p in self._params]
        if len(sample) != len(self._params):
            raise ConversionError(f"{self.path.name} has {len(names)} inputs ({', '.join(names)}); the sample has "
                                  f"{len(sample)}")
        for name, param, value in zip(names, self._params, sample):
            want = np.dtype(param.get_element_type().to_dtype())
            if np.asarray(value).dtype != want:
                raise ConversionError(f"input {name!r} of {self.path.name} is {want}; the sample gives "
                                      f"{np.asarray(value).dtype}")

    def _clone(self):
        """A clone of the artifact and, in the same order, its ops (``get_ordered_ops`` keeps the order)."""
        clone = self._model.clone()
        ops = list(clone.get_ordered_ops())
        if [(o.get_type_name(), o.get_friendly_name()) for o in ops] != \
                [(o.get_type_name(), o.get_friendly_name()) for o in self._ops]:
            raise ConversionError(f"OpenVINO cloned {self.path.name} into another graph: its layers cannot be read")
        return clone, ops

    def _compile(self, model, what: str):
        from edgesdk.engines.openvino import core

        with _engine_errors(f"OpenVINO cannot compile {what} of {self.path.name}"):
            return core().compile_model(model, "CPU", self._config)

    def _compile_with_outputs(self, keys: list[_Key]):
        """The artifact with ``keys`` added to its outputs, compiled; and the tensor name of each output."""
        clone, ops = self._clone()
        outputs = [ops[self._index[node]].output(index) for node, index in keys]
        with _engine_errors(f"OpenVINO cannot add the layers of {self.path.name} to its outputs"):
            clone.add_outputs(outputs)
        # the clone's tensors by their key in the original, to name each of the clone's outputs
        back = {(ops[self._index[node]].get_name(), index): self._names[(node, index)] for node, index in keys}
        names = [back.get(self._key(result.input_value(0))) for result in clone.get_results()]
        return self._compile(clone, "the model with its layers as outputs"), names

    def _compile_alone(self, layer: Layer):
        """``layer``'s op in a clone of the artifact with a Parameter in place of each tensor it computes from.

        Every consumer of such a tensor is moved onto the Parameter: the model built from the op's output reaches
        back only to what lies between (FakeQuantize, constants, shape subgraphs), so the rest of the clone drops."""
        import openvino as ov
        import openvino.opset13 as opset

        node, index = self._by_name[layer.name]
        clone, ops = self._clone()
        keys = list(dict.fromkeys(key for key, _ in self._cuts(self._ops[self._index[node]])))
        # the values first, in the layer's order; then the tensors read for their shape only
        keys.sort(key=lambda k: layer.inputs.index(self._names[k]) if self._names[k] in layer.inputs
                  else len(layer.inputs))
        params = []
        with _engine_errors(f"OpenVINO cannot cut layer {layer.node!r} ({layer.name}) out of {self.path.name}"):
            for key in keys:
                source = ops[self._index[key[0]]].output(key[1])
                param = opset.parameter(source.get_partial_shape(), source.get_element_type(), self._names[key])
                entry = self._entry_copy(param.output(0), self._ops[self._index[key[0]]].output(key[1]), ops)
                for target in list(source.get_target_inputs()):
                    target.replace_source_output(entry)
                params.append(param)
            sub = ov.Model([ops[self._index[node]].output(index)], params, f"layer {layer.node}")
        fed = [(self._names[k], np.dtype(p.get_element_type().to_dtype())) for k, p in zip(keys, params)]
        return self._compile(sub, f"layer {layer.node!r} ({layer.name}) alone"), fed

    def _entry_copy(self, value, source, ops):
        """``value`` (fed in place of ``source``) quantized as the artifact quantizes ``source`` before the layers
        that read it: by a copy of the FakeQuantize behind the pass-through layers that computed it. ``value``
        itself when ``source`` is not quantized that way, or by a per-channel FakeQuantize (which a Reshape or
        Transpose would not carry over)."""
        import openvino.opset13 as opset

        fq, _ = self._entry_quantize(source)  # behind a layer: a FakeQuantize right before one is not cut off
        if fq is None:
            return value
        ranges = [fq.input_value(k) for k in range(1, 5)]
        if any(not r.get_partial_shape().is_static or int(np.prod(list(r.get_partial_shape().to_shape()))) != 1
               for r in ranges):
            return value
        copies = [ops[self._index[r.get_node().get_name()]].output(r.get_index()) for r in ranges]
        attrs = fq.get_attributes()
        return opset.fake_quantize(value, *copies, attrs["levels"], attrs.get("auto_broadcast", "numpy")).output(0)


def _dims(shape) -> tuple[int, ...]:
    """A partial shape as a tuple, -1 for each dynamic dimension; () for a dynamic rank."""
    if shape.rank.is_dynamic:
        return ()
    return tuple(d.get_length() if d.is_static else -1 for d in shape)


def _as_float(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if value.dtype.kind == "f" else value
