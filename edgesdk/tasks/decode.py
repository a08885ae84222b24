"""Decoding by task: :func:`decode` turns one prediction's raw outputs into a :class:`~edgesdk.tasks.results.Decoded`
by the bundle's task. Detection, segmentation and text have their own modules; the small tasks are here:

- classification: ``values`` = the class probabilities (softmax applied when the task says; top-k is the
  caller's).
- landmarks: ``points`` [1, P * dims] or [1, P, dims] (any shape with the batch axis first: [1, 1, 1, P * dims]
  too), in model-input pixels or ``normalized`` to [0, 1] of the input (x and z times the input width, y times its
  height); x and y are mapped to the original image, z scaled as x. ``visibility`` [1, P] optional (sigmoid when
  ``visibility_activation`` says). An output without a role (a landmark model's presence score) is not read.
- regression, probability: ``values`` = the output flattened.
- embedding: ``embedding`` = the output flattened, L2-normalized when ``normalize`` (a zero vector stays zero).
- raw: nothing decoded.

Outputs come as the engine gives them, batch axis included (batch 1). Coordinates are in the original image's
pixels through ``transform`` (the bundle's preprocess), in model-input pixels without one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..choices import TaskType
from ..errors import InputError
from .detection import decode_detection
from .geometry import Transform
from .outputs import output_name, role_output, shape_error, sigmoid, softmax
from .results import Decoded, Landmarks
from .segmentation import decode_segmentation
from .spec import TaskSpec
from .text import decode_text


def decode(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *, labels: list[str] | None = None,
           transform: Transform | None = None, memory_room_mb: Callable[[], float] | None = None) -> Decoded:
    """One prediction decoded by ``spec`` (resolved: every required role names one of ``output_names``).
    ``outputs`` are in the order of ``output_names``. ``labels`` name classes (detection, segmentation);
    ``transform`` maps model-input pixels to the original image, and gives the input size that anchors and
    normalized coordinates need (``Transform.identity(h, w)`` for an input that is not an image).
    ``memory_room_mb()`` says what the memory budget leaves now, in MB (None: no budget): masks that need more are
    refused (:class:`~edgesdk.errors.BudgetExceeded`). A role whose output does not fit is an :class:`InputError`
    naming the role, the output and its shape."""
    if len(outputs) != len(output_names):
        raise InputError(f"decode got {len(outputs)} output(s) for {len(output_names)} name(s) "
                         f"({', '.join(output_names)})")
    kind = spec.type
    if kind is TaskType.DETECTION:
        return decode_detection(spec, outputs, output_names, labels=labels, transform=transform)
    if kind is TaskType.SEGMENTATION:
        return decode_segmentation(spec, outputs, output_names, labels=labels, transform=transform,
                                   memory_room_mb=memory_room_mb)
    if kind is TaskType.TEXT:
        return decode_text(spec, outputs, output_names)
    if kind is TaskType.LANDMARKS:
        return decode_landmarks(spec, outputs, output_names, transform=transform)
    if kind is TaskType.CLASSIFICATION:
        scores = _flat(spec, outputs, output_names, "scores")
        return Decoded(kind.value, values=softmax(scores) if spec.softmax else scores)
    if kind in (TaskType.REGRESSION, TaskType.PROBABILITY):
        return Decoded(kind.value, values=_flat(spec, outputs, output_names, "values"))
    if kind is TaskType.EMBEDDING:
        vector = _flat(spec, outputs, output_names, "embedding")
        norm = float(np.linalg.norm(vector))
        if spec.normalize and norm > 0:
            vector = vector / norm
        return Decoded(kind.value, embedding=vector)
    return Decoded(kind.value)


def _flat(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], role: str) -> np.ndarray:
    """The output playing ``role`` as one float64 vector (its batch axis, when it has one, must be 1)."""
    values = _any_rank(spec, outputs, output_names, role, "[1, ...] (batch 1)")
    if values.size == 0:
        raise shape_error(role, output_name(spec, role), np.shape(outputs[spec.output_index(role, output_names)]),
                          "at least one value")
    return values.reshape(-1).astype(np.float64)


def _any_rank(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], role: str,
              need: str) -> np.ndarray:
    """The output playing ``role`` whatever its rank: its first axis is the batch (1) when it has two or more, a
    vector or a scalar is taken as it is."""
    index = spec.output_index(role, output_names)
    rank = np.ndim(outputs[index]) if index is not None and index < len(outputs) else 1
    if rank >= 2:
        return role_output(spec, outputs, output_names, role, (rank - 1,), need)
    return role_output(spec, outputs, output_names, role, (rank,), need, unbatched=True)


def decode_landmarks(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *,
                     transform: Transform | None = None) -> Decoded:
    """The points of one prediction, [P, dims], in the original image's pixels (model-input pixels without
    ``transform``)."""
    dims, name = spec.dims, output_name(spec, "points")
    flat = _any_rank(spec, outputs, output_names, "points", f"[1, P * {dims}] or [1, P, {dims}]").reshape(-1)
    if flat.size == 0 or flat.size % dims:
        shape = np.shape(outputs[spec.output_index("points", output_names)])
        raise shape_error("points", name, shape, f"P points of {dims} values each ([1, P * {dims}] or "
                          f"[1, P, {dims}]): its {flat.size} values are not a multiple of {dims}")
    points = flat.reshape(-1, dims).copy()
    if spec.coordinates == "normalized":
        if transform is None:
            raise InputError("task landmarks with coordinates 'normalized' needs the model input's size (height, "
                             "width) to decode: pass transform=Transform.identity(height, width) when the input "
                             "is not an image")
        height, width = transform.input_size
        points *= (width, height, width)[:dims]
    if transform is not None:
        points[:, :2] = transform.points_to_original(points[:, :2])
        if dims == 3:
            points[:, 2] /= transform.scale_x
    visibility = None
    if spec.output_index("visibility", output_names) is not None:
        visibility = _any_rank(spec, outputs, output_names, "visibility", f"[1, {points.shape[0]}]").reshape(-1)
        if visibility.size != points.shape[0]:
            raise shape_error("visibility", output_name(spec, "visibility"),
                              np.shape(outputs[spec.output_index("visibility", output_names)]),
                              f"one value per point: [1, {points.shape[0]}] (output {name!r} has "
                              f"{points.shape[0]} points)")
        if spec.visibility_activation == "sigmoid":
            visibility = sigmoid(visibility)
    presence = None
    if spec.output_index("presence", output_names) is not None:
        score = _any_rank(spec, outputs, output_names, "presence", "[1, 1] (one score)").reshape(-1)
        if score.size != 1:
            raise shape_error("presence", output_name(spec, "presence"),
                              np.shape(outputs[spec.output_index("presence", output_names)]), "one score: [1, 1]")
        presence = float(sigmoid(score)[0] if spec.presence_activation == "sigmoid" else score[0])
    return Decoded(spec.type.value, landmarks=Landmarks(points, visibility, presence))


__all__ = ["decode", "decode_landmarks"]
