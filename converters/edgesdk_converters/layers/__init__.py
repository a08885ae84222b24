"""Layer by layer: what an artifact computes inside, per engine, so that an INT8 artifact's error can be located
(``edgesdk debug``) and its worst layers kept in float (``quantize --recover``).

Each engine has one probe module (``onnx``, ``openvino``, ``litert``) with one class behind one small interface,
:class:`Probe`, imported only when its engine is asked for (:func:`probe_for`). A probe names tensors by the engine's
own names; :mod:`.align` maps them onto the *source* model's node names (the golden float artifact's), by name where
the engine kept them and by value where it did not, so that three engines' reports line up. :mod:`.compare` turns
the tensors into per-layer numbers; :mod:`.report` prints them.

A *layer* here is one tensor an op computes from activations (not a constant, not a graph input, not the
quantize/dequantize plumbing of an INT8 model), named by that tensor. In an INT8 artifact a layer's value is read as
float: a dequantized int8 tensor, or the float tensor a QDQ/FakeQuantize model computes before quantizing it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

# engine (as the manifest names it) -> probe module under layers/
PROBES = {"onnxruntime": "onnx", "openvino": "openvino", "litert": "litert"}


@dataclass(frozen=True)
class Layer:
    """One layer of an artifact, by the engine's names.

    ``name``: the tensor it computes (its first output); ``op``: the engine's op type (``Conv``, ``Convolution``,
    ``CONV_2D``); ``node``: the op's own name in the engine's graph (ONNX node name, OpenVINO friendly name, the
    TFLite op's index as ``"op 12"`` when it has none); ``inputs``: the activation tensors it reads, by name, each
    the float value before any quantize op of an INT8 model (weights and other constants are not inputs);
    ``macs``: multiply-accumulates of one run at the artifact's input shapes (0 for ops that do none);
    ``quantized``: whether an INT8 artifact runs this op on integers (always False in a float artifact).
    """

    name: str
    op: str
    node: str
    inputs: tuple[str, ...]
    macs: int = 0
    quantized: bool = False
    shape: tuple[int, ...] = field(default=())


class Probe(Protocol):
    """One artifact opened for looking inside. Built as ``Probe(path, runtime)`` (``runtime``: the manifest's
    engine options of the artifact, e.g. ``{"precision_hint": "f32"}``); ``close()`` frees it."""

    def layers(self) -> list[Layer]:
        """Every layer, in an order where each comes after the layers it reads."""

    def capture(self, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The float32 value of every layer (by ``Layer.name``) and of every graph input, for one sample (its
        inputs in the artifact's input order, each in its own dtype)."""

    def isolated(self, layer: Layer, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """``layer``'s output computed from the given float values of its ``inputs`` alone (its weights and the
        artifact's quantization as they are): an INT8 artifact quantizes them on entry as it would its own."""

    def close(self) -> None:
        """Free the engine's resources."""


def probe_for(engine: str, path: Path, runtime: dict | None = None) -> Probe:
    """The probe of ``engine`` opened on ``path``."""
    from edgesdk.errors import ConversionError

    if engine not in PROBES:
        raise ConversionError(f"no layer probe for engine {engine!r}; probes exist for {', '.join(PROBES)}")
    module = importlib.import_module(f"{__name__}.{PROBES[engine]}")
    return module.open_probe(Path(path), dict(runtime or {}))
