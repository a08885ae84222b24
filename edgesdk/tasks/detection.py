"""Detection decoding: a detector's raw outputs -> :class:`~edgesdk.tasks.results.Detection` boxes in the original
image, in three formats (the task's ``format``):

- ``anchors``: SSD regressors against MediaPipe anchors (BlazeFace). The anchors are MediaPipe's
  ``SsdAnchorsCalculator`` with ``fixed_anchor_size: true`` (every anchor 1 x 1 in normalized units): consecutive
  layers of the same stride share one grid of ``ceil(input / stride)`` cells, each layer adding ``per_layer``
  anchors per cell, centred at ``(x + offset) / grid_width``. A row of ``boxes`` is (x_centre, y_centre, w, h, then
  ``keypoints`` (x, y) pairs) for ``box_order`` xywh, each pair swapped for yxhw; it decodes as MediaPipe's
  ``TensorsToDetectionsCalculator``: ``x = raw_x / box_scale[0] * anchor_w + anchor_x`` (normalized, then times the
  input size), ``w = raw_w / box_scale[2] * anchor_w``. ``scores`` [1, N, C] are logits (``score_activation``
  sigmoid, clipped to [-100, 100] first) with one column per class.
- ``yolo``: ``predictions`` [1, N, 4 + obj + C] (``layout`` rows) or [1, 4 + obj + C, N] (columns, YOLOv8):
  centre x, centre y, width, height in input pixels, then the objectness (``objectness``) and one score per
  class; a box's score is objectness x class probability (the class probability alone without objectness).
- ``boxes``: decoded boxes [1, N, 4] in ``box_format`` (xyxy, yxyx, or xywh = centre x, centre y, width, height),
  in input pixels or ``normalized`` to [0, 1] of the input; ``scores`` [1, N] or [1, N, C]; ``classes`` [1, N]
  optional (class indices; without it, the best score column's index).

Each box keeps its best class (one candidate per row or anchor). Then: score >= ``score_threshold``, boxes with no
area (in the model's pixels, or once mapped to the original image: a box wholly outside it) dropped, non-maximum
suppression per class (a box overlapping a higher-scored one of its class by IoU > ``iou_threshold`` goes), at most
``max_detections``, best first. Boxes and keypoints are mapped to the original image by the transform.
:func:`candidates` gives every candidate before the threshold (hybrid hardness reads their scores).

Box arithmetic is done in float64 with overflow silenced, and a candidate whose box (or keypoints, or class) is not a
number, or lies farther than :data:`SANE_EXTENT` input sizes from the input, is *unreadable*: outputs that are
finite but too large for decoding (a float model fed 3e38) must not read as "nothing there, surely". Those at or over
the score threshold are counted in ``Decoded.unreadable``, which makes the answer maximally uncertain (hardness
``uncertain_share`` 1: hybrid mode escalates it); :func:`unreadable_share` says the same of a cloud's answer, which the
client then refuses (``bad_response``) before anything uses it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .geometry import Transform
from .outputs import label_of, output_name, role_output, shape_error, sigmoid
from .results import Decoded, Detection
from .spec import TaskSpec


SANE_EXTENT = 16  # input sizes: a box coordinate farther from the input than this is no answer
MAX_CLASS_INDEX = 2 ** 31 - 1  # a classes output's values are class indices


@dataclass(frozen=True)
class Candidates:
    """Every box a detector proposes, before the score threshold and NMS, in model-input pixels: ``boxes`` [N, 4]
    (x1, y1, x2, y2, float64), ``scores`` [N] (the best class's score), ``classes`` [N] (its index; -1 where a
    classes output gave no index) and ``keypoints`` [N, K, 2] (x, y) or None. ``readable`` [N]: the box, keypoints and
    class are numbers and the box lies within :data:`SANE_EXTENT` input sizes of the input (all True when the input
    size is not known: finite is all that can be told)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    keypoints: np.ndarray | None = None
    readable: np.ndarray | None = None


