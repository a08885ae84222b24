"""The shapes detection sample (samples/shapes): its data generator, letterbox and decoder, and the committed
shapes_detector.onnx run by ONNX Runtime and judged against the generated ground truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shapes_support import SHAPES, load_sample_module

MODEL = SHAPES / "shapes_detector.onnx"


data = load_sample_module("data")
detect = load_sample_module("detect")


@pytest.fixture(scope="module")
def session():
    import onnxruntime as ort

    return ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])


def test_generator_is_deterministic_and_boxes_fit():
    first, again = data.make_set(12, seed=7), data.make_set(12, seed=7)
    other = data.make_set(12, seed=8)
    assert all(np.array_equal(a.pixels, b.pixels) and np.array_equal(a.boxes, b.boxes) for a, b in zip(first, again))
    assert not all(np.array_equal(a.pixels, b.pixels) for a, b in zip(first, other))
    sizes = {(s.pixels.shape[1], s.pixels.shape[0]) for s in first}
    assert sizes == set(data.ORIGINAL_SIZES)  # every original size, not only the model's square
    for s in first:
        h, w = s.pixels.shape[:2]
        assert s.pixels.dtype == np.uint8 and 1 <= len(s.boxes) <= data.MAX_SHAPES == 4
        assert len(s.classes) == len(s.boxes) and set(s.classes.tolist()) <= {0, 1, 2}
        assert (s.boxes[:, 0] >= 0).all() and (s.boxes[:, 2] <= w).all() and (s.boxes[:, 3] <= h).all()
        assert (s.boxes[:, 2] > s.boxes[:, 0]).all() and (s.boxes[:, 3] > s.boxes[:, 1]).all()
        for i in range(len(s.boxes)):  # shapes never overlap, so no two centres share a grid cell
            assert (detect.iou(s.boxes[i], np.delete(s.boxes, i, axis=0)) == 0).all()


def test_shape_is_drawn_inside_its_box():
    s = data.make_set(1, seed=3)[0]
    x1, y1, x2, y2 = s.boxes[0].astype(int)
    inside = s.pixels[y1:y2, x1:x2].astype(float)
    centre = inside[(y2 - y1) // 2 + 2, (x2 - x1) // 2]  # every shape covers its box's centre
    assert np.abs(inside - centre).max(axis=2).mean() < np.abs(s.pixels.astype(float) - centre).max(axis=2).mean()


def test_letterbox_matches_edgesdk_preprocess():
    """Training's numpy letterbox puts every pixel where the device's ``resize = "letterbox"`` does."""
    from edgesdk.bundle.preprocess import Preprocess

    pre = Preprocess.from_toml(SHAPES / "preprocess.toml")
    for s in data.make_set(len(data.ORIGINAL_SIZES), seed=5):
        x, transform = data.to_input(s.pixels)
        device_x, device_transform = pre.apply(s.pixels)
        assert x.shape == device_x.shape == (1, 3, 96, 96)
        np.testing.assert_allclose(x, device_x, atol=1e-6)
        assert (transform.pad_x, transform.pad_y) == (device_transform.pad_x, device_transform.pad_y)
        assert (transform.scale_x, transform.scale_y) == (device_transform.scale_x, device_transform.scale_y)


def test_letterbox_pads_with_grey_and_maps_boxes_back():
    s = next(s for s in data.make_set(6, seed=5) if s.pixels.shape[:2] == (120, 160))
    boxed, transform = data.letterbox(s.pixels)
    assert (transform.pad_x, transform.pad_y) == (0, 12)  # 160x120 -> 96x72, centred
    assert (boxed[:12] == 114).all() and (boxed[84:] == 114).all()
    np.testing.assert_allclose(transform.to_original(transform.to_input(s.boxes)), s.boxes, atol=1e-4)


def test_decoder_keeps_the_best_of_overlapping_boxes_per_class():
    rows = np.array([[[50, 50, 20, 20, 0.9, 0.9, 0.05, 0.05],   # circle 0.81
                      [52, 50, 20, 20, 0.9, 0.8, 0.1, 0.1],     # the same circle, lower: suppressed
                      [52, 50, 20, 20, 0.9, 0.1, 0.9, 0.0],     # a square on it: other class, kept
                      [10, 10, 8, 8, 0.6, 0.7, 0.2, 0.1]]],     # 0.42 < 0.5: dropped
                    dtype=np.float32) / np.array([96, 96, 96, 96, 1, 1, 1, 1], np.float32)  # [0, 1] of the input
    found = detect.decode(rows)
    np.testing.assert_allclose(found.scores, [0.81, 0.81], atol=1e-6)
    assert found.classes.tolist() == [0, 1]
    np.testing.assert_allclose(found.boxes[0], [40, 40, 60, 60])


def test_f1_counts_matches_of_the_same_class_only():
    truth, classes = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32), np.array([0, 2])
    found = detect.Detections(np.array([[1, 1, 11, 11], [20, 20, 30, 30]], np.float32), np.array([0.9, 0.8]),
                              np.array([0, 1]))
    assert detect.match_counts(found, truth, classes) == (1, 1, 1)
    assert detect.f1([(1, 1, 1)])[0] == pytest.approx(0.5)


def test_committed_model_is_small_static_and_decoded(session):
    assert MODEL.stat().st_size < 1_000_000
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.shape) == ("image", [1, 3, 96, 96])
    assert (out.name, out.shape) == ("predictions", [1, 144, 8])
    x, _ = data.to_input(data.make_set(1, seed=11)[0].pixels)
    rows = session.run(None, {"image": x})[0][0]
    assert (rows[:, :4] >= 0).all() and (rows[:, :4] <= 96).all()  # cx, cy, w, h in input pixels
    assert ((rows[:, 4] >= 0) & (rows[:, 4] <= 1)).all()  # objectness: sigmoid applied
    np.testing.assert_allclose(rows[:, 5:].sum(axis=1), 1.0, atol=1e-5)  # class probabilities: softmax applied


def test_committed_model_finds_the_shapes(session):
    samples = data.make_set(20, seed=data.VAL_SEED + 100)  # images the model was neither trained nor selected on
    x, transforms = data.input_batch(samples)
    outputs = [session.run(None, {"image": x[i:i + 1]})[0] for i in range(len(samples))]
    score, precision, recall = detect.evaluate(outputs, samples, transforms)
    assert score >= 0.8, f"F1 {score:.3f} (precision {precision:.3f}, recall {recall:.3f})"
    # The same outputs judged against other images' shapes: the metric is not satisfied by any output.
    shifted = samples[1:] + samples[:1]
    assert detect.evaluate(outputs, shifted, transforms)[0] < 0.3


def test_write_sets_writes_what_quantize_and_run_read(tmp_path):
    out = data.write_sets(tmp_path, calib=4, val=3, demo=2)
    assert len(list((out / "calib").glob("*.png"))) == 4 and len(list((out / "demo").glob("*.png"))) == 2
    assert (out / "labels.txt").read_text().split() == ["circle", "square", "triangle"]
    with np.load(out / "calib.npz") as calib:
        assert calib["x"].shape == (4, 3, 96, 96) and calib["x"].dtype == np.float32
    labels = json.loads((out / "val.json").read_text())
    assert labels["names"] == data.CLASSES and sorted(labels["images"]) == [f"val_{i:04d}.png" for i in range(3)]
    with np.load(out / "val.npz") as val:
        assert val["x"].shape == (3, 3, 96, 96) and val["boxes"].shape == (3, 4, 4) and val["classes"].shape == (3, 4)
        first = labels["images"]["val_0000.png"]
        k = len(first["classes"])
        assert val["classes"][0, :k].tolist() == first["classes"] and (val["classes"][0, k:] == -1).all()
