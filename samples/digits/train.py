"""Train the small digits CNN that the demo quantizes, and save it as digits.pt2 and digits.onnx.

    python samples/digits/train.py

Reads the images through the same edgesdk Preprocess the bundle stores, so training,
calibration and the device all see identical inputs. Deterministic (fixed seeds).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgesdk import Preprocess

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from export_images import export  # noqa: E402


class DigitsNet(nn.Module):
    """Three small conv blocks and a classifier head: ~40k parameters, 1x1x8x8 -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_split(root: Path, pre: Preprocess) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for folder in sorted(root.iterdir()):
        for f in sorted(folder.iterdir()):
            xs.append(pre(f)[0])
            ys.append(int(folder.name))
    return np.stack(xs), np.asarray(ys)


def main() -> None:
    torch.manual_seed(0)
    pre = Preprocess.from_toml(HERE / "preprocess.toml")
    with tempfile.TemporaryDirectory() as tmp:
        export(Path(tmp))
        x_train, y_train = load_split(Path(tmp) / "train", pre)
        x_val, y_val = load_split(Path(tmp) / "val", pre)
    model = DigitsNet()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(40):
        model.train()
        for batch in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[batch]), yt[batch])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_val)).argmax(1).numpy() == y_val).mean()
    print(f"validation accuracy {acc:.4f} on {len(y_val)} images")
    example = (torch.from_numpy(x_val[:1]),)
    program = torch.export.export(model, example)
    torch.export.save(program, HERE / "digits.pt2")
    torch.onnx.export(program, (), HERE / "digits.onnx", dynamo=True, external_data=False,
                      input_names=["image"], output_names=["logits"], verbose=False)
    print(f"saved {HERE / 'digits.pt2'} and {HERE / 'digits.onnx'}")


if __name__ == "__main__":
    main()
