"""Per-task agreement of one artifact with its reference, on what the device shows: each accumulator takes one
validation sample at a time (decoded by :func:`edgesdk.tasks.decode.decode`, or raw for ``raw``) and keeps running
sums, so its memory does not grow with the validation set (a PP-OCR detector's 640x640 maps are dropped after each
sample). The one exception is embeddings: recall@1 needs every vector, kept for the first
:data:`~.value_metrics.MAX_RECALL_SAMPLES` samples.

Each accumulator names its metric (``name``), reports it (:meth:`TaskMetric.value`) with its detail numbers
(:meth:`TaskMetric.details`), and turns it into the gate's drop in its unit (:meth:`TaskMetric.drop`, ``unit``)
with a default limit (:meth:`TaskMetric.default_max_drop`). :func:`metric_for` picks the accumulator of a task.
Here: the metrics of what a task finds (boxes, masks, strings, points); :mod:`.value_metrics`: of the values it
gives (regression and probability values, embeddings, raw outputs); :mod:`.metric_base`: what they all are.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgesdk.tasks import Decoded, TaskSpec, TaskType

from .metric_base import TaskMetric
from .value_metrics import EmbeddingAgreement, RawAgreement, ValueAgreement

DETECTION_IOU = 0.5  # a box matches its reference at this IoU or more (and the same class)
# detection: the scores of matched boxes may differ from the reference's by this much on average (BlazeFace INT8:
# 0.016; a YOLO export whose scores share one INT8 scale with pixel coordinates: 0.2-0.25, steps of ~0.38)
DETECTION_SCORE_ERROR_MAX = 0.10
PRESENCE_AGREEMENT_MIN = 0.90  # landmarks: the presence decision must agree with the reference on this share


class DetectionAgreement(TaskMetric):
    """Boxes matched greedily by score to the reference's (same class, IoU >= 0.5), pooled over the set: F1 of
    the matches, the mean |score difference| and IoU of matched boxes, the mean keypoint distance when boxes have
    keypoints."""

    name, gate, default = "box_f1", "box_f1_drop_points", 10.0

    def __init__(self) -> None:
        self.matched = self.own = self.ref = 0
        self.score_diff = self.iou_sum = self.kp_sum = 0.0
        self.kp_n = 0

    def add(self, own, ref, own_raw, ref_raw):
        dets, refs = list(own.detections or []), list(ref.detections or [])
        self.own, self.ref = self.own + len(dets), self.ref + len(refs)
        free = list(range(len(refs)))
        for d in sorted(dets, key=lambda d: -d.score):
            best, best_iou = None, DETECTION_IOU
            for k in free:
                if refs[k].class_index == d.class_index:
                    iou = box_iou(d.box, refs[k].box)
                    if iou >= best_iou:
                        best, best_iou = k, iou
            if best is None:
                continue
            free.remove(best)
            self.matched += 1
            self.score_diff += abs(float(d.score) - float(refs[best].score))
            self.iou_sum += best_iou
            if d.keypoints and refs[best].keypoints and len(d.keypoints) == len(refs[best].keypoints):
                gaps = np.asarray(d.keypoints, np.float64) - np.asarray(refs[best].keypoints, np.float64)
                self.kp_sum += float(np.linalg.norm(gaps, axis=1).sum())
                self.kp_n += len(d.keypoints)

    def value(self):
        total = self.own + self.ref
        return 1.0 if total == 0 else 2.0 * self.matched / total

    def failure(self):
        error = self.score_diff / self.matched if self.matched else 0.0
        if error > DETECTION_SCORE_ERROR_MAX:
            return (f"the scores of matched boxes differ from the reference's by {error:.3f} on average (max "
                    f"{DETECTION_SCORE_ERROR_MAX:g}): the boxes agree, the confidences do not")
        return None

    def details(self):
        m = self.matched
        return {"box_f1": self.value(), "precision": m / self.own if self.own else 1.0,
                "recall": m / self.ref if self.ref else 1.0, "detections": self.own, "reference_detections": self.ref,
                "score_error": self.score_diff / m if m else None, "box_iou": self.iou_sum / m if m else None,
                "keypoint_error_px": self.kp_sum / self.kp_n if self.kp_n else None}


def box_iou(a, b) -> float:
    """IoU of two (x1, y1, x2, y2) boxes (0 when either is empty)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


