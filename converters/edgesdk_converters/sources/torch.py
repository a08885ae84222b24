"""A ``torch.export`` program (``.pt2`` or an in-memory module): routes to LiteRT (litert-torch), ONNX and
OpenVINO."""

from __future__ import annotations

from pathlib import Path

from edgesdk.engines import TensorSpec
from edgesdk.errors import ConversionError

from .base import Source


class PyTorchSource(Source):
    kind = "pytorch"

    def __init__(self, program, name: str, path: Path | None):
        super().__init__(name, path)
        self.program = program
        sig = program.graph_signature
        nodes = {n.name: n for n in program.graph.nodes}
        self.inputs = [_torch_spec(name, nodes[name]) for name in sig.user_inputs]
        out_node = next(n for n in program.graph.nodes if n.op == "output")
        out_vals = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        self.outputs = [_torch_spec(f"output_{i}", n) for i, n in enumerate(out_vals)]

    def example_inputs(self) -> tuple:
        import torch

        if any(d == -1 for s in self.inputs for d in s.shape):
            raise ConversionError(f"{self.name}: input shapes {[list(s.shape) for s in self.inputs]} are not fixed")
        return tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.inputs)

    def float_tflite(self, path: Path) -> Path:
        import litert_torch

        try:
            litert_torch.convert(self.program.module(), self.example_inputs()).export(str(path))
        except Exception as exc:  # litert-torch raises many kinds on unsupported graphs
            raise ConversionError(f"litert-torch could not convert {self.name} to tflite: {exc}") from exc
        return path

    def float_onnx(self, path: Path) -> Path:
        import torch

        try:
            torch.onnx.export(
                self.program, (), str(path), dynamo=True, external_data=False,
                input_names=[s.name for s in self.inputs], verbose=False,
            )
        except Exception as exc:
            raise ConversionError(f"torch.onnx.export could not export {self.name}: {exc}") from exc
        return path

    def _openvino_input(self):
        return self.program


def _torch_spec(name: str, node) -> TensorSpec:
    val = node.meta.get("val")
    shape = tuple(int(d) if isinstance(d, int) else -1 for d in getattr(val, "shape", ()))
    dtype = str(getattr(val, "dtype", "torch.float32")).replace("torch.", "")
    return TensorSpec(name, shape, dtype)


