"""validate() by task on real artifacts: tiny ONNX models built here, quantized by the ONNX target (ONNX Runtime's
quantize_static) and run by ONNX Runtime, judged on decoded outputs; the dead-output check on an INT8 artifact
that really flattens its output; per-output golden tolerances; the user's plug-in metric, found and refused."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_graphs import save_graph
from edgesdk.errors import ConversionError
from edgesdk.tasks import TaskSpec
from edgesdk_converters.calibration import read_dataset
from edgesdk_converters.validation.metric_plugin import load_metric
from edgesdk_converters.sources import open_source
from edgesdk_converters.targets import builder
from edgesdk_converters.validation.validate import validate


_save = save_graph  # (path, nodes, inputs, outputs, initializers)


def vad_like(path, outlier: float) -> None:
    """x [1, 16] -> one MatMul to two channels: ``prob`` = sigmoid(channel 0) [1, 1] and ``big`` = channel 1 [1, 1].
    With ``outlier`` 1000 the second channel's weights are 1000 times the first's: quantized per tensor, the
    MatMul's INT8 output has a step of ~8, and the probability channel (about +-1) rounds to 0: a constant 0.5."""
    w = np.random.default_rng(0).normal(0, 0.3, (16, 2)).astype(np.float32)
    w[:, 1] *= outlier
    one = lambda v: np.array([v], np.int64)  # noqa: E731
    _save(path, [helper.make_node("MatMul", ["x", "w"], ["y"]),
                 helper.make_node("Slice", ["y", "s0", "s1", "ax"], ["logit"]),
                 helper.make_node("Sigmoid", ["logit"], ["prob"]),
                 helper.make_node("Slice", ["y", "s1", "s2", "ax"], ["big"])],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1]),
           helper.make_tensor_value_info("big", TensorProto.FLOAT, [1, 1])],
          {"w": w, "s0": one(0), "s1": one(1), "s2": one(2), "ax": one(1)})


def seg_model(path) -> None:
    """x [1, 1, 16, 16] -> a 3x3 conv -> sigmoid: a probability map [1, 1, 16, 16]."""
    w = np.random.default_rng(3).normal(0, 0.5, (1, 1, 3, 3)).astype(np.float32)
    _save(path, [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Sigmoid", ["c"], ["map"])],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, 16])],
          [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, 16, 16])], {"w": w})


def map_and_level(path) -> None:
    """x [1, 1, 16, 16] -> ``map`` as :func:`seg_model`, and ``level`` [1, 1]: sigmoid of one channel of a MatMul
    over the flattened image whose other channel is 1000 times larger (INT8 rounds ``level`` to a constant, as
    :func:`vad_like` with its outlier)."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.5, (1, 1, 3, 3)).astype(np.float32)
    m = rng.normal(0, 0.05, (256, 2)).astype(np.float32)
    m[:, 1] *= 1000.0
    one = lambda v: np.array([v], np.int64)  # noqa: E731
    _save(path, [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Sigmoid", ["c"], ["map"]),
                 helper.make_node("Flatten", ["x"], ["flat"]),
                 helper.make_node("MatMul", ["flat", "m"], ["y"]),
                 helper.make_node("Slice", ["y", "s0", "s1", "ax"], ["logit"]),
                 helper.make_node("Sigmoid", ["logit"], ["level"]),
                 helper.make_node("Slice", ["y", "s1", "s2", "ax"], ["big"])],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, 16])],
          [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, 16, 16]),
           helper.make_tensor_value_info("level", TensorProto.FLOAT, [1, 1]),
           helper.make_tensor_value_info("big", TensorProto.FLOAT, [1, 1])],
          {"w": w, "m": m, "s0": one(0), "s1": one(1), "s2": one(2), "ax": one(1)})


def build(tmp_path, make, xs: np.ndarray, **kwargs):
    """``make``'s model quantized by the ONNX target on the first half of ``xs``; (artifacts, the other half as a
    validation dataset)."""
    path = tmp_path / "model.onnx"
    make(path, **kwargs)
    src = open_source(path)
    half = len(xs) // 2
    out = tmp_path / "onnx"
    out.mkdir()
    built = builder("onnx")(src, [[x] for x in xs[:half]], out)
    return built, read_dataset(xs[half:, 0], src.inputs, None, what="validation")  # (N, *shape[1:])


def run(built, aid: str, xs) -> list[list[np.ndarray]]:
    """The artifact's outputs on each of ``xs``, ONNX Runtime called here directly."""
    path = next(b for b in built if b.id == aid).files[0]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(None, {"x": x}) for x in xs]


