"""Image preprocessing, declared once and applied identically everywhere.

The same :class:`Preprocess` object (stored in the bundle manifest) turns an image
into a model input during calibration, during validation and on the device, so
the INT8 ranges measured at quantize time are the ranges seen in production.

``value = (pixel * scale - mean) / std``, per channel, after resizing to ``size``
and converting to ``color``; ``layout`` places the channel axis; a batch axis of 1
is added in front.

``resize`` says how the image reaches ``size``: ``"stretch"`` (each axis on its own,
the aspect not kept) or ``"letterbox"`` (one scale, the largest that fits, the image
centred and the rest filled with ``pad_value``, a pixel in the image's 0-255 scale,
so the padding goes through the formula like any grey pixel the model was trained
with). :meth:`Preprocess.apply` also returns the :class:`~edgesdk.tasks.geometry.Transform`
of that resize, which maps the model's boxes, points and masks back to the image.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..numbers import is_number
from ..tasks.geometry import Transform
from ..tomlfile import read_toml


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".pgm", ".ppm")
_RESAMPLE = ("bilinear", "nearest", "bicubic")
_RESIZE = ("stretch", "letterbox")
_PAD_DEFAULT = (114.0,)  # the grey YOLO-family detectors are trained with


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes a model input (see module docstring for the formula)."""

    size: tuple[int, int]
    color: str = "rgb"
    layout: str = "nchw"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    resample: str = "bilinear"
    resize: str = "stretch"
    pad_value: tuple[float, ...] = _PAD_DEFAULT
    dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ints = _is_seq(self.size) and all(isinstance(v, int) and not isinstance(v, bool) for v in self.size)
        if not ints or len(self.size) != 2 or min(self.size) < 1:
            raise InputError(f"preprocess 'size' must be [height, width] of positive ints, got {self.size!r}")
        object.__setattr__(self, "size", tuple(self.size))
        if self.color not in ("rgb", "gray"):
            raise InputError(f"preprocess 'color' must be 'rgb' or 'gray', got {self.color!r}")
        if self.layout not in ("nchw", "nhwc"):
            raise InputError(f"preprocess 'layout' must be 'nchw' or 'nhwc', got {self.layout!r}")
        if self.resample not in _RESAMPLE:
            raise InputError(f"preprocess 'resample' must be one of {', '.join(_RESAMPLE)}, got {self.resample!r}")
        if self.dtype != "float32":
            raise InputError(f"preprocess 'dtype' must be 'float32', got {self.dtype!r}")
        if not is_number(self.scale) or self.scale == 0:
            raise InputError(f"preprocess 'scale' must be a finite non-zero number, got {self.scale!r}")
        for key in ("mean", "std"):
            value = getattr(self, key)
            values = tuple(value) if _is_seq(value) else (value,)
            if not all(is_number(v) for v in values):
                raise InputError(f"preprocess '{key}' must be a number or a list of numbers, got {value!r}")
            values = tuple(float(v) for v in values)
            if len(values) not in (1, self.channels):
                raise InputError(
                    f"preprocess '{key}' has {len(values)} values; color {self.color!r} has {self.channels} channel(s)"
                )
            if key == "std" and any(v == 0 for v in values):
                raise InputError("preprocess 'std' must not contain 0")
            object.__setattr__(self, key, values)
        if self.resize not in _RESIZE:
            raise InputError(f"preprocess 'resize' must be one of {', '.join(_RESIZE)}, got {self.resize!r}")
        pad = tuple(self.pad_value) if _is_seq(self.pad_value) else (self.pad_value,)
        if not pad or not all(is_number(v) and 0 <= v <= 255 for v in pad):
            raise InputError(f"preprocess 'pad_value' must be a pixel value in [0, 255] or a list of them, "
                             f"got {self.pad_value!r}")
        if len(pad) not in (1, self.channels):
            raise InputError(f"preprocess 'pad_value' has {len(pad)} values; color {self.color!r} has "
                             f"{self.channels} channel(s)")
        pad = tuple(float(v) for v in pad)
        if self.resize == "stretch" and pad != _PAD_DEFAULT:  # a forgotten resize key would stretch silently
            raise InputError(f"preprocess 'pad_value' {list(pad)} needs resize = \"letterbox\" (a stretch "
                             f"resize has no padding)")
        object.__setattr__(self, "pad_value", pad)

    @property
    def channels(self) -> int:
        return 3 if self.color == "rgb" else 1

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        h, w = self.size
        c = self.channels
        return (1, c, h, w) if self.layout == "nchw" else (1, h, w, c)

    def problems_making(self, shape: list[int], max_pixels: int, raise_with: str) -> list[str]:
        """Why this spec cannot make a model input of ``shape`` (a manifest's ``inputs[0].shape``, -1 for a dynamic
        dimension): a fixed height, width or channel count it does not make, or more than ``max_pixels`` pixels
        (the resized image is allocated before an engine could refuse it; ``raise_with`` names how to raise that)."""
        (h, w), problems = self.size, []
        if h * w > max_pixels:
            problems.append(f"preprocess.size {[h, w]} is {h * w} pixels, over the limit of {max_pixels} "
                            f"(${raise_with} raises it)")
        if len(shape) != 4:
            return problems + [f"preprocess makes a 4-dimensional input ({self.layout}), but inputs[0].shape is "
                               f"{list(shape)}"]
        c_axis, h_axis, w_axis = (1, 2, 3) if self.layout == "nchw" else (3, 1, 2)
        if -1 != shape[h_axis] != h or -1 != shape[w_axis] != w:
            problems.append(f"preprocess.size {[h, w]} must be the height and width of inputs[0].shape "
                            f"{list(shape)} ({self.layout})")
        if -1 != shape[c_axis] != self.channels:
            problems.append(f"preprocess.color \"{self.color}\" makes {self.channels} channel(s); inputs[0].shape "
                            f"{list(shape)} ({self.layout}) has {shape[c_axis]}")
        return problems

    # -- construction -------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Preprocess":
        """Build from a mapping; unknown keys are refused (a typo would silently change every input).

        Free-form notes for the app, which edgesdk does not apply, go in an ``extra`` table.
        """
        if not isinstance(data, dict):
            raise InputError(f"preprocess must be a table of keys, got {type(data).__name__}")
        known = ("size", "color", "layout", "scale", "mean", "std", "resample", "resize", "pad_value", "dtype",
                 "extra")
        unknown = [k for k in data if k not in known]
        if unknown:
            raise InputError(f"preprocess has unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
        if "size" not in data:
            raise InputError("preprocess needs 'size = [height, width]'")
        if not isinstance(data.get("extra", {}), dict):
            raise InputError("preprocess 'extra' must be a table")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> "Preprocess":
        data = read_toml(path, "preprocess")
        # Accept both a flat file and one with a [preprocess] table.
        return cls.from_dict(data.get("preprocess", data))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["size"] = list(self.size)
        data["mean"] = list(self.mean)
        data["std"] = list(self.std)
        data["pad_value"] = list(self.pad_value)
        # Keys at their default are left out, so a manifest written before they existed reads back byte-identical.
        if self.resize == "stretch":
            del data["resize"]
        if self.pad_value == _PAD_DEFAULT:
            del data["pad_value"]
        if not data["extra"]:
            del data["extra"]
        return data

    # -- application --------------------------------------------------------
    def __call__(self, image: Any) -> np.ndarray:
        """Turn a path, a PIL image or an HxW / HxWxC uint8 array into a batched float32 input (:meth:`apply`'s
        array, without its transform)."""
        return self.apply(image)[0]

    def apply(self, image: Any) -> tuple[np.ndarray, Transform]:
        """The batched float32 input made from ``image`` and the :class:`Transform` from the image's pixels to the
        input's (stretch or letterbox, per ``resize``): the image is resized to exactly the transform's ``content``
        rectangle, so mapping a result back through it is exact."""
        pil = _to_pil(image)
        try:
            pil = pil.convert("RGB" if self.color == "rgb" else "L")
        except (OSError, ValueError) as exc:  # a truncated image handed over as an open PIL object
            raise InputError(f"image cannot be decoded: {exc}") from exc
        if pil.size[0] * pil.size[1] == 0:
            raise InputError(f"image is {pil.size[0]}x{pil.size[1]} pixels: empty")
        original = (pil.size[1], pil.size[0])
        fit = Transform.letterbox if self.resize == "letterbox" else Transform.stretch
        transform = fit(original, self.size)
        x, y, w, h = transform.content
        if pil.size != (w, h):
            from PIL import Image

            method = {"bilinear": Image.BILINEAR, "nearest": Image.NEAREST, "bicubic": Image.BICUBIC}[self.resample]
            pil = pil.resize((w, h), method)
        arr = np.asarray(pil, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if (w, h) != (self.size[1], self.size[0]):  # letterboxed: the pad pixels go through the formula too
            canvas = np.empty((*self.size, self.channels), dtype=np.float32)
            canvas[...] = np.asarray(self.pad_value, dtype=np.float32)
            canvas[y:y + h, x:x + w] = arr
            arr = canvas
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        arr = (arr * np.float32(self.scale) - mean) / std
        if self.layout == "nchw":
            arr = arr.transpose(2, 0, 1)
        return np.ascontiguousarray(arr[None], dtype=np.float32), transform


def _is_seq(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _to_pil(image: Any):
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, (str, Path)):
        from .tensors import RegularFile  # a regular file, size-capped, opened without blocking (a FIFO waits)

        try:
            with RegularFile(Path(image), "image") as file, Image.open(file) as img:
                img.load()
                return img.copy()
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise InputError(f"{image} is not a readable image: {exc}") from exc
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
            raise InputError(
                f"an image array must be uint8 HxW or HxWxC (C in 1, 3, 4); got {image.dtype} {image.shape}"
            )
        return Image.fromarray(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    raise InputError(f"cannot read an image from {type(image).__name__}; pass a path, a PIL image or a uint8 array")
