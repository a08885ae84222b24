"""Where the model's pixels lie in the original image: :class:`Transform`, made by the bundle's preprocess (stretch
or letterbox resize) and used to map boxes, points and masks back.

A model input pixel (x, y) came from the original pixel ((x - pad_x) / scale_x, (y - pad_y) / scale_y): a stretch
resize has its own scale per axis and no padding; a letterbox one a single scale and the padding that centres the
image. Inputs given as arrays (no image) get the identity: results stay in model-input pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def input_image_size(shape: tuple[int, ...] | list[int]) -> tuple[int, int] | None:
    """(height, width) of an image-shaped model input: 4-D, channels first ([N, 1|3|4, H, W]) unless the last axis
    holds the channels ([N, H, W, 1|3|4]); None for any other rank or a dynamic (-1) height or width. The device
    (:class:`~edgesdk.bundle.tensors.BundleIO`) and quantize's validation read an input's pixels with this one rule,
    so a decoding that needs the input size (anchors, normalized boxes) behaves the same on both."""
    if len(shape) != 4:
        return None
    channels_first = shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4)
    height, width = (shape[2], shape[3]) if channels_first or shape[3] not in (1, 3, 4) else (shape[1], shape[2])
    return (int(height), int(width)) if min(height, width) >= 1 else None


@dataclass(frozen=True)
class Transform:
    """Model input (``input_size`` = (height, width)) from the original image (``original_size`` = (height,
    width)): scale per axis, then padding (left, top) in input pixels."""

    input_size: tuple[int, int]
    original_size: tuple[int, int]
    scale_x: float = 1.0
    scale_y: float = 1.0
    pad_x: float = 0.0
    pad_y: float = 0.0

    @classmethod
    def identity(cls, height: int, width: int) -> "Transform":
        return cls((int(height), int(width)), (int(height), int(width)))

    @classmethod
    def stretch(cls, original: tuple[int, int], size: tuple[int, int]) -> "Transform":
        """A resize of an ``original`` (h, w) image to ``size`` (h, w), aspect not kept."""
        (oh, ow), (h, w) = original, size
        return cls((h, w), (oh, ow), w / ow, h / oh)

    @classmethod
    def letterbox(cls, original: tuple[int, int], size: tuple[int, int]) -> "Transform":
        """A resize keeping the aspect (one scale, the largest that fits) and centred with padding: the image
        occupies :attr:`content` inside the input."""
        (oh, ow), (h, w) = original, size
        scale = min(w / ow, h / oh)
        nw, nh = max(1, round(ow * scale)), max(1, round(oh * scale))
        return cls((h, w), (oh, ow), nw / ow, nh / oh, float((w - nw) // 2), float((h - nh) // 2))

    @property
    def content(self) -> tuple[int, int, int, int]:
        """(x, y, width, height) of the image inside the input, in input pixels."""
        oh, ow = self.original_size
        return (int(self.pad_x), int(self.pad_y), max(1, round(ow * self.scale_x)), max(1, round(oh * self.scale_y)))

    @property
    def is_identity(self) -> bool:
        return (self.scale_x, self.scale_y, self.pad_x, self.pad_y) == (1.0, 1.0, 0.0, 0.0)

    def points_to_original(self, xy: np.ndarray) -> np.ndarray:
        """``xy`` [..., 2] (x, y in input pixels) in original pixels, clipped to the image."""
        xy = np.asarray(xy, dtype=np.float64)
        oh, ow = self.original_size
        x = np.clip((xy[..., 0] - self.pad_x) / self.scale_x, 0.0, ow)
        y = np.clip((xy[..., 1] - self.pad_y) / self.scale_y, 0.0, oh)
        return np.stack([x, y], axis=-1)

    def boxes_to_original(self, boxes: np.ndarray) -> np.ndarray:
        """``boxes`` [N, 4] (x1, y1, x2, y2 in input pixels) in original pixels, clipped to the image."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        return self.points_to_original(boxes.reshape(-1, 2, 2)).reshape(-1, 4)

    def map_to_original(self, values: np.ndarray, nearest: bool = False) -> np.ndarray:
        """A [H, W] map over the model input (probabilities, class indices or a mask) cropped to the image's part
        and resized to the original size (bilinear for probabilities; ``nearest`` for classes and masks)."""
        from PIL import Image

        values = np.asarray(values)
        x, y, w, h = self.content
        crop = values[y:y + h, x:x + w]
        oh, ow = self.original_size
        if crop.shape == (oh, ow):
            return crop.copy()
        if nearest:
            image = Image.fromarray(crop.astype(np.int32), mode="I").resize((ow, oh), Image.NEAREST)
            return np.asarray(image).astype(values.dtype)
        image = Image.fromarray(crop.astype(np.float32), mode="F").resize((ow, oh), Image.BILINEAR)
        return np.asarray(image, dtype=np.float32)
