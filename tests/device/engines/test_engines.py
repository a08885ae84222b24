"""Engines: each runs its fp32 and int8 artifact, checks its inputs, and hides integer I/O."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import Bundle
from edgesdk.engines import ENGINE_NAMES, engine_class, engine_version, open_engine
from edgesdk.errors import BackendUnavailable, InputError
from support import ov_default_precision

ALL_IDS = ["litert-fp32", "litert-int8", "openvino-fp32", "openvino-int8", "onnxruntime-fp32", "onnxruntime-int8"]
OV_DEFAULT = ov_default_precision()


@pytest.fixture(scope="module")
def bundle(digits_bundle) -> Bundle:
    return Bundle.open(digits_bundle.bundle)


@pytest.mark.parametrize("aid", ALL_IDS)
def test_engine_runs_artifact_in_float(bundle, aid):
    art = bundle.artifact(aid)
    golden = bundle.golden()
    with open_engine(art.engine, art.model_path) as engine:
        assert engine.name == art.engine
        assert [list(s.shape) for s in engine.inputs] == [[1, 1, 8, 8]]
        assert [list(s.shape) for s in engine.outputs] == [[1, 10]]
        outs = engine.run([golden["input_0"][:1]])
        assert len(outs) == 1 and outs[0].dtype == np.float32 and outs[0].shape == (1, 10)
        # same top-1 class as the float reference on every golden input
        for i in range(len(golden["input_0"])):
            (out,) = engine.run([golden["input_0"][i : i + 1]])
            assert out.argmax() == golden["output_0"][i].argmax(), (aid, i)


@pytest.mark.parametrize("aid", ALL_IDS)
def test_wrong_input_shape_names_the_input(bundle, aid):
    art = bundle.artifact(aid)
    with open_engine(art.engine, art.model_path) as engine:
        name = engine.inputs[0].name
        with pytest.raises(InputError, match=rf"{art.engine} model input '{name}' has shape \[1, 1, 8, 8\]; "
                                             r"got \[1, 1, 9, 9\]"):
            engine.run([np.zeros((1, 1, 9, 9), np.float32)])
        with pytest.raises(InputError, match=rf"input '{name}' has shape .*; got \[1, 8, 8\]"):
            engine.run([np.zeros((1, 8, 8), np.float32)])


@pytest.mark.parametrize("aid", ALL_IDS)
def test_wrong_input_count_names_the_inputs(bundle, aid):
    art = bundle.artifact(aid)
    with open_engine(art.engine, art.model_path) as engine:
        name = engine.inputs[0].name
        x = np.zeros((1, 1, 8, 8), np.float32)
        with pytest.raises(InputError, match=rf"takes 1 input\(s\) \({name}\); got 2"):
            engine.run([x, x])
        with pytest.raises(InputError, match=r"takes 1 input\(s\) .*; got 0"):
            engine.run([])


@pytest.mark.parametrize("aid", ALL_IDS)
def test_results_are_not_overwritten_by_the_next_run(bundle, aid):
    art = bundle.artifact(aid)
    golden = bundle.golden()
    with open_engine(art.engine, art.model_path) as engine:
        (first,) = engine.run([golden["input_0"][:1]])
        kept = first.copy()
        engine.run([golden["input_0"][1:2]])
    np.testing.assert_array_equal(first, kept)
    assert not np.array_equal(golden["output_0"][0], golden["output_0"][1])  # the second run had other outputs


def test_other_numeric_dtypes_are_converted(bundle):
    art = bundle.artifact("onnxruntime-fp32")
    x = bundle.golden()["input_0"][:1]
    with open_engine(art.engine, art.model_path) as engine:
        np.testing.assert_allclose(engine.run([x.astype(np.float64)])[0], engine.run([x])[0], rtol=1e-6)


def test_litert_int8_io_is_quantized_transparently(int8_io_bundle):
    """An integer-only model's I/O is int8; run() takes and returns float32, matching a hand-quantized invoke."""
    from ai_edge_litert.interpreter import Interpreter

    bundle = Bundle.open(int8_io_bundle.bundle)
    art = bundle.artifact("litert-int8")
    x = bundle.golden()["input_0"][:1]
    with open_engine("litert", art.model_path) as engine:
        assert engine.inputs[0].dtype == "int8" and engine.outputs[0].dtype == "int8"
        (out,) = engine.run([x])
    assert out.dtype == np.float32

    interp = Interpreter(model_path=str(art.model_path))
    interp.allocate_tensors()
    inp, outp = interp.get_input_details()[0], interp.get_output_details()[0]
    scale, zero = inp["quantization"]
    assert scale > 0
    q = np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)
    interp.set_tensor(inp["index"], q)
    interp.invoke()
    raw = interp.get_tensor(outp["index"])
    assert raw.dtype == np.int8
    oscale, ozero = outp["quantization"]
    np.testing.assert_allclose(out, (raw.astype(np.float32) - ozero) * oscale, rtol=1e-6)
    # and it is close to the float model, not merely self-consistent
    fp32 = bundle.artifact("litert-fp32")
    with open_engine("litert", fp32.model_path) as engine:
        (ref,) = engine.run([x])
    assert np.max(np.abs(out - ref)) <= bundle.manifest["validation"]["litert-int8"]["max_abs_error"] + 1e-6


