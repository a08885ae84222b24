"""Preprocess resize = "letterbox": the image placed where its Transform says, the padding a pixel like any other,
results mapped back exactly; "stretch" (the default) and the manifests written before these keys unchanged."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgesdk import Preprocess
from edgesdk.bundle.schema import check_manifest
from edgesdk.errors import BundleError, InputError
from edgesdk.tasks.geometry import Transform
from support import DIGITS_TOML

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _formula(pixels: np.ndarray, pre: Preprocess) -> np.ndarray:
    """``(pixel * scale - mean) / std`` in float32 over an HxWxC array, as the module docstring states it."""
    mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
    return (np.asarray(pixels, np.float32) * np.float32(pre.scale) - mean) / std


def _check_letterbox(image: np.ndarray, size: tuple[int, int], pad_value=114.0) -> Transform:
    """The input is the image resized to the Transform's content rectangle, placed there, and pad elsewhere."""
    pre = Preprocess(size=size, layout="nhwc", mean=MEAN, std=STD, resize="letterbox", pad_value=pad_value)
    out, transform = pre.apply(image)
    assert transform == Transform.letterbox(image.shape[:2], size)
    assert out.shape == (1, *size, 3) and out.dtype == np.float32
    x, y, w, h = transform.content
    resized = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))
    np.testing.assert_array_equal(out[0, y:y + h, x:x + w], _formula(resized, pre))
    pad = np.ones(size, bool)
    pad[y:y + h, x:x + w] = False
    assert pad.any(), "the case must leave some padding"
    grey = np.broadcast_to(np.asarray(pre.pad_value, np.float32), (1, 3))
    np.testing.assert_array_equal(out[0][pad], np.broadcast_to(_formula(grey, pre), (int(pad.sum()), 3)))
    np.testing.assert_array_equal(out, pre(image))  # __call__ is apply's array
    return transform


# -- where the image goes --------------------------------------------------------------------------------

def test_wide_image_is_centred_between_rows_of_padding():
    transform = _check_letterbox(_image(120, 160), (96, 96))
    assert transform.content == (0, 12, 96, 72)  # scale 0.6: 160x120 -> 96x72, 12 rows above and below


def test_padding_pixels_are_the_pad_value_through_the_formula():
    pre = Preprocess(size=(96, 96), resize="letterbox", pad_value=[0, 128, 255], mean=MEAN, std=STD)
    out, _ = pre.apply(_image(120, 160))
    for c, pad in enumerate((0, 128, 255)):
        expected = (np.float32(pad) * np.float32(1 / 255) - np.float32(MEAN[c])) / np.float32(STD[c])
        assert out[0, c, 0, 0] == out[0, c, 95, 95] == expected
        assert out[0, c, 0, 0] == pytest.approx((pad / 255 - MEAN[c]) / STD[c], rel=1e-6)


def test_default_pad_value_is_yolo_grey_and_gray_images_take_one_value():
    out, transform = Preprocess(size=(8, 8), color="gray", resize="letterbox", scale=1.0).apply(
        np.full((4, 8), 7, np.uint8))
    assert transform.content == (0, 2, 8, 4)
    assert set(out[0, 0, :2].ravel()) == set(out[0, 0, 6:].ravel()) == {114.0}
    assert set(out[0, 0, 2:6].ravel()) == {7.0}


def test_asymmetric_padding_and_a_non_square_input():
    transform = _check_letterbox(_image(37, 50, seed=1), (96, 96))
    assert transform.content == (0, 12, 96, 71)  # 25 padding rows: 12 above, 13 below, as Transform puts them
    transform = _check_letterbox(_image(37, 100, seed=2), (48, 64))
    assert transform.content == (0, 12, 64, 24)


def test_tall_image_is_padded_left_and_right():
    transform = _check_letterbox(_image(90, 30, seed=3), (96, 64))
    assert transform.content == (16, 0, 32, 96)


def test_an_image_of_the_input_size_is_not_padded():
    image = _image(96, 96, seed=4)
    pre = Preprocess(size=(96, 96), resize="letterbox")
    out, transform = pre.apply(image)
    assert transform.content == (0, 0, 96, 96) and transform.is_identity
    np.testing.assert_array_equal(out, Preprocess(size=(96, 96))(image))


@pytest.mark.parametrize(("shape", "size"), [((120, 160), (96, 96)), ((90, 30), (96, 64)), ((37, 50), (64, 64)),
                                             ((300, 200), (80, 80))], ids=["wide", "tall", "odd", "downscale"])
