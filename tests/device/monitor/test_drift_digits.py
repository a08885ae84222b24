"""Issue 27's done-when on the digits bundle: 10,000 held-out predictions raise nothing; the same stream shifted
(darker, noisier, rotated, another dataset's images) raises input_drift to alert within 500 predictions, and the
confidence signal moves. Real bundle (quantize's own reference), real engine, the production monitor."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import edgesdk
from edgesdk.choices import AlertLevel, MonitorSignal

STREAM = 10_000
WARM = 1_000  # in-distribution predictions before a shift
WITHIN = 500


@pytest.fixture(scope="module")
def held_out(digits_images) -> np.ndarray:
    files = sorted(digits_images.glob("val/*/*.png"))
    return np.stack([np.asarray(Image.open(f).convert("L")) for f in files])


def _other_dataset(count: int, rng: np.random.Generator) -> np.ndarray:
    """Patches of scikit-learn's two sample photographs (china, flower), gray, 8x8: another dataset's images."""
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(Image.fromarray(im).convert("L")) for im in load_sample_images().images]
    out = []
    for k in range(count):
        g = photos[k % 2]
        y, x = rng.integers(0, g.shape[0] - 64), rng.integers(0, g.shape[1] - 64)
        out.append(np.asarray(Image.fromarray(g[y:y + 64, x:x + 64]).resize((8, 8))))
    return np.stack(out)


SHIFTS = {
    "brightness -30%": lambda a, rng: (a.astype(np.float32) * 0.7).astype(np.uint8),
    "gaussian noise sigma 0.1": lambda a, rng: np.clip(a + rng.normal(0, 0.1 * 255, a.shape), 0, 255).astype(np.uint8),
    "rotation 90 degrees": lambda a, rng: np.ascontiguousarray(np.rot90(a)),
}


def _watch(model) -> list:
    changes = []
    model.monitor.on_alert(changes.append)
    return changes


def test_the_bundle_carries_a_small_reference(digits_bundle):
    import json

    section = digits_bundle.manifest["monitoring"]
    assert len(json.dumps(section)) < 16_000
    name = digits_bundle.manifest["inputs"][0]["name"]
    assert {f"{name}.mean", f"{name}.std", f"{name}.cell[0]", f"{name}.cell[15]", f"{name}.smooth"} == \
        set(section["inputs"]) - {f"{name}.cell[{k}]" for k in range(1, 15)}
    assert {"max_prob", "margin", "entropy", "predicted_class"} == set(section["outputs"])
    assert section["outputs"]["predicted_class"]["edges"] == [k + 0.5 for k in range(9)]  # one bin per class


def test_ten_thousand_held_out_predictions_raise_nothing(digits_bundle, held_out):
    rng = np.random.default_rng(0)
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime") as model:
        changes = _watch(model)
        for i in rng.integers(0, len(held_out), STREAM):
            model.predict(held_out[i])
        snap = model.monitor.snapshot()
    assert changes == []
    assert snap["predictions"] == STREAM and snap["errors"] == {}
    assert all(s["level"] == "ok" for s in snap["signals"].values())
    assert snap["signals"]["input_drift"]["value"] < edgesdk.monitor.MonitorOptions().warn


@pytest.mark.parametrize("shift", [*SHIFTS, "another dataset"])
def test_a_shifted_stream_raises_input_drift_within_500_and_moves_confidence(digits_bundle, held_out, shift):
    rng = np.random.default_rng(1)
    other = _other_dataset(400, rng) if shift == "another dataset" else None
    with edgesdk.load(digits_bundle.bundle, engine="onnxruntime") as model:
        changes = _watch(model)
        for i in rng.integers(0, len(held_out), WARM):
            model.predict(held_out[i])
        before = model.monitor.snapshot()
        assert changes == [], "the in-distribution warm-up raised something"
        for k in range(WITHIN):
            x = other[k % len(other)] if other is not None else SHIFTS[shift](held_out[rng.integers(len(held_out))], rng)
            model.predict(x)
        after = model.monitor.snapshot()
    raised = [c for c in changes if c.signal is MonitorSignal.INPUT_DRIFT and c.level is AlertLevel.ALERT]
    assert raised, f"{shift}: no input_drift alert within {WITHIN} predictions ({after['signals']['input_drift']})"
    assert raised[0].predictions - WARM <= WITHIN
    assert raised[0].feature.startswith(f"{digits_bundle.manifest['inputs'][0]['name']}.")
    confidence = [after["drift"]["outputs"][f]["psi"] - before["drift"]["outputs"][f]["psi"]
                  for f in ("max_prob", "margin", "entropy")]
    assert max(confidence) > 0.05, f"{shift}: the confidence distribution did not move ({confidence})"
