"""What a decoded prediction holds, per task: plain values a caller keeps (:class:`Detection`, :class:`Mask`,
:class:`TextLine`, :class:`Landmarks`) and :class:`Decoded`, the one object a decoder returns.

Coordinates are in the original image's pixels when the input came from an image through the bundle's preprocess
(its resize, stretch or letterbox, undone by :class:`~edgesdk.tasks.geometry.Transform`), else in the model input's
pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Detection:
    """One detected object: ``box`` = (x1, y1, x2, y2), its ``score`` in [0, 1], class index and label, and the
    ``keypoints`` a face or pose detector gives with the box ((x, y) pairs), None when it gives none."""

    box: tuple[float, float, float, float]
    score: float
    class_index: int = 0
    label: str | None = None
    keypoints: tuple[tuple[float, float], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"box": [round(float(v), 3) for v in self.box], "score": round(float(self.score), 6),
               "class_index": int(self.class_index), "label": self.label}
        if self.keypoints is not None:
            out["keypoints"] = [[round(float(x), 3), round(float(y), 3)] for x, y in self.keypoints]
        return out


@dataclass(frozen=True)
class Mask:
    """One segmentation mask: ``mask`` a HxW bool array in the original image's pixels, for class ``class_index``
    (``label``); ``area`` its pixel count; ``score`` the mean probability inside it."""

    mask: np.ndarray
    class_index: int = 0
    label: str | None = None
    score: float = 0.0

    @property
    def area(self) -> int:
        return int(np.count_nonzero(self.mask))

    def to_dict(self) -> dict[str, Any]:
        ys, xs = np.nonzero(self.mask)
        box = [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1] if xs.size else None
        return {"class_index": int(self.class_index), "label": self.label, "area": self.area,
                "score": round(float(self.score), 6), "box": box, "shape": list(self.mask.shape)}


@dataclass(frozen=True)
class TextLine:
    """CTC-decoded text: ``text``, one confidence per character, and their mean (``confidence``; 0 for no text)."""

    text: str
    char_confidences: tuple[float, ...] = ()

    @property
    def confidence(self) -> float:
        return float(np.mean(self.char_confidences)) if self.char_confidences else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "confidence": round(self.confidence, 6),
                "char_confidences": [round(float(c), 6) for c in self.char_confidences]}


@dataclass(frozen=True)
class Landmarks:
    """Points: ``points`` a [P, dims] float array (x, y[, z]) and, when the model gives it, ``visibility`` [P] in
    [0, 1]; ``presence``: a landmark model's own score that an object is there at all (None when it has none)."""

    points: np.ndarray
    visibility: np.ndarray | None = None
    presence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"points": np.round(self.points, 3).tolist(),
                "visibility": None if self.visibility is None else np.round(self.visibility, 6).tolist(),
                "presence": self.presence}


@dataclass
class Decoded:
    """A prediction decoded by its task (:func:`edgesdk.tasks.decode`): the fields of its task are set, the others
    None. ``values``: regression / probability outputs; ``embedding``: one vector (normalized when the task says)."""

    task: str
    detections: list[Detection] | None = None
    masks: list[Mask] | None = None
    score_map: np.ndarray | None = field(default=None, repr=False)  # segmentation: probability or class map
    text: TextLine | None = None
    landmarks: Landmarks | None = None
    embedding: np.ndarray | None = field(default=None, repr=False)
    values: np.ndarray | None = None
    # what the decoding read, in the model's own space, kept so the hardness signals do not compute it again: a
    # detector's candidate scores [N], a segmenter's probabilities [C, H, W], a text model's step probabilities [T, C]
    model_scores: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task}
        if self.detections is not None:
            out["detections"] = [d.to_dict() for d in self.detections]
        if self.masks is not None:
            out["masks"] = [m.to_dict() for m in self.masks]
        if self.text is not None:
            out["text"] = self.text.to_dict()
        if self.landmarks is not None:
            out["landmarks"] = self.landmarks.to_dict()
        if self.embedding is not None:
            out["embedding"] = np.round(self.embedding.astype(np.float64), 6).tolist()
        if self.values is not None:
            out["values"] = np.asarray(self.values, dtype=np.float64).tolist()
        return out
