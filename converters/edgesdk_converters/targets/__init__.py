"""Target builders: each turns a :class:`~..sources.Source` plus calibration samples
into a float reference and an INT8 artifact for one engine.

``build(source, samples, out_dir, progress) -> list[Built]``; imported only when its target is asked for.
``progress`` wraps the calibration samples so each pass over them shows a bar.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

# target name (module under targets/) -> engine name as it appears in the manifest
TARGET_ENGINES = {"tflite": "litert", "openvino": "openvino", "onnx": "onnxruntime"}


@dataclass
class Built:
    """One artifact a builder wrote, before it is checksummed into the bundle."""

    id: str
    engine: str
    precision: str
    files: list[Path]
    method: str = ""
    # Engine options the artifact must be opened with (recorded in the manifest as "runtime").
    runtime: dict = field(default_factory=dict)
    # What accuracy recovery did to an INT8 artifact (recorded in the manifest as "recovery"), when it ran.
    recovery: dict | None = None


def kept_text(keep_float, how: str) -> str:
    """What an INT8 artifact's method says of the layers recovery kept in float (``how``: the engine's mechanism)."""
    count = f"{len(keep_float)} layer{'s' if len(keep_float) > 1 else ''}"
    return f"; {count} kept in float ({how})" if keep_float else ""


def ranges_text(layers, how: str) -> str:
    """What an INT8 artifact's method says of the layers recovery gave the other range choice (``how``)."""
    count = f"{len(layers)} layer{'s' if len(layers) > 1 else ''}"
    return f"; {count} reading with {how} ranges" if layers else ""


def builder(target: str):
    return importlib.import_module(f"{__name__}.{target}").build
