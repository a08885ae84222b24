"""Each task's validation metric on crafted predictions (the accumulators fed by hand, with numbers worked out
here), the dead-output check, and the quantiles behind the landmarks' p95."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.tasks import Decoded, Detection, Landmarks, Mask, TaskSpec, TextLine
from edgesdk_converters.validation.output_spread import OutputSpread, dead_outputs
from edgesdk_converters.validation.task_metrics import (DetectionAgreement, MaskAgreement, PointAgreement, Quantiles,
                                             TextAgreement, box_iou, edit_distance, metric_for)
from edgesdk_converters.validation.value_metrics import EmbeddingAgreement, RawAgreement, ValueAgreement


def _dets(*boxes) -> Decoded:
    return Decoded("detection", detections=[Detection(tuple(b[:4]), b[4], b[5] if len(b) > 5 else 0) for b in boxes])


# -- detection --------------------------------------------------------------------------------------------------------

def test_box_f1_matches_greedily_by_score_within_a_class():
    m = DetectionAgreement()
    ref = _dets((0, 0, 10, 10, 0.9), (20, 20, 30, 30, 0.8), (50, 50, 60, 60, 0.7, 1))
    own = _dets((0, 0, 10, 11, 0.85),  # matches the first (IoU 10/11), score off by 0.05
                (24, 24, 34, 34, 0.8),  # IoU 36/164 with the second: no match
                (50, 50, 60, 60, 0.7, 2))  # the third's box, another class: no match
    m.add(own, ref, [], [])
    m.add(_dets(), _dets(), [], [])  # a sample where neither finds anything counts for nothing
    d = m.details()
    assert m.value() == pytest.approx(2 * 1 / 6) and m.drop() == pytest.approx(100 * (1 - 1 / 3))
    assert d["precision"] == pytest.approx(1 / 3) and d["recall"] == pytest.approx(1 / 3)
    assert d["score_error"] == pytest.approx(0.05) and d["box_iou"] == pytest.approx(10 / 11)
    assert (d["detections"], d["reference_detections"]) == (3, 3) and d["keypoint_error_px"] is None
    assert m.default_max_drop() == 10.0 and m.unit == "points"


def test_box_f1_one_reference_box_matched_once_and_keypoints_measured():
    m = DetectionAgreement()
    kp = ((1.0, 1.0), (5.0, 5.0))
    ref = Decoded("detection", detections=[Detection((0, 0, 10, 10), 0.9, 0, None, kp)])
    own = Decoded("detection", detections=[Detection((0, 0, 10, 10), 0.9, 0, None, ((4.0, 5.0), (5.0, 5.0))),
                                           Detection((0, 0, 10, 10), 0.6)])  # a duplicate: unmatched
    m.add(own, ref, [], [])
    assert m.value() == pytest.approx(2 / 3)
    assert m.details()["keypoint_error_px"] == pytest.approx(2.5)  # (5 + 0) / 2: (4, 5) is 5 px from (1, 1)


def test_box_iou():
    assert box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    assert box_iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0 and box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


# -- segmentation -----------------------------------------------------------------------------------------------------

def _mask(shape, on, c=0) -> Mask:
    m = np.zeros(shape, bool)
    m[on] = True
    return Mask(m, c)


def test_mask_iou_is_pooled_over_the_set_not_averaged_per_sample():
    m = MaskAgreement()
    # sample 1: ref 100 pixels, own the same 100 -> I 100, U 100; sample 2: ref 4 pixels, own 0 -> I 0, U 4
    m.add(Decoded("segmentation", masks=[_mask((20, 20), np.s_[:10, :10])]),
          Decoded("segmentation", masks=[_mask((20, 20), np.s_[:10, :10])]), [], [])
    m.add(Decoded("segmentation", masks=[_mask((20, 20), np.s_[:0])]),
          Decoded("segmentation", masks=[_mask((20, 20), np.s_[:2, :2])]), [], [])
    assert m.value() == pytest.approx(100 / 104)  # a per-sample mean would say 0.5
    assert m.drop() == pytest.approx(100 * 4 / 104)
    assert m.details()["pixels_differing"] == pytest.approx(4 / 800)


def test_mask_iou_of_classes_is_the_mean_over_classes_present():
    m = MaskAgreement()
    own = Decoded("segmentation", masks=[_mask((4, 4), np.s_[:2], 0), _mask((4, 4), np.s_[2:], 1)])
    ref = Decoded("segmentation", masks=[_mask((4, 4), np.s_[:3], 0), _mask((4, 4), np.s_[3:], 1)])
    m.add(own, ref, [], [])  # class 0: I 8 U 12; class 1: I 4 U 8; class 2: never marked, not counted
    assert m.value() == pytest.approx((8 / 12 + 4 / 8) / 2)
    assert m.details()["classes"] == 2 and m.details()["class_iou"] == {"0": pytest.approx(2 / 3), "1": 0.5}


def test_mask_iou_of_nothing_against_nothing_is_agreement():
    m = MaskAgreement()
    m.add(Decoded("segmentation", masks=[_mask((4, 4), np.s_[:0])]),
          Decoded("segmentation", masks=[_mask((4, 4), np.s_[:0])]), [], [])
    assert m.value() == 1.0


# -- text -------------------------------------------------------------------------------------------------------------

def test_text_agreement_and_cer():
    m = TextAgreement()
    for own, ref in (("hello", "hello"), ("he1lo", "hello"), ("", "ab"), ("x", "")):
        m.add(Decoded("text", text=TextLine(own)), Decoded("text", text=TextLine(ref)), [], [])
    assert m.value() == pytest.approx(1 / 4) and m.drop() == pytest.approx(75.0)
    assert m.details()["cer"] == pytest.approx((0 + 1 / 5 + 2 / 2 + 1 / 1) / 4)
    assert m.default_max_drop() == 5.0


@pytest.mark.parametrize("a, b, d", [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "abc", 0), ("ab", "ba", 2)])
def test_edit_distance(a, b, d):
    assert edit_distance(a, b) == d == edit_distance(b, a)


# -- landmarks --------------------------------------------------------------------------------------------------------

def test_point_error_mean_and_p95_in_pixels_gated_by_one_percent_of_the_diagonal():
    m = PointAgreement((300, 400))  # diagonal 500 px: 5 px allowed
    ref = np.zeros((20, 2))
    own = ref.copy()
    own[:, 0] = np.arange(20) * 0.5  # errors 0, 0.5, ..., 9.5 px
    m.add(Decoded("landmarks", landmarks=Landmarks(own, np.full(20, 0.9))),
          Decoded("landmarks", landmarks=Landmarks(ref, np.full(20, 0.5))), [], [])
    d = m.details()
    assert d["mean_point_error_px"] == pytest.approx(4.75) and d["max_point_error_px"] == pytest.approx(9.5)
    assert d["p95_point_error_px"] == pytest.approx(np.percentile(np.arange(20) * 0.5, 95, method="inverted_cdf"),
                                                    rel=0.011)
    assert d["visibility_error"] == pytest.approx(0.4)
    assert m.unit == "px" and m.drop() == m.value() and m.default_max_drop() == pytest.approx(5.0)


def test_point_error_ignores_z_and_defaults_to_the_points_extent_without_an_image():
    m = PointAgreement(None)
    ref = np.array([[0.0, 0.0, 0.0], [30.0, 40.0, 0.0]])
    m.add(Decoded("landmarks", landmarks=Landmarks(ref + [0.0, 0.0, 9.0])),
          Decoded("landmarks", landmarks=Landmarks(ref)), [], [])
    assert m.value() == 0.0 and m.default_max_drop() == pytest.approx(0.5)


def test_quantiles_follow_numpy_within_one_percent():
    q = Quantiles()
    values = np.random.default_rng(0).lognormal(0.0, 2.0, 20000)
    for chunk in np.array_split(values, 7):
        q.add(chunk)
    for level in (0.5, 0.95, 0.99):
        assert q.quantile(level) == pytest.approx(np.quantile(values, level, method="inverted_cdf"), rel=0.011)
    q.add(np.array([np.nan]))  # a point that is not finite is the worst error there is
    assert q.max == math.inf


# -- regression / probability -----------------------------------------------------------------------------------------

def test_relative_mae_to_the_task_range_and_decisions_at_the_threshold():
    task = TaskSpec.make("probability", {"values": "p"})
    m = ValueAgreement(task)
    for own, ref in ((0.55, 0.45), (0.2, 0.1), (0.9, 0.9)):
        m.add(Decoded("probability", values=np.array([own])), Decoded("probability", values=np.array([ref])), [], [])
    assert m.value() == pytest.approx(100 * 0.2 / 3) and m.drop() == m.value()
    assert m.decision_agreement() == pytest.approx(2 / 3)
    assert "agree on 66.7% of values (< 90%)" in m.failure()


def test_regression_without_a_range_is_relative_to_the_reference_spread():
    m = ValueAgreement(TaskSpec.make("regression", {"values": "v"}))
    for own, ref in (([10.0, 21.0], [10.0, 20.0]), ([30.0, 40.0], [30.0, 40.0])):
        m.add(Decoded("regression", values=np.array(own)), Decoded("regression", values=np.array(ref)), [], [])
    assert m.details()["range"] == 30.0 and m.value() == pytest.approx(100 * (1 / 4) / 30)
    assert m.decision_agreement() is None and m.failure() is None  # no threshold: no decisions


# -- embedding --------------------------------------------------------------------------------------------------------

def test_embedding_cosine_and_recall_at_1_agreement():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((6, 8))
    own = ref.copy()
    own[5] = -own[5]  # one vector reversed: its cosine -1, and it is nobody's neighbour as it was
    m = EmbeddingAgreement()
    for a, b in zip(own, ref):
        m.add(Decoded("embedding", embedding=a), Decoded("embedding", embedding=b), [], [])
    assert m.value() == pytest.approx(4 / 6)
    assert m.drop() == pytest.approx(100 * (1 - 4 / 6))
    def nearest(vectors):  # brute force: each vector's most similar other one
        unit = [v / np.linalg.norm(v) for v in vectors]
        return [max((j for j in range(len(unit)) if j != i), key=lambda j: float(unit[i] @ unit[j]))
                for i in range(len(unit))]

    expected = float(np.mean(np.array(nearest(own)) == np.array(nearest(ref))))
    assert expected < 1.0 and m.details()["recall_at_1_agreement"] == pytest.approx(expected)
    same = EmbeddingAgreement()
    for b in ref:
        same.add(Decoded("embedding", embedding=b * 3), Decoded("embedding", embedding=b), [], [])
    assert same.value() == pytest.approx(1.0) and same.details()["recall_at_1_agreement"] == 1.0


# -- raw --------------------------------------------------------------------------------------------------------------

def test_raw_relative_errors_per_output_gate_on_the_worst_mean():
    m = RawAgreement()
    m.add(None, None, [np.array([1.0, 2.0]), np.array([0.0, 100.0])], [np.array([1.0, 1.0]), np.array([0.0, 90.0])])
    m.add(None, None, [np.array([0.0, 0.0]), np.array([0.0, 0.0])], [np.array([0.0, 0.0]), np.array([0.0, 0.0])])
    out = m.details()["outputs"]
    # output 0: range 1 (reference 0..1), errors 0, 1, 0, 0 -> max 100 %, mean 25 %; output 1: range 90, max 10/90
    assert out[0]["relative_max_error"] == pytest.approx(100.0) and out[0]["relative_mean_error"] == pytest.approx(25)
    assert out[1]["relative_max_error"] == pytest.approx(100 * 10 / 90)
    assert m.value() == pytest.approx(25.0) and m.drop() == m.value()


def test_raw_error_of_an_output_that_barely_moves_is_relative_to_its_magnitude():
    m = RawAgreement()
    for i in range(4):  # the reference spans 3e-6 near 0.001; INT8 holds 0.00106
        m.add(None, None, [np.array([0.00106])], [np.array([0.001 + 1e-6 * i])])
    assert m.value() == pytest.approx(100 * (0.00106 - 0.0010015) / (0.5 * 0.001003), rel=1e-6)


def test_metric_for_each_task():
    kinds = {"detection": DetectionAgreement, "segmentation": MaskAgreement, "text": TextAgreement,
             "landmarks": PointAgreement, "regression": ValueAgreement, "probability": ValueAgreement,
             "embedding": EmbeddingAgreement, "raw": RawAgreement}
    for kind, cls in kinds.items():
        spec = TaskSpec.make(kind, format="boxes") if kind == "detection" else TaskSpec.make(kind)
        assert type(metric_for(spec)) is cls
    assert metric_for(TaskSpec.make("classification")) is None


# -- the dead-output check ----------------------------------------------------------------------------------------------

def test_an_output_that_stops_varying_is_dead():
    rng = np.random.default_rng(0)
    ref, flat, fine = OutputSpread(), OutputSpread(), OutputSpread()
    for _ in range(50):
        prob = rng.uniform(0.0, 0.1, (1, 1)).astype(np.float32)
        state = rng.standard_normal((2, 64)).astype(np.float32)
        ref.add([prob, state])
        flat.add([np.full((1, 1), 0.345, np.float32), state])  # Silero's INT8 probability
        fine.add([prob + rng.normal(0, 0.002, (1, 1)), state])
    assert ref.std()[0] == pytest.approx(0.1 / math.sqrt(12), rel=0.3)
    assert flat.std()[0] == 0.0 and dead_outputs(flat, ref) == [0]
    assert dead_outputs(fine, ref) == [] and dead_outputs(ref, ref) == []


def test_spread_is_each_elements_std_across_samples_as_a_root_mean_square():
    rng = np.random.default_rng(1)
    arrays = [rng.normal(3.0, 2.0, (1, 37)) * np.linspace(0.1, 1.0, 37) for _ in range(9)]
    s = OutputSpread()
    for a in arrays:
        s.add([a])
    per_element = np.concatenate(arrays, axis=0).std(axis=0)
    assert s.std()[0] == pytest.approx(float(np.sqrt(np.mean(per_element ** 2))), rel=1e-9)


def test_an_output_answering_the_same_vector_for_every_input_is_dead_though_its_elements_differ():
    """INT8 stuck at [0.345, 0.655] where float answers [p, 1 - p]: across samples it does not move at all."""
    rng = np.random.default_rng(3)
    ref, own = OutputSpread(), OutputSpread()
    for p in rng.uniform(0, 1, 40):
        ref.add([np.array([[p, 1 - p]])])
        own.add([np.array([[0.345, 0.655]])])
    assert own.std() == [0.0] and ref.std()[0] > 0.2
    assert dead_outputs(own, ref) == [0]


def test_an_output_the_reference_holds_nearly_still_is_not_judged():
    """A presence score stuck near 0.995 varies by less than one 8-bit step: INT8 holding it at one value is not a
    loss (the per-output cap's own rule)."""
    rng = np.random.default_rng(2)
    ref, own = OutputSpread(), OutputSpread()
    for _ in range(30):
        ref.add([np.array([[0.995 + rng.uniform(-0.001, 0.001)]])])
        own.add([np.array([[0.996]])])
    assert dead_outputs(own, ref) == []


def test_an_output_varying_by_one_int8_step_is_not_judged():
    """Silero's speech probability on a few chunks of noise (measured: std 4e-6 near 0.001): INT8 rounds it to one
    value, which is no loss; the same output varying over a fifth of its magnitude is judged."""
    rng = np.random.default_rng(3)
    quiet, lively, own = OutputSpread(), OutputSpread(), OutputSpread()
    for _ in range(8):
        quiet.add([np.array([[0.001 + rng.normal(0, 4e-6)]])])
        lively.add([np.array([[0.001 + rng.normal(0, 2e-4)]])])
        own.add([np.array([[0.001]])])
    assert dead_outputs(own, quiet) == [] and dead_outputs(own, lively) == [0]


def test_an_output_that_is_not_finite_is_dead():
    ref, own = OutputSpread(), OutputSpread()
    for i in range(5):
        ref.add([np.array([float(i)])])
        own.add([np.array([np.nan if i == 3 else float(i)])])
    assert dead_outputs(own, ref) == [0]


def test_detection_fails_on_score_error_when_the_boxes_agree():
    """Boxes that all match but whose scores moved by 0.3 (a YOLO export whose INT8 scores share one scale with pixel
    coordinates) fail on the score error; 0.05 of score error passes."""
    from edgesdk_converters.validation.task_metrics import DETECTION_SCORE_ERROR_MAX, DetectionAgreement

    ref = _dets((0, 0, 10, 10, 0.6), (20, 20, 30, 30, 0.7, 1))
    for moved, fails in ((0.3, True), (0.05, False)):
        metric = DetectionAgreement()
        metric.add(_dets((0, 0, 10, 10, 0.6 + moved), (20, 20, 30, 30, 0.7 - moved, 1)), ref, [], [])
        assert metric.value() == 1.0
        assert (metric.failure() is not None) is fails, (moved, metric.failure())
    assert DETECTION_SCORE_ERROR_MAX == 0.10


def test_landmarks_fail_when_the_presence_decision_disagrees_though_the_points_agree():
    points = np.zeros((4, 2))
    for flipped, fails in ((3, True), (0, False)):
        m = PointAgreement((100, 100))
        for i in range(20):
            ref = Landmarks(points, presence=0.9)
            own = Landmarks(points, presence=0.2 if i < flipped else 0.85)
            m.add(Decoded("landmarks", landmarks=own), Decoded("landmarks", landmarks=ref), [], [])
        assert m.value() == 0.0 and m.details()["presence_agreement"] == pytest.approx(1 - flipped / 20)
        assert (m.failure() is not None) is fails, m.failure()
