"""Synthetic shapes for the detection sample: coloured circles, squares and triangles on noise (numpy + Pillow only).

    python samples/shapes/data.py OUT_DIR [--hard SHARE]

writes the data ``edgesdk quantize`` and ``edgesdk run`` read (see :func:`write_sets`). With ``--hard``, that share
of the validation and demo images are *hard*: shapes in a colour close to the background's, under heavy noise, which
the detector finds with scores in its uncertain band (what hybrid mode escalates; samples/shapes/hybrid.py).

Every image is drawn from a seed, so the same seed gives the same pixels and boxes on every machine. Originals come
in several sizes and aspect ratios (96x96, 128x128, 160x120, 120x160, 144x96, 100x150) so that the letterbox and
its inverse (boxes mapped back to original pixels) are exercised. Boxes are ``x1, y1, x2, y2`` in the original
image's pixels (pixel edges: a shape covering columns 10..19 has x1 = 10, x2 = 20); shapes never overlap, each is
12..36 pixels wide once letterboxed to the model input.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ["circle", "square", "triangle"]
INPUT_SIZE = (96, 96)  # model input (height, width)
PAD_VALUE = 114  # letterbox border, in pixel units (114/255 after scaling)
ORIGINAL_SIZES = [(96, 96), (128, 128), (160, 120), (120, 160), (144, 96), (100, 150)]  # (width, height)
MIN_SIDE, MAX_SIDE = 12, 36  # shape size range in model-input pixels
MAX_SHAPES = 4
HARD_CONTRAST = (90.0, 150.0)  # a hard image's shapes differ from its background colour by this much (RGB distance)
HARD_NOISE = (40.0, 60.0)  # ... under pixel noise of this standard deviation (an easy image's: 8)


@dataclass(frozen=True)
class Sample:
    """One generated image: ``pixels`` HxWx3 uint8, ``boxes`` [K, 4] float32 (x1, y1, x2, y2), ``classes`` [K];
    ``hard`` when drawn faint under heavy noise."""

    pixels: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    hard: bool = False


@dataclass(frozen=True)
class Letterbox:
    """Where an original image sits in the model input: ``input = original * scale + pad`` on each axis."""

    scale_x: float
    scale_y: float
    pad_x: int
    pad_y: int

    def to_original(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes [K, 4] (x1, y1, x2, y2) in model-input pixels -> original-image pixels."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        return (boxes - self._offset) / self._scale

    def to_input(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes [K, 4] in original-image pixels -> model-input pixels."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        return boxes * self._scale + self._offset

    @property
    def _scale(self) -> np.ndarray:
        return np.array([self.scale_x, self.scale_y, self.scale_x, self.scale_y], dtype=np.float32)

    @property
    def _offset(self) -> np.ndarray:
        return np.array([self.pad_x, self.pad_y, self.pad_x, self.pad_y], dtype=np.float32)


# -- drawing -----------------------------------------------------------------------------------------------------

def make_sample(rng: np.random.Generator, width: int, height: int, hard: bool = False) -> Sample:
    """One image of ``width`` x ``height`` with 1..4 non-overlapping shapes on coloured noise. ``hard``: the shapes'
    colours lie :data:`HARD_CONTRAST` from the background's and the image gets :data:`HARD_NOISE` (an easy image
    draws the same random numbers as before this option existed: the same seed gives the same pixels)."""
    contrast, grain = (rng.uniform(*HARD_CONTRAST), rng.uniform(*HARD_NOISE)) if hard else (None, 8.0)
    base = rng.integers(40, 216, size=3)
    noise = rng.normal(0.0, 40.0, size=(height, width, 3))
    image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    scale = min(INPUT_SIZE[0] / height, INPUT_SIZE[1] / width)  # the letterbox scale of this size
    boxes: list[list[float]] = []
    classes: list[int] = []
    for _ in range(int(rng.integers(1, MAX_SHAPES + 1))):
        for _attempt in range(20):
            side = int(round(rng.uniform(MIN_SIDE, MAX_SIDE) / scale))
            x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            box = [x, y, x + side, y + side]
            if all(_apart(box, other, margin=2) for other in boxes):
                break
        else:
            continue  # no room left for another shape
        kind = int(rng.integers(0, len(CLASSES)))
        color = tuple(int(v) for v in (_vivid(rng, base) if contrast is None else _faint(rng, base, contrast)))
        _draw_shape(draw, kind, box, color)
        boxes.append([float(v) for v in box])
        classes.append(kind)
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0.0, grain, size=(height, width, 3))
    return Sample(np.clip(pixels, 0, 255).astype(np.uint8), np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
                  np.asarray(classes, dtype=np.int64), hard)


def _apart(a: list[float], b: list[float], margin: int) -> bool:
    return a[2] + margin <= b[0] or b[2] + margin <= a[0] or a[3] + margin <= b[1] or b[3] + margin <= a[1]


def _vivid(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A saturated colour that stands out from the background's mean colour."""
    while True:
        color = rng.integers(0, 256, size=3)
        if color.max() - color.min() > 120 and np.abs(color - background).sum() > 150:
            return color


