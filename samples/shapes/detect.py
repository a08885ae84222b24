"""The reference decoder of the shapes detector's output, and the F1 it is judged by (numpy only).

The model's one output ``predictions`` is [1, N, 4 + 1 + C] (YOLOv5 rows): cx, cy, w, h in [0, 1] of the model input,
objectness (sigmoid applied), then C class probabilities (softmax applied). A row's score is objectness times its
best class probability; rows under ``score_threshold`` are dropped, then non-maximum suppression per class keeps
the best of boxes overlapping by more than ``iou_threshold``.

    python samples/shapes/detect.py IMAGE.png [MODEL.onnx]   # prints the boxes found (needs onnxruntime)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCORE_THRESHOLD = 0.5
IOU_THRESHOLD = 0.45
MAX_DETECTIONS = 100
MATCH_IOU = 0.5


@dataclass(frozen=True)
class Detections:
    """Boxes [K, 4] (x1, y1, x2, y2), scores [K] and class indices [K], best score first."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray


def decode(predictions: np.ndarray, score_threshold: float = SCORE_THRESHOLD, iou_threshold: float = IOU_THRESHOLD,
           max_detections: int = MAX_DETECTIONS, input_size: tuple[int, int] = (96, 96)) -> Detections:
    """One image's detections (boxes in model-input pixels) from the [1, N, 5 + C] output, whose coordinates are in
    [0, 1] of the ``input_size`` (height, width) input."""
    rows = np.asarray(predictions, dtype=np.float32).reshape(-1, predictions.shape[-1]).copy()
    rows[:, 0:4] *= np.array([input_size[1], input_size[0]] * 2, np.float32)
    probs = rows[:, 5:]
    classes = probs.argmax(axis=1)
    scores = rows[:, 4] * probs[np.arange(len(rows)), classes]
    keep = scores >= score_threshold
    rows, scores, classes = rows[keep], scores[keep], classes[keep]
    cx, cy, w, h = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    kept = nms(boxes, scores, classes, iou_threshold)[:max_detections]
    return Detections(boxes[kept], scores[kept], classes[kept])


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices of the boxes kept by greedy per-class non-maximum suppression, best score first."""
    order = np.argsort(-scores, kind="stable")
    kept: list[int] = []
    suppressed = np.zeros(len(boxes), dtype=bool)
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        kept.append(int(i))
        rest = order[pos + 1:]
        same = rest[(classes[rest] == classes[i]) & ~suppressed[rest]]
        suppressed[same[iou(boxes[i], boxes[same]) > iou_threshold]] = True
    return np.asarray(kept, dtype=np.int64)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of one box [4] with each of ``boxes`` [K, 4]."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def match_counts(found: Detections, boxes: np.ndarray, classes: np.ndarray,
                 match_iou: float = MATCH_IOU) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives) of one image: each detection, best score first, takes the
    unmatched ground-truth box of its class it overlaps most, if that IoU is at least ``match_iou``."""
    taken = np.zeros(len(boxes), dtype=bool)
    tp = 0
    for box, cls in zip(found.boxes, found.classes):
        candidates = np.flatnonzero((classes == cls) & ~taken)
        if len(candidates) == 0:
            continue
        overlaps = iou(box, boxes[candidates])
        best = int(overlaps.argmax())
        if overlaps[best] >= match_iou:
            taken[candidates[best]] = True
            tp += 1
    return tp, len(found.boxes) - tp, len(boxes) - tp


def f1(counts: list[tuple[int, int, int]]) -> tuple[float, float, float]:
    """(F1, precision, recall) over many images' :func:`match_counts`."""
    tp, fp, fn = (sum(c[k] for c in counts) for k in range(3))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return (2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0), precision, recall


def evaluate(outputs: list[np.ndarray], samples: list, transforms: list) -> tuple[float, float, float]:
    """F1, precision, recall of the model ``outputs`` (one [1, N, 5 + C] per sample) against the samples' boxes,
    in original-image pixels (each output decoded, then mapped back through its letterbox)."""
    counts = []
    for out, sample, transform in zip(outputs, samples, transforms):
        found = decode(out)
        found = Detections(transform.to_original(found.boxes), found.scores, found.classes)
        counts.append(match_counts(found, sample.boxes, sample.classes))
    return f1(counts)


def main(image: Path, model: Path) -> None:
    import onnxruntime as ort
    from PIL import Image

    from data import CLASSES, to_input

    pixels = np.asarray(Image.open(image).convert("RGB"))
    x, transform = to_input(pixels)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    found = decode(session.run(None, {session.get_inputs()[0].name: x})[0])
    for box, score, cls in zip(transform.to_original(found.boxes), found.scores, found.classes):
        print(f"{CLASSES[cls]:<8} {score:.3f}  box {' '.join(f'{v:.1f}' for v in box)}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(f"usage: {sys.argv[0]} IMAGE.png [MODEL.onnx]")
    default = Path(__file__).with_name("shapes_detector.onnx")
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) == 3 else default)