class MaskAgreement(TaskMetric):
    """Mask IoU pooled over the set (sum of intersections / sum of unions), per class for a class map (the mean
    over the classes either side ever marks); also the share of pixels decided alike."""

    name, gate, default = "mask_iou", "mask_iou_drop_points", 10.0

    def __init__(self) -> None:
        self.inter: dict[int, int] = {}
        self.union: dict[int, int] = {}
        self.differ = self.pixels = 0

    def add(self, own, ref, own_raw, ref_raw):
        mine, theirs = _class_masks(own), _class_masks(ref)
        shape = next((m.shape for m in (*mine.values(), *theirs.values())), None)
        if shape is None:
            return  # neither marks anything: agreed, nothing to count
        empty = np.zeros(shape, bool)
        for c in set(mine) | set(theirs):
            a, b = mine.get(c, empty), theirs.get(c, empty)
            if a.shape != b.shape:
                raise ValueError(f"class {c} mask is {list(a.shape)} here and {list(b.shape)} in the reference")
            self.inter[c] = self.inter.get(c, 0) + int(np.count_nonzero(a & b))
            self.union[c] = self.union.get(c, 0) + int(np.count_nonzero(a | b))
            self.differ += int(np.count_nonzero(a ^ b))
        self.pixels += int(np.prod(shape))

    def value(self):
        ious = [self.inter[c] / self.union[c] for c in self.union if self.union[c] > 0]
        return float(np.mean(ious)) if ious else 1.0

    def details(self):
        present = sorted(c for c in self.union if self.union[c] > 0)
        out: dict[str, Any] = {"mask_iou": self.value(), "classes": len(present),
                               "pixels_differing": self.differ / self.pixels if self.pixels else 0.0}
        if len(present) > 1:
            out["class_iou"] = {str(c): self.inter[c] / self.union[c] for c in present[:64]}
        return out


def _class_masks(decoded: Decoded) -> dict[int, np.ndarray]:
    """{class index: bool mask} of a decoded segmentation (a class the decoder left out marks nothing)."""
    masks: dict[int, np.ndarray] = {}
    for m in decoded.masks or []:
        mask = np.asarray(m.mask, bool)
        masks[int(m.class_index)] = masks[int(m.class_index)] | mask if int(m.class_index) in masks else mask
    return masks


class TextAgreement(TaskMetric):
    """Exact-string agreement with the reference's decoded text, and the mean character error rate (edit distance
    over the reference's length)."""

    name, gate, default = "exact_string_agreement", "text_agreement_drop_points", 5.0

    def __init__(self) -> None:
        self.n = self.same = 0
        self.cer_sum = 0.0

    def add(self, own, ref, own_raw, ref_raw):
        a, b = (own.text.text if own.text else ""), (ref.text.text if ref.text else "")
        self.n += 1
        self.same += int(a == b)
        self.cer_sum += edit_distance(a, b) / max(len(b), 1)

    def value(self):
        return self.same / self.n if self.n else 1.0

    def details(self):
        return {"exact_string_agreement": self.value(), "cer": self.cer_sum / self.n if self.n else 0.0}


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of one character each)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


