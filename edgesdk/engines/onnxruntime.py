"""ONNX Runtime: .onnx on any available execution provider (CPU, CUDA, QNN, OpenVINO EP, CoreML, ...).

ONNX Runtime's own telemetry (events to its vendor, on by default in some builds) is turned off when this module
is imported (``disable_telemetry_events``), before any session exists: nothing leaves the device unless the app says
so. ``EDGESDK_ENGINE_TELEMETRY=on`` leaves the engine's default as it is.

With ``cache_dir`` on the CPU provider, the graph ORT optimized at the first load is saved there and
loaded as it is by later processes (ORT's offline optimization mode), skipping the optimization passes.
"""

from __future__ import annotations


import glob
import hashlib
import os
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..choices import BackendReason, CacheState
from ..errors import BackendUnavailable, BundleError
from ..file_digest import sha256_file
from .model_files import external_data_locations, location_problem
from .base import Device, Discovery, Engine, TensorSpec, cache_key, host_cpu

CACHE_KIND = "optimized model"

ENGINE_TELEMETRY_ENV = "EDGESDK_ENGINE_TELEMETRY"
if os.environ.get(ENGINE_TELEMETRY_ENV, "").strip().lower() != "on" and hasattr(ort, "disable_telemetry_events"):
    ort.disable_telemetry_events()

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


def _read_verified(path: Path, digest: str) -> bytes | None:
    """The file's bytes if their sha256 starts with ``digest`` (written into its name when it was saved). The
    bytes that were hashed are the ones loaded: a file rewritten in between is never served."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if len(digest) == 32 and hashlib.sha256(data).hexdigest()[:32] == digest else None


def _check_external_data(path: Path) -> list[str] | None:
    """Refuse a model whose external data lies outside its folder, before ONNX Runtime opens anything; return
    the locations it names (None: unreadable or not well-formed protobuf, which ONNX Runtime's own load refuses).

    A bundle also checks that each file is one it lists (:meth:`~edgesdk.bundle.reader.Bundle.verify`); this covers a
    model opened on its own."""
    try:
        locations = external_data_locations(path)  # read as protobuf: a byte search misses over-long encodings
    except BundleError:
        return None
    for location in locations:
        problem = location_problem(path, location)
        if problem:
            raise BundleError(f"{path.name} names external data {location!r}, which {problem}")
    return locations


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

    @classmethod
    def compile_cache(cls, device: str = "CPU") -> str | None:
        # Providers that compile nodes (QNN, TensorRT, OpenVINO EP) cannot save them as a plain optimized graph:
        # they have their own EP context caches, not used here.
        return CACHE_KIND if device in ("CPU", "CPUExecutionProvider") else None

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        self._external_data = _check_external_data(self.model_path)
        provider = self._provider(self.device)
        if self.cache_dir is not None and self.compile_cache(provider):
            self._session = self._open_cached(provider)
        else:
            self._session = self._open(str(self.model_path), self._session_options(provider), provider)
        try:
            self.inputs = [_spec(a) for a in self._session.get_inputs()]
            self.outputs = [_spec(a) for a in self._session.get_outputs()]
        except Exception as exc:  # a damaged model can load and still not describe itself (e.g. a non-UTF-8 name)
            raise BackendUnavailable(BackendReason.LOAD_FAILED, f"ONNX Runtime cannot describe {self.model_path.name}: "
                                                                f"{exc}") from exc
        self._in_names = [s.name for s in self.inputs]

    def _session_options(self, provider: str) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if self.num_threads:
            so.intra_op_num_threads = self.num_threads
        if provider != "CPUExecutionProvider":
            # A node the accelerator cannot take must fail the load, not run silently on the CPU.
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so

    def _open(self, model: str | bytes, so: ort.SessionOptions, provider: str) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(model, so, providers=[provider])
        except Exception as exc:  # ORT raises its own pybind exception types
            text = str(exc)
            unsupported = "fallback" in text.lower() or "not supported" in text.lower()
            reason = BackendReason.UNSUPPORTED_OPS if unsupported else BackendReason.LOAD_FAILED
            raise BackendUnavailable(reason, f"ONNX Runtime cannot load {self.model_path.name} on {provider}: "
                                             f"{text[:300]}") from exc

    def _open_cached(self, provider: str) -> ort.InferenceSession:
        """Load the optimized graph saved by an earlier open, or optimize as usual and save the result.

        ORT's offline mode: the saved graph already has every optimization of the online load applied,
        so it is loaded with optimizations disabled. It is only valid for the same model, ORT version,
        optimization level, provider and CPU (layout optimizations use its instruction set): all of them
        are in the file name. The file's own sha256 is in its name too, so a damaged file is discarded,
        never loaded; a new file is written under a temporary name and renamed into place.
        """
        so = self._session_options(provider)
        if self._external_data is None or self._external_data:
            # Unreadable (ORT's own load says why), or weights kept in other files (ONNX external data),
            # which are not in the key: not cached.
            self.cache_state = CacheState.UNAVAILABLE
            return self._open(str(self.model_path), so, provider)
        folder = self.cache_dir / "onnxruntime"
        # The bundle's verified sha256 of the model when it gave one, else hashed here.
        digest = self.digests[0] if self.digests else sha256_file(self.model_path)
        key = cache_key(digest, self.model_path.stat().st_size, ort.__version__, so.graph_optimization_level,
                        provider, host_cpu())
        stem = f"{self.model_path.stem}-{key}"
        discarded = False
        for entry in sorted(folder.glob(f"{glob.escape(stem)}.*.onnx")):
            data = _read_verified(entry, entry.name[len(stem) + 1 : -len(".onnx")])
            if data is not None:
                fast = self._session_options(provider)
                fast.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                try:
                    session = ort.InferenceSession(data, fast, providers=[provider])
                    self.cache_state = CacheState.HIT
                    return session
                except Exception:  # intact but unloadable here (a file from another build): replace it
                    pass
            entry.unlink(missing_ok=True)
            discarded = True
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.onnx"
        except OSError:
            self.cache_state = CacheState.UNAVAILABLE
            return self._open(str(self.model_path), so, provider)
        so.optimized_model_filepath = str(tmp)
        try:
            session = self._open(str(self.model_path), so, provider)
        except BackendUnavailable:
            # Saving can fail where loading does not (read-only folder, a model over protobuf's 2 GB):
            # load without the cache; if that fails too, its error is about the model.
            tmp.unlink(missing_ok=True)
            self.cache_state = CacheState.UNAVAILABLE
            return self._open(str(self.model_path), self._session_options(provider), provider)
        try:
            os.replace(tmp, folder / f"{stem}.{sha256_file(tmp)[:32]}.onnx")
            self.cache_state = CacheState.REBUILT if discarded else CacheState.STORED
        except OSError:
            tmp.unlink(missing_ok=True)
            self.cache_state = CacheState.UNAVAILABLE
        return session

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
        raise BackendUnavailable(BackendReason.DEVICE_MISSING, f"onnxruntime has no execution provider {device!r} here "
                                                               f"(available: {', '.join(available)})")

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        return self._session.run(None, dict(zip(self._in_names, feeds)))

    @property
    def executing(self) -> list[str]:
        return list(self._session.get_providers())

    def close(self) -> None:
        self._session = None


BACKEND = OnnxRuntimeEngine
