"""Session fixtures: the digits images, and bundles built once and shared by many tests.

Every bundle here is built with the real converters (litert-torch, AI Edge Quantizer,
NNCF, onnxruntime.quantization); tests that alter a bundle work on a copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from support import (DIGITS, DIGITS_ONNX, DIGITS_PT2, DIGITS_TOML, SMALL_PER_CLASS, digits_pixels_to_input, quantize,
                     tiny_cnn)


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """Autotune decisions and memory costs learned by the tests stay out of the user's cache."""
    import os

    old = os.environ.get("EDGESDK_CACHE_DIR")
    os.environ["EDGESDK_CACHE_DIR"] = str(tmp_path_factory.mktemp("edgesdk-cache"))
    yield
    if old is None:
        os.environ.pop("EDGESDK_CACHE_DIR", None)
    else:
        os.environ["EDGESDK_CACHE_DIR"] = old


@pytest.fixture(scope="session", autouse=True)
def no_recovery_by_default():
    """quantize recovers a failing INT8 artifact by default (minutes per artifact): the many tests that make an
    artifact fail on purpose, or quantize zoo models that fail, keep their artifacts as quantized. The recovery
    tests ask for it (recover="auto"/"on"), and test_recover checks the default itself."""
    import os

    old = os.environ.get("EDGESDK_RECOVER")
    os.environ["EDGESDK_RECOVER"] = "off"
    yield
    if old is None:
        os.environ.pop("EDGESDK_RECOVER", None)
    else:
        os.environ["EDGESDK_RECOVER"] = old


@pytest.fixture(scope="session")
def digits_images(tmp_path_factory) -> Path:
    """scikit-learn's digits exported by the sample's own script: train/<digit>/*.png and val/<digit>/*.png."""
    out = tmp_path_factory.mktemp("digits-images")
    subprocess.run([sys.executable, str(DIGITS / "export_images.py"), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def digits_arrays(digits_images) -> tuple[np.ndarray, np.ndarray]:
    """The train images as preprocessed inputs (N, 1, 8, 8) and integer labels, computed here with numpy."""
    files = sorted(digits_images.glob("train/*/*.png"))
    pixels = np.stack([np.asarray(Image.open(f)) for f in files])
    labels = np.asarray([int(f.parent.name) for f in files], dtype=np.int64)
    return digits_pixels_to_input(pixels), labels


@pytest.fixture(scope="session")
def digits_calib32(digits_arrays) -> list[list[np.ndarray]]:
    """32 digits as calibration samples: one (1, 1, 8, 8) input each."""
    return [[x[None]] for x in digits_arrays[0][:32]]


@pytest.fixture(scope="session")
def digits_source(digits_calib32):
    """The digits CNN (digits.pt2) opened as ``quantize`` opens it, its input shape fixed from a calibration sample
    (workstation side: converters installed)."""
    from edgesdk_converters.sources import open_source

    src = open_source(DIGITS_PT2)
    src.fix_shapes(digits_calib32[0])
    return src


@pytest.fixture(scope="session")
def digits_npz(tmp_path_factory, digits_arrays) -> Path:
    """150 preprocessed digits with labels: .npz with x and y."""
    x, y = digits_arrays
    path = tmp_path_factory.mktemp("npz") / "digits.npz"
    np.savez(path, x=x[:150], y=y[:150])
    return path


@pytest.fixture(scope="session")
def small_digits(tmp_path_factory, digits_images) -> Path:
    """A small class-folder copy of the train images: SMALL_PER_CLASS per digit."""
    out = tmp_path_factory.mktemp("small-digits")
    for cls in sorted((digits_images / "train").iterdir()):
        (out / cls.name).mkdir()
        for f in sorted(cls.iterdir())[:SMALL_PER_CLASS]:
            shutil.copy(f, out / cls.name / f.name)
    return out


@pytest.fixture(scope="session")
def digits_bundle(tmp_path_factory, digits_images):
    """The issue's reference run: digits.pt2 -> every target, calib = train folder, val = val folder, 300 samples."""
    out = tmp_path_factory.mktemp("digits") / "digits.bundle"
    return quantize(DIGITS_PT2, digits_images / "train", out, val=digits_images / "val", preprocess=DIGITS_TOML,
                    samples=300)


@pytest.fixture(scope="session")
def onnx_bundle(tmp_path_factory, digits_images):
    """digits.onnx -> its default targets (openvino, onnx), image-folder calibration."""
    out = tmp_path_factory.mktemp("onnx-src") / "digits-onnx.bundle"
    return quantize(DIGITS_ONNX, digits_images / "train", out, val=digits_images / "val", preprocess=DIGITS_TOML,
                    samples=100, val_samples=100)


@pytest.fixture(scope="session")
def float_tflite(tmp_path_factory, digits_bundle) -> Path:
    """A float .tflite made by litert-torch: the litert-fp32 artifact of the digits bundle, copied out."""
    src = digits_bundle.bundle / next(a["files"][0]["path"] for a in digits_bundle.manifest["artifacts"]
                                      if a["id"] == "litert-fp32")
    path = tmp_path_factory.mktemp("tflite-src") / "digits_fp32.tflite"
    shutil.copy(src, path)
    return path


@pytest.fixture(scope="session")
def int8_tflite(tmp_path_factory, digits_bundle) -> Path:
    src = digits_bundle.bundle / next(a["files"][0]["path"] for a in digits_bundle.manifest["artifacts"]
                                      if a["id"] == "litert-int8")
    path = tmp_path_factory.mktemp("tflite-int8") / "digits_int8.tflite"
    shutil.copy(src, path)
    return path


@pytest.fixture(scope="session")
def int8_io_bundle(tmp_path_factory, digits_images):
    """digits.pt2 -> tflite only, integer-only (tflite_io="int8": int8 input and output tensors)."""
    out = tmp_path_factory.mktemp("int8-io") / "digits-int8io.bundle"
    return quantize(DIGITS_PT2, digits_images / "train", out, val=digits_images / "val", preprocess=DIGITS_TOML,
                    targets=["tflite"], tflite_io="int8", samples=100, val_samples=100)


@pytest.fixture(scope="session")
def tflite_bundle(tmp_path_factory, float_tflite, digits_npz):
    """A float .tflite -> its default targets (tflite, openvino), .npz calibration."""
    out = tmp_path_factory.mktemp("tflite-bundle") / "digits-tflite.bundle"
    return quantize(float_tflite, digits_npz, out, samples=100)


@pytest.fixture(scope="session")
def module_bundle(tmp_path_factory):
    """An nn.Module + example_input -> every target; random calibration arrays given without their batch axis."""
    import torch

    rng = np.random.default_rng(0)
    data = [rng.standard_normal((3, 16, 16)).astype(np.float32) for _ in range(60)]
    out = tmp_path_factory.mktemp("module") / "tiny.bundle"
    # Random weights and data give no meaningful accuracy: this fixture exercises the route, not the gate.
    return quantize(tiny_cnn(), data, out, example_input=torch.zeros(1, 3, 16, 16), samples=40, max_drop=100.0)


@pytest.fixture
def bundle_copy(tmp_path, digits_bundle) -> Path:
    """A private copy of the digits bundle that a test may damage."""
    dest = tmp_path / "copy.bundle"
    shutil.copytree(digits_bundle.bundle, dest)
    return dest
