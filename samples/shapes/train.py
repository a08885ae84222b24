"""Train the small shapes detector that the detection demo quantizes, and save it as shapes_detector.onnx.

    python samples/shapes/train.py          # ~45 s on 2 idle CPU cores; deterministic (the same .onnx bytes)

A YOLO-style grid: a 96x96 RGB input (an original image letterboxed onto grey 114, values in [0, 1]) goes through
three stride-2 convolutions to a 12x12 grid (stride 8) and two more 3x3 convolutions, each cell predicting one box. The box decoding is part of
the graph, so the one output ``predictions`` [1, 144, 8] is already YOLOv5 rows: cx, cy, w, h in [0, 1] of the
input (normalized, and joined once: a Concat gives all it joins one INT8 scale, so coordinates in pixels, or rows
joined in pixels first, left the probabilities steps of ~0.38), objectness (sigmoid), and the probabilities of circle, square, triangle (softmax).
Decode it with detect.py.

Prints the float model's F1 at IoU 0.5 (score >= 0.5, NMS 0.45) on the validation images, in original pixels.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from data import CLASSES, INPUT_SIZE, VAL_SEED, input_batch, make_set  # noqa: E402
from detect import evaluate  # noqa: E402

STRIDE = 8
GRID = (INPUT_SIZE[0] // STRIDE, INPUT_SIZE[1] // STRIDE)
TRAIN_SEED = 0
TRAIN_IMAGES = 4000
VAL_IMAGES = 300
EPOCHS = 12


def block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class ShapesDetector(nn.Module):
    """41k parameters: 1x3x96x96 in [0, 1] -> 1x144x8 decoded rows (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            block(3, 8, 2), block(8, 16, 2), block(16, 32, 2),  # 12x12, stride 8; thin where the maps are large
            block(32, 48, 1), block(48, 48, 1),  # receptive field 47 px: a cell sees the whole of the largest shape
        )
        self.head = nn.Conv2d(48, 5 + len(CLASSES), 1)
        with torch.no_grad():
            self.head.bias[4] = -4.0  # objectness starts near the share of cells holding a shape (~2 %)
        gy, gx = torch.meshgrid(torch.arange(GRID[0]), torch.arange(GRID[1]), indexing="ij")
        self.register_buffer("cell_origin", torch.stack([gx, gy], -1).reshape(1, -1, 2).float() * STRIDE)
        self.register_buffer("input_size", torch.tensor([INPUT_SIZE[1], INPUT_SIZE[0]], dtype=torch.float32))

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The head's logits as rows [B, 144, 8] (cell order: row-major over the grid)."""
        out = self.head(self.features(x))
        return out.permute(0, 2, 3, 1).reshape(out.shape[0], -1, out.shape[1])

    def parts(self, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(centre, size) in input pixels, objectness and class probabilities of each row."""
        xy = torch.sigmoid(raw[..., 0:2]) * STRIDE + self.cell_origin  # the centre lies in its cell
        wh = torch.sigmoid(raw[..., 2:4]) * self.input_size  # bounded: no exp to blow up under INT8
        return xy, wh, torch.sigmoid(raw[..., 4:5]), torch.softmax(raw[..., 5:], dim=-1)

    def decode(self, raw: torch.Tensor) -> torch.Tensor:
        """Rows in input pixels: what the loss compares with the targets."""
        return torch.cat(self.parts(raw), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the output: [0, 1] of the input, joined once. Every tensor that a Concat joins shares one INT8 scale (ONNX
        # Runtime, LiteRT): rows joined in pixels first (0-96) left the probabilities 4 values (steps of 0.38)
        xy, wh, obj, cls = self.parts(self.raw(x))
        return torch.cat([xy / self.input_size, wh / self.input_size, obj, cls], dim=-1)


def targets(samples, transforms) -> torch.Tensor:
    """Per image and cell: [is object, cx, cy, w, h (input pixels), class]; the cell is the one holding the box
    centre (data.py keeps shapes apart, so no two centres share a cell)."""
    t = np.zeros((len(samples), GRID[0] * GRID[1], 6), dtype=np.float32)
    for i, (s, tr) in enumerate(zip(samples, transforms)):
        for box, cls in zip(tr.to_input(s.boxes), s.classes):
            cx, cy, w, h = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2, box[2] - box[0], box[3] - box[1]
            cell = int(cy // STRIDE) * GRID[1] + int(cx // STRIDE)
            t[i, cell] = (1, cx, cy, w, h, cls)
    return torch.from_numpy(t)


def loss_of(model: ShapesDetector, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    raw = model.raw(x)
    pred = model.decode(raw)
    pos = t[..., 0] > 0
    obj = nn.functional.binary_cross_entropy_with_logits(raw[..., 4], t[..., 0], reduction="sum") / len(x)
    box = (pred[pos][:, :4] - t[pos][:, 1:5]).abs().sum() / STRIDE / len(x)
    cls = nn.functional.cross_entropy(raw[pos][:, 5:], t[pos][:, 5].long(), reduction="sum") / len(x)
    return obj + box + cls


def flip(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror images left-right (each shape class is symmetric), moving each target to its mirrored cell."""
    x = x.flip(-1)
    t = t.reshape(len(t), GRID[0], GRID[1], 6).flip(2).reshape(len(t), -1, 6).clone()
    t[..., 1] = torch.where(t[..., 0] > 0, INPUT_SIZE[1] - t[..., 1], t[..., 1])
    return x, t


def fit(x: torch.Tensor, t: torch.Tensor, start: float) -> ShapesDetector:
    """Train on inputs ``x`` and :func:`targets` ``t``; every other epoch sees the images mirrored."""
    model = ShapesDetector()
    steps = EPOCHS * ((len(x) + 63) // 64)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps, pct_start=0.15)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(EPOCHS):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(x), generator=gen).split(64):
            xb, tb = x[batch], t[batch]
            if epoch % 2:
                xb, tb = flip(xb, tb)
            opt.zero_grad()
            loss = loss_of(model, xb, tb)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(batch)
        print(f"epoch {epoch + 1:2d}/{EPOCHS}  loss {total / len(x):.3f}  ({time.monotonic() - start:.0f} s)")
    return model


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    start = time.monotonic()
    train = make_set(TRAIN_IMAGES, TRAIN_SEED)
    x_np, transforms = input_batch(train)
    x, t = torch.from_numpy(x_np), targets(train, transforms)
    val = make_set(VAL_IMAGES, VAL_SEED)
    x_val, val_transforms = input_batch(val)
    print(f"{len(train)} training images made in {time.monotonic() - start:.1f} s")

    model = fit(x, t, start)
    model.eval()
    with torch.no_grad():
        outputs = model(torch.from_numpy(x_val)).numpy()
    score, precision, recall = evaluate([o[None] for o in outputs], val, val_transforms)
    print(f"float model: F1 {score:.3f} (precision {precision:.3f}, recall {recall:.3f}) at IoU 0.5 on "
          f"{len(val)} validation images, boxes in original pixels")

    path = HERE / "shapes_detector.onnx"
    example = (torch.from_numpy(x_val[:1]),)
    program = torch.export.export(model, example)
    torch.onnx.export(program, (), path, dynamo=True, external_data=False, input_names=["image"],
                      output_names=["predictions"], verbose=False)
    print(f"saved {path} ({path.stat().st_size / 1024:.0f} KiB) in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