def _faint(rng: np.random.Generator, background: np.ndarray, contrast: float) -> np.ndarray:
    """A colour ``contrast`` away from the background's mean colour in a random direction (clipped to 0..255)."""
    direction = rng.normal(size=3)
    return np.clip(background + direction / max(float(np.linalg.norm(direction)), 1e-6) * contrast, 0, 255)


def _draw_shape(draw: ImageDraw.ImageDraw, kind: int, box: list[int], color: tuple[int, ...]) -> None:
    x1, y1, x2, y2 = box
    name = CLASSES[kind]
    if name == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=color)
    elif name == "square":
        draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=color)
    else:  # an upright triangle touching all four sides of its box
        draw.polygon([(x1, y2 - 1), (x2 - 1, y2 - 1), ((x1 + x2 - 1) / 2, y1)], fill=color)


def make_set(count: int, seed: int, hard: float = 0.0) -> list[Sample]:
    """``count`` images from ``seed``, cycling through :data:`ORIGINAL_SIZES`; a ``hard`` share of them (0..1,
    spread evenly: 0.5 makes every second one hard) are :func:`make_sample`'s hard images."""
    if not 0.0 <= hard <= 1.0:
        raise ValueError(f"hard is a share of the images, in [0, 1]; got {hard}")
    rng = np.random.default_rng(seed)
    return [make_sample(rng, *ORIGINAL_SIZES[i % len(ORIGINAL_SIZES)],
                        hard=math.floor((i + 1) * hard) > math.floor(i * hard)) for i in range(count)]


# -- letterbox ---------------------------------------------------------------------------------------------------

def letterbox(pixels: np.ndarray, size: tuple[int, int] = INPUT_SIZE,
              pad_value: int = PAD_VALUE) -> tuple[np.ndarray, Letterbox]:
    """Fit HxWx3 uint8 ``pixels`` into ``size`` (height, width) keeping its aspect ratio, centred on ``pad_value``.

    Resized with Pillow's bilinear filter to the rounded ``original * scale``; the padding is split with the odd
    pixel at the bottom/right. The same placement as edgesdk's ``resize = "letterbox"`` preprocess, so the model
    is trained on the inputs the device makes."""
    height, width = pixels.shape[:2]
    out_h, out_w = size
    scale = min(out_h / height, out_w / width)
    new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
    resized = Image.fromarray(pixels).resize((new_w, new_h), Image.BILINEAR)
    pad_x, pad_y = (out_w - new_w) // 2, (out_h - new_h) // 2
    canvas = np.full((out_h, out_w, 3), pad_value, dtype=np.uint8)
    canvas[pad_y:pad_y + new_h, pad_x:pad_x + new_w] = np.asarray(resized)
    return canvas, Letterbox(new_w / width, new_h / height, pad_x, pad_y)


