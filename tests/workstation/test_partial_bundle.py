"""A target that fails does not throw the others away: the bundle holds the targets that worked, its manifest's
``build`` section says what was dropped and why, and quantize / the CLI fail naming each failed target in full.

The failures are real: an ONNX model with a cubic Resize, which ONNX Runtime and OpenVINO run and the ONNX -> LiteRT
importer refuses (late, while the tflite target converts); a model whose shapes and indices come from the data, which
both OpenVINO and ONNX Runtime fail on while calibrating; the PP-OCRv4 detector.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle
from edgesdk.bundle.report import summary
from edgesdk.errors import ConversionError, TargetsFailed, ValidationFailed
from support import ARTIFACT_IDS, quantize

REFUSAL = "node 'upsample' (Resize): mode='cubic' is not supported"


def _save(path: Path, nodes: list, weights: list, out_shape: list[int]) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _cubic_model(path: Path) -> Path:
    """Conv -> Relu -> cubic Resize x2 -> global average pool -> 10 logits, on a 1x3x16x16 input."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(0, 0.3, (4, 10)).astype(np.float32), "fc"),
               numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Resize", ["r", "", "scales"], ["u"], mode="cubic", name="upsample"),
             helper.make_node("GlobalAveragePool", ["u"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="logits")]
    return _save(path, nodes, weights, [1, 10])


