"""OpenVINO: IR (.xml + .bin) on any device in ``Core().available_devices``."""

from __future__ import annotations


import numpy as np
import openvino as ov

from ..errors import BackendUnavailable
from .base import KINDS, Device, Discovery, Engine, TensorSpec

_core: ov.Core | None = None
_PRECISION_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i8": "int8", "u8": "uint8"}


def core() -> ov.Core:
    """One process-wide Core: creating one costs tens of milliseconds."""
    global _core
    if _core is None:
        _core = ov.Core()
    return _core


def _spec(port) -> TensorSpec:
    shape = tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
    return TensorSpec(port.get_any_name(), shape, port.get_element_type().to_dtype().name)


def _first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("Exception from")]
    return lines[0][:240] if lines else type(exc).__name__


def _kind(device: str) -> str | None:
    kind = device.split(".")[0]
    return kind if kind in KINDS else None


class OpenVINOEngine(Engine):
    name = "openvino"
    suffixes = (".xml",)

    @classmethod
    def discover(cls) -> Discovery:
        from . import engine_version

        c = core()
        devices, notes = [], []
        for dev in c.available_devices:
            kind = _kind(dev)
            if kind is None:
                continue
            caps = tuple(str(v) for v in c.get_property(dev, "OPTIMIZATION_CAPABILITIES"))
            devices.append(Device("openvino", kind, dev, str(c.get_property(dev, "FULL_DEVICE_NAME")), caps))
        for kind in ("GPU", "NPU"):
            if not any(d.kind == kind for d in devices):
                try:
                    found = c.get_property(kind, "AVAILABLE_DEVICES")
                    notes.append(f"{kind}: the {kind} plugin loads but finds no device ({found or 'none'}): "
                                 "no driver or hardware")
                except Exception as exc:  # the plugin's own reason: missing driver, library, compiler
                    notes.append(f"{kind}: {_first_line(exc)}")
        return Discovery("openvino", engine_version("openvino"), devices, notes)

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        available = core().available_devices
        if self.device not in available and self.device.split(".")[0] not in ("AUTO", "HETERO", "MULTI"):
            why = next((n for n in self.discover().notes if n.startswith(self.device.split(".")[0])), "")
            raise BackendUnavailable("device_missing", f"OpenVINO has no device {self.device!r} here "
                                                       f"(available: {', '.join(available)}){'; ' + why if why else ''}")
        config: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
        if self.precision_hint:
            # On AMX CPUs the default hint is bf16: an honest fp32 reference must ask for f32.
            config["INFERENCE_PRECISION_HINT"] = self.precision_hint
        if self.num_threads and self.device.startswith("CPU"):
            config["INFERENCE_NUM_THREADS"] = str(self.num_threads)
        try:
            model = core().read_model(str(self.model_path))
        except RuntimeError as exc:
            raise BackendUnavailable("load_failed", f"OpenVINO cannot read {self.model_path.name}: {_first_line(exc)}") from exc
        try:
            self._compiled = core().compile_model(model, self.device, config)
        except RuntimeError as exc:
            raise BackendUnavailable("compile_failed", f"OpenVINO cannot compile {self.model_path.name} on "
                                                       f"{self.device}: {_first_line(exc)}") from exc
        self._request = self._compiled.create_infer_request()
        self.inputs = [_spec(p) for p in self._compiled.inputs]
        self.outputs = [_spec(p) for p in self._compiled.outputs]

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        # infer() already hands back copies of the outputs (share_outputs=False): no second copy.
        return list(self._request.infer(feeds, share_inputs=True).to_tuple())

    @property
    def effective_precision(self) -> str:
        hint = self._compiled.get_property("INFERENCE_PRECISION_HINT")
        name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        # numpy has no bfloat16: name the OpenVINO type, not its numpy stand-in (float16).
        return _PRECISION_NAMES.get(name, name)

    @property
    def execution_devices(self) -> list[str]:
        return list(self._compiled.get_property("EXECUTION_DEVICES"))

    @property
    def executing(self) -> list[str]:
        return self.execution_devices

    def close(self) -> None:
        self._request = None
        self._compiled = None


BACKEND = OpenVINOEngine
