"""Engine registry: maps engine names to backend modules, imported only when used.

A device with a single engine installed works: nothing here imports an engine
package until :func:`open_engine` asks for it.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
from pathlib import Path

from ..errors import BackendUnavailable
from .base import Engine, TensorSpec

# engine name -> (backend module, distributions that provide it, in order of preference)
_BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "litert": ("edgesdk.engines.litert", ("ai-edge-litert", "tflite-runtime")),
    "openvino": ("edgesdk.engines.openvino", ("openvino",)),
    "onnxruntime": ("edgesdk.engines.onnxruntime", ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino",
                                                     "onnxruntime-qnn", "onnxruntime-directml")),
}

ENGINE_NAMES = tuple(_BACKENDS)


def engine_version(name: str) -> str | None:
    """Installed version of an engine, read from package metadata (no import)."""
    for dist in _BACKENDS[name][1]:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def engine_class(name: str) -> type[Engine]:
    if name not in _BACKENDS:
        raise BackendUnavailable("engine_unknown", f"unknown engine {name!r} (known: {', '.join(_BACKENDS)})")
    module_name, dists = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            "engine_missing", f"engine {name!r} is not installed (pip install 'edgesdk[{name}]'; provided by {', '.join(dists)})"
        ) from exc
    return module.BACKEND


def open_engine(name: str, model_path: str | Path, **options) -> Engine:
    """Load ``model_path`` on engine ``name`` (options: device, precision_hint, num_threads)."""
    return engine_class(name)(model_path, **options)


__all__ = ["Engine", "TensorSpec", "ENGINE_NAMES", "engine_version", "engine_class", "open_engine"]
