"""``edgesdk quantize``'s task options as a user types them (the console script in a subprocess, tiny ONNX models
built here, the ONNX Runtime target): --task, --task-config (TOML and JSON), --charset, --metric, and their misuse
refused with exit 2 before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
STEPS, CLASSES = 12, 5  # the CTC model: 12 time steps, the blank and 4 characters


def edgesdk(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env or ENV,
                          timeout=600)


def _save(path: Path, nodes, x_shape, out_name: str, out_shape, weights: np.ndarray) -> Path:
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def prob_model(tmp_path_factory) -> tuple[Path, Path]:
    """x [1, 8] -> MatMul -> Sigmoid: ``prob`` [1, 1], one 2-D float output (a classifier by default); and its data."""
    folder = tmp_path_factory.mktemp("prob")
    rng = np.random.default_rng(0)
    model = _save(folder / "prob.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"]),
                                         helper.make_node("Sigmoid", ["y"], ["prob"])],
                  [1, 8], "prob", [1, 1], rng.normal(0, 0.8, (8, 1)).astype(np.float32))
    np.savez(folder / "prob.npz", x=rng.normal(0, 1, (64, 1, 8)).astype(np.float32))
    return model, folder / "prob.npz"


@pytest.fixture(scope="module")
def ctc_model(tmp_path_factory) -> tuple[Path, Path, np.ndarray]:
    """x [1, 12, 5] (a noisy one-hot class per step) -> MatMul 6 x identity -> Softmax: CTC ``logits`` [1, 12, 5]
    whose best class per step is the input's; its data and the classes of each step."""
    folder = tmp_path_factory.mktemp("ctc")
    rng = np.random.default_rng(0)
    model = _save(folder / "ctc.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"]),
                                        helper.make_node("Softmax", ["y"], ["logits"], axis=-1)],
                  [1, STEPS, CLASSES], "logits", [1, STEPS, CLASSES], (6.0 * np.eye(CLASSES)).astype(np.float32))
    classes = rng.integers(0, CLASSES, (64, STEPS))
    x = np.eye(CLASSES, dtype=np.float32)[classes][:, None] + rng.normal(0, 0.1, (64, 1, STEPS, CLASSES))
    np.savez(folder / "ctc.npz", x=x.astype(np.float32))
    return model, folder / "ctc.npz", classes


