"""Tiny task models for the adversarial tests, built here as ONNX graphs and quantized by the ONNX target (a second or
two each): a segmenter whose classes tile its input, and a detector whose outputs are linear in its input.

Both read a 3-channel image through a stretch preprocess, so an image of any size maps onto the model input and back
(masks and boxes in the image's pixels); their answers do not depend on the image much (a small weight on it, a large
bias), so what a test measures is the decoding, not a trained model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from onnx_graphs import save_graph
from support import quantize

SIDE = 32  # the segmenter's input and map: SIDE x SIDE
DET_SIDE, DET_CELLS = 16, 4  # the detector's input, and its grid of DET_CELLS x DET_CELLS boxes (one per cell)


def _stretch(size: int) -> dict:
    return {"size": [size, size], "color": "rgb", "layout": "nchw", "resize": "stretch", "scale": 1 / 255}


def _calibration(size: int, n: int = 24) -> np.ndarray:
    return np.random.default_rng(0).uniform(0, 1, (n, 3, size, size)).astype(np.float32)


def segmenter_bundle(folder: Path, classes: int) -> Path:
    """x [1, 3, 32, 32] -> map [1, C, 32, 32] (softmax over C): the classes tile the map in a square grid of equal
    cells (C a square: 64 gives 8 x 8 cells of 4 x 4 pixels), whatever the image, so every class is in every
    answer and covers 1/C of the image."""
    grid = int(round(classes ** 0.5))
    if grid * grid != classes or SIDE % grid:
        raise ValueError(f"classes must be a square whose root divides {SIDE}, got {classes}")
    cell = SIDE // grid
    index = (np.arange(SIDE) // cell)[:, None] * grid + (np.arange(SIDE) // cell)[None, :]
    bias = np.zeros((1, classes, SIDE, SIDE), np.float32)
    bias[0, index, np.arange(SIDE)[:, None], np.arange(SIDE)[None, :]] = 10.0
    w = np.random.default_rng(1).normal(0, 0.01, (classes, 3, 1, 1)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"segmenter{classes}.onnx"
    save_graph(model, [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["map"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIDE, SIDE])],
               [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, classes, SIDE, SIDE])],
               {"w": w, "b": bias})
    task = {"type": "segmentation", "kind": "classes", "activation": "softmax", "outputs": {"map": "map"}}
    return quantize(model, _calibration(SIDE), folder / f"segmenter{classes}.bundle", targets=["onnx"], samples=16,
                    val_samples=8, max_drop=100.0, max_error_cap=100.0, preprocess=_stretch(SIDE), task=task,
                    name=f"segmenter{classes}").bundle


def detector_bundle(folder: Path) -> Path:
    """x [1, 3, 16, 16] -> predictions [1, 6, 16] (YOLOv8 columns: cx, cy, w, h normalized to the input, an
    objectness logit and one class logit; sigmoid activation): one box per 4 x 4 cell, a quarter of the input wide,
    scored ~0.83 on an ordinary image. A 4 x 4 stride-4 convolution with weights of 0.01 on the image, so the outputs
    follow the input linearly: 3e38 everywhere makes finite outputs near 1.4e38, which decoding must not turn into
    "no box, surely"."""
    n = DET_CELLS * DET_CELLS
    centres = (np.arange(DET_CELLS) + 0.5) / DET_CELLS
    bias = np.zeros((1, 6, n), np.float32)
    bias[0, 0] = np.tile(centres, DET_CELLS)  # cx, row by row
    bias[0, 1] = np.repeat(centres, DET_CELLS)  # cy
    bias[0, 2:4] = 1.0 / DET_CELLS  # w, h
    bias[0, 4], bias[0, 5] = 3.0, 2.0  # objectness and class logits: 0.95 x 0.88
    w = np.full((6, 3, DET_SIDE // DET_CELLS, DET_SIDE // DET_CELLS), 0.01, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "detector.onnx"
    save_graph(model, [helper.make_node("Conv", ["x", "w"], ["c"], strides=[4, 4]),
                       helper.make_node("Reshape", ["c", "shape"], ["flat"]),
                       helper.make_node("Add", ["flat", "b"], ["predictions"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, DET_SIDE, DET_SIDE])],
               [helper.make_tensor_value_info("predictions", TensorProto.FLOAT, [1, 6, n])],
               {"w": w, "b": bias, "shape": np.array([1, 6, n], np.int64)})
    task = {"type": "detection", "format": "yolo", "layout": "columns", "objectness": True, "normalized": True,
            "score_activation": "sigmoid", "score_threshold": 0.5, "outputs": {"predictions": "predictions"}}
    return quantize(model, _calibration(DET_SIDE), folder / "detector.bundle", targets=["onnx"], samples=16,
                    val_samples=8, max_drop=100.0, max_error_cap=100.0, preprocess=_stretch(DET_SIDE), task=task,
                    name="detector").bundle
