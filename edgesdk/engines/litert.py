"""LiteRT (ai-edge-litert, or tflite-runtime on boards that only have it), CPU via XNNPACK."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import BackendUnavailable
from .base import Engine, TensorSpec

try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:  # older ARM boards ship only the frozen tflite-runtime
    from tflite_runtime.interpreter import Interpreter


def _qparams(detail: dict) -> tuple[float, int] | None:
    scale, zero_point = detail["quantization"]
    if detail["dtype"] in (np.int8, np.uint8, np.int16) and scale:
        return float(scale), int(zero_point)
    return None


def _input_qparams(detail: dict) -> tuple[np.float32, np.float32, int, int] | None:
    q = _qparams(detail)
    if q is None:
        return None
    info = np.iinfo(detail["dtype"])
    return np.float32(q[0]), np.float32(q[1]), info.min, info.max


class LiteRTEngine(Engine):
    name = "litert"
    suffixes = (".tflite",)

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        if self.device != "CPU":
            raise BackendUnavailable("device_missing", f"litert backend here runs on CPU only; asked for {self.device}")
        try:
            # The interpreter defaults to one thread; ORT and OpenVINO use every core by default.
            threads = self.num_threads or os.cpu_count() or 1
            self._interp = Interpreter(model_path=str(self.model_path), num_threads=threads)
            self._interp.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise BackendUnavailable("load_failed", f"LiteRT cannot load {self.model_path.name}: {exc}") from exc
        self._in = self._interp.get_input_details()
        self._out = self._interp.get_output_details()
        self._in_q = [_input_qparams(d) for d in self._in]
        self._in_buf = [np.empty(tuple(d["shape"]), np.float32) if q else None for d, q in zip(self._in, self._in_q)]
        self._out_q = [_qparams(d) for d in self._out]
        self.inputs = [TensorSpec(d["name"], tuple(int(v) for v in d["shape"]), np.dtype(d["dtype"]).name) for d in self._in]
        self.outputs = [TensorSpec(d["name"], tuple(int(v) for v in d["shape"]), np.dtype(d["dtype"]).name) for d in self._out]

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = self.check_feeds(feeds)
        for detail, q, buf, arr in zip(self._in, self._in_q, self._in_buf, feeds):
            if q is None:
                self._interp.set_tensor(detail["index"], arr)
                continue
            # round(x / scale) + zero_point, as TFLite's Quantize op (rounding before the offset
            # matters at .5 ties), in a preallocated buffer, clipped straight into the tensor's memory.
            scale, zero_point, lo, hi = q
            np.divide(arr, scale, out=buf)
            np.rint(buf, out=buf)
            np.add(buf, zero_point, out=buf)
            np.clip(buf, lo, hi, out=self._interp.tensor(detail["index"])(), casting="unsafe")
        self._interp.invoke()
        results = []
        for detail, q in zip(self._out, self._out_q):
            out = self._interp.get_tensor(detail["index"])
            results.append(((out.astype(np.float32) - q[1]) * q[0]) if q is not None else out)
        return results

    def close(self) -> None:
        self._interp = None


BACKEND = LiteRTEngine
