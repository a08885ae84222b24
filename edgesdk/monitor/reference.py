"""The bundle's reference statistics (the manifest's ``monitoring`` section), built at quantize time from the
calibration and validation data with the device's own summaries (:mod:`edgesdk.monitor.summaries`), so that the
device compares like with like.

::

    "monitoring": {
      "version": 1, "bins": 10, "grid": 4,
      "inputs_from": "...", "outputs_from": "...",
      "inputs":  {"x.mean": {"edges": [...], "p": [...], "mean": m, "std": s, "n": N}, "x.cell[0]": {...}, ...},
      "outputs": {"max_prob": {...}, "margin": {...}, "entropy": {...}, "predicted_class": {...}},
      "artifacts": {"onnxruntime-int8": {"outputs": {...}}, ...}
    }

``outputs`` is the golden float reference's; ``artifacts.<id>.outputs`` each artifact's own on the same samples,
what a device running that artifact is compared with (INT8 moves a detector's scores by a little, and deciles of
scores that crowd near 0.93 are narrow enough for that to look like drift against the float reference).

A few KB (10 bins per feature, 6 significant digits). The manifest is what a bundle's signature covers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .drift import BINS, reference_entry
from .summaries import GRID, InputSummary, OutputSummary, classifier_features

VERSION = 1


class ReferenceBuilder:
    """Collects the summaries of reference samples: :meth:`add_input` per input sample (calibration and
    validation), :meth:`add_output` per validation sample's float outputs; :meth:`table` makes the section."""

    def __init__(self, inputs: Sequence[tuple[str, Sequence[int]]], layout: str | None, spec: Any,
                 output_names: Sequence[str], centers: Sequence[float] | None = None):
        centers = list(centers) if centers is not None else [0.0] * len(inputs)
        self.inputs = [InputSummary(name, shape, layout if i == 0 else None, 1, centers[i])
                       for i, (name, shape) in enumerate(inputs)]
        self._spec, self._names = spec, list(output_names)
        self._shapes: list[list[int]] | None = None  # the outputs' shapes, from the first outputs seen
        self._in_rows: list[list[np.ndarray]] = [[] for _ in self.inputs]
        self._outputs: dict[str | None, list[np.ndarray]] = {}  # artifact id (None: the reference) -> rows
        self._summary: OutputSummary | None = None

    def add_input(self, sample: Sequence[np.ndarray]) -> None:
        for summary, rows, x in zip(self.inputs, self._in_rows, sample):
            summary.record(np.asarray(x), 0)
            rows.append(summary.features(1)[0])

    def add_output(self, outputs: Sequence[np.ndarray], decoded: Callable[[], Any], key: str | None = None) -> None:
        """One validation sample's outputs (``key``: the artifact that gave them; None: the bundle's reference);
        ``decoded()`` gives the task's decoding (called for the tasks that need it). A classifier's scores are
        kept until :meth:`table` (the softmax flag is known then)."""
        if self._shapes is None:
            self._shapes = [list(np.shape(o)) for o in outputs]
        if self._summary is None:
            self._summary = OutputSummary(self._spec, self._names, self._shapes, softmax=False)
        summary = self._summary
        rows = self._outputs.setdefault(key, [])
        if summary.bulk:
            rows.append(np.asarray(outputs[summary.scores_at], dtype=np.float64).reshape(-1))
            return
        summary.record(outputs, decoded, 0)
        rows.append(summary.features(1)[0].copy())

    def table(self, softmax: bool, inputs_from: str, outputs_from: str) -> dict[str, Any]:
        section: dict[str, Any] = {"version": VERSION, "bins": BINS, "grid": GRID, "inputs_from": inputs_from,
                                   "outputs_from": outputs_from, "inputs": {}, "outputs": {}}
        for summary, rows in zip(self.inputs, self._in_rows):
            if not rows:
                continue
            feats = np.stack(rows)
            for j, name in enumerate(summary.names):
                entry = reference_entry(feats[:, j])
                if entry is not None:
                    section["inputs"][name] = entry
        if self._summary is None:  # no outputs were seen: the input features only
            return section
        summary = self._summary
        for key, rows in self._outputs.items():
            if not rows:
                continue
            feats = classifier_features(np.stack(rows), softmax, "predicted_class" in summary.names) \
                if summary.bulk else np.stack(rows)
            table = {}
            for j, name in enumerate(summary.names):
                entry = reference_entry(feats[:, j], categorical=name in summary.categorical)
                if entry is not None:
                    table[name] = entry
            if key is None:
                section["outputs"] = table
            else:
                section.setdefault("artifacts", {})[key] = {"outputs": table}
        return section


def input_centers(manifest: Mapping[str, Any]) -> list[float]:
    """Per input, the middle of its calibrated range (``calibration.input_ranges``; 0 without one): what the
    summaries subtract before their sums, on both sides."""
    ranges = (manifest.get("calibration") or {}).get("input_ranges") or []
    centers = []
    for i, _ in enumerate(manifest["inputs"]):
        entry = ranges[i] if i < len(ranges) and isinstance(ranges[i], Mapping) else {}
        lo, hi = entry.get("min"), entry.get("max")
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (lo, hi))
        centers.append((lo + hi) / 2 if ok else 0.0)
    return centers


__all__ = ["ReferenceBuilder", "VERSION", "input_centers"]
