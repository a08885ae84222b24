"""Train the larger float model that the digits sample serves from the cloud, and save it as digits_cloud.onnx.

    python samples/digits/train_cloud.py

An ensemble of wider CNNs trained with small random shifts (augmentation), averaged in one graph: several times
the device model's size and work, and more accurate; the device keeps the small INT8 model (train.py) and sends
only its hard inputs here. The input is named ``x`` like the device bundle's, so the same tensors go to either.
Deterministic (fixed seeds).
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
from train import load_split  # noqa: E402

MEMBERS = 5
EPOCHS = 60


class WideNet(nn.Module):
    """A wider version of the device model's blocks (~0.3M parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(128 * 2 * 2, 128), nn.ReLU(),
                                  nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Ensemble(nn.Module):
    """The members' mean logits."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


def shifted(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each image moved by up to one pixel in each direction (zero fill)."""
    out = torch.zeros_like(x)
    dy, dx = (torch.randint(-1, 2, (2,), generator=gen)).tolist()
    h, w = x.shape[-2:]
    out[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        x[..., max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def train_member(seed: int, xt: torch.Tensor, yt: torch.Tensor) -> nn.Module:
    torch.manual_seed(seed)
    model = WideNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, EPOCHS)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS):
        model.train()
        for batch in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(shifted(xt[batch], gen)), yt[batch], label_smoothing=0.05)
            loss.backward()
            opt.step()
        sched.step()
    return model.eval()


def main() -> None:
    pre = Preprocess.from_toml(HERE / "preprocess.toml")
    with tempfile.TemporaryDirectory() as tmp:
        export(Path(tmp))
        x_train, y_train = load_split(Path(tmp) / "train", pre)
        x_val, y_val = load_split(Path(tmp) / "val", pre)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    members = []
    for seed in range(MEMBERS):
        members.append(train_member(seed, xt, yt))
        with torch.no_grad():
            acc = (members[-1](torch.from_numpy(x_val)).argmax(1).numpy() == y_val).mean()
        print(f"member {seed}: validation accuracy {acc:.4f}")
    model = Ensemble(members).eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_val)).argmax(1).numpy() == y_val).mean()
    params = sum(p.numel() for p in model.parameters())
    print(f"ensemble of {MEMBERS}: validation accuracy {acc:.4f} on {len(y_val)} images, {params} parameters")
    example = (torch.from_numpy(x_val[:1]),)
    program = torch.export.export(model, example)
    torch.onnx.export(program, (), HERE / "digits_cloud.onnx", dynamo=True, external_data=False,
                      # the device bundle's names (digits.pt2: x -> output_0): hybrid mode checks the cloud's answer
                      # against the bundle's outputs, names included
                      input_names=["x"], output_names=["output_0"], verbose=False)
    print(f"saved {HERE / 'digits_cloud.onnx'}")


if __name__ == "__main__":
    np.random.seed(0)
    main()