def _data_shaped_model(path: Path) -> Path:
    """A valid ONNX model that no engine can run on real data: it reshapes the input to [1, int(sum(x))] (OpenVINO
    fails: 768 values do not fit) and gathers element int(10 * sum(x)) of it (ONNX Runtime fails: out of range)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.array([1], np.int64), "one"),
               numpy_helper.from_array(np.array([0], np.int64), "axis0"),
               numpy_helper.from_array(np.array(10, np.float32), "ten")]
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Cast", ["total"], ["total_int"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["total_int", "axis0"], ["length"]),
             helper.make_node("Concat", ["one", "length"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["reshaped"], name="reshape_by_sum"),
             helper.make_node("ReduceSum", ["reshaped"], ["reshaped_total"], keepdims=1),
             helper.make_node("Mul", ["total", "ten"], ["total10"]),
             helper.make_node("Cast", ["total10"], ["total10_int"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["total10_int", "axis0"], ["index"]),
             helper.make_node("Flatten", ["x"], ["flat"]),
             helper.make_node("Gather", ["flat", "index"], ["picked"], axis=1, name="gather_by_sum"),
             helper.make_node("Add", ["reshaped_total", "picked"], ["y"])]
    return _save(path, nodes, weights, [1, 1])


def _calib(folder: Path, n: int = 24) -> Path:
    path = folder / "calib.npy"
    np.save(path, np.random.default_rng(1).random((n, 3, 16, 16), dtype=np.float32))
    return path


@pytest.fixture(scope="module")
def cubic(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("cubic")
    return _cubic_model(folder / "cubic.onnx"), _calib(folder)


@pytest.fixture(scope="module")
def partial(tmp_path_factory, cubic) -> tuple[Path, TargetsFailed]:
    """The cubic model through the default targets: tflite fails, openvino and onnx build."""
    out = tmp_path_factory.mktemp("partial") / "cubic.bundle"
    with pytest.raises(TargetsFailed) as caught:
        quantize(cubic[0], cubic[1], out, samples=16)
    return out, caught.value


def test_the_model_runs_on_the_other_engines(cubic):
    """The failure below is the LiteRT route's alone: ONNX Runtime and OpenVINO run the float model."""
    import onnxruntime as ort
    import openvino as ov

    x = np.load(cubic[1])[:1]
    want = ort.InferenceSession(str(cubic[0]), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ov.Core().compile_model(str(cubic[0]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
    assert np.allclose(got, want, atol=1e-4)


def test_bundle_holds_the_targets_that_worked(partial):
    out, exc = partial
    assert exc.bundle == str(out)
    assert set(exc.failed) == {"tflite"}
    manifest = Bundle.open(out).manifest
    assert {a["id"] for a in manifest["artifacts"]} == {*ARTIFACT_IDS["openvino"], *ARTIFACT_IDS["onnx"]}
    assert not (out / "tflite").exists()
    assert {t: e["status"] for t, e in manifest["build"].items()} == {
        "tflite": "failed", "openvino": "built", "onnx": "built"}
    assert manifest["build"]["openvino"]["error"] is None
    assert all(manifest["validation"][a]["passed"] for a in ARTIFACT_IDS["openvino"] + ARTIFACT_IDS["onnx"])


def test_error_is_typed_full_and_names_the_target(partial):
    out, exc = partial
    assert isinstance(exc, ConversionError)
    assert exc.failed["tflite"].startswith(f"ConversionError: {REFUSAL}: supported modes: nearest, linear")
    text = str(exc)
    assert text.startswith(f"1 of 3 targets failed (tflite); bundle written to {out} with openvino, onnx only")
    assert f"[tflite] {exc.failed['tflite']}" in text
    assert exc.failing == []


def test_manifest_keeps_the_error_and_the_converter_lines(partial):
    out, exc = partial
    entry = json.loads((out / "manifest.json").read_text())["build"]["tflite"]
    assert entry["error"] == exc.failed["tflite"]
    assert isinstance(entry["log_tail"], list)  # the converter's own lines (litert-torch / torch warnings)
    assert all(isinstance(line, str) and "\n" not in line for line in entry["log_tail"])


def test_load_serves_the_rest(partial, cubic):
    out, _ = partial
    x = np.load(cubic[1])[:1]
    for engine in ("openvino", "onnxruntime"):
        with edgesdk.load(out, engine=engine) as model:
            assert model.predict(x).outputs[0].shape == (1, 10)
    with edgesdk.load(out) as model:
        assert model.placement.engine in ("openvino", "onnxruntime")


def test_inspect_shows_what_was_dropped_and_why(partial):
    out, exc = partial
    text = summary(Bundle.open(out).manifest)
    assert "build: tflite failed, openvino built, onnx built" in text
    assert "  tflite FAILED, left out of this bundle:" in text
    assert f"    {exc.failed['tflite']}" in text
    done = subprocess.run([sys.executable, "-m", "edgesdk.cli", "inspect", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "tflite FAILED, left out of this bundle:" in done.stdout and REFUSAL in done.stdout


def test_cli_exits_1_naming_the_failed_target(cubic, tmp_path):
    out = tmp_path / "cli.bundle"
    done = subprocess.run([sys.executable, "-m", "edgesdk.cli", "quantize", str(cubic[0]), "--calib", str(cubic[1]),
                           "--out", str(out), "--samples", "16", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "error: TargetsFailed: 1 of 3 targets failed (tflite)" in done.stderr
    assert f"[tflite] ConversionError: {REFUSAL}" in done.stderr
    assert f"bundle written to {out} without tflite" in done.stdout
    assert "onnxruntime-int8" in done.stdout  # the validation table of what was built
    assert Bundle.open(out).manifest["build"]["tflite"]["status"] == "failed"


def test_error_text_keeps_the_chained_cause(tmp_path):
    """An engine's one-line summary (ONNX Runtime's load error is cut at 300 characters) keeps its whole message in
    the chained cause: the recorded error carries it."""
    from edgesdk_converters.quantize import _error_text  # private: the recorded text alone, no failing toolchain

    long = "x" * 400 + " the real cause at the end"
    try:
        try:
            raise RuntimeError(long)
        except RuntimeError as inner:
            raise ConversionError(f"cannot load: {long[:300]}") from inner
    except ConversionError as exc:
        text = _error_text(exc)
    assert text.splitlines()[0] == f"ConversionError: cannot load: {long[:300]}"
    assert text.splitlines()[1] == f"caused by RuntimeError: {long}"


def test_manifest_error_is_capped_keeping_both_ends():
    from edgesdk_converters.quantize import MAX_ERROR_CHARS, _capped  # private: the manifest cap alone

    error = "head " + "x" * 50_000 + " tail"
    kept = _capped(error)
    assert len(kept) < MAX_ERROR_CHARS + 100
    assert kept.startswith("head ") and kept.endswith(" tail")
    assert f"({len(error) - MAX_ERROR_CHARS} characters left out)" in kept
    assert _capped("short") == "short" and _capped(None) is None


def test_every_target_failing_writes_nothing(tmp_path):
    """Both openvino and onnx fail while calibrating: nothing is written, the error names each with its cause."""
    model = _data_shaped_model(tmp_path / "bad.onnx")
    out = tmp_path / "bad.bundle"
    with pytest.raises(TargetsFailed) as caught:
        quantize(model, _calib(tmp_path), out, samples=16, targets=["openvino", "onnx"])
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad.bundle.")]  # no work folder left
    exc = caught.value
    assert exc.bundle is None
    assert set(exc.failed) == {"openvino", "onnx"}
    assert str(exc).startswith(f"no target could be built; nothing was written to {out}:\n[openvino] ")
    assert f"\n[onnx] {exc.failed['onnx']}" in str(exc)
    assert "reshape_by_sum" in exc.failed["openvino"] and "conflicts with the reshape pattern" in exc.failed["openvino"]
    assert "gather_by_sum" in exc.failed["onnx"] and "indices element out of data bounds" in exc.failed["onnx"]


def test_cli_exits_2_when_nothing_was_built(tmp_path):
    model = _data_shaped_model(tmp_path / "bad.onnx")
    done = subprocess.run([sys.executable, "-m", "edgesdk.cli", "quantize", str(model), "--calib",
                           str(_calib(tmp_path)), "--out", str(tmp_path / "o.bundle"), "--samples", "16",
                           "--targets", "openvino,onnx", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "error: TargetsFailed: no target could be built" in done.stderr
    assert "[openvino] " in done.stderr and "[onnx] " in done.stderr
    assert not (tmp_path / "o.bundle").exists()


@pytest.mark.filterwarnings("ignore::edgesdk.errors.FailedArtifactWarning")
def test_ppocr_detector_default_targets_write_a_bundle(tmp_path):
    """PP-OCRv4's text detector (Paddle export, dynamic H/W fixed to 96x96) through every default target: whatever
    builds is in the bundle and loads; whatever fails is named with its full error."""
    import zoo

    source = zoo.model("ppocr_det")
    rng = np.random.default_rng(0)
    calib, val = tmp_path / "calib.npy", tmp_path / "val.npy"
    np.save(calib, rng.random((8, 3, 96, 96), dtype=np.float32))
    np.save(val, rng.random((4, 3, 96, 96), dtype=np.float32))
    out = tmp_path / "ppocr_det.bundle"
    failed = {}
    try:
        quantize(source, calib, out, samples=8, val=val, input_shapes={"x": (1, 3, 96, 96)})
    except TargetsFailed as exc:
        assert exc.bundle == str(out), str(exc)
        failed = exc.failed
        for target, error in failed.items():
            assert f"[{target}] {error}" in str(exc)
    except ValidationFailed:
        pass  # top-1 agreement of a probability map on random images: not this test's concern
    manifest = Bundle.open(out).manifest
    build = manifest["build"]
    assert {t for t, e in build.items() if e["status"] == "failed"} == set(failed)
    for target, error in failed.items():
        assert build[target]["error"] == error[:20_000] or len(error) > 20_000
    assert manifest["artifacts"]
    x = np.load(val)[:1]
    for art in manifest["artifacts"]:
        with edgesdk.load(out, artifact=art["id"], allow_failed=True) as model:
            assert model.predict(x).outputs[0].shape[-2:] == (96, 96)