def quantize(model: Path, data: Path, out: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    return edgesdk("quantize", model, "--calib", data, "--targets", "onnx", "--samples", 32, "-o", out, "-q", *args,
                   env=env)


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and pattern in lines[0], proc.stderr


def test_task_probability_is_recorded_and_judged_as_one(prob_model, tmp_path):
    model, data = prob_model
    proc = quantize(model, data, tmp_path / "b", "--task", "probability")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = manifest(tmp_path / "b")
    assert m["task"] == {"type": "probability", "outputs": {"values": "prob"}, "range": [0.0, 1.0], "threshold": 0.5}
    assert {m["validation"][a]["metric"] for a in ("onnxruntime-fp32", "onnxruntime-int8")} == {"relative_mae"}


def test_without_task_the_same_model_is_a_classifier(prob_model, tmp_path):
    model, data = prob_model
    proc = quantize(model, data, tmp_path / "b")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert manifest(tmp_path / "b")["task"]["type"] == "classification"


@pytest.mark.parametrize(("name", "text", "threshold"), [
    ("task.toml", 'type = "probability"\nthreshold = 0.7\n[outputs]\nvalues = "prob"\n', 0.7),
    ("task.json", json.dumps({"task": {"type": "probability", "threshold": 0.3, "outputs": {"values": "prob"}}}), 0.3),
], ids=["toml", "json"])
def test_task_config_file(prob_model, tmp_path, name, text, threshold):
    model, data = prob_model
    (tmp_path / name).write_text(text)
    proc = quantize(model, data, tmp_path / "b", "--task-config", tmp_path / name)
    assert proc.returncode == 0, proc.stderr[-2000:]
    task = manifest(tmp_path / "b")["task"]
    assert task["type"] == "probability" and task["threshold"] == threshold and task["outputs"] == {"values": "prob"}


def test_charset_makes_a_text_task_judged_by_exact_strings(ctc_model, tmp_path):
    model, data, classes = ctc_model
    (tmp_path / "chars.txt").write_text("a\nb\nc\nd\n")
    proc = quantize(model, data, tmp_path / "b", "--charset", tmp_path / "chars.txt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = manifest(tmp_path / "b")
    assert m["task"]["type"] == "text" and m["task"]["charset"] == ["a", "b", "c", "d"] and m["task"]["blank"] == 0
    for aid in ("onnxruntime-fp32", "onnxruntime-int8"):
        entry = m["validation"][aid]
        assert entry["metric"] == "exact_string_agreement" and entry["passed"], entry
        assert set(entry["details"]) >= {"exact_string_agreement", "cer"}
    # The device decodes with that charset: runs collapsed, blanks dropped, class k -> the charset's line k.
    with np.load(data) as npz:
        np.save(tmp_path / "one.npy", npz["x"][3])
    proc = edgesdk("run", tmp_path / "b", tmp_path / "one.npy", "--json", "--artifact", "onnxruntime-int8",
                   "--speed-check", "off")
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = classes[3]
    expected = "".join("_abcd"[c] for i, c in enumerate(steps) if c != 0 and (i == 0 or c != steps[i - 1]))
    (row,) = json.loads(proc.stdout)["results"]
    assert row["text"]["text"] == expected and len(row["text"]["char_confidences"]) == len(expected)


PLUGIN = '''
from pathlib import Path

import numpy as np


def within(outputs, reference, label, task):
    """1 when every output is within 0.1 of the reference: INT8 of a sigmoid is."""
    with open(Path(__file__).with_name("calls.log"), "a") as log:
        log.write(f"{task.type} {len(outputs)}\\n")
    return float(max(np.abs(o - r).max() for o, r in zip(outputs, reference)) <= 0.1)


def never(outputs, reference, label, task):
    return 0.0
'''


def test_metric_plug_in_gates(prob_model, tmp_path):
    model, data = prob_model
    (tmp_path / "plug_gate.py").write_text(PLUGIN)
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), ENV.get("PYTHONPATH")]))}
    passing = quantize(model, data, tmp_path / "ok", "--task", "probability", "--metric", "plug_gate:within", env=env)
    assert passing.returncode == 0, passing.stderr[-2000:]
    entry = manifest(tmp_path / "ok")["validation"]["onnxruntime-int8"]
    assert entry["metric"] == "plug_gate:within" and entry["metric_value"] == 1.0 and entry["passed"]
    assert entry["task_metric"] == "relative_mae"  # the task's own numbers are still reported
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) >= 2 and set(calls) == {"probability 1"}  # per validation sample, with the task
    failing = quantize(model, data, tmp_path / "no", "--task", "probability", "--metric", "plug_gate:never", env=env)
    assert failing.returncode == 1
    assert "plug_gate:never" in failing.stderr and "validation failed" in failing.stderr
    entry = manifest(tmp_path / "no")["validation"]["onnxruntime-int8"]
    assert entry["metric"] == "plug_gate:never" and entry["drop"] == 100.0 and entry["passed"] is False


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_an_unknown_task_config_key_is_refused_before_any_work(prob_model, tmp_path, suffix):
    model, _ = prob_model
    config = tmp_path / f"task{suffix}"
    config.write_text('type = "probability"\nthresold = 0.3\n' if suffix == ".toml" else
                      json.dumps({"type": "probability", "thresold": 0.3}))
    # The calibration data does not exist: the task is checked first, so its error is the one reported.
    proc = quantize(model, tmp_path / "missing.npz", tmp_path / "b", "--task-config", config)
    _one_line_error(proc, "unknown key(s) 'thresold'")
    assert not (tmp_path / "b").exists()


def test_an_unknown_metric_module_is_refused_before_any_work(prob_model, tmp_path):
    model, _ = prob_model
    proc = quantize(model, tmp_path / "missing.npz", tmp_path / "b", "--task", "probability", "--metric", "nosuch:fn")
    _one_line_error(proc, "metric 'nosuch:fn': no module named 'nosuch'")
    assert not (tmp_path / "b").exists()
