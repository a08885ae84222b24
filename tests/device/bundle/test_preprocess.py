"""Preprocess: the declared formula, its TOML, and the same arrays in calibration and on the device."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from edgesdk import Bundle, Preprocess
from edgesdk.engines import open_engine
from edgesdk.errors import InputError
from support import DIGITS_TOML

RGB_TOML = """\
[preprocess]
size = [6, 5]
color = "rgb"
layout = "nhwc"
scale = 0.00392156862745098
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
resample = "bicubic"

[preprocess.extra]
crop = "center"
"""


@pytest.fixture
def rgb_image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)


# -- the formula -----------------------------------------------------------------------------------------

def test_gray_nchw_formula():
    pixels = np.array([[0, 64, 255], [128, 1, 200]], dtype=np.uint8)
    pre = Preprocess(size=(2, 3), color="gray", layout="nchw", scale=1 / 255, mean=(0.5,), std=(0.25,))
    out = pre(pixels)
    assert out.dtype == np.float32 and out.shape == (1, 1, 2, 3) == pre.input_shape
    expected = (pixels.astype(np.float32) * np.float32(1 / 255) - np.float32(0.5)) / np.float32(0.25)
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-6)


def test_rgb_per_channel_mean_std_and_layouts(rgb_image):
    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
    nhwc = Preprocess(size=(12, 10), color="rgb", layout="nhwc", scale=1.0, mean=mean, std=std)(rgb_image)
    nchw = Preprocess(size=(12, 10), color="rgb", layout="nchw", scale=1.0, mean=mean, std=std)(rgb_image)
    assert nhwc.shape == (1, 12, 10, 3) and nchw.shape == (1, 3, 12, 10)
    for c in range(3):
        expected = (rgb_image[:, :, c].astype(np.float32) - mean[c]) / std[c]
        np.testing.assert_allclose(nhwc[0, :, :, c], expected, rtol=1e-6)
    np.testing.assert_array_equal(nchw[0].transpose(1, 2, 0), nhwc[0])


def test_resize_and_color_conversion(rgb_image):
    pre = Preprocess(size=(4, 6), color="gray", scale=1.0, resample="nearest")
    out = pre(rgb_image)
    expected = np.asarray(Image.fromarray(rgb_image).convert("L").resize((6, 4), Image.NEAREST), np.float32)
    np.testing.assert_array_equal(out[0, 0], expected)


def test_path_pil_and_array_give_the_same_input(tmp_path, rgb_image):
    path = tmp_path / "img.png"
    Image.fromarray(rgb_image).save(path)
    pre = Preprocess.from_toml(DIGITS_TOML)
    from_path = pre(path)
    np.testing.assert_array_equal(from_path, pre(str(path)))
    np.testing.assert_array_equal(from_path, pre(Image.open(path)))
    np.testing.assert_array_equal(from_path, pre(rgb_image))


# -- TOML ------------------------------------------------------------------------------------------------

def test_toml_round_trips_through_the_manifest(tmp_path, rgb_image):
    path = tmp_path / "pre.toml"
    path.write_text(RGB_TOML)
    pre = Preprocess.from_toml(path)
    assert pre.size == (6, 5) and pre.layout == "nhwc" and pre.resample == "bicubic"
    stored = json.loads(json.dumps(pre.to_dict()))
    assert stored["extra"] == {"crop": "center"}  # free-form notes for the app are kept, under 'extra'
    again = Preprocess.from_dict(stored)
    assert again == pre
    np.testing.assert_array_equal(again(rgb_image), pre(rgb_image))


@pytest.mark.parametrize(("toml", "message"), [
    ('size = [0, 8]', r"'size' must be \[height, width\] of positive ints, got \[0, 8\]"),
    ('size = [8]', r"'size' must be \[height, width\]"),
    ('size = 8', r"'size' must be \[height, width\]"),
    ('color = "gray"', r"preprocess needs 'size = \[height, width\]'"),
    ('size = [8, 8]\ncolor = "cmyk"', r"'color' must be 'rgb' or 'gray', got 'cmyk'"),
    ('size = [8, 8]\nlayout = "chw"', r"'layout' must be 'nchw' or 'nhwc', got 'chw'"),
    ('size = [8, 8]\nresample = "lanczos"', r"'resample' must be one of bilinear, nearest, bicubic, got 'lanczos'"),
    ('size = [8, 8]\ndtype = "int8"', r"'dtype' must be 'float32', got 'int8'"),
    ('size = [8, 8]\nscale = 0', r"'scale' must be a finite non-zero number, got 0"),
    ('size = [8, 8]\nscale = "1/255"', r"'scale' must be a finite non-zero number, got '1/255'"),
    ('size = [8, 8]\nscale = nan', r"'scale' must be a finite non-zero number, got nan"),
    ('size = [8, 8]\ncolor = "gray"\nmean = [0.1, 0.2]', r"'mean' has 2 values; color 'gray' has 1 channel"),
    ('size = [8, 8]\nstd = [1.0, 1.0]', r"'std' has 2 values; color 'rgb' has 3 channel"),
    ('size = [8, 8]\nstd = [0.5, 0.0, 0.5]', r"'std' must not contain 0"),
], ids=["size-zero", "size-one-value", "size-scalar", "no-size", "color", "layout", "resample", "dtype",
        "scale-zero", "scale-string", "scale-nan", "mean-count", "std-count", "std-zero"])
def test_bad_toml_values(tmp_path, toml, message):
    path = tmp_path / "pre.toml"
    path.write_text(toml)
    with pytest.raises(InputError, match=message):
        Preprocess.from_toml(path)


@pytest.mark.parametrize("toml", ['size = ["a", 8]', 'size = [8, 8]\nmean = ["zero"]',
                                  'size = [8, 8]\nstd = ["x", 1, 1]'], ids=["size", "mean", "std"])
def test_non_numeric_toml_values_are_input_errors(tmp_path, toml):
    path = tmp_path / "pre.toml"
    path.write_text(toml)
    with pytest.raises(InputError, match=r"preprocess '(size|mean|std)'"):
        Preprocess.from_toml(path)


def test_fractional_size_is_refused(tmp_path):
    path = tmp_path / "pre.toml"
    path.write_text("size = [8.5, 8]")
    with pytest.raises(InputError, match=r"'size' must be \[height, width\] of positive ints"):
        Preprocess.from_toml(path)


def test_toml_syntax_error_and_missing_file(tmp_path):
    path = tmp_path / "pre.toml"
    path.write_text("size = [8, 8")
    with pytest.raises(InputError, match=r"pre.toml is not valid TOML"):
        Preprocess.from_toml(path)
    with pytest.raises(InputError, match=r"preprocess file not found: .*absent.toml"):
        Preprocess.from_toml(tmp_path / "absent.toml")


# -- images that cannot be read --------------------------------------------------------------------------

def test_unreadable_images(tmp_path):
    pre = Preprocess(size=(8, 8))
    broken = tmp_path / "broken.png"
    broken.write_bytes(np.random.default_rng(0).bytes(200))
    with pytest.raises(InputError, match=r"broken.png is not a readable image"):
        pre(broken)
    with pytest.raises(InputError, match=r"image not found: .*absent.png"):
        pre(tmp_path / "absent.png")
    with pytest.raises(InputError, match=r"an image array must be uint8 HxW or HxWxC .*got float32 \(8, 8\)"):
        pre(np.zeros((8, 8), np.float32))
    with pytest.raises(InputError, match=r"cannot read an image from int"):
        pre(42)


# -- identical preprocessing in calibration and on the device ---------------------------------------------

def test_calibration_loader_and_device_preprocess_give_identical_arrays(digits_bundle, digits_images):
    from edgesdk.engines import TensorSpec
    from edgesdk_converters import calibration

    m = digits_bundle.manifest
    device = Bundle.open(digits_bundle.bundle).preprocess
    inputs = [TensorSpec(m["inputs"][0]["name"], tuple(m["inputs"][0]["shape"]), "float32")]
    # the loader as quantize() builds it from --preprocess FILE
    ds = calibration.read_dataset(digits_images / "train", inputs, Preprocess.from_toml(DIGITS_TOML))
    checked = 0
    for i in range(0, len(ds), 97):
        (from_loader,) = ds.load(i)
        assert from_loader.dtype == np.float32 and from_loader.shape == (1, 1, 8, 8)
        np.testing.assert_array_equal(from_loader, device(ds.names[i]))
        checked += 1
    assert checked >= 10


def test_calibration_fingerprint_is_the_device_preprocessing_of_the_drawn_images(digits_bundle, digits_images):
    """The data actually calibrated on is the device's preprocessing of the drawn training images, bit for bit."""
    from edgesdk.engines import TensorSpec
    from edgesdk_converters import calibration

    m = digits_bundle.manifest
    device = Bundle.open(digits_bundle.bundle).preprocess
    inputs = [TensorSpec(m["inputs"][0]["name"], tuple(m["inputs"][0]["shape"]), "float32")]
    ds = calibration.read_dataset(digits_images / "train", inputs, device)
    picked, _ = calibration.draw(ds, m["calibration"]["samples"], m["calibration"]["seed"])
    samples = [[device(ds.names[i])] for i in picked]
    assert calibration.fingerprint(samples) == m["calibration"]["fingerprint"]


