"""Engine registry: maps engine names to backend modules, imported only when used.

A device with a single engine installed works: nothing here imports an engine
package until :func:`open_engine` asks for it.

``base`` (the :class:`Engine` interface every backend implements), one module per engine (``litert``, ``openvino``,
``onnxruntime``) and ``model_files`` (what a model file points at, read without its engine: ONNX external data). This
package is below :mod:`edgesdk.bundle` and imports none of it: what a bundle and an engine both need (a file's
SHA-256) is :mod:`edgesdk.file_digest`'s.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
from pathlib import Path

from ..choices import BackendReason
from ..errors import BackendUnavailable
from .base import KINDS, Device, Discovery, Engine, TensorSpec

# engine name -> (backend module, distributions that provide it, in order of preference)
_BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "litert": ("edgesdk.engines.litert", ("ai-edge-litert", "tflite-runtime")),
    "openvino": ("edgesdk.engines.openvino", ("openvino",)),
    "onnxruntime": ("edgesdk.engines.onnxruntime", ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino",
                                                     "onnxruntime-qnn", "onnxruntime-directml")),
}

ENGINE_NAMES = tuple(_BACKENDS)
_EXTRA: dict[str, type[Engine]] = {}  # backends registered at run time (plug-ins, test fakes)


def register_backend(name: str, backend: type[Engine]) -> None:
    """Add a backend class under ``name`` (``backend.formats`` says which artifacts it runs)."""
    if name in _BACKENDS:
        raise ValueError(f"{name!r} is a built-in engine")
    _EXTRA[name] = backend


def unregister_backend(name: str) -> None:
    _EXTRA.pop(name, None)


def backend_names() -> tuple[str, ...]:
    return ENGINE_NAMES + tuple(_EXTRA)


def engine_version(name: str) -> str | None:
    """Installed version of an engine, read from package metadata (no import)."""
    if name in _EXTRA:
        return getattr(_EXTRA[name], "version", None)
    for dist in _BACKENDS[name][1]:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def engine_class(name: str) -> type[Engine]:
    if name in _EXTRA:
        return _EXTRA[name]
    if name not in _BACKENDS:
        raise BackendUnavailable(BackendReason.ENGINE_UNKNOWN,
                                 f"unknown engine {name!r} (known: {', '.join(_BACKENDS)})")
    module_name, dists = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            BackendReason.ENGINE_MISSING,
            f"engine {name!r} is not installed (pip install 'edgesdk[{name}]'; provided by {', '.join(dists)})"
        ) from exc
    return module.BACKEND


def open_engine(name: str, model_path: str | Path, **options) -> Engine:
    """Load ``model_path`` on engine ``name`` (options: device, precision_hint, num_threads, cache_dir).

    ``cache_dir`` lets the engine keep its compiled or optimized model for later processes, where one
    applies (``engine_class(name).compile_cache(device)``); None (the default) keeps nothing.
    """
    return engine_class(name)(model_path, **options)


def discover(name: str) -> Discovery:
    """What engine ``name`` reports here; an engine that is not installed reports no device and says so."""
    try:
        return engine_class(name).discover()
    except BackendUnavailable as exc:
        return Discovery(name, None, [], [exc.detail])


__all__ = ["Engine", "TensorSpec", "Device", "Discovery", "KINDS", "ENGINE_NAMES", "engine_version", "engine_class",
           "open_engine", "register_backend", "unregister_backend", "backend_names", "discover"]
