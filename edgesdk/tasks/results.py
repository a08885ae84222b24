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


class Mask:
    """One segmentation mask of class ``class_index`` (``label``) in the original image's pixels: ``mask`` a HxW bool
    array (``shape`` is (H, W)), ``area`` its pixel count, ``box`` (x1, y1, x2, y2) around it (x2, y2 past the last
    pixel; None when empty), ``score`` the mean probability inside it. Read-only.

    The masks of a class map share its one label map (``labels``, :attr:`Decoded.score_map`), with their area, box and
    score counted when it was decoded: each read of ``mask`` makes a new HxW array from the label map (none is kept),
    so the masks of many classes over a large image cost one label map, not one array per class. Read ``area`` and
    ``box`` rather than counting ``mask``.
    """

    __slots__ = ("class_index", "label", "score", "_mask", "_labels", "_area", "_box")

    def __init__(self, mask: np.ndarray | None = None, class_index: int = 0, label: str | None = None,
                 score: float = 0.0, *, labels: np.ndarray | None = None, area: int | None = None,
                 box: tuple[int, int, int, int] | None = None):
        if (mask is None) == (labels is None):
            raise TypeError("Mask takes a mask, or the label map it is one class of (labels=...)")
        if labels is not None and area is None:
            raise TypeError("a Mask of a label map needs its area (counted when the map was decoded)")
        for name, value in (("class_index", int(class_index)), ("label", label), ("score", float(score)),
                            ("_mask", None if mask is None else np.asarray(mask)), ("_labels", labels),
                            ("_area", None if area is None else int(area)),
                            ("_box", None if box is None else tuple(int(v) for v in box))):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Mask is read-only (cannot set {name!r})")

    def __repr__(self) -> str:
        return f"Mask(class_index={self.class_index}, label={self.label!r}, score={self.score:.4f}, area={self.area})"

    @property
    def mask(self) -> np.ndarray:
        if self._mask is not None:
            return self._mask
        return self._labels == self.class_index

    @property
    def shape(self) -> tuple[int, int]:
        source = self._mask if self._mask is not None else self._labels
        return tuple(int(d) for d in source.shape)

    @property
    def area(self) -> int:
        return self._area if self._area is not None else int(np.count_nonzero(self._mask))

    @property
    def box(self) -> tuple[int, int, int, int] | None:
        if self._labels is not None or self._mask is None:
            return self._box
        rows, cols = np.flatnonzero(self._mask.any(axis=1)), np.flatnonzero(self._mask.any(axis=0))
        if not rows.size:
            return None
        return (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)

    def to_dict(self) -> dict[str, Any]:
        box = self.box
        return {"class_index": int(self.class_index), "label": self.label, "area": self.area,
                "score": round(float(self.score), 6), "box": None if box is None else list(box),
                "shape": list(self.shape)}


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
    # detection: candidates at or over the score threshold whose box could not be decoded (not finite, or farther
    # than the sane extent from the input: values too large for the decoding's arithmetic); the answer is then
    # maximally uncertain (hardness uncertain_share 1)
    unreadable: int = 0
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
        if self.unreadable:
            out["unreadable"] = int(self.unreadable)
        return out