def test_a_point_drawn_in_the_image_maps_back_within_a_pixel(shape, size):
    """A bright dot's centroid in the model input, through Transform.points_to_original, lands on the dot."""
    pre = Preprocess(size=size, color="gray", scale=1.0, resize="letterbox", pad_value=0)
    rng = np.random.default_rng(5)
    for _ in range(5):
        image = np.zeros(shape, np.uint8)
        r, c = int(rng.integers(3, shape[0] - 3)), int(rng.integers(3, shape[1] - 3))
        image[r - 2:r + 3, c - 2:c + 3] = 255  # a 5x5 dot centred on pixel (c, r): (c + 0.5, r + 0.5)
        out, transform = pre.apply(image)
        weights = out[0, 0].astype(np.float64)
        ys, xs = np.mgrid[0:size[0], 0:size[1]] + 0.5
        centroid = np.array([(xs * weights).sum(), (ys * weights).sum()]) / weights.sum()
        back = transform.points_to_original(centroid)
        assert np.abs(back - (c + 0.5, r + 0.5)).max() <= 1.0, (shape, (c, r), back)


# -- stretch, the default, is what it was ----------------------------------------------------------------

# Preprocess(size=(3, 4), mean=MEAN, std=STD)(rng(17) 6x5 RGB image), recorded from __call__ before letterbox
# existed (commit 80d635a, Pillow 13.0.0), to 6 decimals.
_OLD_STRETCH = [
    [[-0.62805, -0.148557, -0.148557, 0.313811], [-0.799298, 0.02269, 0.330936, 0.690556],
     [-0.610926, 0.810429, 0.467934, 0.039815]],
    [[0.117647, 0.327731, 0.345238, 0.345238], [0.152661, -0.827731, -0.617647, -0.285014],
     [1.115546, -0.932773, 0.45028, 0.677871]],
    [[1.193377, 0.635643, 0.426493, -0.044096], [0.600784, -0.60183, 0.26963, 0.47878],
     [-0.340392, 0.618214, 0.26963, 0.897081]],
]


def test_stretch_is_unchanged():
    image = np.random.default_rng(17).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    pre = Preprocess(size=(3, 4), mean=MEAN, std=STD)
    assert pre.resize == "stretch"
    out, transform = pre.apply(image)
    np.testing.assert_allclose(out[0], np.asarray(_OLD_STRETCH, np.float32), atol=1e-6)
    np.testing.assert_array_equal(out, pre(image))
    assert transform == Transform.stretch((6, 5), (3, 4)) and transform.content == (0, 0, 4, 3)
    resized = np.asarray(Image.fromarray(image).resize((4, 3), Image.BILINEAR))
    np.testing.assert_array_equal(out[0], _formula(resized, pre).transpose(2, 0, 1))


def test_stretch_transform_maps_input_corners_to_image_corners():
    _, transform = Preprocess(size=(96, 96)).apply(_image(120, 160))
    np.testing.assert_allclose(transform.points_to_original([[0, 0], [96, 96], [48, 48]]),
                               [[0, 0], [160, 120], [80, 60]])


# -- misuse ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("table", "message"), [
    ({"resize": "fit"}, r"preprocess 'resize' must be one of stretch, letterbox, got 'fit'"),
    ({"resize": "letterbox", "pad_value": -1}, r"preprocess 'pad_value' must be a pixel value in \[0, 255\].*got -1"),
    ({"resize": "letterbox", "pad_value": 300}, r"preprocess 'pad_value' must be a pixel value in \[0, 255\].*got 300"),
    ({"resize": "letterbox", "pad_value": [1, 2]}, r"preprocess 'pad_value' has 2 values; color 'rgb' has 3 channel"),
    ({"resize": "letterbox", "color": "gray", "pad_value": [1, 2, 3]},
     r"preprocess 'pad_value' has 3 values; color 'gray' has 1 channel"),
    ({"resize": "letterbox", "pad_value": []}, r"preprocess 'pad_value' must be a pixel value"),
    ({"resize": "letterbox", "pad_value": float("nan")}, r"preprocess 'pad_value' must be a pixel value"),
    ({"resize": "letterbox", "pad_value": "114"}, r"preprocess 'pad_value' must be a pixel value"),
    ({"resize": "letterbox", "pad_value": True}, r"preprocess 'pad_value' must be a pixel value"),
    ({"pad_value": 0}, r"preprocess 'pad_value' \[0.0\] needs resize = \"letterbox\""),
    ({"resize": "Letterbox"}, r"preprocess 'resize' must be one of"),
], ids=["resize-fit", "pad-negative", "pad-300", "pad-count-rgb", "pad-count-gray", "pad-empty", "pad-nan",
        "pad-string", "pad-bool", "pad-without-letterbox", "resize-case"])
