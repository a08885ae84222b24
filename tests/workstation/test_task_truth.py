"""Ground truth beyond class labels: the task metrics against it on hand-made predictions (numbers worked out here),
the truth arrays read from a validation .npz and refused when they do not fit, and validation gating INT8 artifacts
by their drop on the truth: tiny ONNX models quantized by the ONNX target, and the shapes sample's detector with
the val.npz its data.py writes (real engines throughout)."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgesdk.engines import TensorSpec
from onnx_graphs import save_graph
from edgesdk.errors import CalibrationError, ValidationFailed
from edgesdk.tasks import Decoded, Detection, TaskSpec, TextLine
from edgesdk.tasks.decode import decode
from edgesdk_converters.calibration import read_dataset
from edgesdk_converters.sources import open_source
from edgesdk_converters.targets import builder
from edgesdk_converters.validation.task_truth import (DetectionTruth, MaskTruth, TextTruth, Truth, average_precision,
                                           truth_score_for)
from edgesdk_converters.validation.validate import validate
from support import REPO, quantize

SHAPES = REPO / "samples" / "shapes"
IMAGE = [TensorSpec("x", (1, 3, 8, 8), "float32")]


def _dets(*rows) -> Decoded:
    """Detections from (x1, y1, x2, y2, score, class) rows."""
    return Decoded("detection", detections=[Detection(tuple(map(float, r[:4])), r[4], r[5]) for r in rows])


def _truth(*rows) -> Truth:
    """Truth boxes from (x1, y1, x2, y2, class) rows."""
    a = np.array(rows, np.float64).reshape(-1, 5)
    return Truth("test", boxes=a[:, :4], classes=a[:, 4].astype(np.int64))


A, B, C = (0, 0, 10, 10), (20, 20, 30, 30), (40, 40, 50, 50)


# -- detection: mAP@0.5 and F1 -------------------------------------------------------------------------------------

def test_map50_of_a_perfect_prediction_is_1():
    m = DetectionTruth()
    m.add(_dets((*A, 0.9, 0), (*B, 0.8, 0), (*C, 0.7, 1)), [], _truth((*A, 0), (*B, 0), (*C, 1)))
    m.add(_dets((1, 1, 10, 10, 0.6, 1)), [], _truth((0, 0, 10, 10, 1)))  # IoU 0.81: a hit
    d = m.details()
    assert m.value() == 1.0 and d["f1"] == 1.0 and (d["precision"], d["recall"]) == (1.0, 1.0)
    assert d["class_ap50"] == {"0": 1.0, "1": 1.0} and (d["detections"], d["true_boxes"]) == (4, 4)


def test_map50_a_missed_box_halves_its_class():
    m = DetectionTruth()
    m.add(_dets((*A, 0.9, 0), (*C, 0.7, 1)), [], _truth((*A, 0), (*B, 0), (*C, 1)))
    assert m.class_ap() == {0: 0.5, 1: 1.0} and m.value() == pytest.approx(0.75)
    assert m.details()["f1"] == pytest.approx(2 * 2 / 5) and m.details()["recall"] == pytest.approx(2 / 3)


def test_map50_a_wrong_class_is_a_false_positive_and_a_miss():
    m = DetectionTruth()
    m.add(_dets((*A, 0.9, 0), (*B, 0.8, 0)), [], _truth((*A, 0), (*B, 1)))
    # class 0: a hit then a false positive (recall 1 reached at precision 1): AP 1; class 1: never found
    assert m.class_ap() == {0: 1.0, 1: 0.0} and m.value() == 0.5
    assert m.details()["f1"] == 0.5


def test_map50_a_duplicate_is_a_false_positive():
    ranked_above = DetectionTruth()  # the duplicate scores above the second true box: precision 2/3 at recall 1
    ranked_above.add(_dets((*A, 0.9, 0), (0, 0, 10, 9, 0.8, 0), (*B, 0.7, 0)), [], _truth((*A, 0), (*B, 0)))
    assert ranked_above.value() == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)
    assert ranked_above.details()["f1"] == pytest.approx(2 * 2 / 5)
    ranked_last = DetectionTruth()  # below every hit: the curve reaches recall 1 at precision 1 first
    ranked_last.add(_dets((*A, 0.9, 0), (*B, 0.8, 0), (0, 0, 10, 9, 0.7, 0)), [], _truth((*A, 0), (*B, 0)))
    assert ranked_last.value() == 1.0 and ranked_last.details()["precision"] == pytest.approx(2 / 3)


def test_map50_pools_samples_and_ignores_classes_the_truth_lacks():
    m = DetectionTruth()
    m.add(_dets((*A, 0.9, 0), (*C, 0.95, 2)), [], _truth((*A, 0)))  # class 2 is in no truth: F1 counts it
    m.add(_dets((*B, 0.5, 0), (12, 12, 22, 22, 0.8, 0)), [], _truth((*B, 0), (*C, 0)))  # a box 12 px off: miss
    # class 0 ranked 0.9 hit, 0.8 miss, 0.5 hit over 3 true boxes: 1/3 at precision 1, 2/3 at precision 2/3
    assert m.class_ap() == {0: pytest.approx(1 / 3 + 1 / 3 * 2 / 3)}
    assert m.details()["f1"] == pytest.approx(2 * 2 / (4 + 3))
    assert average_precision([], 3) == 0.0


def test_map50_without_a_true_box_is_refused():
    m = DetectionTruth()
    m.add(_dets((*A, 0.9, 0)), [], _truth())
    with pytest.raises(CalibrationError, match="no box"):
        m.value()


# -- text and segmentation ------------------------------------------------------------------------------------------

def test_text_accuracy_and_cer():
    m = TextTruth()
    for said, true in (("abc", "abc"), ("abd", "abc"), ("", "xy")):
        m.add(Decoded("text", text=TextLine(said)), [], Truth("test", text=true))
    m.add(Decoded("text"), [], Truth("test", text="q"))  # nothing decoded reads as the empty string
    assert m.value() == 0.25 and m.details()["cer"] == pytest.approx((0 + 1 + 2 + 1) / (3 + 3 + 2 + 1))


def test_miou_of_a_class_map_over_the_classes_either_side_marks():
    spec = TaskSpec.make("segmentation", {"map": "map"}, kind="classes")
    pred = np.array([[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 2, 2], [2, 2, 2, 2]])
    true = np.array([[0, 0, 0, 1], [0, 0, 0, 1], [2, 2, 2, 2], [3, 3, 2, 2]])
    scores = np.eye(4)[pred].transpose(2, 0, 1)[None]  # one-hot [1, 4, 4, 4]: its arg-max is pred
    m = MaskTruth(spec, ["map"])
    m.add(Decoded("segmentation"), [scores], Truth("test", mask=true))
    # class 0: 4 / 6, class 1: 2 / 4, class 2: 6 / 8, class 3: 0 / 2 (only the truth marks it)
    assert m.value() == pytest.approx(np.mean([4 / 6, 2 / 4, 6 / 8, 0.0]))
    assert m.details()["classes"] == 4 and m.details()["class_iou"]["3"] == 0.0


def test_miou_of_a_probability_map_is_the_foreground_iou_at_the_threshold():
    spec = TaskSpec.make("segmentation", {"map": "map"}, threshold=0.6)
    prob = np.array([[0.9, 0.7, 0.5], [0.1, 0.65, 0.2]])[None, None]
    m = MaskTruth(spec, ["map"])
    m.add(Decoded("segmentation"), [prob], Truth("test", mask=np.array([[1, 1, 1], [0, 0, 0]], np.uint8)))
    m.add(Decoded("segmentation"), [prob], Truth("test", mask=np.array([[1, 1, 0], [0, 1, 0]], np.uint8)))
    assert m.value() == pytest.approx((2 + 3) / (4 + 3))  # pooled: intersections over unions of both samples
    with pytest.raises(CalibrationError, match=r"'masks' is \[2, 2\]; the model's map is \[2, 3\]"):
        m.add(Decoded("segmentation"), [prob], Truth("test", mask=np.zeros((2, 2), np.uint8)))
    with pytest.raises(CalibrationError, match="'masks' holds 2; a probability map's mask is 0/1"):
        m.add(Decoded("segmentation"), [prob], Truth("test", mask=np.full((2, 3), 2, np.uint8)))


def test_truth_of_another_task_is_not_read(tmp_path):
    npz = _npz_with(tmp_path, 4, boxes=np.zeros((4, 1, 4)) + [0, 0, 2, 2], classes=np.zeros((4, 1), np.int64))
    boxes = read_dataset(npz, IMAGE, None, what="validation")
    assert boxes.truth.kind.value == "detection"
    assert truth_score_for(TaskSpec.make("text", {"logits": "y"}), boxes.truth, ["y"]) is None
    assert truth_score_for(TaskSpec.make("detection", {"predictions": "y"}, format="yolo"), boxes.truth, ["y"])


# -- reading the truth ----------------------------------------------------------------------------------------------

def _npz_with(folder, count: int, **arrays):
    """A validation .npz in ``folder``: ``count`` blank 3x8x8 inputs with ``arrays`` beside them."""
    path = folder / f"val{len(list(folder.iterdir()))}.npz"
    np.savez(path, x=np.zeros((count, 3, 8, 8), np.float32), **arrays)
    return path


def test_npz_truth_is_read_per_sample_without_its_padding_and_follows_subsets(tmp_path):
    boxes = np.full((3, 2, 4), -1.0)
    classes = np.full((3, 2), -1)
    boxes[:, 0], classes[:, 0] = [1, 2, 5, 6], [0, 2, 1]
    boxes[1, 1], classes[1, 1] = [0, 0, 3, 3], 1
    ds = read_dataset(_npz_with(tmp_path, 3, boxes=boxes, classes=classes), IMAGE, None, what="validation")
    first = ds.truth.load(1)
    assert first.boxes.tolist() == [[1, 2, 5, 6], [0, 0, 3, 3]] and first.classes.tolist() == [2, 1]
    picked = ds.subset([2, 1])
    assert len(picked.truth) == 2 and picked.truth.load(0).classes.tolist() == [1]
    texts = read_dataset(_npz_with(tmp_path, 2, texts=np.array(["ab", "ĉ d"])), IMAGE, None, what="validation")
    assert texts.truth.load(1).text == "ĉ d" and texts.truth.kind.value == "text"
    masks = read_dataset(_npz_with(tmp_path, 2, masks=np.ones((2, 3, 5), np.uint8)), IMAGE, None, what="validation")
    assert masks.truth.load(0).mask.shape == (3, 5)
    assert read_dataset(_npz_with(tmp_path, 2), IMAGE, None).truth is None


@pytest.mark.parametrize("arrays, match", [
    (dict(boxes=np.zeros((3, 1, 4)) + [0, 0, 2, 2], classes=np.zeros((3, 1), np.int64)),
     r"'boxes' must be \[N, K, 4\] \(x1, y1, x2, y2\) for the 4 samples, got float64 \[3, 1, 4\]"),
    (dict(boxes=np.zeros((4, 1, 4)) + [0, 0, 2, 2]), r"no 'classes'"),
    (dict(boxes=np.zeros((4, 2, 4)) + [0, 0, 2, 2], classes=np.zeros((4, 1), np.int64)), "do not fit"),
    (dict(boxes=np.zeros((4, 1, 4)) + [5, 5, 2, 2], classes=np.zeros((4, 1), np.int64)), "x2 > x1"),
    (dict(boxes=np.zeros((4, 1, 4)), classes=np.full((4, 1), -1)), "holds no box"),
    (dict(boxes=np.zeros((4, 1, 4)) + [0, 0, 2, 2], classes=np.full((4, 1), -3)), "'classes' holds -3"),
    (dict(texts=np.array(["a", "b", "c"])), r"'texts' must be \[N\] unicode strings"),
    (dict(texts=np.array([1, 2, 3, 4])), r"'texts' must be"),
    (dict(texts=np.array(["a" * 1001] * 4)), "1001 characters"),
    (dict(masks=np.zeros((4, 5), np.uint8)), r"'masks' must be \[N, H, W\]"),
    (dict(masks=np.zeros((4, 2, 2), np.float32)), r"'masks' must be"),
    (dict(masks=np.full((4, 2, 2), -1, np.int64)), "'masks' hold values -1"),
    (dict(masks=np.zeros((4, 2, 2), np.uint8), texts=np.array(["a"] * 4)), "the truth of several tasks"),
])
def test_truth_that_does_not_fit_is_refused_naming_its_key(tmp_path, arrays, match):
    with pytest.raises(CalibrationError, match=match):
        read_dataset(_npz_with(tmp_path, 4, **arrays), IMAGE, None, what="validation")


def test_npz_folder_of_mixed_truth_is_refused(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.zeros((2, 3, 8, 8), np.float32), texts=np.array(["a", "b"]))
    np.savez(folder / "b.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(CalibrationError, match="different truth .*a.npz: text, b.npz: none"):
        read_dataset(folder, IMAGE, None, what="validation")
    np.savez(folder / "b.npz", x=np.zeros((1, 3, 8, 8), np.float32), texts=np.array(["c"]))
    joined = read_dataset(folder, IMAGE, None, what="validation")
    assert [joined.truth.load(i).text for i in range(3)] == ["a", "b", "c"]


# -- validation on real artifacts -------------------------------------------------------------------------------------

_save = save_graph  # (path, nodes, inputs, outputs, initializers)


def _built(tmp_path, nodes, x_shape, out_shape, inits, calib):
    path = tmp_path / "model.onnx"
    _save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    src = open_source(path)
    (tmp_path / "onnx").mkdir()
    return builder("onnx")(src, [[x] for x in calib], tmp_path / "onnx"), src


def _outputs(built, aid, xs) -> list[np.ndarray]:
    session = ort.InferenceSession(str(next(b for b in built if b.id == aid).files[0]),
                                   providers=["CPUExecutionProvider"])
    return [session.run(None, {"x": x})[0] for x in xs]


def test_text_artifacts_gated_by_their_exact_match_drop(tmp_path):
    """A [1, 8, 4] -> [1, 8, 5] CTC head; the truth is the float artifact's own text on three samples in four and a
    string it never reads on the others: float scores 0.75, INT8 what its own decoded strings say (one fewer)."""
    rng = np.random.default_rng(2)
    xs = rng.normal(0, 1, (48, 1, 8, 4)).astype(np.float32)
    built, src = _built(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [1, 8, 4], [1, 8, 5],
                        {"w": rng.normal(0, 1.5, (4, 5)).astype(np.float32)}, xs[:24])
    spec = TaskSpec.make("text", {"logits": "y"}, charset=list("abcd"), activation="softmax")
    read = lambda out: decode(spec, [out], ["y"]).text.text  # noqa: E731
    held = list(xs[24:])
    float_texts = [read(o) for o in _outputs(built, "onnxruntime-fp32", held)]
    truth = [t if i % 4 != 3 else "zzz" for i, t in enumerate(float_texts)]
    np.savez(tmp_path / "val.npz", x=xs[24:, 0], texts=np.array(truth))
    val = read_dataset(tmp_path / "val.npz", src.inputs, None, what="validation")
    metrics, _ = validate(built, val, None, task=spec, output_names=["y"])
    int8, fp32 = metrics["onnxruntime-int8"], metrics["onnxruntime-fp32"]
    own = np.mean([a == b for a, b in zip((read(o) for o in _outputs(built, "onnxruntime-int8", held)), truth)])
    assert int8["metric"] == "text_accuracy" and int8["gate"] == "text_accuracy_drop_points"
    assert own < 0.75  # what the test is about: INT8 really reads a string float reads right
    assert int8["metric_value"] == pytest.approx(own) and int8["reference_metric_value"] == 0.75
    assert int8["drop"] == pytest.approx(100 * (0.75 - own)) and int8["max_drop"] == 5.0
    assert int8["passed"] is (int8["drop"] <= 5.0)
    assert "exact_string_agreement" in int8["details"] and int8["details"]["reference_truth"]["text_accuracy"] == 0.75
    assert fp32["metric"] == "exact_string_agreement" and fp32["details"]["truth"]["text_accuracy"] == 0.75


def test_segmentation_artifacts_gated_by_their_miou_drop(tmp_path):
    """A 3x3 conv + sigmoid probability map; the truth is the float map's mask with a few pixels flipped: the
    INT8 artifact's mIoU is what an independent count of its masks says."""
    rng = np.random.default_rng(4)
    xs = rng.normal(0, 1, (40, 1, 1, 16, 16)).astype(np.float32)
    built, src = _built(tmp_path, [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                   helper.make_node("Sigmoid", ["c"], ["y"])], [1, 1, 16, 16], [1, 1, 16, 16],
                        {"w": rng.normal(0, 0.5, (1, 1, 3, 3)).astype(np.float32)}, xs[:20])
    held = list(xs[20:])
    masks = np.stack([o[0, 0] > 0.5 for o in _outputs(built, "onnxruntime-fp32", held)])
    masks ^= rng.random(masks.shape) < 0.05
    np.savez(tmp_path / "val.npz", x=xs[20:, 0], masks=masks.astype(np.uint8))
    val = read_dataset(tmp_path / "val.npz", src.inputs, None, what="validation")
    spec = TaskSpec.make("segmentation", {"map": "y"})
    metrics, _ = validate(built, val, None, task=spec, output_names=["y"])

    def iou(aid):
        own = np.stack([o[0, 0] > 0.5 for o in _outputs(built, aid, held)])
        return (own & masks).sum() / (own | masks).sum()

    int8 = metrics["onnxruntime-int8"]
    assert int8["metric"] == "miou" and int8["metric_value"] == pytest.approx(iou("onnxruntime-int8"))
    assert int8["reference_metric_value"] == pytest.approx(iou("onnxruntime-fp32"))
    assert int8["reference_metric_value"] < 0.95  # the flipped pixels: float is not perfect on this truth either
    assert int8["drop"] == pytest.approx(100 * (int8["reference_metric_value"] - int8["metric_value"]))
    assert int8["passed"] is (int8["drop"] <= 10.0) and "mask_iou" in int8["details"]
    assert metrics["onnxruntime-fp32"]["metric"] == "mask_iou"


