"""ONNX Runtime: .onnx on any available execution provider (CPU, CUDA, QNN, OpenVINO EP, CoreML, ...)."""

from __future__ import annotations


import numpy as np
import onnxruntime as ort

from ..errors import BackendUnavailable
from .base import Device, Discovery, Engine, TensorSpec

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}
# Which kind of device each execution provider drives (when get_ep_devices cannot say).
PROVIDER_KINDS = {
    "CPUExecutionProvider": "CPU", "XnnpackExecutionProvider": "CPU", "ArmNNExecutionProvider": "CPU",
    "ACLExecutionProvider": "CPU", "DnnlExecutionProvider": "CPU",
    "CUDAExecutionProvider": "GPU", "TensorrtExecutionProvider": "GPU", "ROCMExecutionProvider": "GPU",
    "MIGraphXExecutionProvider": "GPU", "DmlExecutionProvider": "GPU", "WebGpuExecutionProvider": "GPU",
    "QNNExecutionProvider": "NPU", "VitisAIExecutionProvider": "NPU", "RknpuExecutionProvider": "NPU",
}
# Providers that drive several kinds of device (CPU included) depending on their options: their kind is
# taken only from what ORT enumerates (get_ep_devices), never assumed, so CPU execution is not called NPU.
MULTI_DEVICE = {"OpenVINOExecutionProvider", "CoreMLExecutionProvider", "NnapiExecutionProvider"}
_NOT_DEVICES = {"AzureExecutionProvider"}  # a cloud endpoint, not a device


def _spec(arg) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSpec(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))


def _ep_kinds() -> dict[str, str]:
    """Provider -> kind, from the hardware ORT enumerates (get_ep_devices, ORT >= 1.22), else from the table."""
    kinds = {}
    if hasattr(ort, "get_ep_devices"):
        for ep in ort.get_ep_devices():
            kinds.setdefault(ep.ep_name, str(ep.device.type).rsplit(".", 1)[-1])
    return kinds


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    suffixes = (".onnx",)

    @classmethod
    def discover(cls) -> Discovery:
        from . import engine_version

        hw = _ep_kinds()
        devices: list[Device] = []
        notes: list[str] = []
        for provider in ort.get_available_providers():
            if provider in _NOT_DEVICES:
                continue
            kind = hw.get(provider) or PROVIDER_KINDS.get(provider)
            if kind is None:
                notes.append(f"{provider}: its device kind is not reported; ask for it with device={provider!r}")
                continue
            devices.append(Device("onnxruntime", kind, provider, provider.replace("ExecutionProvider", " EP"),
                                  ("fp32", "int8") if kind == "CPU" else ()))
        notes += [f"{kind}: no {kind} execution provider in this onnxruntime build (e.g. onnxruntime-gpu, "
                 "onnxruntime-qnn, onnxruntime-openvino, onnxruntime-directml)"
                 for kind in ("GPU", "NPU") if not any(d.kind == kind for d in devices)]
        return Discovery("onnxruntime", engine_version("onnxruntime"), devices, notes)

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        provider = self._provider(self.device)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if self.num_threads:
            so.intra_op_num_threads = self.num_threads
        if provider != "CPUExecutionProvider":
            # A node the accelerator cannot take must fail the load, not run silently on the CPU.
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            self._session = ort.InferenceSession(str(self.model_path), so, providers=[provider])
        except Exception as exc:  # ORT raises its own pybind exception types
            text = str(exc)
            reason = "unsupported_ops" if "fallback" in text.lower() or "not supported" in text.lower() else "load_failed"
            raise BackendUnavailable(reason, f"ONNX Runtime cannot load {self.model_path.name} on {provider}: "
                                             f"{text[:300]}") from exc
        self.inputs = [_spec(a) for a in self._session.get_inputs()]
        self.outputs = [_spec(a) for a in self._session.get_outputs()]
        self._in_names = [s.name for s in self.inputs]

    @staticmethod
    def _provider(device: str) -> str:
        """``device`` is a provider name, or CPU/GPU/NPU for the first provider of that kind."""
        available = [p for p in ort.get_available_providers() if p not in _NOT_DEVICES]
        if device in available:
            return device
        if device in ("CPU", "GPU", "NPU"):
            kinds = _ep_kinds()
            match = [p for p in available if (kinds.get(p) or PROVIDER_KINDS.get(p)) == device]
            if device == "CPU":
                return "CPUExecutionProvider"
            if match:
                return match[0]
        raise BackendUnavailable("device_missing", f"onnxruntime has no execution provider {device!r} here "
                                                   f"(available: {', '.join(available)})")

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        return self._session.run(None, dict(zip(self._in_names, feeds)))

    @property
    def executing(self) -> list[str]:
        return list(self._session.get_providers())

    def close(self) -> None:
        self._session = None


BACKEND = OnnxRuntimeEngine