def test_device_preprocessing_reproduces_golden_on_every_int8_artifact(digits_bundle, digits_images):
    """Golden inputs are the device's preprocessing of validation images; INT8 outputs stay within tolerance."""
    bundle = Bundle.open(digits_bundle.bundle)
    pre = bundle.preprocess
    golden = bundle.golden()
    tolerance = bundle.manifest["golden"]["tolerance"]
    by_bytes = {pre(f).tobytes(): f for f in sorted(digits_images.glob("val/*/*.png"))}
    files = [by_bytes.get(golden["input_0"][i : i + 1].tobytes()) for i in range(len(golden["input_0"]))]
    assert None not in files, "a golden input is not exactly the preprocessing of a validation image"
    for aid in ("litert-int8", "openvino-int8", "onnxruntime-int8"):
        art = bundle.artifact(aid)
        with art.open() as engine:
            for i, f in enumerate(files):
                (out,) = engine.run([pre(f)])
                err = float(np.max(np.abs(out - golden["output_0"][i : i + 1])))
                assert err <= tolerance[aid], (aid, f.name, err, tolerance[aid])


def test_unknown_key_is_refused_not_ignored(tmp_path):
    """A typo ('means') would otherwise silently leave mean at 0 for calibration, validation and the device."""
    path = tmp_path / "pre.toml"
    path.write_text('size = [8, 8]\nmeans = [0.5]\n')
    with pytest.raises(InputError, match=r"preprocess has unknown key\(s\) means \(known: size, "):
        Preprocess.from_toml(path)


def test_non_table_preprocess_is_refused():
    with pytest.raises(InputError, match=r"preprocess must be a table of keys, got int"):
        Preprocess.from_dict(3)


def test_preprocess_reads_only_regular_files_without_blocking(tmp_path):
    """The same open as predict's (calibration data goes through here): a FIFO with no writer, a directory or a
    device is refused at once, naming the path."""
    import os

    pre = Preprocess(size=(8, 8), color="gray")
    fifo = tmp_path / "frame.png"
    os.mkfifo(fifo)  # a blocking open would wait for a writer forever
    with pytest.raises(InputError, match="frame.png is not a regular file"):
        pre(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        pre("/dev/zero")
    with pytest.raises(InputError, match="image not found: .*missing.png"):
        pre(tmp_path / "missing.png")
