"""The shapes detection sample for the tests: its files, its modules loaded from the sample's own sources, and the
detector quantized as the demo does it (the fixtures that build things once are in conftest.py)."""

from __future__ import annotations

import importlib.util
import sys

from support import REPO, quantize

SHAPES = REPO / "samples" / "shapes"
SHAPES_MODEL = SHAPES / "shapes_detector.onnx"
CALIB_IMAGES, VAL_IMAGES = 60, 30  # few: the tests judge decoding and mapping, not the quantizer's best


def load_sample_module(name: str):
    """``samples/shapes/<name>.py`` under a name of its own (``data`` is too common a name to import bare)."""
    spec = importlib.util.spec_from_file_location(f"shapes_sample_{name}", SHAPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def quantize_shapes(out, sets, **options):
    """The detector quantized as the demo does it (task.toml, letterbox preprocess, labels; bundle name shapes),
    with ``sets`` written by data.py's write_sets."""
    from edgesdk.tomlfile import read_toml

    return quantize(SHAPES_MODEL, sets / "calib", out, val=sets / "val", preprocess=SHAPES / "preprocess.toml",
                    labels=sets / "labels.txt", task=read_toml(SHAPES / "task.toml", "task"), samples=CALIB_IMAGES,
                    name="shapes", **options)
