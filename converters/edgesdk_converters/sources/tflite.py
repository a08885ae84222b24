"""A ``.tflite`` model from any exporter (MediaPipe's have no SignatureDef, some use custom ops): routes to LiteRT
INT8 and OpenVINO, each refused up front when it cannot take the model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from edgesdk.engines import TensorSpec
from edgesdk.errors import ConversionError

from .base import Source, _op_listing


class TFLiteSource(Source):
    """A float ``.tflite`` file from any exporter (litert-torch, the TF converter, MediaPipe). A model without a
    SignatureDef gets one for the tflite target; custom ops are checked route by route before any work."""

    kind = "tflite"

    def __init__(self, path: Path):
        super().__init__(path.name, path)
        from ai_edge_litert.interpreter import Interpreter

        from ..tflite_model import has_signature, operators

        self.operators = operators(path)  # from the flatbuffer: an interpreter stops at the first custom op
        self.has_signature = has_signature(path)
        try:
            interp = Interpreter(model_path=str(path))
            self.inputs = [_tflite_spec(d) for d in interp.get_input_details()]
            self.outputs = [_tflite_spec(d) for d in interp.get_output_details()]
            tensors = interp.get_tensor_details()
        except Exception as exc:  # ValueError, RuntimeError... from the interpreter
            raise ConversionError(f"{path} is not a loadable TFLite model: {type(exc).__name__}: {exc}") from exc
        # A quantized model may keep float I/O around an int8 graph: look at every tensor.
        quantized = [d for d in tensors
                     if np.dtype(d["dtype"]) in (np.int8, np.uint8, np.int16) and d["quantization"][0]]
        if quantized:
            raise ConversionError(
                f"{path} is already quantized ({quantized[0]['name']} is {np.dtype(quantized[0]['dtype']).name}); "
                "give the float model"
            )
        self._litert_error = None
        try:
            interp.allocate_tensors()  # resolves every op's kernel
        except Exception as exc:
            if not self.custom_ops():
                raise ConversionError(f"{path} is not a loadable TFLite model: {type(exc).__name__}: {exc}") from exc
            self._litert_error = " ".join(str(exc).split())
        self._why_not: dict[str, str | None] = {}

    def custom_ops(self) -> list[tuple[str, int, str]]:
        """``(custom code, node count, first node)`` of every custom op (MediaPipe's ``Convolution2DTransposeBias``,
        TF Select's ``Flex*``)."""
        found: dict[str, list] = {}
        for op in self.operators:
            if op.custom:
                found.setdefault(op.name, [0, f"node {op.index}" + (f" of subgraph {op.subgraph}" if op.subgraph
                                                                     else "")])[0] += 1
        return [(name, n, first) for name, (n, first) in found.items()]

    def unsupported(self, target: str) -> str | None:
        """Why ``target`` cannot take this model, or None; checked once per target, before any data is read."""
        if target not in self._why_not:
            check = {"tflite": self._unsupported_for_tflite, "openvino": self._unsupported_for_openvino}[target]
            self._why_not[target] = check()
        return self._why_not[target]

    def _unsupported_for_tflite(self) -> str | None:
        if self._litert_error is not None:
            # LiteRT's own text adds only "Encountered unresolved custom op" and a link when the kernel is missing.
            detail = "" if "unresolved custom op" in self._litert_error else f": {self._litert_error}"
            return (f"{_custom_listing(self.custom_ops())} that LiteRT has no kernel for (AI Edge Quantizer "
                    f"calibrates by running the model in LiteRT, and a device runs it there){detail}")
        if not self.has_signature:
            self.notes.append(f"[tflite] {self.name} has no SignatureDef: one is built from its inputs and outputs "
                              "(AI Edge Quantizer calibrates through it); both LiteRT artifacts carry it")
            self.provenance["signature_added"] = {"key": "serving_default", "targets": ["tflite"]}
        return None

    def _unsupported_for_openvino(self) -> str | None:
        """Ops OpenVINO's TFLite frontend cannot convert: its partial conversion leaves them as framework nodes
        (named by their index in the main subgraph)."""
        from openvino.frontend import FrontEndManager

        try:
            frontend = FrontEndManager().load_by_framework("tflite")
            partial = frontend.convert_partially(frontend.load(str(self.path)))
        except Exception as exc:  # the frontend raises its own GeneralFailure/OpConversionFailure kinds
            return f"OpenVINO's TFLite frontend cannot read it: {' '.join(str(exc).split())}"
        main = {str(op.index): op.name for op in self.operators if op.subgraph == 0}
        found: dict[str, list] = {}
        for node in partial.get_ordered_ops():
            if "FrameworkNode" in node.get_type_name():
                index = node.get_friendly_name()
                found.setdefault(main.get(index, node.get_type_name()), [0, f"node {index}"])[0] += 1
        if not found:
            return None
        missing = [(op, n, first) for op, (n, first) in found.items()]
        custom = {name for name, _, _ in self.custom_ops()}
        what = "custom op" if all(op in custom for op, _, _ in missing) else "op"
        return f"{len(missing)} {what} type(s) that OpenVINO's TFLite frontend cannot convert: {_op_listing(missing)}"

    def float_tflite(self, path: Path) -> Path:
        shutil.copyfile(self.path, path)
        return path


def _tflite_spec(detail: dict) -> TensorSpec:
    return TensorSpec(detail["name"], tuple(int(v) for v in detail["shape"]), np.dtype(detail["dtype"]).name)


def _custom_listing(custom: list[tuple[str, int, str]]) -> str:
    return f"{len(custom)} custom op type(s) {_op_listing(custom)}"