def test_bad_values_are_refused_naming_the_key(table, message):
    with pytest.raises(InputError, match=message):
        Preprocess.from_dict({"size": [8, 8], **table})
    with pytest.raises(InputError, match=message):
        Preprocess(size=(8, 8), **table)


def test_bad_values_from_toml(tmp_path):
    path = tmp_path / "pre.toml"
    path.write_text('size = [8, 8]\nresize = "letterbox"\npad_value = 255.5\n')
    with pytest.raises(InputError, match=r"'pad_value' must be a pixel value in \[0, 255\].*got 255.5"):
        Preprocess.from_toml(path)


def test_unknown_keys_are_still_refused():
    with pytest.raises(InputError, match=r"unknown key\(s\) pad \(known: .*resize, pad_value"):
        Preprocess.from_dict({"size": [8, 8], "resize": "letterbox", "pad": 0})


# -- the manifest ----------------------------------------------------------------------------------------

def test_letterbox_round_trips_through_to_dict(tmp_path):
    path = tmp_path / "pre.toml"
    path.write_text('size = [96, 64]\nresize = "letterbox"\npad_value = [0, 128, 255]\n')
    pre = Preprocess.from_toml(path)
    stored = json.loads(json.dumps(pre.to_dict()))
    assert stored["resize"] == "letterbox" and stored["pad_value"] == [0.0, 128.0, 255.0]
    again = Preprocess.from_dict(stored)
    assert again == pre
    image = _image(120, 160)
    np.testing.assert_array_equal(again(image), pre(image))
    default_pad = Preprocess(size=(96, 96), resize="letterbox").to_dict()
    assert default_pad["resize"] == "letterbox" and "pad_value" not in default_pad
    assert Preprocess.from_dict(default_pad).pad_value == (114.0,)


def test_manifests_written_before_letterbox_are_byte_identical():
    """to_dict of a stretch spec has no new keys: the JSON quantize wrote before this change, byte for byte."""
    digits = Preprocess.from_toml(DIGITS_TOML)
    assert json.dumps(digits.to_dict()) == (
        '{"size": [8, 8], "color": "gray", "layout": "nchw", "scale": 0.00392156862745098, "mean": [0.5], '
        '"std": [0.5], "resample": "bilinear", "dtype": "float32"}')
    rgb = Preprocess(size=(6, 5), layout="nhwc", mean=MEAN, std=STD, resample="bicubic", extra={"crop": "center"})
    assert json.dumps(rgb.to_dict()) == (
        '{"size": [6, 5], "color": "rgb", "layout": "nhwc", "scale": 0.00392156862745098, '
        '"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "resample": "bicubic", "dtype": "float32", '
        '"extra": {"crop": "center"}}')
    assert Preprocess.from_dict(json.loads(json.dumps(digits.to_dict()))) == digits


def _seed_manifest() -> dict:
    repo = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("fuzz_bundle", repo / "tests" / "fuzz" / "fuzz_bundle.py")
    fuzz_bundle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz_bundle)
    manifest = json.loads(fuzz_bundle.seed_files()["manifest.json"])
    manifest["inputs"][0]["shape"] = [1, 3, 96, 96]
    return manifest


def test_the_manifest_schema_accepts_letterbox_and_refuses_bad_values():
    good = _seed_manifest()
    good["preprocess"] = Preprocess(size=(96, 96), resize="letterbox", pad_value=0).to_dict()
    check_manifest(good, "manifest.json")
    bad = copy.deepcopy(good)
    bad["preprocess"]["resize"] = "fit"
    with pytest.raises(BundleError, match=r"preprocess is not a usable preprocess spec: .*'resize'"):
        check_manifest(bad, "manifest.json")
    bad = copy.deepcopy(good)
    bad["preprocess"]["pad_value"] = [1, 2]
    with pytest.raises(BundleError, match=r"preprocess is not a usable preprocess spec: .*'pad_value' has 2"):
        check_manifest(bad, "manifest.json")
