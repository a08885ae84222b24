"""The ONNX Runtime probe: a float ONNX model or its QDQ INT8 twin (``onnxruntime.quantization.quantize_static``),
layer by layer.

Every layer's tensor is read by adding it to the graph's outputs (ORT's own way to look inside, as its
``qdq_loss_debug`` does). A QDQ model keeps each float tensor under its name and quantizes it with a
QuantizeLinear/DequantizeLinear pair before its consumers, so the INT8 model's layers have the float model's names.
Both run with graph optimizations off: the reading is the QDQ arithmetic as the ONNX standard defines it, the same
whether a tensor is read or not (a fused integer kernel rounds the same values; it is not re-checked here).
A layer run alone (:meth:`OnnxProbe.isolated`) is the sub-graph from the layer's float inputs to its output,
Q/DQ pairs included: its inputs are quantized on entry exactly as the whole model quantizes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Layer

_PLUMBING = {"QuantizeLinear", "DequantizeLinear"}
_RENAMED = "_QuantizeLinear_Input"  # quantize_static's name for the float value of a graph output it quantizes
_FLOAT = 1  # onnx.TensorProto.FLOAT


def open_probe(path: Path, runtime: dict) -> "OnnxProbe":
    return OnnxProbe(path)


class OnnxProbe:
    """An ONNX artifact opened for looking inside (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        import onnx

        self.path = Path(path)
        try:
            model = onnx.load(str(self.path))
            self._model = onnx.shape_inference.infer_shapes(model)
        except Exception as exc:
            raise ConversionError(f"{self.path} is not a readable ONNX model: {exc}") from exc
        graph = self._model.graph
        self._initializers = {i.name: i for i in graph.initializer}
        self._consts = set(self._initializers)
        self._consts |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
        self._producer = {o: n for n in graph.node for o in n.output}
        self._consumers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                self._consumers.setdefault(i, []).append(n)
        self._types = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
        self._inputs = [v.name for v in graph.input if v.name not in self._consts]
        self._outputs = {v.name for v in graph.output}
        self._tensor: dict[str, str] = {}  # layer name -> the tensor holding its value, where they differ
        self._shapes: dict[str, tuple[int, ...]] = {}  # from the first capture, for dynamic dimensions
        self._sessions: dict[str, object] = {}
        self._capture_session = None
        self._layers = self._find_layers()

    # -- reading the graph ------------------------------------------------------------------------------------
    def _source(self, name: str) -> str | None:
        """The float activation behind input ``name``: through a DequantizeLinear(QuantizeLinear(x)) pair to x; None
        for a constant (an initializer, a Constant, a dequantized initializer)."""
        seen = 0
        while seen < 4:
            if name in self._consts or name == "":
                return None
            node = self._producer.get(name)
            if node is None or node.op_type not in _PLUMBING:
                return name
            name, seen = node.input[0], seen + 1
        return name

    def _constant(self, name: str) -> np.ndarray | None:
        """The value of a constant input (an initializer or a Constant, maybe behind a DequantizeLinear), or None."""
        from onnx import numpy_helper

        node = self._producer.get(name)
        if node is not None and node.op_type == "DequantizeLinear":
            name = node.input[0]
            node = self._producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return None if value is None else numpy_helper.to_array(value)
        init = self._initializers.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def _shape(self, name: str) -> tuple[int, ...]:
        if name in self._shapes:
            return self._shapes[name]
        info = self._types.get(name)
        if info is None or not info.type.HasField("tensor_type"):
            return ()
        dims = info.type.tensor_type.shape.dim
        return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)

    def _is_float(self, name: str) -> bool:
        info = self._types.get(name)
        return info is None or info.type.tensor_type.elem_type == _FLOAT

    def _dequantized(self, name: str) -> str:
        """The DequantizeLinear(QuantizeLinear(``name``)) output the consumers of ``name`` read, or ``name``: an INT8
        layer's value includes the rounding of its own output (and the clipping of an activation that QDQ folded
        into that range, as quantize_static does with a Relu or Clip)."""
        for q in self._consumers.get(name, ()):
            if q.op_type == "QuantizeLinear" and q.input[0] == name:
                for dq in self._consumers.get(q.output[0], ()):
                    if dq.op_type == "DequantizeLinear":
                        return dq.output[0]
        return name

    def _find_layers(self) -> list[Layer]:
        layers = []
        for node in self._model.graph.node:
            if node.op_type in _PLUMBING or node.op_type == "Constant" or not node.output:
                continue
            out = node.output[0]
            inputs = tuple(dict.fromkeys(s for s in (self._source(i) for i in node.input) if s is not None))
            if not inputs or not self._is_float(out):
                continue  # computed from constants only, or not a float activation (Shape, a mask...)
            read = self._dequantized(out)  # what the next layers read: the tensor after its Q/DQ pair, if any
            if out.endswith(_RENAMED) and out[:-len(_RENAMED)] in self._outputs:
                out = out[:-len(_RENAMED)]  # a graph output quantized by QDQ: the float value was renamed
            if read != out:
                self._tensor[out] = read
            # on integers when every input it reads comes through a DequantizeLinear (a node quantize_static left
            # out reads a quantized neighbour's Q/DQ copy too, but its float weights directly)
            quantized = all(self._producer.get(i) is not None and self._producer[i].op_type == "DequantizeLinear"
                            for i in node.input if i)
            shape = self._shape(out)
            layers.append(Layer(out, node.op_type, node.name or out, inputs, self._macs(node, shape), quantized,
                                shape))
        return layers

    def _macs(self, node, out_shape: tuple[int, ...]) -> int:
        if not out_shape or any(d < 0 for d in out_shape):
            return 0
        out = int(np.prod(out_shape))
        if node.op_type in ("Conv", "ConvTranspose"):
            w = self._constant(node.input[1])
            if w is None:
                return 0
            channels = w.shape[0] if node.op_type == "Conv" else w.shape[1] * _attr(node, "group", 1)
            return out * int(w.size) // max(1, int(channels))
        if node.op_type in ("MatMul", "Gemm"):
            a, b = self._constant(node.input[0]), self._constant(node.input[1])
            if node.op_type == "Gemm" and b is not None:
                k = b.shape[1] if _attr(node, "transB", 0) else b.shape[0]
                return out * int(k)
            if b is not None:
                return out * int(b.shape[-2] if b.ndim > 1 else b.shape[0])
            shape = self._shape(node.input[0]) if a is None else a.shape
            return out * int(shape[-1]) if shape and shape[-1] > 0 else 0
        return 0

    # -- the Probe interface ----------------------------------------------------------------------------------
    def layers(self) -> list[Layer]:
        return list(self._layers)

    def capture(self, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Every layer's value and every value a layer reads (float as float32; shape tensors in their dtype)."""
        if self._capture_session is None:
            wanted = [self._tensor.get(l.name, l.name) for l in self._layers]
            wanted += [i for l in self._layers for i in l.inputs]
            self._capture_session = self._session(self._with_outputs(list(dict.fromkeys(wanted))))
        session = self._capture_session
        if len(sample) != len(self._inputs):
            raise ConversionError(f"{self.path.name} has {len(self._inputs)} inputs ({', '.join(self._inputs)}); the "
                                  f"sample has {len(sample)}")
        feeds = dict(zip(self._inputs, sample))
        names = [o.name for o in session.get_outputs()]
        try:
            values = session.run(names, feeds)
        except Exception as exc:
            raise ConversionError(f"running {self.path.name} with its layers read failed: {exc}") from exc
        found = {n: _as_float(v) for n, v in zip(names, values)}
        found.update({n: _as_float(v) for n, v in feeds.items()})
        for layer, tensor in self._tensor.items():
            found[layer] = found[tensor]
        if not self._shapes:  # dynamic dimensions: MACs are counted at the sample's shapes
            self._shapes = {n: tuple(np.shape(v)) for n, v in found.items()}
            if any(not l.shape or -1 in l.shape for l in self._layers):
                self._layers = self._find_layers()
        return found

    def isolated(self, layer: Layer, inputs: dict[str, np.ndarray]) -> np.ndarray:
        missing = [i for i in layer.inputs if i not in inputs]
        if missing:
            raise ConversionError(f"layer {layer.node!r} reads {', '.join(missing)}, which were not given")
        session = self._sessions.get(layer.name)
        if session is None:
            session = self._sessions[layer.name] = self._session(self._extract(layer))
        try:
            tensor = self._tensor.get(layer.name, layer.name)
            return np.asarray(session.run([tensor], {i: inputs[i] for i in layer.inputs})[0], np.float32)
        except Exception as exc:
            raise ConversionError(f"running layer {layer.node!r} of {self.path.name} alone failed: {exc}") from exc

    def close(self) -> None:
        self._sessions.clear()
        self._capture_session = None

    def __enter__(self) -> "OnnxProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- models built for reading -----------------------------------------------------------------------------
    def _with_outputs(self, names: list[str]):
        import onnx

        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        have = {o.name for o in model.graph.output}
        for name in names:
            if name in have:
                continue
            info = self._types.get(name)
            if info is not None:
                model.graph.output.append(info)
            else:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, _FLOAT, None))
        return model

    def _extract(self, layer: Layer):
        """The sub-graph from ``layer.inputs`` to ``layer.name``: every node needed, nothing else."""
        import onnx

        graph = self._model.graph
        stop = set(layer.inputs)
        tensor = self._tensor.get(layer.name, layer.name)
        needed, todo = [], [tensor]
        seen = set()
        while todo:
            name = todo.pop()
            if name in seen or name in stop or name in self._consts and name not in self._producer:
                continue
            seen.add(name)
            node = self._producer.get(name)
            if node is None:
                raise ConversionError(f"layer {layer.node!r} depends on {name!r}, which is none of its inputs "
                                      f"({', '.join(layer.inputs)}): it cannot be run alone")
            if id(node) not in {id(n) for n in needed}:
                needed.append(node)
            todo.extend(i for i in node.input if i)
        order = {id(n): k for k, n in enumerate(graph.node)}
        needed.sort(key=lambda n: order[id(n)])
        used = {i for n in needed for i in n.input}
        inits = [i for i in graph.initializer if i.name in used]
        ins = [self._types.get(i) or onnx.helper.make_tensor_value_info(i, _FLOAT, None) for i in layer.inputs]
        out = self._types.get(tensor) or onnx.helper.make_tensor_value_info(tensor, _FLOAT, None)
        sub = onnx.helper.make_graph(needed, f"layer_{layer.node}", ins, [out], initializer=inits)
        model = onnx.helper.make_model(sub, opset_imports=self._model.opset_import)
        model.ir_version = self._model.ir_version
        return model

    def _session(self, model):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        try:
            return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ConversionError(f"ONNX Runtime cannot open {self.path.name} for reading its layers: {exc}") from exc


def _as_float(value) -> np.ndarray:
    value = np.asarray(value)
    return value.astype(np.float32) if value.dtype.kind == "f" else value


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            import onnx

            return onnx.helper.get_attribute_value(a)
    return default