@pytest.fixture
def flattened(tmp_path):
    xs = np.random.default_rng(1).normal(0, 1, (64, 1, 16)).astype(np.float32)
    return build(tmp_path, vad_like, xs, outlier=1000.0)


# -- the dead-output check ----------------------------------------------------------------------------------------------

def test_int8_that_flattens_an_output_fails_on_the_dead_output_check_alone(tmp_path):
    """A segmentation task on the map, which INT8 keeps; the model's other output, which no role reads, is
    flattened: the task's metric passes, and the artifact fails only because that output stopped varying."""
    xs = np.random.default_rng(4).normal(0, 1, (48, 1, 1, 16, 16)).astype(np.float32)
    built, val = build(tmp_path, map_and_level, xs)
    metrics, _ = validate(built, val, None, task=TaskSpec.make("segmentation", {"map": "map"}),
                          output_names=["map", "level", "big"])
    int8 = metrics["onnxruntime-int8"]
    levels = np.array([o[1] for o in run(built, "onnxruntime-int8", [val.load(i)[0] for i in range(len(val))])])
    assert np.ptp(levels) == 0.0  # what the test is about: this INT8 artifact really outputs a constant level
    assert int8["metric"] == "mask_iou" and int8["drop"] <= int8["max_drop"] == 10.0 and "task_failure" not in int8
    assert "max_abs_error_cap_exceeded" not in int8  # the caps do not gate a segmentation task
    assert int8["passed"] is False and int8["dead_output"] == ["level"]
    assert int8["output_std"][1] == 0.0 and int8["reference_output_std"][1] > 0.1
    assert metrics["onnxruntime-fp32"]["passed"] is True and metrics["onnxruntime-fp32"]["dead_output"] == []


def test_probability_gate_fails_the_flattened_artifact_on_its_own_numbers(flattened):
    built, val = flattened
    metrics, golden = validate(built, val, None, task=TaskSpec.make("probability", {"values": "prob"}),
                               output_names=["prob", "big"])
    int8 = metrics["onnxruntime-int8"]
    assert int8["task"] == "probability" and int8["gate"] == "relative_mae_points"
    assert int8["drop"] > 5.0 and "decisions at 0.5 agree on" in int8["task_failure"]
    assert int8["details"]["decision_agreement"] < 0.9 and int8["dead_output"] == ["prob"]
    # the device's tolerances on the probability are that output's own, under the errors the artifact makes
    each = golden["tolerance_per_output"]["onnxruntime-int8"]
    each_mean = golden["mean_tolerance_per_output"]["onnxruntime-int8"]
    gaps = [np.abs(own[0] - ref[0])
            for own, ref in zip(run(built, "onnxruntime-int8", [s[0] for s in golden["inputs"]]), golden["outputs"])]
    assert max(float(g.max()) for g in gaps) > each[0]  # the golden check will refuse it on a device
    assert max(float(g.mean()) for g in gaps) > each_mean[0]
    assert golden["tolerance"]["onnxruntime-int8"] > max(float(g.max()) for g in gaps)  # the pooled one would not


def test_raw_task_keeps_the_caps_as_gates(flattened):
    built, val = flattened
    metrics, _ = validate(built, val, None, task=TaskSpec.make("raw"), output_names=["prob", "big"])
    int8 = metrics["onnxruntime-int8"]
    assert int8["metric"] == "relative_mean_error" and int8["passed"] is False
    assert int8["max_abs_error_cap_exceeded"] is True and int8["dead_output"] == ["prob"]
    prob, big = int8["details"]["outputs"]
    assert big["relative_mean_error"] < 2.0 < prob["relative_mean_error"]  # the wide output survives, prob does not
    assert int8["drop"] == prob["relative_mean_error"]


def test_a_sound_int8_artifact_passes_and_keeps_a_tolerance_it_meets(tmp_path):
    xs = np.random.default_rng(1).normal(0, 1, (64, 1, 16)).astype(np.float32)
    built, val = build(tmp_path, vad_like, xs, outlier=1.0)
    metrics, golden = validate(built, val, None, task=TaskSpec.make("probability", {"values": "prob"}),
                               output_names=["prob", "big"])
    int8 = metrics["onnxruntime-int8"]
    assert int8["passed"] is True and int8["dead_output"] == [] and int8["drop"] < 5.0
    each, each_mean = (golden[k]["onnxruntime-int8"] for k in ("tolerance_per_output", "mean_tolerance_per_output"))
    for own, ref in zip(run(built, "onnxruntime-int8", [s[0] for s in golden["inputs"]]), golden["outputs"]):
        assert all(float(np.abs(o - r).max()) <= t for o, r, t in zip(own, ref, each))
        assert all(float(np.abs(o - r).mean()) <= t for o, r, t in zip(own, ref, each_mean))


