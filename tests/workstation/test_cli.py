"""The ``edgesdk`` command line, run as a user runs it: the console script in a subprocess."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk import Bundle
from support import DIGITS_ONNX

SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def edgesdk(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=ENV, cwd=cwd,
                          timeout=600)


def _flat(text: str) -> str:
    """Help text without Rich's box drawing and line wrapping."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", text)


def _assert_one_line_error(proc, code: int, pattern: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.match(pattern, lines[0]), lines[0]


def test_console_script_is_the_cli_main():
    (ep,) = [e for e in md.entry_points(group="console_scripts") if e.name == "edgesdk"]
    assert ep.value == "edgesdk.cli:main"
    assert SCRIPT.is_file()


# -- help --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("command", "mentions"), [
    ((), ("quantize", "inspect", "demo")),
    (("quantize",), ("--calib", "--targets", "--val", "--preprocess", "--labels", "--samples", "--val-samples",
                     "--seed", "--max-drop", "--out", "--force", "--json", ".pt2", ".onnx", ".tflite",
                     "tflite, openvino, onnx", "[default: 300]", "--task", "--task-config", "--charset", "--metric",
                     "default: the task's")),
    (("inspect",), ("bundle", "--json", "checksums")),
    (("demo",), ("--workdir", "--quiet", "digits")),
], ids=["edgesdk", "quantize", "inspect", "demo"])
def test_help(command, mentions):
    proc = edgesdk(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    text = _flat(proc.stdout)
    for word in mentions:
        assert word in text, word


def test_help_shows_the_documented_defaults():
    text = _flat(edgesdk("quantize", "--help").stdout)
    assert "SOURCE stem + .bundle" in text
    assert "every target the source allows" in text
    assert "a held-out split of the calibration data" in text


# -- quantize and inspect ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_bundle(tmp_path_factory, digits_npz):
    out = tmp_path_factory.mktemp("cli") / "digits.bundle"
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", digits_npz, "-o", out, "--samples", 50, "--val-samples", 50,
                   "--quiet")
    return proc, out


def test_quantize_writes_a_bundle(cli_bundle):
    proc, out = cli_bundle
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    ids = {"litert-fp32", "litert-int8", "openvino-fp32", "openvino-int8", "onnxruntime-fp32", "onnxruntime-int8"}
    for aid in ids:
        assert aid in proc.stdout
    assert f"bundle written to {out}" in proc.stdout
    m = Bundle.open(out).manifest
    assert {a["id"] for a in m["artifacts"]} == ids  # an .onnx reaches all three engines
    assert m["calibration"]["samples"] == 50
    assert all(m["validation"][aid]["passed"] for aid in ids)
    assert m["validation"]["machine"]["isa_class"]  # where the numbers were measured


def test_quantize_json_targets_and_name(tmp_path, digits_npz):
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", digits_npz, "-o", tmp_path / "b", "--targets", "onnx",
                   "--name", "handwriting", "--samples", 40, "--val-samples", 30, "--seed", 3, "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    assert manifest == Bundle.open(tmp_path / "b").manifest
    assert manifest["name"] == "handwriting"
    assert manifest["calibration"]["seed"] == 3
    assert [a["id"] for a in manifest["artifacts"]] == ["onnxruntime-fp32", "onnxruntime-int8"]


def test_inspect(cli_bundle):
    _, out = cli_bundle
    proc = edgesdk("inspect", out)
    assert proc.returncode == 0, proc.stderr
    assert "bundle digits v1 (format 1)" in proc.stdout
    assert "calibration: 50 samples" in proc.stdout
    for aid in ("openvino-int8", "onnxruntime-int8"):
        row = next(line for line in proc.stdout.splitlines() if line.startswith(aid + " "))
        assert row.split()[-1] == "yes"


