"""LiteRT (ai-edge-litert, or tflite-runtime on boards that only have it).

CPU runs on the classic Interpreter with XNNPACK. GPU and NPU go through LiteRT's
CompiledModel with that accelerator alone, so a model that does not fully run there
fails to load (and the runtime records why) instead of silently running on the CPU.

No compile cache applies (``cache_dir`` is accepted and unused): the classic Interpreter has no way to
set XNNPACK's weight cache file, which only CompiledModel's CPU options take
(``CpuOptions(xnnpack_weight_cache_path=...)``), and the GPU/NPU path here runs without the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..choices import BackendReason
from ..errors import BackendUnavailable
from .base import Device, Discovery, Engine, TensorSpec

try:
    from ai_edge_litert.interpreter import Interpreter

    _PACKAGE = "ai-edge-litert"
except ImportError:  # older ARM boards ship only the frozen tflite-runtime
    from tflite_runtime.interpreter import Interpreter

    _PACKAGE = "tflite-runtime"


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


def _tensor_spec(detail: dict) -> TensorSpec:
    return TensorSpec(detail["name"], tuple(int(v) for v in detail["shape"]), np.dtype(detail["dtype"]).name)


# NPU device nodes (/dev/dri is a GPU node, not listed): Intel/AMD accel, Qualcomm DSP, MediaTek APU.
_NPU_NODES = ("/dev/accel", "/dev/fastrpc-cdsp", "/dev/apusys")


def _npu_node() -> str | None:
    return next((p for p in _NPU_NODES if Path(p).exists()), None)


def _accelerator_libs() -> dict[str, list[str]]:
    """GPU accelerator and NPU dispatch libraries shipped with ai-edge-litert (none with tflite-runtime)."""
    if _PACKAGE != "ai-edge-litert":
        return {"GPU": [], "NPU": []}
    import ai_edge_litert

    root = Path(ai_edge_litert.__file__).parent
    gpu = sorted(p.name for p in root.glob("libLiteRt*Gpu*Accelerator*.so"))
    npu = sorted(p.name for p in (root / "vendors").glob("*")) if (root / "vendors").is_dir() else []
    return {"GPU": gpu, "NPU": npu}


class LiteRTEngine(Engine):
    name = "litert"
    suffixes = (".tflite",)

    @classmethod
    def discover(cls) -> Discovery:
        from . import engine_version

        libs = _accelerator_libs()
        devices = [Device("litert", "CPU", "CPU", "XNNPACK", ("fp32", "int8"))]
        notes = []
        # LiteRT cannot list GPUs or NPUs without compiling a model: these are probed at load.
        if libs["GPU"]:
            devices.append(Device("litert", "GPU", "GPU", f"probed at load ({', '.join(libs['GPU'])})",
                                  ("fp32", "fp16"), verified=False))
        else:
            notes.append(f"GPU: {_PACKAGE} has no GPU accelerator library here")
        if libs["NPU"] and _npu_node():
            devices.append(Device("litert", "NPU", "NPU", f"probed at load (vendors: {', '.join(libs['NPU'])})",
                                  ("int8",), verified=False))
        else:
            notes.append("NPU: no NPU device node (/dev/accel, /dev/fastrpc-cdsp, ...) for LiteRT's vendor dispatch "
                         f"libraries ({', '.join(libs['NPU']) or 'none installed'})")
        return Discovery("litert", engine_version("litert"), devices, notes)

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        if self.device not in ("CPU", "GPU", "NPU"):
            raise BackendUnavailable(BackendReason.DEVICE_MISSING,
                                     f"litert has no device {self.device!r} (CPU, GPU, NPU)")
        self._interp = self._compiled = None
        self._fully = None
        if self.device == "CPU":
            self._open_interpreter()
        else:
            self._open_compiled()

    def _open_interpreter(self) -> None:
        # Reading the tensor details parses more of the file than the interpreter's verifier checks (a name
        # that is not UTF-8 raises UnicodeDecodeError there): any engine exception up to here is a load failure.
        try:
            # The interpreter defaults to one thread; ORT and OpenVINO use every core by default.
            threads = self.num_threads or os.cpu_count() or 1
            self._interp = Interpreter(model_path=str(self.model_path), num_threads=threads)
            self._interp.allocate_tensors()
            self._in = self._interp.get_input_details()
            self._out = self._interp.get_output_details()
            self._in_q = [_input_qparams(d) for d in self._in]
            self._out_q = [_qparams(d) for d in self._out]
            self.inputs = [_tensor_spec(d) for d in self._in]
            self.outputs = [_tensor_spec(d) for d in self._out]
        except Exception as exc:  # ValueError, RuntimeError, UnicodeDecodeError... from the interpreter
            self._interp = None
            raise BackendUnavailable(BackendReason.LOAD_FAILED, f"LiteRT cannot load {self.model_path.name}: "
                                                                f"{type(exc).__name__}: {exc}") from exc
        self._in_buf = [np.empty(tuple(d["shape"]), np.float32) if q else None for d, q in zip(self._in, self._in_q)]

    def _open_compiled(self) -> None:
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        except ImportError as exc:  # tflite-runtime has no CompiledModel
            raise BackendUnavailable(BackendReason.DEVICE_MISSING, f"{_PACKAGE} here has no LiteRT accelerator API "
                                                                   f"(CompiledModel) for {self.device}") from exc

        accel = HardwareAccelerator.GPU if self.device == "GPU" else HardwareAccelerator.NPU
        if self.device == "NPU" and not _npu_node():
            # Without a device, LiteRT's NPU accelerator reports every op as "not accelerated".
            raise BackendUnavailable(BackendReason.DEVICE_MISSING,
                                     f"litert: no NPU device node here ({', '.join(_NPU_NODES)})")
        try:
            # The accelerator alone, no CPU in the set: a partial placement fails instead of hiding.
            self._compiled = CompiledModel.from_file(str(self.model_path), hardware_accel=accel)
        except (ValueError, UnicodeDecodeError) as exc:  # the file itself, not the accelerator
            raise BackendUnavailable(BackendReason.LOAD_FAILED, f"LiteRT cannot load {self.model_path.name}: "
                                                                f"{type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:
            text = str(exc)
            reason = BackendReason.UNSUPPORTED_OPS if "not accelerated" in text else BackendReason.DEVICE_MISSING
            words = [ln.split("]", 1)[-1].strip(" └") for ln in text.splitlines()]
            detail = " ".join(w for w in words if w)[:300] or \
                f"the {self.device} accelerator did not initialize (no usable {self.device} here; LiteRT logs why)"
            raise BackendUnavailable(reason, f"LiteRT {self.device} cannot run {self.model_path.name}: {detail}") from exc
        try:
            self._fully = bool(self._compiled.is_fully_accelerated())
            sig = next(iter(self._compiled.get_signature_list()))
            ins = self._compiled.get_input_tensor_details(sig)
            outs = self._compiled.get_output_tensor_details(sig)
            self.inputs = [TensorSpec(d["name"], tuple(d["shape"]), d["dtype"]) for d in ins.values()]
            self.outputs = [TensorSpec(d["name"], tuple(d["shape"]), d["dtype"]) for d in outs.values()]
        except Exception as exc:  # a damaged model can compile and still fail to describe itself
            self._compiled = None
            raise BackendUnavailable(BackendReason.LOAD_FAILED,
                                     f"LiteRT {self.device} cannot read the signature of "
                                     f"{self.model_path.name}: {type(exc).__name__}: {exc}") from exc
        if any(s.dtype != "float32" for s in self.inputs + self.outputs):
            raise BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT,
                                     f"LiteRT {self.device} path takes float I/O; {self.model_path.name} has integer I/O")
        self._in_bufs = self._compiled.create_input_buffers(0)
        self._out_bufs = self._compiled.create_output_buffers(0)
        self._out_sizes = [int(np.prod(s.shape)) for s in self.outputs]

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        if self._compiled is not None:
            for buf, arr in zip(self._in_bufs, feeds):
                buf.write(arr)
            self._compiled.run_by_index(0, self._in_bufs, self._out_bufs)
            return [buf.read(n, np.float32).reshape(s.shape)
                    for buf, n, s in zip(self._out_bufs, self._out_sizes, self.outputs)]
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

    @property
    def fully_accelerated(self) -> bool | None:
        return self._fully

    def close(self) -> None:
        self._interp = None
        self._compiled = None


BACKEND = LiteRTEngine