# -- segmentation: mask IoU against an independent count ------------------------------------------------------------

def test_segmentation_mask_iou_is_what_the_masks_say(tmp_path):
    xs = np.random.default_rng(4).normal(0, 1, (24, 1, 1, 16, 16)).astype(np.float32)
    built, val = build(tmp_path, seg_model, xs)
    metrics, _ = validate(built, val, None, task=TaskSpec.make("segmentation", {"map": "map"}),
                          output_names=["map"])
    held = [val.load(i)[0] for i in range(len(val))]
    own = [o[0] > 0.5 for o in run(built, "onnxruntime-int8", held)]
    ref = [o[0] > 0.5 for o in run(built, "onnxruntime-fp32", held)]
    iou = sum(int((a & b).sum()) for a, b in zip(own, ref)) / sum(int((a | b).sum()) for a, b in zip(own, ref))
    int8 = metrics["onnxruntime-int8"]
    assert int8["metric"] == "mask_iou" and int8["metric_value"] == pytest.approx(iou)
    assert int8["drop"] == pytest.approx(100 * (1 - iou)) and int8["max_drop"] == 10.0
    assert int8["passed"] is (100 * (1 - iou) <= 10.0)
    assert "top1_agreement" not in int8  # the arg-max pixel of a map means nothing
    assert metrics["onnxruntime-fp32"]["metric_value"] == 1.0


def test_a_map_judged_by_its_masks_gets_a_max_tolerance_up_to_its_range_and_a_mean_one_under_its_cap():
    """INT8 that passes its mask IoU may flip a pixel far (PP-OCRv4's detector on OpenVINO: 0.9987 on a [0, 1]
    map, mask IoU 0.96): its device tolerance on the largest error reaches the map's range, so the device loads
    what validation passed, while its tolerance on the mean error stays under the INT8 cap and holds the map as a
    whole. Capped (a failed artifact, or a task whose caps gate), the largest error's tolerance is the cap."""
    from edgesdk_converters.validation.output_errors import Tally, add, golden_tolerances, output_caps
    from edgesdk_converters.targets import Built

    rng = np.random.default_rng(0)
    golden, int8 = Tally(), Tally()
    for _ in range(8):
        ref = rng.uniform(0, 1, (1, 1, 16, 16))
        own = ref.copy()
        k = rng.integers(256)
        own.flat[k] = 0.0 if ref.flat[k] > 0.5 else 1.0  # one pixel flipped (off by 0.5 or more), the rest exact
        add(golden, ref, ref, ref, None, [ref], [ref])
        add(int8, own, ref, ref, None, [own], [ref])
    built = [Built("openvino-fp32", "openvino", "fp32", []), Built("openvino-int8", "openvino", "int8", [])]
    tallies = {"openvino-fp32": golden, "openvino-int8": int8}
    cap = output_caps(built, tallies, "openvino-fp32")[0]
    span = golden.hi_per[0] - golden.lo_per[0]
    assert int8.err_per[0] > 5 * cap  # what the test is about: a pixel off by far more than the cap
    _, each, each_mean = golden_tolerances(built, tallies, "openvino-fp32", 0.1, {"openvino-int8": False})
    assert each["openvino-int8"] == [pytest.approx(min(2 * int8.err_per[0], span))]
    assert each_mean["openvino-int8"] == [pytest.approx(2 * int8.mean_err_per[0])] and 2 * int8.mean_err_per[0] < cap
    _, capped, capped_mean = golden_tolerances(built, tallies, "openvino-fp32", 0.1, {"openvino-int8": True})
    assert capped["openvino-int8"] == [pytest.approx(cap)] and capped_mean == each_mean
    assert each["openvino-fp32"] == [pytest.approx(1e-4 + 1e-3 * golden.abs_per[0])]  # the float floor


