"""Export scikit-learn's handwritten digits (shipped inside the package, no download) to image folders.

    python samples/digits/export_images.py OUT_DIR

writes OUT_DIR/train/<digit>/*.png and OUT_DIR/val/<digit>/*.png (70/30 split,
stratified, fixed seed): the image-folder layout `edgesdk quantize --calib` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

SPLIT_SEED = 0
VAL_FRACTION = 0.3


def export(out: Path) -> Path:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    idx = np.arange(len(images))
    train, val = train_test_split(idx, test_size=VAL_FRACTION, random_state=SPLIT_SEED, stratify=digits.target)
    for split, indices in (("train", train), ("val", val)):
        for i in indices:
            folder = out / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i], mode="L").save(folder / f"{i:04d}.png")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    print(export(Path(sys.argv[1])))
