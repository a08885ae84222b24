"""An INT8 artifact against its float reference, layer by layer, on the same inputs.

For each layer of the INT8 artifact that the float one also has (same engine: same names):

- *accumulated* error: the layer's value in the INT8 run against the float run's, everything before it quantized;
- *added* error: the layer run alone on the float run's values of its inputs (:meth:`~.Probe.isolated`: its own
  weights and quantizers, nothing before it) against the float run's value: what this layer adds.

Each is summed over the samples into SNR (dB: the float value's power over the error's), cosine, max and mean
|error|. Layers are named by the source model (:mod:`.align`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from . import Layer, Probe


@dataclass
class ErrorSum:
    """Running sums of one tensor's error over samples."""

    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    norm_a: float = 0.0
    norm_b: float = 0.0
    max_abs: float = 0.0
    abs_sum: float = 0.0
    count: int = 0

    def add(self, value: np.ndarray, ref: np.ndarray) -> None:
        a, b = np.asarray(value, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
        if a.size != b.size:
            a = np.resize(a, b.size)  # shapes disagree (should not happen within one engine): compare what there is
        diff = a - b
        self.signal += float(b @ b)
        self.noise += float(diff @ diff)
        self.dot += float(a @ b)
        self.norm_a += float(a @ a)
        self.norm_b += float(b @ b)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        self.abs_sum += float(np.sum(np.abs(diff)))
        self.count += diff.size

    @property
    def snr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    @property
    def cosine(self) -> float:
        denom = math.sqrt(self.norm_a * self.norm_b)
        return self.dot / denom if denom else (1.0 if self.norm_a == self.norm_b else 0.0)

    def numbers(self) -> dict:
        return {"snr_db": _finite(self.snr_db), "cosine": self.cosine, "max_abs_error": self.max_abs,
                "mean_abs_error": self.abs_sum / self.count if self.count else 0.0}


@dataclass
class LayerError:
    """One layer's numbers: ``source`` is the source model's node name (its tensor: ``source_tensor``), None when the
    layer could not be matched; ``node`` the engine's own op name; ``position`` its index in the engine's order."""

    name: str
    op: str
    node: str
    position: int
    macs: int
    quantized: bool
    source: str | None = None
    source_tensor: str | None = None
    accumulated: ErrorSum = field(default_factory=ErrorSum)
    added: ErrorSum | None = field(default_factory=ErrorSum)

    def as_dict(self) -> dict:
        return {"layer": self.source or self.node, "source_node": self.source, "source_tensor": self.source_tensor,
                "engine_node": self.node, "tensor": self.name, "op": self.op, "position": self.position,
                "macs": self.macs, "quantized": self.quantized,
                "added": self.added.numbers() if self.added is not None and self.added.count else None,
                "accumulated": self.accumulated.numbers()}


def compare(float_probe: Probe, int8_probe: Probe, samples: Iterable[list[np.ndarray]],
            names: Callable[[Layer], tuple[str, str] | None] = lambda layer: None, isolate: bool = True,
            progress: Callable[[Iterable], Iterable] = iter) -> list[LayerError]:
    """Every layer of ``int8_probe`` found in ``float_probe``, its errors summed over ``samples``, in the INT8
    artifact's order. ``names``: a layer's (source node name, source tensor name), None when unknown
    (:class:`~.debug.SourceNames`). ``isolate=False`` skips the added error (one run per sample instead of one per
    layer per sample)."""
    rows: dict[str, LayerError] = {}
    layers: list[Layer] = []
    for sample in progress(list(samples)):
        ref, own = float_probe.capture(sample), int8_probe.capture(sample)
        if not layers:
            layers = [l for l in int8_probe.layers() if l.name in ref and l.name in own]
            for k, l in enumerate(layers):
                source = names(l)
                rows[l.name] = LayerError(l.name, l.op, l.node, k, l.macs, l.quantized,
                                          source[0] if source else None, source[1] if source else None)
        for l in layers:
            row = rows[l.name]
            row.accumulated.add(own[l.name], ref[l.name])
            if isolate and row.added is not None:
                if all(i in ref for i in l.inputs):
                    row.added.add(int8_probe.isolated(l, {i: ref[i] for i in l.inputs}), ref[l.name])
                else:
                    row.added = None  # an input the float artifact does not have under that name
    return list(rows.values())


def worst(rows: list[LayerError], count: int | None = None, by: str = "added") -> list[LayerError]:
    """The rows with the lowest SNR first (``by``: "added", or "accumulated"). By added error, a layer whose added
    error could not be measured (an input the float artifact does not have under its name) comes after every
    measured one, ranked among them by its accumulated error."""
    def key(row: LayerError) -> tuple[int, float]:
        if by == "added":
            if row.added is not None and row.added.count:
                return 0, row.added.snr_db
            return 1, row.accumulated.snr_db
        return 0, row.accumulated.snr_db
    ranked = sorted(rows, key=key)
    return ranked if count is None else ranked[:count]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