def anchor_count(strides: tuple[int, ...], per_layer: int, input_size: tuple[int, int]) -> int:
    """How many anchors :func:`ssd_anchors` makes, computed without making them (a manifest's strides and per-layer
    count are checked against the model's rows with it before any array is allocated)."""
    height, width = input_size
    return sum(math.ceil(height / s) * math.ceil(width / s) * per_layer for s in strides)


def ssd_anchors(strides: tuple[int, ...], per_layer: int, offset: float,
                input_size: tuple[int, int]) -> np.ndarray:
    """MediaPipe's SSD anchor centres (fixed anchor size) for an input of ``input_size`` (height, width): [N, 2]
    (x, y) normalized to [0, 1], in the order the model's rows follow. Made once per parameters and input size
    (read-only: every prediction shares it)."""
    return _ssd_anchors(tuple(int(s) for s in strides), int(per_layer), float(offset),
                        (int(input_size[0]), int(input_size[1])))


@functools.lru_cache(maxsize=16)
def _ssd_anchors(strides: tuple[int, ...], per_layer: int, offset: float, input_size: tuple[int, int]) -> np.ndarray:
    height, width = input_size
    centres = []
    layer = 0
    while layer < len(strides):
        same = layer
        while same < len(strides) and strides[same] == strides[layer]:
            same += 1
        rows, cols = math.ceil(height / strides[layer]), math.ceil(width / strides[layer])
        ys, xs = np.meshgrid((np.arange(rows) + offset) / rows, (np.arange(cols) + offset) / cols, indexing="ij")
        cells = np.stack([xs.ravel(), ys.ravel()], axis=-1)
        centres.append(np.repeat(cells, per_layer * (same - layer), axis=0))
        layer = same
    anchors = np.concatenate(centres).astype(np.float64)
    anchors.flags.writeable = False
    return anchors


def _input_size(transform: Transform | None, why: str) -> tuple[int, int]:
    if transform is None:
        raise InputError(f"task detection with {why} needs the model input's size (height, width) to decode: pass "
                         f"transform=Transform.identity(height, width) when the input is not an image")
    return transform.input_size