def test_openvino_honours_the_f32_precision_hint(bundle):
    art = bundle.artifact("openvino-fp32")
    with open_engine("openvino", art.model_path, precision_hint="f32") as engine:
        assert engine.effective_precision == "float32"
        assert engine.execution_devices


def test_openvino_effective_precision_names_the_real_type(bundle):
    art = bundle.artifact("openvino-int8")
    names = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
    with open_engine("openvino", art.model_path) as engine:
        assert engine.effective_precision == names[OV_DEFAULT]


@pytest.mark.parametrize("aid", ALL_IDS)
def test_golden_within_tolerance_with_the_recorded_runtime_options(bundle, aid):
    """A device opening any artifact the way the manifest says can check its numerics against the golden file."""
    art = bundle.artifact(aid)
    golden = bundle.golden()
    tolerance = bundle.manifest["golden"]["tolerance"][aid]
    with art.open() as engine:
        for i in range(len(golden["input_0"])):
            (out,) = engine.run([golden["input_0"][i : i + 1]])
            assert np.max(np.abs(out - golden["output_0"][i : i + 1])) <= tolerance


# -- registry and load failures --------------------------------------------------------------------------

def test_registry_knows_the_three_engines():
    assert set(ENGINE_NAMES) == {"litert", "openvino", "onnxruntime"}
    assert all(engine_version(name) for name in ENGINE_NAMES)


def test_unknown_engine():
    with pytest.raises(BackendUnavailable, match=r"engine_unknown: unknown engine 'tensorrt' \(known: litert") as info:
        engine_class("tensorrt")
    assert info.value.reason == "engine_unknown"


@pytest.mark.parametrize(("engine", "suffix", "reason"), [
    ("litert", ".tflite", "load_failed"), ("onnxruntime", ".onnx", "load_failed"),
    ("openvino", ".xml", "load_failed")])
def test_garbage_model_file(tmp_path, engine, suffix, reason):
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(BackendUnavailable, match=rf"{reason}: .*garbage\{suffix}") as info:
        open_engine(engine, path)
    assert info.value.reason == reason


@pytest.mark.parametrize(("engine", "device", "message"), [
    ("litert", "NPU", r"litert: no NPU device node here"),
    ("litert", "GPU", r"LiteRT GPU cannot run model_fp32.tflite"),
    ("onnxruntime", "NPU", r"onnxruntime has no execution provider 'NPU' here"),
    ("openvino", "GPU", r"OpenVINO has no device 'GPU' here"),
])
def test_missing_accelerators_fail_for_real(bundle, engine, device, message):
    """This machine has no GPU or NPU: each engine's real attempt fails with device_missing."""
    art = bundle.artifact(f"{engine}-fp32")
    with pytest.raises(BackendUnavailable, match=message) as info:
        open_engine(engine, art.model_path, device=device)
    assert info.value.reason == "device_missing"


def test_openvino_fp32_records_the_f32_hint(bundle):
    """Without it the float reference would run as bf16 on AMX CPUs and miss its golden tolerance."""
    art = bundle.artifact("openvino-fp32")
    assert art.runtime == {"precision_hint": "f32"}
    with art.open() as engine:
        assert engine.effective_precision == "float32"
    assert bundle.artifact("openvino-int8").runtime == {}


def test_litert_int8_default_keeps_float_io(bundle):
    """The default INT8 tflite takes and returns float32 tensors; QUANTIZE/DEQUANTIZE run inside the graph."""
    art = bundle.artifact("litert-int8")
    with open_engine("litert", art.model_path) as engine:
        assert engine.inputs[0].dtype == "float32" and engine.outputs[0].dtype == "float32"
    assert "float input/output tensors" in art.entry["method"]


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_an_int64_scalar_input_keeps_its_dtype_and_shape(engine, tmp_path):
    """Silero VAD's ``sr``: an int64 scalar beside float inputs. Engine.run keeps it int64 and 0-d (it used to make
    every feed a float32 array, which the engine refuses)."""
    import onnx
    from onnx import TensorProto, helper

    from edgesdk.engines import open_engine

    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "srf"], ["y"])], "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "scaled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    if engine == "openvino":  # the OpenVINO engine runs IR, as bundles hold it
        import openvino as ov

        ov.save_model(ov.convert_model(path), tmp_path / "scaled.xml")
        path = tmp_path / "scaled.xml"
    with open_engine(engine, path) as eng:
        (y,) = eng.run([np.ones((1, 4), np.float64), np.array(3, np.int64)])
    np.testing.assert_allclose(y, np.full((1, 4), 3.0))
