"""The workstation's commands read by an adversary (hardening issue 29): ``quantize``'s and ``debug``'s files that are
no regular file or nest without end, plug-in metrics that exit or answer a number no float holds, ``debug --plot``
targets, and an ``.npz`` that holds a member twice. The console script in a subprocess, a tiny ONNX model built
here and its ONNX Runtime artifacts (real engines); every refusal is one line and exit 2, never a traceback or a
hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
HANG = 120  # seconds: a command that reads a FIFO with no writer never returns; the test fails instead of hanging


def edgesdk(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env or ENV,
                          timeout=HANG)


@pytest.fixture(scope="module")
def prob_model(tmp_path_factory) -> tuple[Path, Path]:
    """x [1, 8] -> MatMul -> Sigmoid -> ``prob`` [1, 1], and 64 samples of x in an .npz."""
    folder = tmp_path_factory.mktemp("adversarial-prob")
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Sigmoid", ["y"], ["prob"])], "prob",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(rng.normal(0, 0.8, (8, 1)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "prob.onnx"))
    np.savez(folder / "prob.npz", x=rng.normal(0, 1, (64, 1, 8)).astype(np.float32))
    return folder / "prob.onnx", folder / "prob.npz"


@pytest.fixture(scope="module")
def prob_bundle(prob_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adversarial-bundle") / "prob.bundle"
    proc = quantize(*prob_model, out, "--task", "probability")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def quantize(model: Path, data: Path, out: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    return edgesdk("quantize", model, "--calib", data, "--targets", "onnx", "--samples", 32, "-o", out, "-q", *args,
                   env=env)


def one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and pattern in lines[0], proc.stderr[-2000:]


@pytest.fixture
def fifo(tmp_path) -> Path:
    """A FIFO no one writes to: opening it for reading blocks for ever."""
    path = tmp_path / "task.toml"
    os.mkfifo(path)
    return path


# -- finding 6: files that are not regular files ------------------------------------------------------------------

def test_quantize_refuses_a_fifo_task_config(prob_model, fifo, tmp_path):
    proc = quantize(*prob_model, tmp_path / "b", "--task-config", fifo)
    one_line_error(proc, f"task file {fifo} is not a regular file")
    assert not (tmp_path / "b").exists()


def test_quantize_refuses_dev_zero_as_a_task_config(prob_model, tmp_path):
    proc = quantize(*prob_model, tmp_path / "b", "--task-config", "/dev/zero")
    one_line_error(proc, "task file /dev/zero is not a regular file")


@pytest.mark.parametrize("option", ["--calib", "--val", "--preprocess", "--labels"])
def test_quantize_refuses_a_fifo_for_its_other_files(prob_model, tmp_path, option):
    model, data = prob_model
    fifo = tmp_path / ("data.npz" if option in ("--calib", "--val") else "file.toml")
    os.mkfifo(fifo)
    args = [model, "--calib", fifo if option == "--calib" else data, "--targets", "onnx", "--samples", 32, "-o",
            tmp_path / "b", "-q"]
    if option != "--calib":
        args += [option, fifo]
    proc = edgesdk("quantize", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and f"{fifo} is not a regular file" in proc.stderr, proc.stderr[-2000:]


def test_debug_refuses_a_fifo_for_val(prob_bundle, tmp_path):
    fifo = tmp_path / "val.npz"
    os.mkfifo(fifo)
    proc = edgesdk("debug", prob_bundle, "--val", fifo)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert f"debug data {fifo} is not a regular file" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_a_task_config_over_the_size_cap_is_refused_before_it_is_read(prob_model, tmp_path):
    config = tmp_path / "task.json"
    with open(config, "wb") as f:
        f.truncate((4 << 20) + 1)  # sparse: 4 MiB + 1 byte of nothing
    proc = quantize(*prob_model, tmp_path / "b", "--task-config", config)
    one_line_error(proc, f"task file {config} is {(4 << 20) + 1} bytes; more than 4194304 is refused "
                         "(EDGESDK_MAX_SETTINGS_BYTES raises it)")


# -- low: a task config nested without end ------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_task_config_nested_100k_deep_is_a_typed_error(prob_model, tmp_path, suffix):
    config = tmp_path / f"task{suffix}"
    depth = 100_000
    config.write_text("[" * depth + "]" * depth if suffix == ".json" else "a = " + "[" * depth + "]" * depth + "\n")
    proc = quantize(*prob_model, tmp_path / "b", "--task-config", config)
    one_line_error(proc, f"task file {config} nests deeper than 64 levels")


def test_a_task_config_nested_past_the_cap_but_within_the_parser_is_refused(prob_model, tmp_path):
    config = tmp_path / "task.json"
    config.write_text(json.dumps({"type": "probability", "deep": json.loads("[" * 70 + "]" * 70)}))
    proc = quantize(*prob_model, tmp_path / "b", "--task-config", config)
    one_line_error(proc, f"task file {config} nests deeper than 64 levels")


# -- low: plug-in metrics -------------------------------------------------------------------------------------------

def _plugin_env(tmp_path: Path, name: str, text: str) -> dict:
    (tmp_path / f"{name}.py").write_text(text)
    return {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), ENV.get("PYTHONPATH")]))}


def test_a_metric_module_that_exits_at_import_is_a_typed_error(prob_model, tmp_path):
    env = _plugin_env(tmp_path, "plug_exit", "import sys\nsys.exit(0)\n")
    proc = quantize(*prob_model, tmp_path / "b", "--task", "probability", "--metric", "plug_exit:score", env=env)
    one_line_error(proc, "metric 'plug_exit:score': importing module 'plug_exit' called sys.exit(0)")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(("body", "message"), [
    ("return 10**400", "metric plug_score:score returned int 1000000000000000000000000000000000000000... (401 "
                       "digits), outside [0, 1]"),
    ("return 10**5000", "metric plug_score:score returned int (5001 digits), outside [0, 1]"),
    ("raise SystemExit(3)", "metric plug_score:score called sys.exit(3)"),
], ids=["10**400", "10**5000", "sys.exit"])
def test_a_metric_whose_answer_is_no_float_or_that_exits_is_a_typed_error(prob_model, tmp_path, body, message):
    env = _plugin_env(tmp_path, "plug_score", f"def score(outputs, reference, label, task):\n    {body}\n")
    proc = quantize(*prob_model, tmp_path / "b", "--task", "probability", "--metric", "plug_score:score", env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr[-2000:]


# -- low: debug --plot ----------------------------------------------------------------------------------------------

def test_debug_plot_with_a_suffix_that_is_no_image_is_refused_before_any_work(prob_bundle, tmp_path):
    proc = edgesdk("debug", prob_bundle, "--plot", tmp_path / "x.json")
    one_line_error(proc, "--plot writes .png, .svg, .pdf files; ")
    assert proc.stdout == "" and not (tmp_path / "x.json").exists()


def test_debug_plot_without_a_suffix_says_the_file_it_wrote(prob_bundle, tmp_path):
    proc = edgesdk("debug", prob_bundle, "--plot", tmp_path / "snr")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"plot written to {tmp_path / 'snr.png'}" in proc.stderr
    assert (tmp_path / "snr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_debug_plot_that_cannot_be_written_keeps_the_report(prob_bundle):
    proc = edgesdk("debug", prob_bundle, "--plot", "/proc/edgesdk-snr.png", "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "--plot /proc/edgesdk-snr.png cannot be written" in proc.stderr
    assert json.loads(proc.stdout)["artifacts"][0]["artifact"] == "onnxruntime-int8"


# -- low: an .npz with a member twice --------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Duplicate name")  # zipfile warns as it writes the second
def test_calibration_npz_holding_a_member_twice_is_refused_naming_it(prob_model, tmp_path):
    model, data = prob_model
    dup = tmp_path / "dup.npz"
    with np.load(data) as npz:
        x = npz["x"]
    with zipfile.ZipFile(dup, "w") as out:
        for value in (x, x * 0):
            with out.open("x.npy", "w") as member:
                np.lib.format.write_array(member, value)
    proc = quantize(model, dup, tmp_path / "b")
    one_line_error(proc, f"calibration file {dup} holds the member 'x.npy' twice")