def to_input(pixels: np.ndarray) -> tuple[np.ndarray, Letterbox]:
    """An original HxWx3 uint8 image -> the model input [1, 3, H, W] float32 in [0, 1], and its letterbox."""
    boxed, transform = letterbox(pixels)
    return (boxed.astype(np.float32) / 255.0).transpose(2, 0, 1)[None].copy(), transform


def input_batch(samples: list[Sample]) -> tuple[np.ndarray, list[Letterbox]]:
    """Model inputs [N, 3, H, W] of ``samples`` and their letterboxes."""
    pairs = [to_input(s.pixels) for s in samples]
    return np.concatenate([p[0] for p in pairs]), [p[1] for p in pairs]


# -- files -------------------------------------------------------------------------------------------------------

CALIB_SEED, VAL_SEED, DEMO_SEED = 1, 2, 3


def write_sets(out: Path, calib: int = 200, val: int = 100, demo: int = 6, hard: float = 0.0) -> Path:
    """Write what quantize, validation and the demo read, from fixed seeds (different from training's); a ``hard``
    share of the validation and demo images are hard (:func:`make_set`), the calibration images never:

    - ``calib/*.png``: original images (several sizes), the image-folder form of ``--calib``, for a preprocess
      spec that letterboxes; ``calib.npz``: the same images already letterboxed, ``x`` [N, 3, 96, 96] float32;
    - ``val/*.png`` and ``val.json`` (labels: per file its size and ground-truth ``boxes`` x1, y1, x2, y2 in the
      original image's pixels with ``classes`` indices into ``names``, and whether it is ``hard``); ``val.npz``:
      ``x`` letterboxed inputs, ``boxes`` [N, 4, 4] in model-input pixels and ``classes`` [N, 4] (rows past an
      image's shapes are -1);
    - ``demo/*.png``: a few images to run and draw; ``labels.txt``: the class names, one a line (``--labels``).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "labels.txt").write_text("".join(f"{name}\n" for name in CLASSES))
    for name, count, seed in (("calib", calib, CALIB_SEED), ("val", val, VAL_SEED), ("demo", demo, DEMO_SEED)):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        samples = make_set(count, seed, hard=0.0 if name == "calib" else hard)
        labels = {}
        for i, s in enumerate(samples):
            file = f"{name}_{i:04d}.png"
            Image.fromarray(s.pixels).save(folder / file)
            labels[file] = {"size": [int(s.pixels.shape[1]), int(s.pixels.shape[0])], "boxes": s.boxes.tolist(),
                            "classes": s.classes.tolist(), "hard": s.hard}
        if name == "demo":
            continue
        x, transforms = input_batch(samples)
        if name == "calib":
            np.savez_compressed(out / "calib.npz", x=x)
            continue
        (out / "val.json").write_text(json.dumps({"names": CLASSES, "images": labels}, indent=1))
        boxes = np.full((count, MAX_SHAPES, 4), -1.0, dtype=np.float32)
        classes = np.full((count, MAX_SHAPES), -1, dtype=np.int64)
        for i, (s, t) in enumerate(zip(samples, transforms)):
            boxes[i, :len(s.boxes)] = t.to_input(s.boxes)
            classes[i, :len(s.classes)] = s.classes
        np.savez_compressed(out / "val.npz", x=x, boxes=boxes, classes=classes)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write the shapes sample's calibration, validation and demo images.")
    parser.add_argument("out", type=Path, help="the folder to write (made if missing)")
    parser.add_argument("--hard", type=float, default=0.0, metavar="SHARE",
                        help="share of the validation and demo images drawn faint under heavy noise (default 0)")
    args = parser.parse_args()
    if not 0.0 <= args.hard <= 1.0:
        parser.error(f"--hard is a share in [0, 1], got {args.hard}")
    print(write_sets(args.out, hard=args.hard))
