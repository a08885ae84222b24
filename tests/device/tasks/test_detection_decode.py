"""Detection decoding (edgesdk.tasks.detection) on hand-built tensors with known answers: MediaPipe SSD anchors, an
anchor box encoded then decoded, YOLO rows and columns, decoded boxes (pixels, normalized, yxyx, centre xywh),
NMS per class, the letterbox mapped back, and the errors naming the role, the output and its shape."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.tasks.decode import decode
from edgesdk.tasks.detection import candidates, nms, ssd_anchors
from edgesdk.tasks.geometry import Transform
from edgesdk.tasks.spec import TaskSpec

BLAZEFACE = {"strides": [8, 16, 16, 16], "per_layer": 2, "offset": 0.5}


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


# -- anchors ----------------------------------------------------------------------------------------------------------
def test_blazeface_anchors_are_896_in_mediapipe_order():
    anchors = ssd_anchors((8, 16, 16, 16), 2, 0.5, (128, 128))
    assert anchors.shape == (896, 2)  # 16x16 cells x 2 + 8x8 cells x 6 (three stride-16 layers merged)
    assert anchors[0].tolist() == [1 / 32, 1 / 32]
    assert anchors[1].tolist() == [1 / 32, 1 / 32]  # per_layer 2: two anchors per cell
    assert anchors[2].tolist() == [3 / 32, 1 / 32]  # then the next cell along x
    assert anchors[32].tolist() == [1 / 32, 3 / 32]  # a row of 16 cells later, the next row
    assert anchors[512].tolist() == anchors[517].tolist() == [1 / 16, 1 / 16]  # stride 16: 6 anchors per cell
    assert anchors[518].tolist() == [3 / 16, 1 / 16]
    assert anchors[-1].tolist() == [15 / 16, 15 / 16]


def test_anchor_grids_round_up_and_layers_of_another_stride_do_not_merge():
    assert ssd_anchors((4,), 1, 0.5, (192, 192)).shape == (2304, 2)  # BlazeFace full range
    anchors = ssd_anchors((8,), 1, 0.5, (100, 60))  # ceil(100 / 8) = 13 rows, ceil(60 / 8) = 8 columns
    assert anchors.shape == (104, 2)
    assert anchors[1].tolist() == [1.5 / 8, 0.5 / 13]
    assert ssd_anchors((8, 16, 8), 1, 0.0, (16, 16)).shape == (4 + 1 + 4, 2)  # 8 then 16 then 8 again: 3 groups
    assert ssd_anchors((8,), 1, 0.0, (16, 16))[3].tolist() == [0.5, 0.5]  # offset 0: cell corners


def anchors_spec(**params) -> TaskSpec:
    params = {"anchors": BLAZEFACE, "keypoints": 2, **params}
    return TaskSpec.make("detection", {"boxes": "regressors", "scores": "classificators"}, format="anchors", **params)


def encode(box_xywh, keypoints, anchor, input_wh=(128, 128), scale=(128, 128, 128, 128), order="xywh"):
    """A regressor row for a box (centre x, centre y, w, h in input pixels) and keypoints against ``anchor``."""
    (w_in, h_in), (sx, sy, sw, sh) = input_wh, scale
    cx, cy, w, h = box_xywh
    row = [(cx / w_in - anchor[0]) * sx, (cy / h_in - anchor[1]) * sy, w / w_in * sw, h / h_in * sh]
    for kx, ky in keypoints:
        row += [(kx / w_in - anchor[0]) * sx, (ky / h_in - anchor[1]) * sy]
    if order == "yxhw":
        row = [v for pair in zip(row[1::2], row[0::2]) for v in pair]
    return row


def anchor_outputs(rows: dict[int, tuple[list[float], float]], n=896, width=8):
    boxes = np.zeros((1, n, width), np.float32)
    scores = np.full((1, n, 1), -20.0, np.float32)
    for i, (row, score) in rows.items():
        boxes[0, i, :len(row)] = row
        scores[0, i, 0] = score
    return [boxes, scores], ["regressors", "classificators"]


@pytest.mark.parametrize("order", ["xywh", "yxhw"])
def test_an_anchor_box_encoded_then_decoded_comes_back(order):
    anchors = ssd_anchors((8, 16, 16, 16), 2, 0.5, (128, 128))
    kps = [(62.0, 45.0), (78.0, 45.0)]
    outputs, names = anchor_outputs({600: (encode((70, 50, 30, 40), kps, anchors[600], order=order), 3.0)})
    decoded = decode(anchors_spec(box_order=order), outputs, names, transform=Transform.identity(128, 128))
    (det,) = decoded.detections
    assert det.box == pytest.approx((55, 30, 85, 70), abs=1e-4)
    assert np.allclose(det.keypoints, kps, atol=1e-4)
    assert det.score == pytest.approx(1 / (1 + np.exp(-3.0)))
    assert det.class_index == 0 and det.label is None


def test_anchor_box_scale_and_a_non_square_input():
    spec = anchors_spec(box_scale=[10, 20, 5, 4], keypoints=0,
                        anchors={"strides": [16], "per_layer": 1, "offset": 0.5})
    anchors = ssd_anchors((16,), 1, 0.5, (64, 128))  # 4 rows x 8 columns
    row = encode((40, 20, 16, 8), [], anchors[9], input_wh=(128, 64), scale=(10, 20, 5, 4))
    outputs, names = anchor_outputs({9: (row, 5.0)}, n=32, width=4)
    (det,) = decode(spec, outputs, names, transform=Transform.identity(64, 128)).detections
    assert det.box == pytest.approx((32, 16, 48, 24), abs=1e-4)
    assert det.keypoints is None


def test_anchor_scores_several_classes_take_the_best_with_its_label():
    anchors = ssd_anchors((8, 16, 16, 16), 2, 0.5, (128, 128))
    boxes = np.zeros((1, 896, 4), np.float32)
    boxes[0, 5] = encode((20, 20, 10, 10), [], anchors[5])
    scores = np.full((1, 896, 3), -20.0, np.float32)
    scores[0, 5] = [logit(0.2), logit(0.9), logit(0.6)]
    spec = anchors_spec(keypoints=0)
    (det,) = decode(spec, [boxes, scores], ["regressors", "classificators"], labels=["cat", "dog", "eel"],
                    transform=Transform.identity(128, 128)).detections
    assert (det.class_index, det.label) == (1, "dog") and det.score == pytest.approx(0.9)


def test_anchor_scores_without_activation_are_taken_as_probabilities():
    anchors = ssd_anchors((8, 16, 16, 16), 2, 0.5, (128, 128))
    outputs, names = anchor_outputs({7: (encode((20, 20, 10, 10), [], anchors[7]), 0.75)})
    outputs[1][outputs[1] < 0] = 0.0
    (det,) = decode(anchors_spec(keypoints=0, score_activation="none"), outputs, names,
                    transform=Transform.identity(128, 128)).detections
    assert det.score == pytest.approx(0.75)


def test_anchors_need_the_input_size():
    outputs, names = anchor_outputs({})
    with pytest.raises(InputError, match=r"format 'anchors' needs the model input's size.*Transform.identity"):
        decode(anchors_spec(), outputs, names)


def test_an_anchor_count_that_does_not_fit_the_output_is_refused():
    outputs, names = anchor_outputs({}, n=900)
    with pytest.raises(InputError, match=r"give 896 anchors for a 128x128 input, but output 'regressors' \(role "
                                         r"'boxes'\) has 900 rows"):
        decode(anchors_spec(), outputs, names, transform=Transform.identity(128, 128))


def test_a_regressor_row_too_short_for_its_keypoints_names_role_output_and_shape():
    outputs, names = anchor_outputs({}, width=7)
    with pytest.raises(InputError, match=r"role 'boxes' \(output 'regressors'\) has shape \[1, 896, 7\]; the task "
                                         r"needs \[1, N, 8\]"):
        decode(anchors_spec(keypoints=2), outputs, names, transform=Transform.identity(128, 128))


def test_a_batch_of_two_is_refused():
    boxes, scores = anchor_outputs({})[0]
    with pytest.raises(InputError, match=r"role 'boxes' \(output 'regressors'\) has batch 2"):
        decode(anchors_spec(), [np.concatenate([boxes, boxes]), scores], ["regressors", "classificators"],
               transform=Transform.identity(128, 128))


# -- yolo -------------------------------------------------------------------------------------------------------------
YOLO_ROWS = np.array([
    [50, 50, 20, 20, 0.9, 0.1, 0.8],   # class 1, 0.72
    [52, 50, 20, 20, 0.9, 0.1, 0.6],   # class 1, 0.54: overlaps the first (IoU 0.82), suppressed
    [52, 52, 20, 20, 0.9, 0.7, 0.1],   # class 0, 0.63: overlaps too, but another class: kept
    [10, 10, 8, 8, 0.3, 0.0, 0.9],     # 0.27: under the threshold
], np.float32)


def yolo_spec(**params) -> TaskSpec:
    return TaskSpec.make("detection", {"predictions": "output0"}, format="yolo", **params)


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_yolo_rows_and_columns_decode_alike(layout):
    tensor = YOLO_ROWS[None] if layout == "rows" else YOLO_ROWS.T[None]
    decoded = decode(yolo_spec(layout=layout), [tensor], ["output0"], labels=["a", "b"])
    got = [(d.label, round(d.score, 4), tuple(round(v, 3) for v in d.box)) for d in decoded.detections]
    assert got == [("b", 0.72, (40, 40, 60, 60)), ("a", 0.63, (42, 42, 62, 62))]


def test_yolo_without_objectness_scores_by_class_alone_and_sigmoid_activation():
    rows = YOLO_ROWS[:, [0, 1, 2, 3, 5, 6]].copy()  # cx, cy, w, h, two class scores
    decoded = decode(yolo_spec(objectness=False), [rows[None]], ["output0"])
    assert [(d.class_index, round(d.score, 4)) for d in decoded.detections] == [(1, 0.9), (1, 0.8), (0, 0.7)]
    rows[:, 4:] = np.log(rows[:, 4:] / (1 - rows[:, 4:] + 1e-9) + 1e-9)  # the same scores as logits
    decoded = decode(yolo_spec(objectness=False, score_activation="sigmoid"), [rows[None]], ["output0"])
    assert [round(d.score, 3) for d in decoded.detections] == [0.9, 0.8, 0.7]


def test_yolo_thresholds_and_max_detections():
    spec = yolo_spec(score_threshold=0.6, max_detections=1)
    decoded = decode(spec, [YOLO_ROWS[None]], ["output0"])
    assert [round(d.score, 2) for d in decoded.detections] == [0.72]
    spec = yolo_spec(score_threshold=0.2, iou_threshold=0.9)  # IoU 0.82 < 0.9: nothing suppressed
    assert len(decode(spec, [YOLO_ROWS[None]], ["output0"]).detections) == 4


def test_yolo_with_too_few_values_per_row_names_role_output_and_shape():
    with pytest.raises(InputError, match=r"role 'predictions' \(output 'output0'\) has shape \[1, 3, 4\]"):
        decode(yolo_spec(), [np.zeros((1, 3, 4), np.float32)], ["output0"])
    with pytest.raises(InputError, match=r"role 'predictions' \(output 'output0'\) has shape \[1, 8400\]; the "
                                         r"task needs \[1, N, 4 \+ obj \+ C\]"):
        decode(yolo_spec(), [np.zeros((1, 8400), np.float32)], ["output0"])


# -- NMS --------------------------------------------------------------------------------------------------------------
def test_nms_suppresses_overlap_within_a_class_only():
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [2, 0, 12, 10], [20, 20, 30, 30]], np.float64)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    same = nms(boxes, scores, np.array([0, 0, 0, 0]), 0.45, 100)
    assert same.tolist() == [0, 3]
    other = nms(boxes, scores, np.array([0, 0, 1, 0]), 0.45, 100)
    assert other.tolist() == [0, 2, 3]
    # IoUs 0.82 and 0.67 with the first: all kept at 0.9
    assert nms(boxes, scores, np.zeros(4, np.int64), 0.9, 100).tolist() == [0, 1, 2, 3]
    assert nms(boxes, scores, np.zeros(4, np.int64), 0.9, 2).tolist() == [0, 1]
    assert nms(boxes[:0], scores[:0], np.zeros(0, np.int64), 0.5, 10).tolist() == []


# -- decoded boxes ----------------------------------------------------------------------------------------------------
def boxes_spec(**params) -> TaskSpec:
    return TaskSpec.make("detection", {"boxes": "boxes", "scores": "scores", **params.pop("roles", {})},
                         format="boxes", **params)


def test_letterbox_maps_boxes_back_to_the_original_image():
    transform = Transform.letterbox((200, 400), (128, 128))  # scale 0.32, 128x64 image, 32 rows of padding on top
    assert transform.content == (0, 32, 128, 64)
    boxes = np.array([[[32, 48, 96, 80]]], np.float32)  # (100, 50, 300, 150) in the original
    decoded = decode(boxes_spec(), [boxes, np.array([[0.9]], np.float32)], ["boxes", "scores"], transform=transform)
    assert decoded.detections[0].box == pytest.approx((100, 50, 300, 150))
    normalized = boxes / 128
    decoded = decode(boxes_spec(normalized=True), [normalized, np.array([[0.9]], np.float32)], ["boxes", "scores"],
                     transform=transform)
    assert decoded.detections[0].box == pytest.approx((100, 50, 300, 150))


def test_box_formats_and_a_classes_output():
    expected = (10, 20, 30, 60)
    formats = {"xyxy": [10, 20, 30, 60], "yxyx": [20, 10, 60, 30], "xywh": [20, 40, 20, 40]}  # xywh: centre, size
    for box_format, box in formats.items():
        outputs = [np.array([[box]], np.float32), np.array([[0.8]], np.float32), np.array([[2.0]], np.float32)]
        spec = boxes_spec(box_format=box_format, roles={"classes": "classes"})
        (det,) = decode(spec, outputs, ["boxes", "scores", "classes"], labels=["a", "b", "c"]).detections
        assert det.box == pytest.approx(expected), box_format
        assert (det.class_index, det.label) == (2, "c")


def test_normalized_boxes_need_the_input_size():
    with pytest.raises(InputError, match=r"normalized boxes needs the model input's size"):
        decode(boxes_spec(normalized=True), [np.zeros((1, 2, 4)), np.zeros((1, 2))], ["boxes", "scores"])


def test_scores_that_do_not_match_the_boxes_name_role_output_and_shape():
    with pytest.raises(InputError, match=r"role 'scores' \(output 'scores'\) has shape \[1, 3\]; the task needs one "
                                         r"row per box: \[1, 2\]"):
        decode(boxes_spec(), [np.zeros((1, 2, 4)), np.zeros((1, 3))], ["boxes", "scores"])
    with pytest.raises(InputError, match=r"role 'boxes' \(output 'boxes'\) has shape \[1, 2, 5\]"):
        decode(boxes_spec(), [np.zeros((1, 2, 5)), np.zeros((1, 2))], ["boxes", "scores"])


def test_boxes_without_area_are_dropped_but_stay_candidates():
    boxes = np.array([[[10, 10, 10, 20], [0, 0, 5, 5]]], np.float32)
    scores = np.array([[0.9, 0.8]], np.float32)
    decoded = decode(boxes_spec(), [boxes, scores], ["boxes", "scores"])
    assert [d.score for d in decoded.detections] == [pytest.approx(0.8)]
    assert candidates(boxes_spec(), [boxes, scores], ["boxes", "scores"]).scores.tolist() == pytest.approx([0.9, 0.8])


def test_an_unresolved_spec_is_refused_naming_the_role():
    spec = TaskSpec.make("detection", format="yolo")
    with pytest.raises(InputError, match=r"needs output role 'predictions'.*resolve"):
        decode(spec, [YOLO_ROWS[None]], ["output0"])


def test_yolo_normalized_rows_are_scaled_to_the_input_and_scores_clipped_to_one():
    """A YOLO export with coordinates in [0, 1] of the input (normalized: true), whose INT8 scores were rounded past 1
    (one output scale shared with the coordinates): boxes in input pixels, scores kept in [0, 1]."""
    spec = TaskSpec.make("detection", {"predictions": "p"}, format="yolo", normalized=True)
    rows = np.array([[[0.5, 0.25, 0.25, 0.125, 1.23, 1.0, 0.0]]], np.float32)  # cx, cy, w, h, obj, 2 classes
    (d,) = decode(spec, [rows], ["p"], transform=Transform.identity(96, 128)).detections
    np.testing.assert_allclose(d.box, (48.0, 18.0, 80.0, 30.0))
    assert d.score == 1.0
    pixels = TaskSpec.make("detection", {"predictions": "p"}, format="yolo")
    (p,) = decode(pixels, [rows * np.array([128, 96, 128, 96, 1, 1, 1], np.float32)], ["p"],
                  transform=Transform.identity(96, 128)).detections
    np.testing.assert_allclose(p.box, d.box, atol=1e-4)
    with pytest.raises(InputError, match="normalized"):
        decode(spec, [rows], ["p"])


def test_a_box_wholly_outside_the_image_is_dropped_not_clipped_to_its_edge():
    """A box in the letterbox padding (or past the image) used to be clipped to a zero-area box on the image's edge."""
    transform = Transform.letterbox((200, 400), (128, 128))  # the image is rows 32 to 96 of the input
    boxes = np.array([[[32, 48, 96, 80], [10, 2, 40, 20], [10, 100, 40, 126]]], np.float32)  # in, above, below
    decoded = decode(boxes_spec(), [boxes, np.array([[0.7, 0.9, 0.8]], np.float32)], ["boxes", "scores"],
                     transform=transform)
    assert [d.box for d in decoded.detections] == [pytest.approx((100, 50, 300, 150))]


