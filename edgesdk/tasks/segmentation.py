"""Segmentation decoding: a per-pixel map -> masks (:class:`~edgesdk.tasks.results.Mask`) in the original image.

The ``map`` output is [1, C, H, W] with the channels on ``channel_axis`` (1; 3 or -1 for [1, H, W, C]), or
[1, H, W] (one channel). ``activation`` (none, sigmoid, softmax over the channels) makes it probabilities.

- ``kind`` probability: one channel; the mask is probability > ``threshold``. One :class:`Mask` (class 0, empty
  when no pixel passes), its score the mean probability inside it.
- ``kind`` classes: each pixel takes its arg-max channel; one :class:`Mask` per class present (class 0 included:
  what class 0 means is the model's business), its score the mean top-1 value inside it.

The maps are cropped to the image's part of the input and resized to the original size, so ``Decoded.score_map`` is
the probability map (probability; bilinear, :meth:`~edgesdk.tasks.geometry.Transform.map_to_original`) or the label
map (classes; nearest, int8, or int16 past 128 classes) in original pixels. For classes the arg-max is taken at the
model's resolution and only the label map is resized, never the probabilities: each class's area, box and score are
counted from the model's map, each of its pixels weighed by the original pixels it becomes, and the masks share the
one label map (each :attr:`Mask.mask` is made when it is read). So the masks of a large image cost one or two bytes
a pixel whatever the number of classes. They are refused before anything is made when the image has more than
:data:`MAX_MASK_PIXELS` pixels (:class:`InputError`) or when what they need does not fit in what the memory budget
leaves (:class:`BudgetExceeded`, with ``memory_room_mb``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..choices import BudgetReason
from ..errors import BudgetExceeded, InputError
from .geometry import Transform
from .outputs import label_of, output_name, role_output, sigmoid, softmax
from .results import Decoded, Mask
from .spec import TaskSpec

MAX_CLASSES = 4096  # one mask each; a map with more channels is not a class map
# Masks (and the probability or label map) are made in the original image's pixels: at most this many, read at each
# call so an app raises it by setting it (as edgesdk.bundle.tensors.MAX_IMAGE_PIXELS, which it equals by default).
MAX_MASK_PIXELS = 50_000_000
# What one original pixel costs while the masks are made: the bilinear probability map (Pillow's image and its numpy
# copy, float32) and the mask; for classes, the label map and one mask read from it.
PROBABILITY_BYTES_PER_PIXEL = 9
_MB = 1024 * 1024


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
                        labels: list[str] | None = None, transform: Transform | None = None,
                        memory_room_mb: Callable[[], float] | None = None) -> Decoded:
    """The masks of one prediction, in the original image's pixels (model-input pixels without ``transform``).
    ``memory_room_mb()``: what the memory budget leaves now, in MB (None: no budget)."""
    probs = probabilities(spec, outputs, output_names)
    if transform is None:
        transform = Transform.identity(*probs.shape[1:])
    elif tuple(transform.input_size) != probs.shape[1:]:
        # a map at a lower resolution than the input (a stride-4 head): scale it to the input first
        transform = _scaled(transform, probs.shape[1:])
    label_type = np.int8 if probs.shape[0] <= 128 else np.int16
    per_pixel = PROBABILITY_BYTES_PER_PIXEL if spec.kind == "probability" else np.dtype(label_type).itemsize + 1
    _check_room(transform.original_size, per_pixel, memory_room_mb)
    if spec.kind == "probability":
        prob = transform.map_to_original(probs[0])
        mask = prob > spec.threshold
        score = float(prob[mask].mean()) if mask.any() else 0.0
        return Decoded(spec.type.value, masks=[Mask(mask, 0, label_of(labels, 0), score)], score_map=prob,
                       model_scores=probs)
    x, y, w, h = transform.content
    classes = np.argmax(probs, axis=0)[y:y + h, x:x + w]  # the model's pixels that hold the image
    top = np.max(probs, axis=0)[y:y + h, x:x + w]
    (oh, ow), (h, w) = transform.original_size, classes.shape
    rows, cols = _nearest(h, oh), _nearest(w, ow)  # the model pixel each original row and column comes from
    label_map = np.take(np.take(classes.astype(label_type), rows, axis=0), cols, axis=1)
    # what each model pixel becomes: the original pixels it is copied to (0 for one no original pixel comes from)
    weight = np.bincount(rows, minlength=h)[:, None] * np.bincount(cols, minlength=w)[None, :]
    flat, count = classes.ravel(), probs.shape[0]
    area = np.bincount(flat, weights=weight.ravel(), minlength=count)
    score = np.bincount(flat, weights=(top * weight).ravel(), minlength=count)
    boxes = _boxes(classes, weight > 0, rows, cols, count)
    masks = [Mask(None, int(k), label_of(labels, int(k)), float(score[k] / area[k]), labels=label_map,
                  area=int(round(area[k])), box=boxes[k]) for k in np.flatnonzero(area > 0)]
    return Decoded(spec.type.value, masks=masks, score_map=label_map, model_scores=probs)


def _check_room(size: tuple[int, int], per_pixel: float, memory_room_mb: Callable[[], float] | None) -> None:
    """Refuse masks over :data:`MAX_MASK_PIXELS`, or that need more than the memory budget leaves, before any is
    made."""
    oh, ow = size
    if oh * ow > MAX_MASK_PIXELS:
        raise InputError(f"masks of a {ow}x{oh} image are {oh * ow} pixels; more than {MAX_MASK_PIXELS} is refused "
                         f"(edgesdk.tasks.segmentation.MAX_MASK_PIXELS)")
    needed = oh * ow * per_pixel / _MB
    if memory_room_mb is not None and needed > 1.0:  # small masks cost less than measuring the RSS
        room = memory_room_mb()
        if needed > room:
            raise BudgetExceeded(BudgetReason.MEMORY,
                                 f"masks of a {ow}x{oh} image need ~{needed:.1f} MB; the memory budget "
                                 f"leaves {max(room, 0.0):.1f} MB",
                                 needed=round(needed, 2), available=round(max(room, 0.0), 2))


def _nearest(source: int, size: int) -> np.ndarray:
    """For each of ``size`` pixels along an axis resized from ``source``: the source pixel nearest its centre."""
    return np.minimum(((np.arange(size) + 0.5) * (source / size)).astype(np.intp), source - 1)


def _boxes(classes: np.ndarray, seen: np.ndarray, rows: np.ndarray, cols: np.ndarray,
           count: int) -> list[tuple[int, int, int, int] | None]:
    """Each class's box (x1, y1, x2, y2) in original pixels, from the model pixels of that class that reach the
    original (``seen``): the original rows and columns copied from its first and last such row and column."""
    ys, xs = np.nonzero(seen)
    ks = classes[ys, xs]
    big = np.iinfo(np.intp).max
    low_y, low_x = np.full(count, big, np.intp), np.full(count, big, np.intp)
    high_y, high_x = np.full(count, -1, np.intp), np.full(count, -1, np.intp)
    np.minimum.at(low_y, ks, ys)
    np.minimum.at(low_x, ks, xs)
    np.maximum.at(high_y, ks, ys)
    np.maximum.at(high_x, ks, xs)
    # the original rows copied from model row i are a run: [searchsorted(rows, i), searchsorted(rows, i, right))
    y1, y2 = np.searchsorted(rows, low_y.clip(0, None)), np.searchsorted(rows, high_y, side="right")
    x1, x2 = np.searchsorted(cols, low_x.clip(0, None)), np.searchsorted(cols, high_x, side="right")
    return [(int(x1[k]), int(y1[k]), int(x2[k]), int(y2[k])) if high_y[k] >= 0 else None for k in range(count)]


def _scaled(transform: Transform, size: tuple[int, int]) -> Transform:
    """``transform`` for a map of ``size`` (h, w) over the same input: its scales and padding times the ratio."""
    (h, w), (ih, iw) = size, transform.input_size
    fx, fy = w / iw, h / ih
    return Transform((int(h), int(w)), transform.original_size, transform.scale_x * fx, transform.scale_y * fy,
                     transform.pad_x * fx, transform.pad_y * fy)


__all__ = ["MAX_CLASSES", "MAX_MASK_PIXELS", "probabilities", "decode_segmentation"]
