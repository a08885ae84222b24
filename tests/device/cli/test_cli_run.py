"""``edgesdk devices`` and ``edgesdk run``, run as a user runs them: the console script in a subprocess."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.runtime.profiles import load_profile
from support import fail_validation

SCRIPT = Path(sys.executable).parent / "edgesdk"
ENGINES = {"litert": "ai-edge-litert", "openvino": "openvino", "onnxruntime": "onnxruntime"}


@pytest.fixture
def run_cli(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EDGESDK_CACHE_DIR": str(tmp_path / "c")}

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)

    return run


@pytest.fixture(scope="module")
def images(digits_images) -> list[Path]:
    return [sorted((digits_images / "val" / d).glob("*.png"))[0] for d in ("3", "8")]


def test_devices(run_cli):
    proc = run_cli("devices")
    assert proc.returncode == 0, proc.stderr
    for engine, dist in ENGINES.items():
        assert f"{engine} {md.version(dist)}" in proc.stdout
    assert "CPU" in proc.stdout
    assert "platform profile: " in proc.stdout


def test_devices_json(run_cli):
    proc = run_cli("devices", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    engines = {e["engine"]: e for e in data["engines"]}
    assert set(engines) == set(ENGINES)
    for engine, dist in ENGINES.items():
        found = engines[engine]
        assert found["version"] == md.version(dist)
        assert any(d["kind"] == "CPU" for d in found["devices"]), found
        assert all(d["kind"] in ("NPU", "GPU", "CPU") and d["engine"] == engine for d in found["devices"])
        assert isinstance(found["notes"], list)
    # a device this machine lacks is explained, not just absent
    assert any(n.startswith("NPU") for e in engines.values() for n in e["notes"])
    assert load_profile(data["profile"]["name"]).name == data["profile"]["name"]
    assert isinstance(data["profile"]["matched"], list)


def test_run_json(run_cli, digits_bundle, images, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 1, 8, 8), np.float32))
    proc = run_cli("run", digits_bundle.bundle, *images, npy, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    pl = data["placement"]
    assert pl["engine"] in ENGINES and pl["device"] and pl["kind"] == "CPU"
    assert pl["artifact"] in {a["id"] for a in digits_bundle.manifest["artifacts"]}
    assert isinstance(pl["skipped"], list) and pl["numerics"]["checked"] is True
    assert [r["input"] for r in data["results"]] == [str(p) for p in [*images, npy]]
    for r in data["results"]:
        assert r["source"] == "device"
        assert r["top"][0]["label"] in [str(i) for i in range(10)]
        assert 0 < r["top"][0]["score"] <= 1
        assert set(r["timings_ms"]) == {"preprocess", "inference", "postprocess"}
    assert [r["top"][0]["label"] for r in data["results"][:2]] == ["3", "8"]
    for r in data["results"]:  # the raw outputs too, as Result.to_dict gives them
        assert r["output_shapes"] == [[1, 10]] and len(r["outputs"][0][0]) == 10
        assert r["backend"] == f"{pl['engine']}:{pl['device']}:{pl['artifact']}"


def test_run_answers_every_good_input_when_one_is_bad(run_cli, digits_bundle, images, tmp_path):
    """a.png bad.png c.png: the good ones are answered, the bad one says why, the exit code says one failed."""
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    missing = tmp_path / "missing.png"
    proc = run_cli("run", digits_bundle.bundle, images[0], bad, missing, images[1], "--json")
    assert proc.returncode == 2, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    assert [r["input"] for r in rows] == [str(images[0]), str(bad), str(missing), str(images[1])]
    assert [r["top"][0]["label"] for r in (rows[0], rows[3])] == ["3", "8"]
    assert rows[1]["error"]["type"] == "InputError" and "bad.png" in rows[1]["error"]["detail"]
    assert rows[2]["error"] == {"type": "InputError", "detail": f"input not found: {missing}"}
    text = run_cli("run", digits_bundle.bundle, images[0], bad, images[1])
    assert text.returncode == 2
    lines = [line for line in text.stdout.splitlines() if line.startswith(str(tmp_path)) or line.startswith(
        str(images[0].parent.parent))]
    assert any(line.startswith(f"{bad}: error: ") for line in text.stdout.splitlines()), text.stdout
    assert sum(line.startswith((str(images[0]), str(images[1]))) for line in text.stdout.splitlines()) == 2, lines


def test_run_with_only_unreadable_inputs_fails_before_loading(run_cli, digits_bundle, tmp_path):
    proc = run_cli("run", digits_bundle.bundle, tmp_path / "nothing.png")
    assert proc.returncode == 2 and "input not found" in proc.stderr and "placement" not in proc.stdout


def test_run_json_with_options(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--json", "--policy", "cpu-only", "--engine", "openvino",
                   "--artifact", "openvino-fp32", "--no-check")
    assert proc.returncode == 0, proc.stderr
    pl = json.loads(proc.stdout)["placement"]
    assert (pl["engine"], pl["artifact"], pl["policy"]) == ("openvino", "openvino-fp32", "cpu-only")
    assert pl["numerics"]["checked"] is False


def test_run_text(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--engine", "openvino", "--device", "GPU")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("placement: ") and "executing on" in lines[0]
    assert any(line.startswith("  numerics: ") for line in lines)
    assert any(line.startswith("  skipped openvino:GPU:") for line in lines)
    assert lines[-1].startswith(f"{images[0]}: 3: ") and "[device, " in lines[-1]


def test_run_require_npu_fails_with_the_reason(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--require", "NPU", "--json")
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "error: BackendUnavailable: device_missing: no engine reports a NPU device" in proc.stderr
    assert "reason: device_missing" in proc.stderr.splitlines()


def test_run_unknown_policy(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--policy", "fastest")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: InputError: unknown policy 'fastest'")


def test_run_bad_image(run_cli, digits_bundle, tmp_path):
    (tmp_path / "x.png").write_text("text")
    proc = run_cli("run", digits_bundle.bundle, tmp_path / "x.png")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "error: InputError: " in proc.stderr and "x.png is not a readable image" in proc.stderr


# -- artifacts that failed their validation gate -----------------------------------------------------------

GATE = "accuracy drop 1.48 points > max 0.5 at quantize time"


@pytest.fixture
def failed_int8(bundle_copy):
    fail_validation(bundle_copy, "onnxruntime-int8")
    return bundle_copy


def test_run_never_serves_a_failed_artifact_by_default(run_cli, failed_int8, images):
    proc = run_cli("run", failed_int8, images[0], "--engine", "onnxruntime", "--json")
    assert proc.returncode == 0, proc.stderr
    pl = json.loads(proc.stdout)["placement"]
    assert (pl["engine"], pl["artifact"]) == ("onnxruntime", "onnxruntime-fp32")
    refused = [s for s in pl["skipped"] if s["reason"] == "validation_failed"]
    assert refused and {s["artifact"] for s in refused} == {"onnxruntime-int8"} and refused[0]["detail"] == GATE
    assert "warning:" not in proc.stderr


def test_run_artifact_alone_refuses_a_failed_artifact_exit_2_naming_allow_failed(run_cli, failed_int8, images):
    proc = run_cli("run", failed_int8, images[0], "--artifact", "onnxruntime-int8")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: BundleError: artifact 'onnxruntime-int8' of bundle 'digits' failed its "
                           f"validation gate ({GATE})")
    assert "--allow-failed" in line


def test_run_allow_failed_serves_it_and_warns_on_stderr(run_cli, failed_int8, images):
    proc = run_cli("run", failed_int8, images[0], "--artifact", "onnxruntime-int8", "--allow-failed", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["placement"]["artifact"] == "onnxruntime-int8"
    assert f"warning: serving artifact 'onnxruntime-int8' of bundle 'digits', which failed its validation gate " \
           f"({GATE}), because allow_failed is set" in proc.stderr.splitlines()


def test_run_when_every_artifact_failed_exits_3_with_the_reason(run_cli, bundle_copy, images):
    fail_validation(bundle_copy, *(a["id"] for a in json.loads((bundle_copy / "manifest.json").read_text())
                                   ["artifacts"]))
    proc = run_cli("run", bundle_copy, images[0])
    assert proc.returncode == 3, proc.stderr
    assert "reason: validation_failed" in proc.stderr.splitlines()
    assert "re-quantize the bundle" in proc.stderr and "--allow-failed" in proc.stderr


def test_run_prints_terminal_controls_in_its_text_escaped(run_cli, digits_bundle, images, tmp_path):
    """A file name (or any text that is data) holding an escape sequence cannot clear the screen or draw a line."""
    evil = tmp_path / "x\x1b[2J\rfake: 9: 1.000.png"
    evil.write_bytes(images[0].read_bytes())
    proc = run_cli("run", digits_bundle.bundle, evil)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    assert "x\\x1b[2J\\x0dfake: 9: 1.000.png: 3: " in proc.stdout


def test_run_reads_a_npy_input_header_first(run_cli, digits_bundle, images, tmp_path):
    """A 144-byte .npy declaring 2^40 elements is refused from its header (no 4 TiB allocation), as are object
    arrays and a file cut short; a good .npy beside them is answered."""
    import struct

    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    huge = tmp_path / "huge.npy"
    huge.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0" * 16)
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    short = tmp_path / "short.npy"
    np.save(short, np.zeros((1, 1, 8, 8), np.float32))
    short.write_bytes(short.read_bytes()[:-10])
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((1, 1, 8, 8), np.float32))
    proc = run_cli("run", digits_bundle.bundle, huge, objects, short, good, "--json")
    assert proc.returncode == 2, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    assert "declares 1099511627776 elements" in rows[0]["error"]["detail"]
    assert "not numbers (Python objects are never unpickled)" in rows[1]["error"]["detail"]
    assert "is cut short: 246 of the 256 bytes" in rows[2]["error"]["detail"]
    assert rows[3]["top"] and rows[3]["output_shapes"] == [[1, 10]]


def test_an_error_line_escapes_terminal_controls(run_cli, digits_bundle, tmp_path):
    evil = tmp_path / "gone\x1b]0;owned\x07.png"  # an OSC sequence would retitle the terminal
    proc = run_cli("run", digits_bundle.bundle, evil)
    assert proc.returncode == 2
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "input not found: " in proc.stderr and "gone\\x1b]0;owned\\x07.png" in proc.stderr


def test_run_takes_a_batch_npy_and_an_npz_one_prediction_per_sample(run_cli, digits_bundle, digits_arrays, tmp_path):
    """A .npy of 3 samples is 3 predictions (x.npy[0]..[2]); an .npz keyed by the input name, first axis = sample,
    likewise; an .npz naming an input the model does not have says which inputs it has."""
    x = digits_arrays[0][:3].astype(np.float32)  # [3, 1, 8, 8]
    batch, npz, wrong = tmp_path / "batch.npy", tmp_path / "samples.npz", tmp_path / "wrong.npz"
    np.save(batch, x)
    name = digits_bundle.manifest["inputs"][0]["name"]
    np.savez(npz, **{name: x})
    np.savez(wrong, a=x, b=x)
    proc = run_cli("run", digits_bundle.bundle, batch, npz, wrong, "--json")
    assert proc.returncode == 2, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    assert [r["input"] for r in rows] == [f"{batch}[{i}]" for i in range(3)] + [f"{npz}[{i}]" for i in range(3)] + [
        str(wrong)]
    assert all(r.get("top") for r in rows[:6]), [r.get("error") for r in rows]
    assert [r["top"][0]["index"] for r in rows[:3]] == [r["top"][0]["index"] for r in rows[3:6]]
    assert f"the model's inputs are ['{name}']" in rows[6]["error"]["detail"]


def test_run_describes_every_output_of_a_model_that_is_not_a_classifier(run_cli, tmp_path):
    """No top-k for a regression output: the text names each output with its shape, dtype and value range."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["level"], keepdims=0, axes=[1, 2, 3]),
         helper.make_node("Relu", ["x"], ["mask"])], "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("level", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.normal(size=(16, 1, 8, 8)).astype(np.float32))
    q = subprocess.run([str(SCRIPT), "quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib.npy"),
                        "--targets", "onnx", "--samples", "8", "--max-drop", "100", "-o", str(tmp_path / "b"), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    x = tmp_path / "x.npy"
    np.save(x, np.full((1, 1, 8, 8), 2.0, np.float32))
    proc = run_cli("run", tmp_path / "b", x, "--artifact", "onnxruntime-fp32")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith(str(x)))
    assert "level [1] float32 min 2 mean 2 max 2; mask [1, 1, 8, 8] float32 min 2 mean 2 max 2" in line