def test_inspect_json(cli_bundle):
    _, out = cli_bundle
    proc = edgesdk("inspect", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads((out / "manifest.json").read_text())


def test_demo(tmp_path):
    """The README's first command: quantize the digits sample to all three targets and print the table."""
    proc = edgesdk("demo", "--workdir", tmp_path / "demo", "--quiet", "--sample", "digits")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "demo" / "digits.bundle"
    assert f"bundle written to {out}" in proc.stdout
    m = Bundle.open(out).manifest
    rows = [line.split() for line in proc.stdout.splitlines() if line.split() and line.split()[0] in
            {a["id"] for a in m["artifacts"]}]
    assert len(rows) == 6 and all(row[-1] == "yes" for row in rows)
    assert all(v["accuracy_drop_points"] <= 0.5 for k, v in m["validation"].items() if k.endswith("int8"))


# -- errors ------------------------------------------------------------------------------------------------

def test_misuse_unknown_extension(tmp_path, digits_npz):
    (tmp_path / "model.h5").write_bytes(b"\0")
    proc = edgesdk("quantize", tmp_path / "model.h5", "--calib", digits_npz, "-q")
    _assert_one_line_error(proc, 2, r"error: ConversionError: unknown model type '.h5'")


def test_misuse_onnx_with_ops_the_importer_lacks_to_tflite(tmp_path, digits_npz):
    from onnx import TensorProto, helper, save

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("LpNormalization", ["a"], ["y"], name="lp")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "lp.onnx"))
    proc = edgesdk("quantize", tmp_path / "lp.onnx", "--calib", digits_npz, "--targets", "tflite", "-o",
                   tmp_path / "b", "-q")
    _assert_one_line_error(proc, 2, r"error: ConversionError: lp.onnx cannot go to tflite: 1 op type\(s\) are not "
                                    r"supported by the ONNX importer: LpNormalization \(1 node, first 'lp'\)")


@pytest.mark.parametrize("value,message", [("1x3x8x8", "write NAME:DIMS"), ("image:1xAx8", "write NAME:DIMS"),
                                           ("image:", "write NAME:DIMS")])
def test_misuse_input_shape(tmp_path, digits_npz, value, message):
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", digits_npz, "--input-shape", value, "-o", tmp_path / "b", "-q")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-1500:]


def test_misuse_image_folder_without_preprocess(tmp_path, small_digits):
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", small_digits, "-o", tmp_path / "b", "-q")
    _assert_one_line_error(proc, 2, r"error: CalibrationError: .* needs a preprocessing spec")


def test_misuse_output_exists(tmp_path, digits_npz):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("x")
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", digits_npz, "-o", tmp_path / "b", "-q")
    _assert_one_line_error(proc, 2, r"error: ConversionError: output .* exists and is not empty .*--force")


def test_misuse_bad_preprocess(tmp_path, small_digits):
    (tmp_path / "pre.toml").write_text("size = [8, 8]\nlayout = 'hwc'\n")
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", small_digits, "--preprocess", tmp_path / "pre.toml",
                   "-o", tmp_path / "b", "-q")
    _assert_one_line_error(proc, 2, r"error: InputError: preprocess 'layout' must be 'nchw' or 'nhwc', got 'hwc'")


def test_inspect_tampered_bundle(tmp_path, cli_bundle):
    _, out = cli_bundle
    copy = tmp_path / "copy.bundle"
    shutil.copytree(out, copy)
    path = copy / "onnx" / "model_int8.onnx"
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    proc = edgesdk("inspect", copy)
    _assert_one_line_error(proc, 2, r"error: BundleError: bundle file 'onnx/model_int8.onnx' was altered")


def test_inspect_missing_bundle(tmp_path):
    proc = edgesdk("inspect", tmp_path / "nothing")
    _assert_one_line_error(proc, 2, r"error: BundleError: bundle not found: .*nothing is not a directory")


def test_validation_failure_exits_1(tmp_path, digits_npz):
    out = tmp_path / "b"
    proc = edgesdk("quantize", DIGITS_ONNX, "--calib", digits_npz, "-o", out, "--targets", "onnx", "--samples", 40,
                   "--val-samples", 30, "--max-drop", "-1", "-q")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    assert re.match(r"error: validation failed for .*onnxruntime-int8", first), first
    assert "FAILED: onnxruntime-int8" in proc.stderr
    assert Bundle.open(out).manifest["validation"]["onnxruntime-int8"]["passed"] is False


@pytest.mark.parametrize("args", [("quantize", "model.onnx"), ("inspect",), ("quantize", "m.onnx", "--calib")],
                         ids=["missing-calib", "missing-bundle", "option-without-value"])
def test_usage_error_exits_2_without_traceback(args):
    proc = edgesdk(*args)
    assert proc.returncode == 2, proc.stderr[-300:]
    assert "Traceback" not in proc.stderr
    assert "Missing" in proc.stderr or "requires an argument" in proc.stderr
