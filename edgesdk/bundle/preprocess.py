"""Image preprocessing, declared once and applied identically everywhere.

The same :class:`Preprocess` object (stored in the bundle manifest) turns an image
into a model input during calibration, during validation and on the device, so
the INT8 ranges measured at quantize time are the ranges seen in production.

``value = (pixel * scale - mean) / std``, per channel, after resizing to ``size``
and converting to ``color``; ``layout`` places the channel axis; a batch axis of 1
is added in front.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..tomlfile import read_toml


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".pgm", ".ppm")
_RESAMPLE = ("bilinear", "nearest", "bicubic")


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
        if not _is_number(self.scale) or not math.isfinite(self.scale) or self.scale == 0:
            raise InputError(f"preprocess 'scale' must be a finite non-zero number, got {self.scale!r}")
        for key in ("mean", "std"):
            value = getattr(self, key)
            values = tuple(value) if _is_seq(value) else (value,)
            if not all(_is_number(v) and math.isfinite(v) for v in values):
                raise InputError(f"preprocess '{key}' must be a number or a list of numbers, got {value!r}")
            values = tuple(float(v) for v in values)
            if len(values) not in (1, self.channels):
                raise InputError(
                    f"preprocess '{key}' has {len(values)} values; color {self.color!r} has {self.channels} channel(s)"
                )
            if key == "std" and any(v == 0 for v in values):
                raise InputError("preprocess 'std' must not contain 0")
            object.__setattr__(self, key, values)

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
        known = ("size", "color", "layout", "scale", "mean", "std", "resample", "dtype", "extra")
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
        if not data["extra"]:
            del data["extra"]
        return data

    # -- application --------------------------------------------------------
    def __call__(self, image: Any) -> np.ndarray:
        """Turn a path, a PIL image or an HxW / HxWxC uint8 array into a batched float32 input."""
        pil = _to_pil(image)
        try:
            pil = pil.convert("RGB" if self.color == "rgb" else "L")
        except (OSError, ValueError) as exc:  # a truncated image handed over as an open PIL object
            raise InputError(f"image cannot be decoded: {exc}") from exc
        if pil.size[0] * pil.size[1] == 0:
            raise InputError(f"image is {pil.size[0]}x{pil.size[1]} pixels: empty")
        h, w = self.size
        if pil.size != (w, h):
            from PIL import Image

            method = {"bilinear": Image.BILINEAR, "nearest": Image.NEAREST, "bicubic": Image.BICUBIC}[self.resample]
            pil = pil.resize((w, h), method)
        arr = np.asarray(pil, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        arr = (arr * np.float32(self.scale) - mean) / std
        if self.layout == "nchw":
            arr = arr.transpose(2, 0, 1)
        return np.ascontiguousarray(arr[None], dtype=np.float32)


def _is_seq(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
