"""Whether a task's parameters fit the outputs the manifest declares: :func:`shape_problems`, read when the bundle is
opened (:mod:`edgesdk.bundle.schema`), so that a charset, a blank, a keypoint count or a channel count that no
output could match is refused then, naming the parameter and the output's shape, instead of failing every
prediction. A dimension declared dynamic (-1) cannot be told: it is checked when the model answers, by the decoders.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..choices import TaskType
from .segmentation import MAX_CLASSES
from .spec import TaskSpec


def shape_problems(spec: TaskSpec, outputs: Sequence[Mapping[str, Any]]) -> list[str]:
    """What in ``spec`` (resolved against ``outputs``) no output of these declared shapes can satisfy."""
    shapes = {o["name"]: list(o["shape"]) for o in outputs}

    def role(name: str) -> tuple[str, list[int]] | None:
        output = spec.outputs.get(name)
        return (output, shapes[output]) if output in shapes else None

    kind = spec.type
    if kind is TaskType.TEXT:
        return _text(spec, role("logits"))
    if kind is TaskType.DETECTION:
        return _detection(spec, role)
    if kind is TaskType.SEGMENTATION:
        return _segmentation(spec, role("map"))
    if kind is TaskType.LANDMARKS:
        return _landmarks(spec, role("points"))
    return []


def _of(role: str, found: tuple[str, list[int]]) -> str:
    return f"output {found[0]!r} (role {role!r})"


def _text(spec: TaskSpec, found: tuple[str, list[int]] | None) -> list[str]:
    if found is None or len(found[1]) not in (2, 3) or found[1][-1] < 1:
        return []
    classes, shape, where = found[1][-1], found[1], _of("logits", found)
    problems = []
    if spec.blank >= classes:
        problems.append(f"task 'blank' {spec.blank} is not a class of {where}: it has {classes} classes (shape "
                        f"{shape})")
    if spec.charset is not None and len(spec.charset) != classes - 1:
        problems.append(f"task 'charset' has {len(spec.charset)} entries, but {where} has {classes} classes (shape "
                        f"{shape}): the charset lists every class but the blank, so it needs {classes - 1}")
    return problems


def _detection(spec: TaskSpec, role) -> list[str]:
    fmt, problems = spec.format, []
    if fmt == "yolo":
        found = role("predictions")
        if found is not None and len(found[1]) == 3:
            width = found[1][2] if spec.layout == "rows" else found[1][1]
            if 0 <= width < 5:
                problems.append(f"task layout {spec.layout!r} reads {width} values per box from "
                                f"{_of('predictions', found)} (shape {found[1]}); a box needs 5 or more (cx, cy, w, h, "
                                "then scores)")
        return problems
    boxes, scores = role("boxes"), role("scores")
    if boxes is not None and len(boxes[1]) == 3 and boxes[1][2] >= 0:
        width = boxes[1][2]
        if fmt == "anchors" and width < 4 + 2 * spec.keypoints:
            problems.append(f"task 'keypoints' {spec.keypoints} needs {4 + 2 * spec.keypoints} values per row of "
                            f"{_of('boxes', boxes)} (4 for the box, 2 per keypoint); it has {width} (shape "
                            f"{boxes[1]})")
        elif fmt == "boxes" and width != 4:
            problems.append(f"task format 'boxes' reads 4 values per row of {_of('boxes', boxes)}; it has {width} "
                            f"(shape {boxes[1]})")
    if boxes is not None and scores is not None and len(boxes[1]) >= 2 and len(scores[1]) >= 2 \
            and min(boxes[1][1], scores[1][1]) >= 0 and boxes[1][1] != scores[1][1]:
        problems.append(f"task {_of('scores', scores)} has {scores[1][1]} rows (shape {scores[1]}), "
                        f"{_of('boxes', boxes)} {boxes[1][1]} (shape {boxes[1]}): one score row per box")
    return problems


def _segmentation(spec: TaskSpec, found: tuple[str, list[int]] | None) -> list[str]:
    if found is None or len(found[1]) not in (3, 4):
        return []
    shape = found[1]
    if len(shape) == 3:
        channels = 1
    elif spec.channel_axis % 4 == 0:
        return [f"task 'channel_axis' {spec.channel_axis} is the batch axis of {_of('map', found)} (shape {shape}); "
                "the channels are on axis 1 or 3"]
    else:
        channels = shape[spec.channel_axis % 4]
    if channels < 0:
        return []
    if spec.kind == "probability" and channels != 1:
        return [f"task 'kind' 'probability' needs one channel on channel_axis {spec.channel_axis} of "
                f"{_of('map', found)}; it has {channels} (shape {shape})"]
    if spec.kind == "classes" and not 1 <= channels <= MAX_CLASSES:
        return [f"task 'kind' 'classes' takes 1 to {MAX_CLASSES} channels on channel_axis {spec.channel_axis} of "
                f"{_of('map', found)}; it has {channels} (shape {shape})"]
    return []


def _landmarks(spec: TaskSpec, found: tuple[str, list[int]] | None) -> list[str]:
    if found is None:
        return []
    shape = found[1]
    values = shape[1:] if len(shape) >= 2 else shape
    if any(d < 0 for d in values):
        return []
    count = math.prod(values)
    if count == 0 or count % spec.dims:
        return [f"task 'dims' {spec.dims} does not divide the {count} values of {_of('points', found)} (shape "
                f"{shape})"]
    return []


__all__ = ["shape_problems"]