def test_max_drop_is_read_in_the_metric_unit(tmp_path):
    xs = np.random.default_rng(4).normal(0, 1, (24, 1, 1, 16, 16)).astype(np.float32)
    built, val = build(tmp_path, seg_model, xs)
    metrics, _ = validate(built, val, -1.0, task=TaskSpec.make("segmentation", {"map": "map"}),
                          output_names=["map"])
    assert metrics["onnxruntime-int8"]["max_drop"] == -1.0 and metrics["onnxruntime-int8"]["passed"] is False


# -- the plug-in metric -------------------------------------------------------------------------------------------------

PLUGIN = '''
import numpy as np
calls = []

def closeness(outputs, reference, label, task):
    calls.append((len(outputs), len(reference), label, task.type.value))
    return float(1.0 - min(1.0, abs(float(outputs[0].ravel()[0]) - float(reference[0].ravel()[0]))))

def zero(outputs, reference, label, task):
    return 0.0

def boom(outputs, reference, label, task):
    raise KeyError("no such thing")

def words(outputs, reference, label, task):
    return "high"

def too_much(outputs, reference, label, task):
    return 1.5

def scribble(outputs, reference, label, task):
    outputs[0][...] = 0.0
    return 1.0

not_a_function = 3
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "plug_metrics.py").write_text(PLUGIN)
    (tmp_path / "plug_broken.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "plug_metrics"
    for name in ("plug_metrics", "plug_broken"):
        sys.modules.pop(name, None)


def test_load_metric_imports_module_function(plugin):
    fn = load_metric(f"{plugin}:closeness")
    assert fn.__name__ == "closeness" and load_metric(fn) is fn


@pytest.mark.parametrize("spec, problem", [
    ("closeness", r"metric must be 'module:function'"),
    ("a:b:c", r"metric must be 'module:function'"),
    ("plug_missing_module:f", r"metric 'plug_missing_module:f': no module named 'plug_missing_module'"),
    ("plug_metrics:nothing", r"metric 'plug_metrics:nothing': plug_metrics has no 'nothing' \(its functions: boom, "
                             r"closeness"),
    ("plug_metrics:not_a_function", r"metric 'plug_metrics:not_a_function' is a int, not a function"),
    ("plug_broken:f", r"importing module 'plug_broken' failed: RuntimeError: half written"),
])
def test_load_metric_names_what_is_wrong(plugin, spec, problem):
    with pytest.raises(ConversionError, match=problem):
        load_metric(spec)


def test_the_plug_in_gates_instead_of_the_task_and_the_task_numbers_stay(plugin, flattened):
    built, val = flattened
    task = TaskSpec.make("regression", {"values": "prob"}, range=[-1000.0, 1000.0])
    metrics, _ = validate(built, val, None, task=task, metric=f"{plugin}:zero", output_names=["prob", "big"])
    fp32 = metrics["onnxruntime-fp32"]
    assert fp32["metric"] == "plug_metrics:zero" and fp32["metric_value"] == 0.0 and fp32["drop"] == 100.0
    assert fp32["passed"] is False and fp32["max_drop"] == 5.0  # the plug-in's default limit, in points
    assert fp32["task_metric"] == "relative_mae" and fp32["details"]["relative_mae"] == 0.0
    module = sys.modules[plugin]
    metrics, _ = validate(built, val, 30.0, task=task, metric=f"{plugin}:closeness", output_names=["prob", "big"])
    int8 = metrics["onnxruntime-int8"]
    assert int8["metric"] == "plug_metrics:closeness" and 0.0 < int8["metric_value"] < 1.0
    assert int8["drop"] <= 30.0 and int8["passed"] is False and int8["dead_output"] == ["prob"]  # still dead
    assert module.calls[0] == (2, 2, None, "regression") and len(module.calls) == 2 * len(val)


@pytest.mark.parametrize("name, problem", [
    ("boom", r"metric plug_metrics:boom raised KeyError: 'no such thing'"),
    ("words", r"metric plug_metrics:words returned str 'high', not a number"),
    ("too_much", r"metric plug_metrics:too_much returned 1.5, outside \[0, 1\]"),
    ("scribble", r"metric plug_metrics:scribble raised ValueError: assignment destination is read-only"),
])
def test_a_plug_in_that_misbehaves_fails_the_validation_naming_it(plugin, flattened, name, problem):
    built, val = flattened
    with pytest.raises(ConversionError, match=problem):
        validate(built, val, None, task=TaskSpec.make("raw"), metric=f"{plugin}:{name}", output_names=["prob", "big"])
