"""Benchmark models built in code (no model hub): a MobileNetV2-shaped network.

Same layer layout as MobileNetV2 1.0 / 224 (inverted residual blocks, ReLU6,
depthwise 3x3, 1000 classes, 3.5 M parameters); weights from a fixed seed, with
BatchNorm statistics set to plausible values so activations stay in range.
"""

from __future__ import annotations

import torch
from torch import nn

# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper.
_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, cout, 1, 1, act=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2Shaped(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers = [_conv_bn(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in _BLOCKS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.classifier(x.mean((2, 3)))


def mobilenet_v2_shaped(seed: int = 0) -> nn.Module:
    """The benchmark model in eval mode, deterministic for a given seed."""
    torch.manual_seed(seed)
    model = MobileNetV2Shaped()
    # Set BatchNorm statistics from synthetic images (one pass in train mode), so the
    # activations have the ranges of a trained network instead of saturating ReLU6.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None  # cumulative average over the pass
    model.train()
    with torch.no_grad():
        images = torch.from_numpy(synthetic_images(32, seed=seed + 1))
        model(images)
        model.eval()
        # Centre the logits on the mean feature so top-1 depends on the input (agreement means something).
        mean_feature = model.features(images).mean((0, 2, 3))
        model.classifier.weight.normal_(0.0, 0.05)
        model.classifier.bias.copy_(-model.classifier.weight @ mean_feature)
    return model.eval()


def synthetic_images(n: int, seed: int = 0, size: int = 224) -> "numpy.ndarray":
    """Smooth random images (low-frequency noise), normalized like ImageNet inputs, NCHW float32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    coarse = rng.normal(0.0, 1.0, size=(n, 3, size // 16, size // 16)).astype(np.float32)
    images = np.repeat(np.repeat(coarse, 16, axis=2), 16, axis=3)
    images += rng.normal(0.0, 0.25, size=images.shape).astype(np.float32)
    return images
