"""Issue 27's done-when on the shapes detector: held-out images raise nothing; the stream shifted (darker, noisier,
another dataset's images) raises input_drift within 500 predictions (to alert; noise to warn: see the cases), and
the detection summary (count, scores, the uncertain share) moves; a 90 degree rotation is no shift of this data. The detector quantized with enough data for a reference (200 + 200),
ONNX Runtime only (the monitor is the same on every engine)."""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.choices import AlertLevel, MonitorSignal
from shapes_support import SHAPES, SHAPES_MODEL
from support import quantize

STREAM = 3_000  # held-out predictions (a detector decodes each one: slower than the digits' 10,000)
WARM = 600
WITHIN = 500


@pytest.fixture(scope="module")
def monitored_shapes(tmp_path_factory, shapes_data_module):
    from edgesdk.tomlfile import read_toml

    sets = shapes_data_module.write_sets(tmp_path_factory.mktemp("shapes-monitor"), calib=200, val=200, demo=0)
    out = tmp_path_factory.mktemp("shapes-monitor-bundle") / "shapes.bundle"
    return quantize(SHAPES_MODEL, sets / "calib", out, val=sets / "val", preprocess=SHAPES / "preprocess.toml",
                    labels=sets / "labels.txt", task=read_toml(SHAPES / "task.toml", "task"), samples=200,
                    targets=["onnx"], name="shapes").bundle


@pytest.fixture(scope="module")
def held_out(shapes_data_module) -> list[np.ndarray]:
    return [s.pixels for s in shapes_data_module.make_set(1000, seed=987654)]  # a seed no set uses


def _digits_images(count: int) -> list[np.ndarray]:
    """scikit-learn's digits, upscaled to 96x96 RGB: another dataset's images."""
    from PIL import Image
    from sklearn.datasets import load_digits

    images = (load_digits().images[:count] * 16).clip(0, 255).astype(np.uint8)
    return [np.asarray(Image.fromarray(im).resize((96, 96)).convert("RGB")) for im in images]


SHIFTS = {
    "brightness -30%": lambda a, rng: (a.astype(np.float32) * 0.7).astype(np.uint8),
    "gaussian noise sigma 0.1": lambda a, rng: np.clip(a + rng.normal(0, 0.1 * 255, a.shape), 0, 255).astype(np.uint8),
    "rotation 90 degrees": lambda a, rng: np.ascontiguousarray(np.rot90(a)),
}


def test_held_out_images_raise_nothing(monitored_shapes, held_out):
    rng = np.random.default_rng(0)
    with edgesdk.load(monitored_shapes, engine="onnxruntime") as model:
        changes = []
        model.monitor.on_alert(changes.append)
        for i in rng.integers(0, len(held_out), STREAM):
            model.predict(held_out[i])
        snap = model.monitor.snapshot()
    assert changes == []
    assert set(snap["outputs"]) == {"count", "mean_score", "uncertain_share", "min_kept_score"}
    assert snap["outputs"]["count"]["mean"] > 0


ROTATION_IS_NO_SHIFT_HERE = (
    "the shapes set is symmetric under a 90 degree rotation: its image sizes come in rotated pairs (160x120 and "
    "120x160, 144x96 and 100x150 letterbox alike), shapes are placed uniformly on noise, circles and squares do not "
    "change; only a triangle's orientation does, which no per-cell mean sees (input_drift 0.08 above its floor)")


@pytest.mark.parametrize("shift, level", [
    ("brightness -30%", AlertLevel.ALERT),
    ("another dataset", AlertLevel.ALERT),
    # the set's backgrounds are noise already: sigma 0.1 more lowers smoothness 0.79 -> 0.75, PSI 0.26 when the whole
    # window is noisy, 0.17 to 0.23 above its floor: warn, short of alert (digits, on black, reach alert); the
    # detector's answers do not move either
    ("gaussian noise sigma 0.1", AlertLevel.WARN),
    pytest.param("rotation 90 degrees", AlertLevel.WARN,
                 marks=pytest.mark.xfail(strict=True, reason=ROTATION_IS_NO_SHIFT_HERE)),
])
def test_a_shifted_stream_raises_input_drift_within_500(monitored_shapes, held_out, shift, level):
    rng = np.random.default_rng(1)
    other = _digits_images(WITHIN) if shift == "another dataset" else None
    with edgesdk.load(monitored_shapes, engine="onnxruntime") as model:
        changes = []
        model.monitor.on_alert(changes.append)
        for i in rng.integers(0, len(held_out), WARM):
            model.predict(held_out[i])
        before = model.monitor.snapshot()
        assert changes == []
        for k in range(WITHIN):
            x = other[k] if other is not None else SHIFTS[shift](held_out[rng.integers(len(held_out))], rng)
            model.predict(x)
        after = model.monitor.snapshot()
    raised = [c for c in changes if c.signal is MonitorSignal.INPUT_DRIFT and c.level in (level, AlertLevel.ALERT)]
    assert raised and raised[0].predictions - WARM <= WITHIN, after["signals"]["input_drift"]
    moved = {f: after["drift"]["outputs"][f]["psi"] - before["drift"]["outputs"][f]["psi"]
             for f in after["drift"]["outputs"] if f in before["drift"]["outputs"]}
    if level is AlertLevel.ALERT:
        assert max(moved.values()) > 0.05, f"{shift}: the detection summary did not move ({moved})"
    else:  # the detector shrugs this noise off: its answers stay where they were, as the monitor says
        assert after["signals"]["output_drift"]["level"] == "ok"