def test_boxes_and_classes_past_what_decoding_can_hold_are_unreadable_not_absent():
    """Finite outputs too large for the decoding's arithmetic (3e38 normalized, a class index of 1e30) are counted as
    unreadable, without a RuntimeWarning; the others decode as before."""
    import warnings

    spec = TaskSpec.make("detection", {"predictions": "p"}, format="yolo", normalized=True)
    rows = np.array([[[0.5, 0.5, 0.25, 0.25, 0.9, 1.0], [3e38, 3e38, 3e38, 3e38, 0.9, 1.0],
                      [40.0, 0.5, 0.25, 0.25, 0.9, 1.0], [3e38, 3e38, 3e38, 3e38, 0.1, 1.0]]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoded = decode(spec, [rows], ["p"], transform=Transform.identity(96, 128))
    # the second row overflows, the third lies 40 input widths away (past 16); the fourth is under the threshold
    assert len(decoded.detections) == 1 and decoded.unreadable == 2
    classes = boxes_spec(roles={"classes": "classes"})
    outputs = [np.array([[[10, 20, 30, 60], [10, 20, 30, 60]]], np.float32), np.array([[0.8, 0.9]], np.float32),
               np.array([[1e30, 2.0]], np.float32)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoded = decode(classes, outputs, ["boxes", "scores", "classes"])
    assert [d.class_index for d in decoded.detections] == [2] and decoded.unreadable == 1
