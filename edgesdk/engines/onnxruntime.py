"""ONNX Runtime: .onnx on the CPU execution provider (other EPs come with device discovery)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnxruntime as ort

from ..errors import BackendUnavailable
from .base import Engine, TensorSpec

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}


def _spec(arg) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSpec(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    suffixes = (".onnx",)

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        if self.device != "CPU":
            raise BackendUnavailable("device_missing", f"onnxruntime backend here runs on CPU only; asked for {self.device}")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if self.num_threads:
            so.intra_op_num_threads = self.num_threads
        try:
            self._session = ort.InferenceSession(str(self.model_path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own pybind exception types
            raise BackendUnavailable("load_failed", f"ONNX Runtime cannot load {self.model_path.name}: {exc}") from exc
        self.inputs = [_spec(a) for a in self._session.get_inputs()]
        self.outputs = [_spec(a) for a in self._session.get_outputs()]
        self._in_names = [s.name for s in self.inputs]

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = self.check_feeds(feeds)
        return self._session.run(None, dict(zip(self._in_names, feeds)))

    def close(self) -> None:
        self._session = None


BACKEND = OnnxRuntimeEngine
