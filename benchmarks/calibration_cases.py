"""The models, data and task metrics of ``benchmarks/calibration_methods.py``: each a :class:`Case` holding its float
ONNX, its fixed input shape, its calibration and validation inputs (made here: no dataset download works) and how an
answer is scored against the truth or against the float model's."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import zoo  # noqa: E402
from edgesdk_converters.validation.task_metrics import edit_distance  # noqa: E402

VAL_SEED = 1  # the validation data's seed; calibration data is drawn with another


@dataclass
class Case:
    """One model: its float ONNX, its fixed input shape, its data and how an answer is scored."""

    key: str
    path: Path
    shape: tuple[int, ...]
    calib: list[np.ndarray]  # each a whole input, batch axis included
    val: list[np.ndarray]
    metric: str  # what score()'s first number is
    detail: str  # what its second is
    score: Callable[[list[np.ndarray], list[np.ndarray]], tuple[float, float]]  # (answers, float answers)


def recognizer(calib_seed: int = 0) -> Case:
    import onnx

    path = zoo.model("ppocr_rec")
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    chars = ["blank", *meta["character"].splitlines(), " "]  # rapidocr CTCLabelDecode: blank first, space last
    calib, _ = zoo.text_lines(32, seed=calib_seed)
    val, truth = zoo.text_lines(100, seed=VAL_SEED)

    def decode(prob: np.ndarray) -> str:
        steps = prob.reshape(-1, prob.shape[-1]).argmax(-1)
        keep = (steps != 0) & np.r_[True, steps[1:] != steps[:-1]]
        return "".join(chars[i] for i in steps[keep]).strip()

    def score(outs, ref):
        read = [decode(o) for o in outs]
        exact = np.mean([r == t for r, t in zip(read, truth)]) * 100
        return exact, sum(edit_distance(r, t) for r, t in zip(read, truth)) / sum(len(t) for t in truth) * 100

    return Case("ppocr_rec", path, (1, 3, 48, 320), list(calib[:, None]), list(val[:, None]),
                "exact-string %", "CER %", score)


def detector(calib_seed: int = 0, size: int = 256) -> Case:
    def pages(n: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)  # tests/zoo.py's text pages, normalized as rapidocr feeds the detector
        return [((zoo._text_image(rng, size, size) - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)
                for _ in range(n)]

    def score(outs, ref):
        ious = []
        for o, r in zip(outs, ref):
            a, b = o > 0.3, r > 0.3
            union = np.logical_or(a, b).sum()
            ious.append(np.logical_and(a, b).sum() / union if union else 1.0)
        rms = np.sqrt(np.mean([np.mean((o - r) ** 2) for o, r in zip(outs, ref)]))
        return float(np.mean(ious)), float(rms)

    return Case("ppocr_det", zoo.model("ppocr_det"), (1, 3, size, size), pages(32, calib_seed), pages(50, VAL_SEED),
                "mask IoU", "prob RMS vs float", score)


def digits(calib_seed: int = 0) -> Case:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()  # samples/digits/export_images.py: 0..16 -> 0..255 PNGs, 70/30 split; preprocess.toml
    images = (np.round(data.images * (255.0 / 16.0)) / 255.0 - 0.5) / 0.5
    train, test = train_test_split(np.arange(len(images)), test_size=0.3, random_state=0, stratify=data.target)
    picked = np.random.default_rng(calib_seed).choice(train, 300, replace=False)
    as_input = lambda i: images[i][None, None].astype(np.float32)  # noqa: E731
    truth = data.target[test]

    def score(outs, ref):
        top1 = np.mean([o.argmax() == t for o, t in zip(outs, truth)]) * 100
        return top1, float(np.sqrt(np.mean([np.mean((o - r) ** 2) for o, r in zip(outs, ref)])))

    return Case("digits", REPO / "samples" / "digits" / "digits.onnx", (1, 1, 8, 8), [as_input(i) for i in picked],
                [as_input(i) for i in test], "top-1 %", "logit RMS vs float", score)


CASES = {"ppocr_rec": recognizer, "ppocr_det": detector, "digits": digits}

LEGEND = {
    "ppocr_rec": "exact-string % of 100 lines against their truth; finer: character error rate % (edit distance over "
                 "the truth's length)",
    "ppocr_det": "mean mask IoU (prob > 0.3) of 50 pages against the same engine's float model; finer: probability "
                 "RMS against it",
    "digits": "top-1 % of 540 images; finer: logit RMS against the same engine's float model",
}
LEGEND_FLOAT = ("float rows: the metric against the truth, or for the detector against ONNX Runtime on the source "
                "ONNX; finer: against ONNX Runtime on the source ONNX")
