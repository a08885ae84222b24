"""Segmentation decoding: a per-pixel map -> masks (:class:`~edgesdk.tasks.results.Mask`) in the original image.

The ``map`` output is [1, C, H, W] with the channels on ``channel_axis`` (1; 3 or -1 for [1, H, W, C]), or
[1, H, W] (one channel). ``activation`` (none, sigmoid, softmax over the channels) makes it probabilities.

- ``kind`` probability: one channel; the mask is probability > ``threshold``. One :class:`Mask` (class 0, empty
  when no pixel passes), its score the mean probability inside it.
- ``kind`` classes: each pixel takes its arg-max channel; one :class:`Mask` per class present (class 0 included:
  what class 0 means is the model's business), its score the mean top-1 value inside it.

The maps are cropped to the image's part of the input and resized to the original size
(:meth:`~edgesdk.tasks.geometry.Transform.map_to_original`: bilinear for probabilities, nearest for classes), so
``Decoded.score_map`` is the probability map (probability) or the class map (classes) in original pixels.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .geometry import Transform
from .outputs import label_of, output_name, role_output, sigmoid, softmax
from .results import Decoded, Mask
from .spec import TaskSpec

MAX_CLASSES = 4096  # one mask each; a map with more channels is not a class map


def probabilities(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str]) -> np.ndarray:
    """The ``map`` output as [C, H, W] over the model input, the task's activation applied."""
    values = role_output(spec, outputs, output_names, "map", (2, 3), "[1, C, H, W] (channels on channel_axis), "
                         "[1, H, W, C] with channel_axis 3, or [1, H, W]")
    if values.ndim == 2:
        values = values[None]
    else:
        axis = spec.channel_axis % 4
        if axis == 0:
            raise InputError(f"task 'channel_axis' {spec.channel_axis} is the batch axis of output "
                             f"{output_name(spec, 'map')!r} (role 'map'); the channels are on axis 1 or 3")
        values = np.moveaxis(values, axis - 1, 0)
    name = output_name(spec, "map")
    if spec.kind == "probability" and values.shape[0] != 1:
        raise InputError(f"task role 'map' (output {name!r}) has {values.shape[0]} channels on channel_axis "
                         f"{spec.channel_axis} (shape {list(values.shape)} without the batch axis); kind "
                         f"'probability' needs one (is channel_axis right? kind 'classes' takes the arg-max)")
    if spec.kind == "classes" and not 1 <= values.shape[0] <= MAX_CLASSES:
        raise InputError(f"task role 'map' (output {name!r}) has {values.shape[0]} channels on channel_axis "
                         f"{spec.channel_axis}; kind 'classes' takes 1 to {MAX_CLASSES}")
    if spec.activation == "sigmoid":
        return sigmoid(values)
    if spec.activation == "softmax":
        if values.shape[0] == 1:
            raise InputError(f"task activation 'softmax' over the one channel of output {name!r} (role 'map') "
                             f"is 1 everywhere; use 'sigmoid' for a one-channel map")
        return softmax(values, axis=0)
    return values


def decode_segmentation(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], *,
                        labels: list[str] | None = None, transform: Transform | None = None) -> Decoded:
    """The masks of one prediction, in the original image's pixels (model-input pixels without ``transform``)."""
    probs = probabilities(spec, outputs, output_names)
    if transform is not None and tuple(transform.input_size) != probs.shape[1:]:
        # a map at a lower resolution than the input (a stride-4 head): scale it to the input first
        transform = _scaled(transform, probs.shape[1:])
    if spec.kind == "probability":
        prob = probs[0]
        if transform is not None:
            prob = transform.map_to_original(prob)
        mask = prob > spec.threshold
        score = float(prob[mask].mean()) if mask.any() else 0.0
        return Decoded(spec.type.value, masks=[Mask(mask, 0, label_of(labels, 0), score)], score_map=prob,
                       model_scores=probs)
    classes = np.argmax(probs, axis=0)
    top = np.max(probs, axis=0)
    if transform is not None:
        classes = transform.map_to_original(classes, nearest=True)
        top = transform.map_to_original(top)
    masks = []
    for index in np.unique(classes):
        mask = classes == index
        masks.append(Mask(mask, int(index), label_of(labels, int(index)), float(top[mask].mean())))
    return Decoded(spec.type.value, masks=masks, score_map=classes, model_scores=probs)


def _scaled(transform: Transform, size: tuple[int, int]) -> Transform:
    """``transform`` for a map of ``size`` (h, w) over the same input: its scales and padding times the ratio."""
    (h, w), (ih, iw) = size, transform.input_size
    fx, fy = w / iw, h / ih
    return Transform((int(h), int(w)), transform.original_size, transform.scale_x * fx, transform.scale_y * fy,
                     transform.pad_x * fx, transform.pad_y * fy)


__all__ = ["MAX_CLASSES", "probabilities", "decode_segmentation"]
