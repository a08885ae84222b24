"""The shapes detector in hybrid mode against a real ``edgesdk serve`` on loopback (the cloud venv): the device's INT8
detector keeps the inputs it is sure of, escalates those with candidates in its uncertain band (the detection signal
``uncertain_share``), reads the cloud's answer as detections in the original image's pixels, and answers alone,
degraded, when the cloud is gone. calibrate-escalation needs no labels for it; samples/shapes/hybrid.py end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.tasks.detection import candidate_scores

from cloud_server import CloudServer, free_port
from shapes_support import SHAPES, SHAPES_MODEL, load_sample_module, quantize_shapes

EDGESDK = str(Path(sys.executable).parent / "edgesdk")
DEVICE_ARTIFACT = "onnxruntime-int8"
UNCERTAIN = (0.3, 0.7)  # the detection task's default uncertain band (edgesdk.tasks.spec)


@pytest.fixture(scope="module")
def float_bundle(tmp_path_factory, shapes_sets):
    """What the cloud serves: the same detector for ONNX Runtime, whose float artifact edgesdk serve picks."""
    return quantize_shapes(tmp_path_factory.mktemp("shapes-cloud") / "shapes-cloud.bundle", shapes_sets,
                           targets=["onnx"]).bundle


@pytest.fixture(scope="module")
def server(float_bundle, tmp_path_factory):
    with CloudServer(float_bundle, log_dir=tmp_path_factory.mktemp("shapes-serve")) as srv:
        yield srv


@pytest.fixture(scope="module")
def hard_case(shapes_bundle, shapes_data_module):
    """A hard, non-square image (data.py's hard option) on which the INT8 detector finds something but has more
    than half of its candidates in the uncertain band: (the sample, the device-only result)."""
    with edgesdk.load(shapes_bundle, artifact=DEVICE_ARTIFACT, speed_check="off") as model:
        for sample in shapes_data_module.make_set(60, seed=41, hard=1.0):
            height, width = sample.pixels.shape[:2]
            if height == width:
                continue  # a square original maps back by scale alone: no padding to undo
            result = model.predict(sample.pixels)
            scores = candidate_scores(model.io.task, result.outputs, model.io.output_names)
            reaching = scores[scores >= UNCERTAIN[0]]
            if result.detections and reaching.size and np.mean(reaching < UNCERTAIN[1]) > 0.5:
                return sample, result
    pytest.fail("none of 60 hard images has most of its candidates in the uncertain band: data.py's hard option "
                "no longer makes hard inputs")


def reference_float_boxes(pixels: np.ndarray, detect, data) -> tuple[np.ndarray, np.ndarray]:
    """The float ONNX run directly by ONNX Runtime and decoded by the sample's own reference code (detect.py), boxes
    mapped back through data.py's letterbox: independent of edgesdk's decoding and transform."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(SHAPES_MODEL), providers=["CPUExecutionProvider"])
    x, transform = data.to_input(pixels)
    found = detect.decode(session.run(None, {"image": x})[0])
    return transform.to_original(found.boxes), found.classes


def test_an_easy_image_stays_on_the_device(shapes_bundle, server, shapes_data_module):
    easy = shapes_data_module.make_set(8, seed=shapes_data_module.VAL_SEED)
    with edgesdk.load(shapes_bundle, mode="prefer-device", cloud=server.url, artifact=DEVICE_ARTIFACT) as model:
        assert model.policy.signal == "uncertain_share" and model.policy.threshold == 0.5  # the task's, uncalibrated
        results = [model.predict(s.pixels) for s in easy]
    kept = [r for r in results if r.source == "device"]
    assert len(kept) >= 6, [r.signals for r in results]  # most easy images are sure ones
    for r in results:
        assert (r.source == "device") == (r.signals["uncertain_share"] <= 0.5), r.signals
    for r in kept:
        assert r.escalation_reason is None and not r.degraded and "cloud" not in r.timings_ms
        assert r.signals["min_kept_score"] == min((d.score for d in r.detections), default=None)
    assert sum(bool(r.detections) for r in kept) >= 6  # found their shapes (one image's is missed by float too)


def test_a_hard_image_escalates_and_the_cloud_answer_is_decoded_in_original_pixels(shapes_bundle, server, hard_case):
    sample, device_only = hard_case
    height, width = sample.pixels.shape[:2]
    with edgesdk.load(shapes_bundle, mode="prefer-device", cloud=server.url, artifact=DEVICE_ARTIFACT) as model:
        result = model.predict(sample.pixels)
    assert result.source == "cloud" and result.escalation_reason == "low_confidence" and not result.degraded
    assert result.signals["uncertain_share"] > model.policy.threshold  # why: the device's own signal, kept
    assert result.signals["min_kept_score"] == pytest.approx(min(d.score for d in device_only.detections))
    assert "cloud" in result.timings_ms and result.task == "detection"
    # The cloud's raw answer, decoded by the device bundle's task into boxes on the original (non-square) image,
    # is what the float model says, decoded and mapped back by the sample's own reference code.
    boxes, classes = reference_float_boxes(sample.pixels, load_sample_module("detect"), load_sample_module("data"))
    assert len(result.detections) == len(boxes) >= 1
    for d, box, cls in zip(result.detections, boxes, classes):
        np.testing.assert_allclose(d.box, box, atol=0.05)
        assert d.class_index == cls and d.label == ["circle", "square", "triangle"][cls]
        assert 0 <= d.box[0] < d.box[2] <= width + 1 and 0 <= d.box[1] < d.box[3] <= height + 1


def test_a_dead_cloud_returns_the_device_answer_degraded(shapes_bundle, hard_case):
    sample, device_only = hard_case
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with edgesdk.load(shapes_bundle, mode="prefer-device", cloud=dead, artifact=DEVICE_ARTIFACT) as model:
        result = model.predict(sample.pixels)
    assert result.source == "device" and result.degraded and result.escalation_reason == "low_confidence"
    assert result.cloud_error and result.signals["uncertain_share"] > 0.5
    assert [d.to_dict() for d in result.detections] == [d.to_dict() for d in device_only.detections]


def test_calibrate_escalation_needs_no_labels_for_a_detector(shapes_bundle, float_bundle, shapes_sets, tmp_path):
    bundle = tmp_path / "shapes.bundle"
    shutil.copytree(shapes_bundle, bundle)
    assert not any(p.is_dir() for p in (shapes_sets / "val").iterdir())  # a flat folder: no class sub-folders
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(bundle), "--val", str(shapes_sets / "val"),
                           "--cloud-bundle", str(float_bundle), "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads((bundle / "manifest.json").read_text())["hybrid"]
    assert entry["signal"] == "uncertain_share" and entry["agreement_with"] == "cloud"
    assert entry["samples"] == len(list((shapes_sets / "val").glob("*.png"))) and entry["cloud_accuracy"] == 1.0
    assert 0.0 <= entry["threshold"] <= 1.0 and entry["curve"] and "device agrees with cloud" in proc.stdout
    assert "uncertain_share >" in proc.stdout  # high is hard for this signal
    with edgesdk.load(bundle, mode="prefer-device", cloud="http://127.0.0.1:9") as model:
        assert model.policy.signal == "uncertain_share" and model.policy.threshold == entry["threshold"]


def test_the_shapes_hybrid_sample_runs(shapes_bundle, float_bundle, shapes_sets, tmp_path):
    """samples/shapes/hybrid.py end to end (the bundles of the fixtures in its work folder): escalates at most its
    target, only for low confidence, and agrees with the cloud more than the device alone."""
    work = tmp_path / "demo"
    work.mkdir()
    shutil.copytree(shapes_bundle, work / "shapes.bundle")
    shutil.copytree(float_bundle, work / "shapes-cloud.bundle")
    (work / "shapes-data").symlink_to(shapes_sets)
    proc = subprocess.run([sys.executable, str(SHAPES / "hybrid.py"), "--workdir", str(work), "--artifact",
                           DEVICE_ARTIFACT, "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    device, cloud, hybrid = summary["device-only"], summary["cloud-only"], summary["prefer-device"]
    assert summary["signal"] == "uncertain_share" and summary["agreement_with"] == "cloud"
    # how often INT8 disagrees with float depends on the CPU's integer kernels (99% agreement here, AMX): the run's
    # own numbers must hang together, whatever they are
    assert cloud["agreement"] == 1.0 and 0.5 <= device["agreement"] <= 1.0
    assert 0.0 <= hybrid["escalated"] <= 0.3 and hybrid["degraded"] == 0
    assert hybrid["agreement"] >= device["agreement"]
    assert device["agreement_hard"] <= device["agreement_easy"]  # the hard images are where the device disagrees
    assert "split-half check" in proc.stdout and "reasons: low_confidence)" in proc.stdout


@pytest.fixture(scope="module")
def mixed_val(tmp_path_factory, shapes_data_module):
    """40 validation images, every second one hard: the INT8 device disagrees with the float cloud on some."""
    out = shapes_data_module.write_sets(tmp_path_factory.mktemp("shapes-mixed"), calib=1, val=40, demo=0, hard=0.5)
    return out / "val"


@pytest.mark.parametrize("signal", ["uncertain_share", "min_kept_score"])
def test_calibrated_escalation_rate_is_what_prefer_device_then_does(shapes_bundle, float_bundle, mixed_val,
                                                                      tmp_path, signal):
    """The curve measures what the runtime will do: on the calibration images, prefer-device with the stored
    threshold escalates exactly the share the entry says (also for an image with no detection, whose
    min_kept_score is None: not hard, at calibration as at run time)."""
    from edgesdk_converters.escalation import calibrate_escalation

    bundle = tmp_path / "shapes.bundle"
    shutil.copytree(shapes_bundle, bundle)
    entry = calibrate_escalation(bundle, mixed_val, cloud_bundle=float_bundle, signal=signal,
                                 target_escalation=0.5, progress=False, say=lambda text: None,
                                 artifact=DEVICE_ARTIFACT)
    assert entry["cloud"].endswith("(onnxruntime-fp32)")  # what edgesdk serve serves, not the device's artifact
    # a point of the curve that escalates some images, not all (whether the device disagrees with the cloud on any
    # depends on the CPU's INT8 kernels; the curve's escalation rates do not): the runtime must escalate that share
    point = next(p for p in entry["curve"] if 0.0 < p["escalation_rate"] < 1.0)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["hybrid"]["threshold"] = point["threshold"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    images = sorted(mixed_val.glob("*.png"))
    dead = f"http://127.0.0.1:{free_port()}"  # every escalation fails fast and comes back degraded, still counted
    with edgesdk.load(bundle, mode="prefer-device", cloud=dead, artifact=DEVICE_ARTIFACT) as model:
        assert model.policy.signal == signal and model.policy.threshold == point["threshold"]
        results = [model.predict(p) for p in images]
    if signal == "min_kept_score":
        assert any(r.signals["min_kept_score"] is None for r in results)  # the case this test is about
    escalated = sum(r.escalation_reason is not None for r in results) / len(results)
    assert escalated == pytest.approx(point["escalation_rate"]), (escalated, point)
