"""The tflite target keeps float the op types XNNPACK has no int8 kernel for (``targets.tflite.speed_choice``):
HARD_SWISH in LiteRT 2.3. An int8 HARD_SWISH runs on LiteRT's builtin kernel, cutting the XNNPACK graph at each one;
kept float, it runs inside XNNPACK between a DEQUANTIZE and a QUANTIZE, and the INT8 artifact's method says so.

The model: three conv -> nn.Hardswish blocks (litert-torch writes TFLite HARD_SWISH ops), 16 channels at 32x32, large
enough that the graph cut costs more than the float HARD_SWISH (the choice is kept only when the whole model is
faster, timed interleaved: about 0.37 against 0.12 ms here). Real converters and interpreter; no timing asserts.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.bench.ops.litert import KERNEL_FAST, ops_outside_xnnpack, outside_xnnpack, profile
from edgesdk.bundle.reader import Bundle
from edgesdk_converters.tflite_model import operators
from edgesdk_converters.targets.tflite import CORE_TYPES
from support import quantize

SIZE = 32


@pytest.fixture(scope="module")
def hardswish(tmp_path_factory):
    """(the quantize result, its litert-fp32 and litert-int8 paths, one input) for the three-block model, 8
    calibration and 8 validation samples, tflite target only, no recovery."""
    import torch
    from torch import nn

    class HardSwishNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
            self.conv3 = nn.Conv2d(16, 16, 3, padding=1)
            self.act = nn.Hardswish()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            x = self.act(self.conv3(self.act(self.conv2(self.act(self.conv1(x))))))
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((3, SIZE, SIZE)).astype(np.float32) for _ in range(16)]
    out = tmp_path_factory.mktemp("hardswish") / "hardswish.bundle"
    # random weights and data: the route is what is exercised, so the accuracy gates are opened
    result = quantize(HardSwishNet().eval(), data, out, example_input=torch.zeros(1, 3, SIZE, SIZE),
                      targets=["tflite"], recover="off", samples=8, val_samples=8, max_drop=100.0, max_error_cap=10.0)
    bundle = Bundle.open(result.bundle)
    return (result, bundle.artifact("litert-fp32").model_path, bundle.artifact("litert-int8").model_path,
            data[0][None])


def _method(result) -> str:
    return next(a["method"] for a in result.manifest["artifacts"] if a["id"] == "litert-int8")


def test_the_float_model_runs_hard_swish_inside_xnnpack(hardswish):
    _, fp32, _, _ = hardswish
    assert [op.name for op in operators(fp32)].count("HARD_SWISH") == 3
    assert outside_xnnpack(fp32) == {}


def test_without_the_choice_int8_hard_swish_runs_outside_xnnpack(hardswish, tmp_path):
    """Why the choice is made: AI Edge Quantizer alone quantizes every HARD_SWISH, and none of them runs in XNNPACK."""
    from ai_edge_quantizer import quantizer, recipe

    _, fp32, _, x = hardswish
    qt = quantizer.Quantizer(str(fp32), recipe.static_wi8_ai8())
    qt.quantize(qt.calibrate({"serving_default": [{"args_0": x}]})).export_model(str(tmp_path / "all_int8.tflite"),
                                                                                 overwrite=True)
    outside = [(kind, dtype) for kind, _, dtype in ops_outside_xnnpack(tmp_path / "all_int8.tflite")]
    assert outside.count(("HARD_SWISH", "int8")) == 3, outside


def test_the_method_says_hard_swish_was_kept_float_and_why(hardswish):
    result, _, _, _ = hardswish
    method = _method(result)
    assert "kept float for speed on this CPU (HARD_SWISH: XNNPACK has no int8 kernel for it (3 op(s) would run " \
           "outside XNNPACK)" in method, method


def test_int8_hard_swish_runs_in_float_inside_xnnpack(hardswish):
    _, _, int8, x = hardswish
    assert not [kind for kind, _, _ in ops_outside_xnnpack(int8) if kind == "HARD_SWISH"]
    found = profile(int8, [x], 1, 1, 0.0)
    swish = [r for r in found["ops"] if r["type"] == "HARD_SWISH"]
    assert len(swish) == 3 and all((r["kernel"], r["precision"]) == (KERNEL_FAST, "float32") for r in swish), swish
    assert found["partitions"] == 1 and all(r["kernel"] == KERNEL_FAST for r in found["ops"])


def test_the_layers_int8_is_for_stay_int8(hardswish):
    """CORE_TYPES are never kept float for speed: the convolutions and the fully-connected layer are int8."""
    _, _, int8, x = hardswish
    core = [r for r in profile(int8, [x], 1, 1, 0.0)["ops"] if r["type"] in CORE_TYPES]
    assert len(core) == 4 and {r["precision"] for r in core} == {"int8"}, core
