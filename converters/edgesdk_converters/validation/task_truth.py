"""Ground truth beyond class labels: what a validation ``.npz`` may hold for detection, segmentation and text, and
each task's metric against it, so that validation gates an INT8 artifact by what it loses on the truth (the float
reference's score minus its own, in points), as classification does with labels ``y``.

The arrays (besides the inputs), one row per sample, read by :func:`read_truth`:

- detection: ``boxes`` [N, K, 4] (x1, y1, x2, y2 in model-input pixels) and ``classes`` [N, K] (class indices);
  rows past an image's objects hold class -1 (their boxes are not read);
- text: ``texts`` [N], a numpy unicode array (``np.array(["abc", ...])``);
- segmentation: ``masks`` [N, H, W] at the map's own size: class indices for a class map, 0/1 for a probability
  map.

The metrics stream (:class:`TruthScore`: one sample at a time, decoded as the device decodes it): detection mAP@0.5
(:class:`DetectionTruth`; VOC's all-point interpolated AP per class, the mean over the classes the truth holds) and
F1 at IoU 0.5; text exact-match accuracy and CER (:class:`TextTruth`); segmentation mIoU (:class:`MaskTruth`).
Detection keeps one (score, hit) pair per detection for its precision-recall curves (a few bytes each); the others
keep running sums.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from edgesdk.errors import CalibrationError
from edgesdk.tasks import Decoded, TaskSpec, TaskType
from edgesdk.tasks.segmentation import MAX_CLASSES, probabilities

from .task_metrics import box_iou, edit_distance

TRUTH_IOU = 0.5  # a detection finds a true box at this IoU or more (and the same class)
MAX_TRUTH_BOXES = 1000  # true boxes per sample (matching costs boxes x detections per sample)
MAX_TRUTH_TEXT_CHARS = 1000  # characters of one true text (CER's edit distance costs the product of two lengths)
MAX_TRUTH_MASK_PIXELS = 8192 * 8192  # pixels of one true mask, as a preprocessed image's
TRUTH_KEYS = {"boxes": TaskType.DETECTION, "classes": TaskType.DETECTION, "texts": TaskType.TEXT,
              "masks": TaskType.SEGMENTATION}


@dataclass(frozen=True)
class Truth:
    """One sample's ground truth (``sample`` names it in errors): ``boxes`` [K, 4] with their ``classes`` [K]
    (padding rows removed), a ``text``, or a ``mask`` [H, W]."""

    sample: str
    boxes: np.ndarray | None = None
    classes: np.ndarray | None = None
    text: str | None = None
    mask: np.ndarray | None = None


@dataclass
class Truths:
    """The ground truth of every sample of a dataset, loaded one sample at a time; ``kind``: the task it is for."""

    kind: TaskType
    loaders: list[Callable[[], Truth]]

    def __len__(self) -> int:
        return len(self.loaders)

    def load(self, i: int) -> Truth:
        return self.loaders[i]()

    def subset(self, indices: Sequence[int]) -> "Truths":
        return Truths(self.kind, [self.loaders[i] for i in indices])


def read_truth(arrays: Mapping[str, np.ndarray], count: int, where: str) -> Truths | None:
    """The truth held by ``arrays`` (an .npz's arrays of :data:`TRUTH_KEYS`) for ``count`` samples, or None when
    there is none. An array whose shape, length, dtype or values do not fit is a :class:`CalibrationError` naming
    its key."""
    kinds = {TRUTH_KEYS[k] for k in arrays}
    if len(kinds) > 1:
        raise CalibrationError(f"{where} holds the truth of several tasks ({', '.join(sorted(arrays))}); give one "
                               f"task's: boxes and classes, texts, or masks")
    if not kinds:
        return None
    kind = kinds.pop()
    names = [f"{where}[{i}]" for i in range(count)]
    if kind is TaskType.DETECTION:
        boxes, classes = _box_arrays(arrays, count, where)
        return Truths(kind, [(lambda i=i: Truth(names[i], boxes=boxes[i][classes[i] >= 0].astype(np.float64),
                                                classes=classes[i][classes[i] >= 0].astype(np.int64)))
                             for i in range(count)])
    if kind is TaskType.TEXT:
        texts = _need(arrays["texts"], "texts", where, count, 1, "[N] unicode strings (np.array(['abc', ...]))", "U")
        longest = max((len(str(t)) for t in texts), default=0)
        if longest > MAX_TRUTH_TEXT_CHARS:
            raise CalibrationError(f"{where}: 'texts' holds a text of {longest} characters; at most "
                                   f"{MAX_TRUTH_TEXT_CHARS}")
        return Truths(kind, [(lambda i=i: Truth(names[i], text=str(texts[i]))) for i in range(count)])
    masks = _need(arrays["masks"], "masks", where, count, 3, "[N, H, W] integer class indices (0/1 for a "
                  "probability map)", "biu")
    if masks.shape[1] * masks.shape[2] > MAX_TRUTH_MASK_PIXELS:
        raise CalibrationError(f"{where}: 'masks' are {masks.shape[1]} x {masks.shape[2]} pixels; at most "
                               f"{MAX_TRUTH_MASK_PIXELS}")
    if masks.size and (int(masks.min()) < 0 or int(masks.max()) >= MAX_CLASSES):
        raise CalibrationError(f"{where}: 'masks' hold values {int(masks.min())} to {int(masks.max())}; class "
                               f"indices are 0 to {MAX_CLASSES - 1}")
    return Truths(kind, [(lambda i=i: Truth(names[i], mask=masks[i])) for i in range(count)])


def _need(a: np.ndarray, key: str, where: str, count: int, ndim: int, shape: str, kinds: str) -> np.ndarray:
    if a.ndim != ndim or len(a) != count or a.dtype.kind not in kinds:
        raise CalibrationError(f"{where}: {key!r} must be {shape} for the {count} samples, got {a.dtype} "
                               f"{list(a.shape)}")
    return a


def _box_arrays(arrays: Mapping[str, np.ndarray], count: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``boxes`` and ``classes`` checked: both there, shapes that fit each other, real boxes (x2 > x1, y2 > y1)."""
    missing = [k for k in ("boxes", "classes") if k not in arrays]
    if missing:
        raise CalibrationError(f"{where} has 'boxes' or 'classes' without the other (no {missing[0]!r}): detection "
                               f"truth is both, boxes [N, K, 4] and classes [N, K]")
    boxes = _need(arrays["boxes"], "boxes", where, count, 3, "[N, K, 4] (x1, y1, x2, y2)", "iuf")
    classes = _need(arrays["classes"], "classes", where, count, 2, "[N, K] integer class indices (-1: no box)", "iu")
    if boxes.shape[2] != 4 or classes.shape[1] != boxes.shape[1]:
        raise CalibrationError(f"{where}: 'boxes' {list(boxes.shape)} and 'classes' {list(classes.shape)} do not "
                               f"fit: boxes [N, K, 4], classes [N, K]")
    if boxes.shape[1] > MAX_TRUTH_BOXES:
        raise CalibrationError(f"{where}: 'boxes' holds {boxes.shape[1]} boxes per sample; at most "
                               f"{MAX_TRUTH_BOXES}")
    real = classes >= 0
    if classes.size and int(classes.min()) < -1:
        raise CalibrationError(f"{where}: 'classes' holds {int(classes.min())}; class indices are >= 0, -1 for a "
                               f"padding row")
    kept = boxes[real].astype(np.float64)
    if not np.isfinite(kept).all() or not ((kept[:, 2] > kept[:, 0]) & (kept[:, 3] > kept[:, 1])).all():
        raise CalibrationError(f"{where}: 'boxes' holds a box that is not finite x1, y1, x2, y2 with x2 > x1 and "
                               f"y2 > y1 (a centre-and-size box?)")
    if not real.any():
        raise CalibrationError(f"{where}: 'classes' is -1 everywhere: the truth holds no box to measure map50 on")
    return boxes, classes


def join_truths(parts: list[Truths | None], where: str, files: list[str]) -> Truths | None:
    """The truth of several .npz files read as one set: every file's of one kind, or none."""
    kinds = {None if p is None else p.kind for p in parts}
    if len(kinds) > 1:
        shown = ", ".join(f"{f}: {'none' if p is None else p.kind.value}" for f, p in zip(files, parts))
        raise CalibrationError(f"{where}: the .npz files hold different truth ({shown[:300]}); all the same or none")
    if kinds == {None}:
        return None
    return Truths(parts[0].kind, [f for p in parts for f in p.loaders])


# -- metrics -----------------------------------------------------------------------------------------------------

class TruthScore(ABC):
    """One artifact's running score against the ground truth of one task."""

    name = ""  # the metric, as the manifest and the report name it
    gate = ""  # the entry key holding the drop against the float reference's score

    @abstractmethod
    def add(self, decoded: Decoded, outputs: list[np.ndarray], truth: Truth) -> None:
        """One sample: the artifact's decoded prediction (and its raw outputs) against the sample's truth."""

    @abstractmethod
    def value(self) -> float:
        """The metric over the samples so far, in [0, 1]."""

    def details(self) -> dict[str, Any]:
        return {self.name: self.value()}


class DetectionTruth(TruthScore):
    """mAP@0.5 and F1 at IoU 0.5 of the detections the device keeps (after its score threshold and NMS). Matching
    is VOC's: best score first, each detection takes the true box of its class it overlaps most; a hit when that
    IoU is >= 0.5 and no better-scored detection took the box (a duplicate is a false positive)."""

    name, gate = "map50", "map50_drop_points"

    def __init__(self) -> None:
        self.scored: dict[int, list[tuple[float, bool]]] = {}  # class -> (score, hit) of each detection
        self.positives: dict[int, int] = {}  # class -> true boxes
        self.hits = self.detections = self.boxes = 0

    def add(self, decoded, outputs, truth):
        dets = sorted(decoded.detections or [], key=lambda d: -float(d.score))
        boxes, classes = truth.boxes, truth.classes
        for c in classes.tolist():
            self.positives[c] = self.positives.get(c, 0) + 1
        taken = np.zeros(len(boxes), bool)
        for d in dets:
            best, best_iou = -1, 0.0
            for k in np.flatnonzero(classes == d.class_index):
                iou = box_iou(d.box, boxes[k])
                if iou > best_iou:
                    best, best_iou = int(k), iou
            hit = best >= 0 and best_iou >= TRUTH_IOU and not taken[best]
            if hit:
                taken[best] = True
            self.scored.setdefault(int(d.class_index), []).append((float(d.score), hit))
        self.hits += int(taken.sum())
        self.detections, self.boxes = self.detections + len(dets), self.boxes + len(boxes)

    def class_ap(self) -> dict[int, float]:
        """AP of each class the truth holds."""
        return {c: average_precision(self.scored.get(c, []), n) for c, n in sorted(self.positives.items()) if n}

    def value(self):
        ap = self.class_ap()
        if not ap:
            raise CalibrationError("the validation truth holds no box (every class is -1): map50 has nothing to "
                                   "measure")
        return float(np.mean(list(ap.values())))

    def details(self):
        precision = self.hits / self.detections if self.detections else 1.0
        recall = self.hits / self.boxes if self.boxes else 1.0
        total = self.detections + self.boxes
        out = {"map50": self.value(), "f1": 2.0 * self.hits / total if total else 1.0, "precision": precision,
               "recall": recall, "detections": self.detections, "true_boxes": self.boxes}
        ap = self.class_ap()
        if len(ap) > 1:
            out["class_ap50"] = {str(c): v for c, v in list(ap.items())[:64]}
        return out


def average_precision(scored: list[tuple[float, bool]], positives: int) -> float:
    """VOC's all-point interpolated AP: the area under the precision-recall curve of ``scored`` (score, hit) pairs
    taken best score first, each precision raised to the best at any higher recall; ``positives`` true boxes."""
    if not scored or positives <= 0:
        return 0.0
    hits = np.array([hit for _, hit in sorted(scored, key=lambda s: -s[0])], bool)
    tp, fp = np.cumsum(hits), np.cumsum(~hits)
    recall = np.concatenate([[0.0], tp / positives, [1.0]])
    precision = np.concatenate([[0.0], tp / (tp + fp), [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1])
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


class TextTruth(TruthScore):
    """Exact-match accuracy of the decoded text against the true text, and the CER: edit distance summed over the
    set, over the true texts' characters."""

    name, gate = "text_accuracy", "text_accuracy_drop_points"

    def __init__(self) -> None:
        self.n = self.same = self.edits = self.chars = 0

    def add(self, decoded, outputs, truth):
        text = decoded.text.text if decoded.text else ""
        self.n += 1
        self.same += int(text == truth.text)
        self.edits += edit_distance(text, truth.text)
        self.chars += len(truth.text)

    def value(self):
        return self.same / self.n if self.n else 1.0

    def details(self):
        return {"text_accuracy": self.value(), "cer": self.edits / max(self.chars, 1), "samples": self.n}


class MaskTruth(TruthScore):
    """mIoU of the map against the true masks, at the map's own size, pooled over the set (each class's summed
    intersections over its summed unions): for a class map, the mean over the classes the truth or the prediction
    marks; for a probability map, the IoU of probability > threshold with the mask's 1s."""

    name, gate = "miou", "miou_drop_points"

    def __init__(self, spec: TaskSpec, output_names: list[str]) -> None:
        self.spec, self.names = spec, output_names
        self.inter: dict[int, int] = {}
        self.union: dict[int, int] = {}

    def add(self, decoded, outputs, truth):
        probs = probabilities(self.spec, outputs, self.names)
        mask = np.asarray(truth.mask)
        if mask.shape != probs.shape[1:]:
            raise CalibrationError(f"{truth.sample}: 'masks' is {list(mask.shape)}; the model's map is "
                                   f"{list(probs.shape[1:])} (a mask is at the map's own size)")
        if self.spec.kind == "probability":
            if mask.size and int(mask.max()) > 1:
                raise CalibrationError(f"{truth.sample}: 'masks' holds {int(mask.max())}; a probability map's mask "
                                       f"is 0/1")
            self._count(1, probs[0] > self.spec.threshold, mask == 1)
            return
        pred = np.argmax(probs, axis=0)
        for c in np.union1d(np.unique(pred), np.unique(mask)).tolist():
            self._count(c, pred == c, mask == c)

    def _count(self, c: int, pred: np.ndarray, true: np.ndarray) -> None:
        self.inter[c] = self.inter.get(c, 0) + int(np.count_nonzero(pred & true))
        self.union[c] = self.union.get(c, 0) + int(np.count_nonzero(pred | true))

    def value(self):
        ious = [self.inter[c] / self.union[c] for c in self.union if self.union[c] > 0]
        return float(np.mean(ious)) if ious else 1.0

    def details(self):
        present = sorted(c for c in self.union if self.union[c] > 0)
        out: dict[str, Any] = {"miou": self.value(), "classes": len(present)}
        if len(present) > 1:
            out["class_iou"] = {str(c): self.inter[c] / self.union[c] for c in present[:64]}
        return out


def truth_score_for(spec: TaskSpec, truths: Truths | None, output_names: list[str]) -> Callable[[], TruthScore] | None:
    """A factory of the scorer of ``spec``'s task against ``truths``, or None when the data carry no truth of the
    task's kind (labels of another task are not read)."""
    if truths is None or truths.kind is not spec.type:
        return None
    if spec.type is TaskType.DETECTION:
        return DetectionTruth
    if spec.type is TaskType.TEXT:
        return TextTruth
    return lambda: MaskTruth(spec, output_names)


def truth_gate(out: dict[str, Any], own: TruthScore, ref: TruthScore,
               int8: bool) -> tuple[str, float, str, float] | None:
    """Record an artifact's score on the truth and its reference's in ``out["details"]`` (``truth``,
    ``reference_truth``). An INT8 artifact is gated by its drop on the truth: the reference's value is set in
    ``out`` and (metric, value, gate key, drop in points) returned. A float artifact (None returned) stays judged
    by its agreement with the golden reference."""
    details = out.setdefault("details", {})
    details["truth"], details["reference_truth"] = own.details(), ref.details()
    if not int8:
        return None
    value, ref_value = own.value(), ref.value()
    out["reference_metric_value"] = ref_value
    return own.name, value, own.gate, 100.0 * (ref_value - value)