class PointAgreement(TaskMetric):
    """Distance of each point (x, y) from the reference's, in input pixels: mean and p95 over every point of every
    sample (p95 from a fixed histogram of 1 % wide bins: constant memory); the gate is the p95, by default at most
    1 % of the input's diagonal (``image_size``; without one, of the reference points' extent)."""

    name, gate, unit = "p95_point_error_px", "p95_point_error_px", "px"

    def __init__(self, image_size: tuple[int, int] | None, presence_threshold: float = 0.5) -> None:
        self.image_size = image_size
        self.presence_threshold = presence_threshold
        self.presence_n = self.presence_same = 0
        self.presence_sum = 0.0
        self.errors = Quantiles()
        self.sum, self.n = 0.0, 0
        self.vis_sum, self.vis_n = 0.0, 0
        self.lo, self.hi = np.full(2, np.inf), np.full(2, -np.inf)

    def add(self, own, ref, own_raw, ref_raw):
        a, b = own.landmarks, ref.landmarks
        pa, pb = np.asarray(a.points, np.float64), np.asarray(b.points, np.float64)
        if pa.shape != pb.shape:
            raise ValueError(f"points are {list(pa.shape)} here and {list(pb.shape)} in the reference")
        err = np.linalg.norm(pa[:, :2] - pb[:, :2], axis=1)
        self.errors.add(err)
        self.sum, self.n = self.sum + float(err.sum()), self.n + err.size
        if pb.size:
            self.lo, self.hi = np.minimum(self.lo, pb[:, :2].min(0)), np.maximum(self.hi, pb[:, :2].max(0))
        if a.visibility is not None and b.visibility is not None:
            gap = np.abs(np.asarray(a.visibility, np.float64) - np.asarray(b.visibility, np.float64))
            self.vis_sum, self.vis_n = self.vis_sum + float(gap.sum()), self.vis_n + gap.size
        if a.presence is not None and b.presence is not None:  # is the object there: the same answer as float's?
            self.presence_n += 1
            self.presence_same += int((a.presence > self.presence_threshold) == (b.presence > self.presence_threshold))
            self.presence_sum += abs(a.presence - b.presence)

    def value(self):
        return self.errors.quantile(0.95)

    def drop(self):
        return self.value()

    def default_max_drop(self):
        if self.image_size is not None:
            return 0.01 * math.hypot(*self.image_size)
        extent = self.hi - self.lo
        return 0.01 * float(math.hypot(*extent)) if np.all(np.isfinite(extent)) else 0.0

    def details(self):
        return {"p95_point_error_px": self.value(), "mean_point_error_px": self.sum / self.n if self.n else 0.0,
                "max_point_error_px": self.errors.max, "points": self.n,
                "visibility_error": self.vis_sum / self.vis_n if self.vis_n else None,
                "presence_agreement": self.presence_same / self.presence_n if self.presence_n else None,
                "presence_error": self.presence_sum / self.presence_n if self.presence_n else None}

    def failure(self):
        agreement = self.presence_same / self.presence_n if self.presence_n else None
        if agreement is not None and agreement < PRESENCE_AGREEMENT_MIN:
            return (f"the presence decision (score > {self.presence_threshold:g}) agrees with the reference on "
                    f"{100 * agreement:.1f}% of samples (< {100 * PRESENCE_AGREEMENT_MIN:.0f}%): the points may "
                    "agree, the answer whether there is an object does not")
        return None


class Quantiles:
    """Quantiles of a stream of non-negative numbers from a histogram of log-spaced bins (1 % wide, from 1e-4 to
    1e6; below is 0, above the last bin): constant memory, 1 % resolution."""

    LOW, HIGH, STEP = 1e-4, 1e6, 1.01

    def __init__(self) -> None:
        self.edges = self.LOW * self.STEP ** np.arange(int(math.log(self.HIGH / self.LOW, self.STEP)) + 1)
        self.counts = np.zeros(self.edges.size + 1, np.int64)  # [0]: below LOW; [k]: edges[k-1] .. edges[k]
        self.max = 0.0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64).ravel()
        if values.size:
            values = np.where(np.isfinite(values), values, np.inf)
            self.max = max(self.max, float(values.max()))
            self.counts += np.bincount(np.searchsorted(self.edges, values), minlength=self.counts.size)[
                :self.counts.size]

    def quantile(self, q: float) -> float:
        total = int(self.counts.sum())
        if total == 0:
            return 0.0
        k = int(np.searchsorted(np.cumsum(self.counts), math.ceil(q * total)))
        return 0.0 if k == 0 else min(float(self.edges[k - 1]) * self.STEP, self.max)


def metric_for(task: TaskSpec, image_size: tuple[int, int] | None = None) -> TaskMetric | None:
    """The accumulator of ``task`` (None for classification, which validation tallies itself)."""
    kind = task.type
    if kind is TaskType.CLASSIFICATION:
        return None
    if kind is TaskType.DETECTION:
        return DetectionAgreement()
    if kind is TaskType.SEGMENTATION:
        return MaskAgreement()
    if kind is TaskType.TEXT:
        return TextAgreement()
    if kind is TaskType.LANDMARKS:
        return PointAgreement(image_size, task.params["presence_threshold"])
    if kind in (TaskType.REGRESSION, TaskType.PROBABILITY):
        return ValueAgreement(task)
    if kind is TaskType.EMBEDDING:
        return EmbeddingAgreement()
    return RawAgreement()
