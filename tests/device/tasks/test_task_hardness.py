"""Hardness signals per task (edgesdk.tasks.hardness) on crafted outputs with known values: detection's uncertain
share and lowest kept score, segmentation's unsure pixels, text's character confidence and margin, the distance
to a decision threshold; and the SIGNALS table that hybrid mode reads."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.choices import TaskType
from edgesdk.tasks.decode import decode
from edgesdk.tasks.hardness import SIGNALS, is_hard, signals, signals_of
from edgesdk.tasks.spec import TaskSpec


def signals_for(spec: TaskSpec, outputs: list[np.ndarray], names: list[str]) -> dict:
    return signals(spec, decode(spec, outputs, names), outputs, names)


def test_detection_uncertain_share_and_lowest_kept_score():
    spec = TaskSpec.make("detection", {"boxes": "b", "scores": "s"}, format="boxes", score_threshold=0.4)
    boxes = np.array([[[i * 20, 0, i * 20 + 10, 10] for i in range(6)]], np.float32)  # apart: NMS keeps all
    scores = np.array([[0.1, 0.2, 0.35, 0.5, 0.8, 0.9]], np.float32)
    got = signals_for(spec, [boxes, scores], ["b", "s"])
    # reaching 0.3: 0.35, 0.5, 0.8, 0.9; of those under 0.7: 0.35 and 0.5
    assert got == {"uncertain_share": pytest.approx(0.5), "min_kept_score": pytest.approx(0.5)}
    quiet = signals_for(spec, [boxes, np.full((1, 6), 0.05, np.float32)], ["b", "s"])
    assert quiet == {"uncertain_share": 0.0, "min_kept_score": None}  # nothing there, surely: not hard
    band = TaskSpec.make("detection", {"boxes": "b", "scores": "s"}, format="boxes", uncertain=[0.15, 0.85])
    assert signals_for(band, [boxes, scores], ["b", "s"])["uncertain_share"] == pytest.approx(4 / 5)


def test_segmentation_unsure_pixels_for_probability_and_classes():
    prob = np.array([[0.1, 0.3, 0.5, 0.69, 0.7, 0.9, 0.95, 0.0]], np.float32)  # 3 of 8 in [0.3, 0.7)
    spec = TaskSpec.make("segmentation", {"map": "m"})
    assert signals_for(spec, [prob[None, None]], ["m"]) == {"uncertain_pixel_share": pytest.approx(3 / 8)}
    probs = np.array([[[0.9, 0.6, 0.4, 0.34]], [[0.05, 0.3, 0.35, 0.33]], [[0.05, 0.1, 0.25, 0.33]]], np.float32)
    classes = TaskSpec.make("segmentation", {"map": "m"}, kind="classes")  # top-1 under 0.7: 3 of 4 pixels
    assert signals_for(classes, [probs[None]], ["m"]) == {"uncertain_pixel_share": pytest.approx(3 / 4)}


def test_text_lowest_char_confidence_and_mean_margin():
    probs = np.array([[0.9, 0.05, 0.05],  # blank: not an emitting step
                      [0.1, 0.8, 0.1],    # 'a', margin 0.7
                      [0.3, 0.6, 0.1],    # 'a' again (same run), margin 0.3
                      [0.2, 0.2, 0.6]],   # 'b', margin 0.4
                     np.float32)
    spec = TaskSpec.make("text", {"logits": "l"}, charset=["a", "b"])
    got = signals_for(spec, [probs[None]], ["l"])
    assert got == {"min_char_confidence": pytest.approx(0.6), "mean_margin": pytest.approx((0.7 + 0.3 + 0.4) / 3)}
    blank = signals_for(spec, [probs[None, :1]], ["l"])
    assert blank == {"min_char_confidence": None, "mean_margin": None}


def test_threshold_distance_relative_to_the_range():
    spec = TaskSpec.make("probability", {"values": "v"})  # range [0, 1], threshold 0.5
    assert signals_for(spec, [np.array([[0.45, 0.9]])], ["v"]) == {"threshold_distance": pytest.approx(0.05)}
    reg = TaskSpec.make("regression", {"values": "v"}, range=[0, 10], threshold=5)
    assert signals_for(reg, [np.array([[7.0]])], ["v"]) == {"threshold_distance": pytest.approx(0.2)}
    assert signals_for(TaskSpec.make("regression", {"values": "v"}), [np.array([[7.0]])], ["v"]) == \
        {"threshold_distance": None}


def test_tasks_without_signals_here_give_none():
    assert signals_for(TaskSpec.make("embedding", {"embedding": "e"}), [np.ones((1, 4))], ["e"]) == {}
    assert signals_for(TaskSpec.make("classification", {"scores": "s"}), [np.ones((1, 4))], ["s"]) == {}


def test_the_signal_table_names_each_signal_once_with_its_hard_side():
    assert signals_of(TaskType.DETECTION) == ("uncertain_share", "min_kept_score")
    assert signals_of(TaskType.PROBABILITY) == signals_of(TaskType.REGRESSION) == ("threshold_distance",)
    assert signals_of(TaskType.CLASSIFICATION) == ()
    for name, (types, side, default) in SIGNALS.items():
        assert side in ("low", "high") and 0 < default < 1 and types
    assert is_hard("uncertain_share", 0.6, 0.5) and not is_hard("uncertain_share", 0.4, 0.5)
    assert is_hard("min_kept_score", 0.55, 0.6) and not is_hard("min_kept_score", 0.65, 0.6)
    assert not is_hard("min_kept_score", None, 0.6)
