"""Calibration data: every accepted form, labels, stratified drawing, and the fingerprint of the data used."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from edgesdk import Bundle, Preprocess
from edgesdk.engines import TensorSpec
from edgesdk.errors import CalibrationError
from support import DIGITS_INPUT, DIGITS_ONNX, DIGITS_TOML, SMALL_PER_CLASS, quantize

DIGITS_SPEC = [TensorSpec(DIGITS_INPUT, (1, 1, 8, 8), "float32")]


@pytest.fixture(scope="module")
def flat_digits(tmp_path_factory, small_digits):
    out = tmp_path_factory.mktemp("flat-digits")
    for f in sorted(small_digits.glob("*/*.png")):
        shutil.copy(f, out / f"{f.parent.name}_{f.name}")
    return out


def _form(name, request, tmp_path):
    """(calib argument, extra quantize kwargs, labelled?, sample count) for one calibration form."""
    x, y = request.getfixturevalue("digits_arrays")
    x, y = x[:100], y[:100]
    if name == "class-folder":
        return request.getfixturevalue("small_digits"), {"preprocess": DIGITS_TOML}, True, 10 * SMALL_PER_CLASS
    if name == "flat-folder":
        return request.getfixturevalue("flat_digits"), {"preprocess": DIGITS_TOML}, False, 10 * SMALL_PER_CLASS
    if name == "npy":
        np.save(tmp_path / "x.npy", x)
        return tmp_path / "x.npy", {}, False, len(x)
    if name == "npz-x-y":
        np.savez(tmp_path / "xy.npz", x=x, y=y)
        return tmp_path / "xy.npz", {}, True, len(x)
    if name == "npz-x":
        np.savez(tmp_path / "x.npz", x=x)
        return tmp_path / "x.npz", {}, False, len(x)
    if name == "iterable-of-arrays":
        return [x[i : i + 1] for i in range(len(x))], {}, False, len(x)
    if name == "iterable-of-dicts":
        return ({DIGITS_INPUT: x[i : i + 1]} for i in range(len(x))), {}, False, len(x)  # a one-shot generator
    raise AssertionError(name)


FORMS = ["class-folder", "flat-folder", "npy", "npz-x-y", "npz-x", "iterable-of-arrays", "iterable-of-dicts"]


@pytest.mark.parametrize("form", FORMS)
def test_calibration_form(request, tmp_path, form):
    calib, kwargs, labelled, total = _form(form, request, tmp_path)
    asked = total // 2
    # max_drop is not what this test checks: the gate kind is
    result = quantize(DIGITS_ONNX, calib, tmp_path / "b", targets=["onnx"], samples=asked, max_drop=100.0, **kwargs)
    m = Bundle.open(result.bundle).manifest
    assert [a["id"] for a in m["artifacts"]] == ["onnxruntime-fp32", "onnxruntime-int8"]
    assert m["calibration"]["samples"] == asked
    assert m["calibration"]["stratified"] is labelled
    v = m["validation"]["onnxruntime-int8"]
    assert v["samples"] == total - asked  # the held-out rest, without --val
    if labelled:
        assert v["gate"] == "accuracy_drop_points"
        assert v["reference_accuracy"] > 0.9  # labels line up with the model's classes
    else:
        # no labels: the gate is agreement with the float model
        assert v["gate"] == "agreement_drop_points" and "accuracy" not in v
    if form == "class-folder":
        assert m["labels"] == [str(d) for d in range(10)]


def test_labels_file_names_the_classes_of_npz_labels(tmp_path, digits_npz):
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    (tmp_path / "labels.txt").write_text("\n".join(names) + "\n\n")
    m = quantize(DIGITS_ONNX, digits_npz, tmp_path / "b", labels=tmp_path / "labels.txt", targets=["onnx"],
                 samples=40, val_samples=20, max_drop=100.0).manifest
    assert m["labels"] == names
    assert m["validation"]["onnxruntime-int8"]["gate"] == "accuracy_drop_points"


# -- reading folders and labels ----------------------------------------------------------------------------

def _image_folder(root, classes, per_class=3):
    rng = np.random.default_rng(0)
    for cls in classes:
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(root / cls / f"{i}.png")
    return root


def test_labels_come_from_folder_names(tmp_path):
    from edgesdk_converters.calibration import read_dataset

    root = _image_folder(tmp_path / "pets", ["cat", "dog"])
    (root / "dog" / ".DS_Store").write_bytes(b"\0junk")  # hidden files are skipped
    ds = read_dataset(root, DIGITS_SPEC, Preprocess(size=(8, 8), color="gray"))
    assert ds.label_names == ["cat", "dog"]
    assert ds.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert [n.split("/")[-2] for n in ds.names] == ["cat"] * 3 + ["dog"] * 3


def test_labels_file_sets_the_class_order(tmp_path):
    from edgesdk_converters.calibration import read_dataset

    root = _image_folder(tmp_path / "pets", ["cat", "dog"])
    ds = read_dataset(root, DIGITS_SPEC, Preprocess(size=(8, 8), color="gray"), label_names=["dog", "cat", "eel"])
    assert ds.label_names == ["dog", "cat", "eel"]
    assert ds.labels.tolist() == [1, 1, 1, 0, 0, 0]
    with pytest.raises(CalibrationError, match=r"has class folders not in the labels: dog"):
        read_dataset(root, DIGITS_SPEC, Preprocess(size=(8, 8), color="gray"), label_names=["cat"])


def test_digit_folder_names_are_class_indices(tmp_path):
    from edgesdk_converters.calibration import read_dataset

    root = _image_folder(tmp_path / "d", ["10", "2"], per_class=1)  # sorted as text: "10" before "2"
    ds = read_dataset(root, DIGITS_SPEC, Preprocess(size=(8, 8), color="gray"))
    assert ds.labels.tolist() == [10, 2]
    assert ds.label_names[2] == "2" and ds.label_names[10] == "10"


# -- drawing samples ---------------------------------------------------------------------------------------

def test_draw_is_stratified_seeded_and_disjoint(digits_images):
    from edgesdk_converters.calibration import draw, read_dataset

    ds = read_dataset(digits_images / "train", DIGITS_SPEC, Preprocess.from_toml(DIGITS_TOML))
    picked, rest = draw(ds, 300, seed=0)
    assert len(picked) == 300 and not set(picked) & set(rest)
    assert sorted(picked + rest) == list(range(len(ds)))
    assert np.bincount(ds.labels[picked]).tolist() == [30] * 10  # 300 over 10 classes
    assert draw(ds, 300, seed=0) == (picked, rest)
    assert draw(ds, 300, seed=1)[0] != picked


def test_draw_without_labels():
    from edgesdk_converters.calibration import draw, read_dataset

    ds = read_dataset(np.zeros((20, 1, 8, 8), np.float32), DIGITS_SPEC, None)
    picked, rest = draw(ds, 5, seed=0)
    assert len(picked) == 5 and len(rest) == 15 and not set(picked) & set(rest)
    assert draw(ds, 20, seed=0) == (list(range(20)), [])


# -- fingerprint of the data actually used -----------------------------------------------------------------

def test_fingerprint_function():
    from edgesdk_converters.calibration import fingerprint

    rng = np.random.default_rng(0)
    a = [[rng.random((1, 4), dtype=np.float32)] for _ in range(3)]
    same = [[arr.copy() for arr in s] for s in a]
    assert fingerprint(a) == fingerprint(same)
    changed = [[arr.copy() for arr in s] for s in a]
    changed[2][0][0, 3] += 1e-3
    assert fingerprint(changed) != fingerprint(a)
    reshaped = [[arr.reshape(2, 2)] for s in a for arr in s]  # same bytes, other shape
    assert fingerprint(reshaped) != fingerprint(a)


def test_fingerprint_is_deterministic_and_follows_the_seed(digits_npz, tmp_path):
    runs = {}
    for key, seed in (("first", 0), ("again", 0), ("other-seed", 1)):
        r = quantize(DIGITS_ONNX, digits_npz, tmp_path / key, targets=["onnx"], samples=40, val_samples=20,
                     seed=seed, max_drop=100.0)
        runs[key] = r.manifest["calibration"]["fingerprint"]
    assert runs["first"] == runs["again"]
    assert runs["other-seed"] != runs["first"]


def test_fingerprint_is_of_the_data_not_the_seed(digits_arrays, tmp_path):
    """When every sample is used, the seed changes nothing: same data, same fingerprint."""
    x, _ = digits_arrays
    calib, val = x[:30], x[30:50]
    prints = {quantize(DIGITS_ONNX, calib, tmp_path / f"s{seed}", val=val, targets=["onnx"], samples=30, seed=seed,
                       max_drop=100.0).manifest["calibration"]["fingerprint"] for seed in (0, 1)}
    assert len(prints) == 1


def test_held_out_validation_never_uses_calibration_samples(digits_arrays, tmp_path):
    """Without --val, validation (and golden) data comes from the rows calibration did not use."""
    from edgesdk_converters.calibration import fingerprint

    x = digits_arrays[0][:38]  # 30 for calibration, 8 left: exactly the golden count
    assert len({row.tobytes() for row in x}) == len(x)
    m = quantize(DIGITS_ONNX, x, tmp_path / "b", targets=["onnx"], samples=30, max_drop=100.0).manifest
    assert m["validation"]["onnxruntime-int8"]["samples"] == 8
    golden = Bundle.open(tmp_path / "b").golden()["input_0"]
    rows = {row.tobytes(): i for i, row in enumerate(x)}
    val_rows = {rows[g.tobytes()] for g in golden}
    assert len(val_rows) == 8
    calib_rows = [i for i in range(len(x)) if i not in val_rows]
    assert fingerprint([[x[i : i + 1]] for i in calib_rows]) == m["calibration"]["fingerprint"]
