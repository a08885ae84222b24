"""Hybrid mode's escalation policy per task: the task's usual signal when none is named, none for tasks without a
hardness signal (they load in every hybrid mode and escalate only out-of-range inputs), and a classifier's scores
read from the output its task names."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgesdk.bundle.tensors import BundleIO
from edgesdk.choices import EscalationReason
from edgesdk.errors import InputError
from edgesdk.hybrid.model import EscalationPolicy


def _manifest(task: dict | None, outputs=("out",)) -> dict:
    return {"outputs": [{"name": n, "shape": [1, 3], "dtype": "float32"} for n in outputs],
            "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}], **({"task": task} if task else {})}


@pytest.mark.parametrize(("task", "signal", "threshold"), [
    ({"type": "detection", "format": "yolo"}, "uncertain_share", 0.5),
    ({"type": "segmentation"}, "uncertain_pixel_share", 0.1),
    ({"type": "text"}, "min_char_confidence", 0.6),
    ({"type": "probability"}, "threshold_distance", 0.1),
    ({"type": "classification"}, "max_prob", 0.6),
    (None, None, None),  # a bundle from before tasks, not a classifier: raw
    ({"type": "landmarks"}, None, None),
    ({"type": "embedding"}, None, None),
])
def test_the_tasks_usual_signal_or_none(task, signal, threshold):
    policy = EscalationPolicy().resolved(_manifest(task))
    assert (policy.signal, policy.threshold) == (signal, threshold)
    if signal is None:  # no confidence signal: never low_confidence, still out_of_range
        assert policy.reason({"clipped_share": 0.0}) is None
        assert policy.reason({"clipped_share": 0.5}) is EscalationReason.OUT_OF_RANGE


def test_a_signal_of_another_task_is_refused_naming_the_tasks_own():
    with pytest.raises(InputError, match=r"'max_prob' is a classification signal; this bundle's task is detection "
                                         r"\(its signal: uncertain_share\)"):
        EscalationPolicy(signal="max_prob").resolved(_manifest({"type": "detection", "format": "yolo"}))
    with pytest.raises(InputError, match="escalation signal must be one of"):
        EscalationPolicy(signal="confidence")


def test_high_uncertain_share_is_hard_and_low_min_score_is_hard():
    manifest = _manifest({"type": "detection", "format": "yolo"})
    share = EscalationPolicy(threshold=0.5).resolved(manifest)
    assert share.reason({"uncertain_share": 0.6}) is EscalationReason.LOW_CONFIDENCE
    assert share.reason({"uncertain_share": 0.4}) is None
    kept = EscalationPolicy(signal="min_kept_score", threshold=0.6).resolved(manifest)
    assert kept.reason({"min_kept_score": 0.55}) is EscalationReason.LOW_CONFIDENCE
    assert kept.reason({"min_kept_score": None}) is None  # nothing kept: nothing unsure


def test_a_classifier_reads_the_output_its_task_names():
    manifest = _manifest({"type": "classification", "outputs": {"scores": "logits"}, "softmax": False},
                         outputs=("features", "logits"))
    bundle = SimpleNamespace(name="b", preprocess=None, manifest=manifest, labels=["a", "b", "c"])
    io = BundleIO(bundle)
    outputs = [np.array([[9.0, 0.0, 0.0]], np.float32), np.array([[0.1, 0.7, 0.2]], np.float32)]
    assert [t.label for t in io.top(outputs)] == ["b", "c", "a"]
    np.testing.assert_allclose(io.probabilities(outputs), [0.1, 0.7, 0.2], rtol=1e-6)
    old = SimpleNamespace(name="b", preprocess=None, labels=None, manifest={
        **_manifest(None), "postprocess": {"type": "classification", "softmax": True}})
    np.testing.assert_allclose(BundleIO(old).probabilities([np.zeros((1, 3), np.float32)]), [1 / 3] * 3)
