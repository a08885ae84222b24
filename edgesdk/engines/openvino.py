"""OpenVINO: IR (.xml + .bin) on any device in ``Core().available_devices``.

With ``cache_dir``, compiled models are kept through OpenVINO's ``CACHE_DIR`` and imported by later
processes instead of compiled again (most of the load time on GPU and NPU, a part of it on CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import openvino as ov

from ..choices import BackendReason, CacheState
from ..errors import BackendUnavailable
from ..file_digest import sha256_file
from .base import KINDS, Device, Discovery, Engine, TensorSpec, cache_key, host_cpu

CACHE_KIND = "CACHE_DIR"
_INTEGRITY = "integrity.json"

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


def _intact(folder: Path) -> bool:
    """Every file of a cache folder is listed in its integrity.json with that size and sha256, and no other."""
    try:
        listing = json.loads((folder / _INTEGRITY).read_text(encoding="utf-8"))
        present = {p.name for p in folder.iterdir()} - {_INTEGRITY}
        if not listing or set(listing) != present:
            return False
        return all((folder / name).stat().st_size == entry["bytes"] and sha256_file(folder / name) == entry["sha256"]
                   for name, entry in listing.items())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False


def _loaded_from_cache(compiled: ov.CompiledModel) -> bool:
    try:
        return bool(compiled.get_property("LOADED_FROM_CACHE"))
    except Exception:  # a plugin that does not report it (pybind raises RuntimeError or TypeError)
        return False


class OpenVINOEngine(Engine):
    name = "openvino"
    suffixes = (".xml",)
    throughput_mode = True

    @classmethod
    def compile_cache(cls, device: str = "CPU") -> str | None:
        return CACHE_KIND

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
        from .model_files import is_openvino_ir

        if not is_openvino_ir(self.model_path):
            # OpenVINO picks its reader by content: an ONNX file named .xml would load (with any external data).
            # A damaged file gets OpenVINO's own refusal; one it can read as another format gets ours.
            self._read()
            raise BackendUnavailable(BackendReason.LOAD_FAILED, f"{self.model_path.name} is not an OpenVINO IR (XML); "
                                                                "OpenVINO would read it as another model format")
        available = core().available_devices
        if self.device not in available and self.device.split(".")[0] not in ("AUTO", "HETERO", "MULTI"):
            why = next((n for n in self.discover().notes if n.startswith(self.device.split(".")[0])), "")
            raise BackendUnavailable(BackendReason.DEVICE_MISSING,
                                     f"OpenVINO has no device {self.device!r} here "
                                     f"(available: {', '.join(available)}){'; ' + why if why else ''}")
        config: dict[str, str] = {"PERFORMANCE_HINT": self.performance.upper()}
        if self.precision_hint:
            # On AMX CPUs the default hint is bf16: an honest fp32 reference must ask for f32.
            config["INFERENCE_PRECISION_HINT"] = self.precision_hint
        if self.num_threads and self.device.startswith("CPU"):
            config["INFERENCE_NUM_THREADS"] = str(self.num_threads)
        self._compiled = self._compile_cached(config) if self.cache_dir is not None else None
        if self._compiled is None:
            self._compiled = self._compile(config)
        self._queue: ov.AsyncInferQueue | None = None  # made by the first run_many that can use parallel requests
        try:
            self._request = self._compiled.create_infer_request()
            self.parallel_requests = int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
            # A damaged IR can compile with ports that have no name (get_any_name raises RuntimeError).
            self.inputs = [_spec(p) for p in self._compiled.inputs]
            self.outputs = [_spec(p) for p in self._compiled.outputs]
        except Exception as exc:
            self.close()
            raise BackendUnavailable(BackendReason.LOAD_FAILED, f"OpenVINO cannot describe {self.model_path.name}: "
                                                                f"{_first_line(exc)}") from exc

    def _read(self) -> ov.Model:
        # OpenVINO raises RuntimeError for what it checks, and UnicodeDecodeError (from its Python layer) for
        # names in the IR that are not UTF-8: both are about the file.
        try:
            return core().read_model(str(self.model_path))
        except Exception as exc:
            raise BackendUnavailable(BackendReason.LOAD_FAILED,
                                     f"OpenVINO cannot read {self.model_path.name}: {_first_line(exc)}") from exc

    def _compile(self, config: dict[str, str]) -> ov.CompiledModel:
        model = self._read()
        try:
            return core().compile_model(model, self.device, config)
        except Exception as exc:
            raise BackendUnavailable(BackendReason.COMPILE_FAILED, f"OpenVINO cannot compile {self.model_path.name} on "
                                                                   f"{self.device}: {_first_line(exc)}") from exc

    def _compile_cached(self, config: dict[str, str]) -> ov.CompiledModel | None:
        """Compile through OpenVINO's model cache (``CACHE_DIR``); None when the cache cannot be used.

        OpenVINO keys its blobs by the model's path and options, and neither notices new weights
        under the same .xml nor checks a blob's content (a damaged blob can load and compute wrong
        results). So each model gets its own folder, named by the sha256 of its .xml and .bin (and
        the OpenVINO version, device, options, CPU), whose blobs are listed with their sha256 in
        ``integrity.json``; a folder that does not match its list is deleted and built again. A new
        folder is filled under a temporary name and renamed into place whole.
        """
        weights = self.model_path.with_suffix(".bin")
        files = [p for p in (self.model_path, weights) if p.is_file()]
        # The bundle's verified sha256 of the .xml and .bin when it gave them, else hashed here.
        digests = list(self.digests[:len(files)]) if len(self.digests) >= len(files) else \
            [sha256_file(p) for p in files]
        # OpenVINO names its blobs after the model's path: a copy elsewhere gets a folder of its own.
        key = cache_key(self.model_path.resolve(), *digests, ov.get_version(), self.device, sorted(config.items()),
                        host_cpu())
        root = self.cache_dir / "openvino"
        final = root / key
        discarded = False
        if final.is_dir():
            if _intact(final):
                try:
                    compiled = core().compile_model(str(self.model_path), self.device,
                                                    {**config, "CACHE_DIR": str(final)})
                    hit = _loaded_from_cache(compiled)
                except Exception:  # the uncached compile says what is wrong with the model or device
                    compiled, hit = None, False
                if not hit:
                    # OpenVINO compiled anew (adding a blob the list does not vouch for) or failed: the
                    # folder is dropped and built again by the next open.
                    shutil.rmtree(final, ignore_errors=True)
                self.cache_state = CacheState.HIT if hit else CacheState.UNAVAILABLE
                return compiled
            shutil.rmtree(final, ignore_errors=True)  # damaged: never handed to OpenVINO
            discarded = True
        try:
            root.mkdir(parents=True, exist_ok=True)
            building = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=root))
        except OSError:
            self.cache_state = CacheState.UNAVAILABLE
            return None
        try:
            compiled = core().compile_model(str(self.model_path), self.device, {**config, "CACHE_DIR": str(building)})
        except Exception:  # the uncached compile says what is wrong with the model or device
            shutil.rmtree(building, ignore_errors=True)
            self.cache_state = CacheState.UNAVAILABLE
            return None
        try:
            blobs = sorted(p for p in building.iterdir() if p.is_file())
            if not blobs:  # a device that cannot export compiled models: nothing to keep
                raise OSError("OpenVINO wrote no blob")
            listing = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in blobs}
            (building / _INTEGRITY).write_text(json.dumps(listing, indent=1), encoding="utf-8")
            os.rename(building, final)
            self.cache_state = CacheState.REBUILT if discarded else CacheState.STORED
        except OSError:  # includes another process publishing the same folder first: its blobs serve as well
            shutil.rmtree(building, ignore_errors=True)
            self.cache_state = (CacheState.REBUILT if discarded else CacheState.STORED) if _intact(final) \
                else CacheState.UNAVAILABLE
        return compiled

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        # infer() already hands back copies of the outputs (share_outputs=False): no second copy.
        return list(self._request.infer(feeds, share_inputs=True).to_tuple())

    def run_many(self, batch: Sequence[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """With ``performance="throughput"``, the inferences overlap on the device's parallel streams (an
        ``AsyncInferQueue`` of the plugin's optimal number of requests); otherwise one after the other."""
        if len(batch) < 2 or self.parallel_requests < 2:
            return super().run_many(batch)
        if self._queue is None:
            self._queue = ov.AsyncInferQueue(self._compiled, self.parallel_requests)
        results: list[list[np.ndarray] | None] = [None] * len(batch)
        errors: list[BaseException] = []
        outputs = len(self.outputs)

        def done(request: ov.InferRequest, index: int) -> None:
            # Runs on OpenVINO's thread: an exception escaping here is stored by pybind and aborts the process
            # when the queue is next used, so it is handed to the calling thread instead.
            try:
                # The request is reused for a later item: its outputs are copied out now.
                results[index] = [request.get_output_tensor(i).data.copy() for i in range(outputs)]
            except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
                errors.append(exc)

        queue = self._queue
        queue.set_callback(done)
        try:
            for index, feeds in enumerate(batch):
                queue.start_async(feeds, userdata=index, share_inputs=True)
        finally:
            queue.wait_all()  # nothing may still be in flight when this call returns or raises
        if errors:
            self._queue = None  # a fresh queue for the next call
            raise errors[0]
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            self._queue = None
            raise RuntimeError(f"OpenVINO returned no outputs for {len(missing)} of {len(batch)} inferences")
        return results  # type: ignore[return-value]

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
        self._queue = None
        self._request = None
        self._compiled = None


BACKEND = OpenVINOEngine