# -- the shapes sample: its detector and the val.npz data.py writes ---------------------------------------------------

def _shapes_data():
    spec = importlib.util.spec_from_file_location("shapes_data_for_truth", SHAPES / "data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shapes_sets(tmp_path_factory):
    return _shapes_data().write_sets(tmp_path_factory.mktemp("shapes-truth"), calib=40, val=40, demo=1)


def _quantize_shapes(sets, out, **options):
    from edgesdk.tomlfile import read_toml

    return quantize(SHAPES / "shapes_detector.onnx", sets / "calib", out, val=sets / "val.npz",
                    preprocess=SHAPES / "preprocess.toml", labels=sets / "labels.txt",
                    task=read_toml(SHAPES / "task.toml", "task"), samples=40, **options)


def test_shapes_bundle_records_map50_per_artifact(shapes_sets, tmp_path):
    from edgesdk.bundle.report import validation_table

    manifest = _quantize_shapes(shapes_sets, tmp_path / "shapes.bundle").manifest
    entries = {a["id"]: manifest["validation"][a["id"]] for a in manifest["artifacts"]}
    assert len(entries) == 6
    for aid, entry in entries.items():
        truth, ref = entry["details"]["truth"], entry["details"]["reference_truth"]
        assert truth["map50"] > 0.8 and ref["map50"] > 0.8 and truth["true_boxes"] == ref["true_boxes"] > 40, aid
        if entry["reference"] is None:  # float: judged by box agreement with the golden reference
            assert entry["metric"] == "box_f1" and entry["passed"], (aid, entry)
            continue
        assert entry["metric"] == "map50" and entry["gate"] == "map50_drop_points", aid
        assert entry["metric_value"] == truth["map50"] and entry["reference_metric_value"] == ref["map50"], aid
        assert entry["reference_metric_value"] == entries[entry["reference"]]["details"]["truth"]["map50"]
        assert entry["drop"] == pytest.approx(100 * (ref["map50"] - truth["map50"])) and entry["max_drop"] == 10.0
        assert entry["passed"] is (entry["drop"] <= 10.0) and "box_f1" in entry["details"], aid
    table = validation_table(manifest)
    row = next(line for line in table.splitlines() if line.startswith("onnxruntime-int8"))
    int8 = entries["onnxruntime-int8"]
    assert "map50" in row and f"{100 * int8['reference_metric_value']:.2f}%" in row
    assert f"{100 * int8['metric_value']:.2f}%" in row


def test_shapes_map50_drop_gates(shapes_sets, tmp_path):
    with pytest.raises(ValidationFailed, match="map50") as failed:
        _quantize_shapes(shapes_sets, tmp_path / "shapes.bundle", targets=["onnx"], max_drop=-1)
    assert "onnxruntime-int8" in failed.value.failing
    from edgesdk import Bundle

    entry = Bundle.open(tmp_path / "shapes.bundle").manifest["validation"]["onnxruntime-int8"]
    assert entry["metric"] == "map50" and entry["drop"] > -1.0 and entry["passed"] is False