def _best_class(spec: TaskSpec, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(score, class) of each row's best class. The arg-max is taken on the raw values and only the best one goes
    through the activation (a sigmoid keeps the order): 25k rows x 80 classes cost one arg-max, not 2M sigmoids."""
    if raw.ndim == 1:
        return _activate(spec, raw), np.zeros(raw.shape[0], dtype=np.int64)
    classes = np.argmax(raw, axis=1)
    return _activate(spec, np.take_along_axis(raw, classes[:, None], axis=1)[:, 0]), classes


def _activate(spec: TaskSpec, values: np.ndarray) -> np.ndarray:
    return sigmoid(values) if spec.score_activation == "sigmoid" else values


def candidate_scores(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str]) -> np.ndarray:
    """The score of every candidate (its best class's), activation applied: what the hardness signal reads (it
    needs no input size, unlike the boxes)."""
    return _scores(spec, outputs, output_names)[0]


def _scores(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores [N], classes [N], the box array [N, D] of the format: regressors, predictions or boxes)."""
    fmt = spec.format
    if fmt == "yolo":
        preds = role_output(spec, outputs, output_names, "predictions", (2,), "[1, N, 4 + obj + C] (layout rows) "
                            "or [1, 4 + obj + C, N] (layout columns)")
        if spec.layout == "columns":
            preds = preds.T
        extra = 1 if spec.objectness else 0
        if preds.shape[1] < 5:  # a box and at least one score (the objectness alone, or one class)
            raise shape_error("predictions", output_name(spec, "predictions"), (1, *preds.shape),
                              f"5 or more values per box (cx, cy, w, h{', objectness' if extra else ''}, class "
                              f"scores) in layout {spec.layout}")
        if not extra:
            scores, classes = _best_class(spec, preds[:, 4:])
        elif preds.shape[1] == 5:
            scores, classes = _activate(spec, preds[:, 4]), np.zeros(preds.shape[0], dtype=np.int64)
        else:
            best, classes = _best_class(spec, preds[:, 5:])
            scores = _activate(spec, preds[:, 4]) * best
        return scores, classes, preds
    boxes = role_output(spec, outputs, output_names, "boxes", (2,), "[1, N, 4]" if fmt == "boxes" else
                        f"[1, N, {4 + 2 * spec.keypoints}] (box, then {spec.keypoints} keypoint pair(s))")
    need = 4 if fmt == "boxes" else 4 + 2 * spec.keypoints
    if boxes.shape[1] != need and not (fmt == "anchors" and boxes.shape[1] > need):
        raise shape_error("boxes", output_name(spec, "boxes"), (1, *boxes.shape), f"[1, N, {need}]")
    raw = role_output(spec, outputs, output_names, "scores", (1, 2), "[1, N] or [1, N, C]")
    if raw.shape[0] != boxes.shape[0]:
        raise shape_error("scores", output_name(spec, "scores"), (1, *raw.shape),
                          f"one row per box: [1, {boxes.shape[0]}] or [1, {boxes.shape[0]}, C] (output "
                          f"{output_name(spec, 'boxes')!r} has {boxes.shape[0]} boxes)")
    scores, classes = _best_class(spec, raw)
    given = role_output(spec, outputs, output_names, "classes", (1,), "[1, N]", optional=True)
    if given is not None:
        if given.shape[0] != boxes.shape[0]:
            raise shape_error("classes", output_name(spec, "classes"), (1, *given.shape), f"[1, {boxes.shape[0]}]")
        index = np.rint(given.astype(np.float64))
        usable = np.isfinite(index) & (index >= 0) & (index <= MAX_CLASS_INDEX)  # else -1: an unreadable candidate
        classes = np.where(usable, index, -1.0).astype(np.int64)
    return scores, classes, boxes


def candidates(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *,
               transform: Transform | None = None) -> Candidates:
    """Every candidate box of the model's outputs, before threshold and NMS, in model-input pixels. ``transform``
    gives the input size, which anchors and normalized boxes need (an :class:`InputError` without it)."""
    scores, classes, values = _scores(spec, outputs, output_names)
    keypoints = None
    with np.errstate(over="ignore", invalid="ignore"):  # finite outputs past what decoding can hold: unreadable
        if spec.format == "anchors":
            height, width = _input_size(transform, "format 'anchors'")
            count = anchor_count(spec.anchors["strides"], spec.anchors["per_layer"], (height, width))
            if count != values.shape[0]:  # counted first: a hostile table must not make millions of anchors
                raise InputError(f"task anchors {{strides: {list(spec.anchors['strides'])}, per_layer: "
                                 f"{spec.anchors['per_layer']}}} give {count} anchors for a {height}x{width} "
                                 f"input, but output {output_name(spec, 'boxes')!r} (role 'boxes') has "
                                 f"{values.shape[0]} rows")
            anchors = ssd_anchors(spec.anchors["strides"], spec.anchors["per_layer"], spec.anchors["offset"],
                                  (height, width))
            sx, sy, sw, sh = spec.box_scale or (width, height, width, height)
            # pairs (x, y) for xywh; (y, x) for yxhw: the same swap for the box centre, its size and the keypoints
            pairs = values[:, :4 + 2 * spec.keypoints].astype(np.float64).reshape(values.shape[0], -1, 2)
            if spec.box_order == "yxhw":
                pairs = pairs[:, :, ::-1]
            size = pairs[:, 1] / (sw, sh)
            points = np.delete(pairs, 1, axis=1) / (sx, sy) + anchors[:, None, :]  # centre, then keypoints
            centre = points[:, 0] * (width, height)
            half = size * (width, height) / 2
            boxes = np.concatenate([centre - half, centre + half], axis=1)
            if spec.keypoints:
                keypoints = points[:, 1:] * (width, height)
        elif spec.format == "yolo":
            coords = values[:, 0:4].astype(np.float64)
            centre, half = coords[:, 0:2], coords[:, 2:4] / 2
            boxes = np.concatenate([centre - half, centre + half], axis=1)
        else:
            boxes = values[:, [1, 0, 3, 2]] if spec.box_format == "yxyx" else values
            boxes = boxes.astype(np.float64)  # a copy
            if spec.box_format == "xywh":
                boxes = np.concatenate([boxes[:, 0:2] - boxes[:, 2:4] / 2, boxes[:, 0:2] + boxes[:, 2:4] / 2],
                                       axis=1)
        if spec.normalized and spec.format != "anchors":  # yolo rows or boxes in [0, 1] of the input
            height, width = _input_size(transform, "normalized boxes")
            boxes = boxes * np.array((width, height, width, height), dtype=np.float64)
        readable = np.isfinite(boxes).all(axis=1) & (classes >= 0)
        if transform is not None:
            reach = SANE_EXTENT * max(transform.input_size)
            readable &= (np.abs(boxes) <= reach).all(axis=1)
        if keypoints is not None:
            readable &= np.isfinite(keypoints).all(axis=(1, 2))
    # a score is a probability: INT8 rounding of an output shared with pixel coordinates can push it past 1
    return Candidates(boxes, np.clip(scores, 0.0, 1.0), classes, keypoints, readable)


def unreadable_share(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *,
                     transform: Transform | None = None) -> tuple[int, int]:
    """(unreadable, candidates) at or over the score threshold: how many candidates that would be detections have a
    box that is no number or lies past :data:`SANE_EXTENT` input sizes, of how many. What the cloud client refuses an
    answer for (anything > 0), with :func:`decode_detection`'s own rule."""
    found = candidates(spec, outputs, output_names, transform=transform)
    passing = found.scores >= spec.score_threshold
    return int(np.count_nonzero(passing & ~found.readable)), int(np.count_nonzero(passing))


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float,
        max_detections: int) -> np.ndarray:
    """Indices of the boxes kept by greedy non-maximum suppression within each class, best score first: a box
    whose IoU with a kept box of its class exceeds ``iou_threshold`` is dropped; at most ``max_detections``."""
    if boxes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    # one pass for every class: each class's boxes shifted to their own region, so boxes of two classes never meet
    span = float(np.max(boxes) - np.min(boxes)) + 1.0
    shifted = boxes - np.min(boxes) + classes[:, None].astype(np.float64) * span
    x1, y1, x2, y2 = shifted.T
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size and len(keep) < max_detections:
        best, rest = order[0], order[1:]
        keep.append(best)
        w = np.clip(np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]), 0.0, None)
        h = np.clip(np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]), 0.0, None)
        inter = w * h
        union = areas[best] + areas[rest] - inter
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def decode_detection(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *,
                     labels: list[str] | None = None, transform: Transform | None = None) -> Decoded:
    """The detections of one prediction, best first, in the original image's pixels (model-input pixels when
    ``transform`` is None)."""
    found = candidates(spec, outputs, output_names, transform=transform)
    boxes = found.boxes
    passing = found.scores >= spec.score_threshold
    unreadable = int(np.count_nonzero(passing & ~found.readable))
    index = np.flatnonzero(passing & found.readable)
    boxes, mapped = boxes[index], boxes[index]
    if transform is not None:  # a box wholly outside the image would become a zero-area box on its edge
        mapped = transform.boxes_to_original(boxes)
    area = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]) & (mapped[:, 2] > mapped[:, 0]) \
        & (mapped[:, 3] > mapped[:, 1])
    index, boxes, mapped = index[area], boxes[area], mapped[area]
    keep = nms(boxes, found.scores[index], found.classes[index], spec.iou_threshold, spec.max_detections)
    index, kept = index[keep], mapped[keep]
    points = found.keypoints[index] if found.keypoints is not None else None
    if transform is not None and points is not None:
        points = transform.points_to_original(points)
    detections = []
    for row, i in enumerate(index):
        class_index = int(found.classes[i])
        keypoints = None if points is None else tuple((float(x), float(y)) for x, y in points[row])
        detections.append(Detection(tuple(float(v) for v in kept[row]), float(found.scores[i]), class_index,
                                    label_of(labels, class_index), keypoints))
    return Decoded(spec.type.value, detections=detections, model_scores=found.scores, unreadable=unreadable)


__all__ = ["Candidates", "SANE_EXTENT", "ssd_anchors", "candidate_scores", "candidates", "unreadable_share", "nms",
           "decode_detection"]
