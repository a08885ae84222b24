""".tflite models from the wild: MediaPipe's BlazeFace and face landmark models (no SignatureDef, float16 weights,
operator codes from before schema 3a) through both routes; custom ops refused for every route before any work;
the transposed-convolution bias AI Edge Quantizer 0.10 quantizes along the wrong axis.

BlazeFace and face landmark come from their pip wheel (tests/zoo.py). Calibration data are random uint8 images
scaled to the models' input range ([-1, 1], NHWC float): they exercise the routes, not accuracy, so the gates are
opened (max_drop=100, max_error_cap=1.0; the accuracy gate for such models is issue 17).
"""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
import zoo
from edgesdk.errors import ConversionError
from support import quantize

MEDIAPIPE = {  # zoo key -> (input shape, output shapes)
    "blazeface": ((1, 128, 128, 3), [(1, 896, 16), (1, 896, 1)]),
    "face_landmark": ((1, 192, 192, 3), [(1, 1, 1, 1404), (1, 1, 1, 1)]),
}
# What each file needs before AI Edge Quantizer reads it (both set only deprecated_builtin_code; BlazeFace keeps
# its weights as float16).
QUANTIZER_INPUT = {
    "blazeface": ["8 operator codes given builtin_code", "74 float16 weight tensors unpacked to float32"],
    "face_landmark": ["5 operator codes given builtin_code"],
}


def _images(shape: tuple[int, ...], n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, *shape[1:]), dtype=np.uint8).astype(np.float32) / 127.5 - 1.0


@pytest.fixture(scope="module", params=list(MEDIAPIPE))
def mediapipe_bundle(request, tmp_path_factory):
    key = request.param
    shape, _ = MEDIAPIPE[key]
    calib = tmp_path_factory.mktemp(key) / "calib.npy"
    np.save(calib, _images(shape, 20))
    out = calib.parent / f"{key}.bundle"
    logged: list[str] = []
    result = quantize(str(zoo.model(key)), str(calib), out, samples=12, max_drop=100.0, max_error_cap=1.0,
                      log=logged.append)
    return key, result, logged


def test_mediapipe_model_builds_both_default_targets(mediapipe_bundle):
    key, result, _ = mediapipe_bundle
    assert {a["id"] for a in result.manifest["artifacts"]} == {"litert-fp32", "litert-int8", "openvino-fp32",
                                                               "openvino-int8"}
    print(f"\n{key}\n{result.table()}")  # the agreement numbers, for the record (pytest -s)


def test_mediapipe_int8_records_the_added_signature_and_quantizer_input(mediapipe_bundle):
    key, result, _ = mediapipe_bundle
    method = next(a["method"] for a in result.manifest["artifacts"] if a["id"] == "litert-int8")
    assert "SignatureDef 'serving_default' added" in method
    for change in QUANTIZER_INPUT[key]:
        assert f"{change}" in method
    assert "float16" not in method or key == "blazeface"
    assert result.manifest["source"]["signature_added"] == {"key": "serving_default", "targets": ["tflite"]}


def test_mediapipe_artifacts_carry_the_signature(mediapipe_bundle):
    from ai_edge_litert.interpreter import Interpreter

    key, result, _ = mediapipe_bundle
    for name in ("model_fp32.tflite", "model_int8.tflite"):
        signatures = Interpreter(model_path=str(result.bundle / "tflite" / name)).get_signature_list()
        assert list(signatures) == ["serving_default"], name


@pytest.mark.parametrize("artifact", ["litert-int8", "openvino-int8"])
def test_mediapipe_int8_artifact_loads_and_runs(mediapipe_bundle, artifact):
    key, result, _ = mediapipe_bundle
    shape, out_shapes = MEDIAPIPE[key]
    with edgesdk.load(result.bundle, artifact=artifact) as model:
        outputs = model.predict(_images(shape, 1, seed=7)).outputs
    assert [tuple(np.shape(o)) for o in outputs] == out_shapes
    assert all(np.isfinite(o).all() for o in outputs)


# -- custom ops --------------------------------------------------------------------------------------------------


def _with_custom_op(source, out, code: str = "Convolution2DTransposeBias"):
    """BlazeFace with two of its RELU nodes turned into the custom op ``code`` (the way MediaPipe's selfie
    segmentation carries Convolution2DTransposeBias), written to ``out``."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(source))
    custom = schema.OperatorCodeT()
    custom.builtinCode = custom.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    custom.customCode, custom.version = code, 1
    model.operatorCodes.append(custom)
    relu = next(i for i, c in enumerate(model.operatorCodes)
                if max(c.builtinCode, c.deprecatedBuiltinCode) == schema.BuiltinOperator.RELU)
    for op in [op for op in model.subgraphs[0].operators if op.opcodeIndex == relu][:2]:
        op.opcodeIndex, op.builtinOptionsType, op.builtinOptions = len(model.operatorCodes) - 1, 0, None
    flatbuffer_utils.write_model(model, str(out))
    return out


@pytest.fixture(scope="module")
def custom_op_tflite(tmp_path_factory):
    return _with_custom_op(zoo.model("blazeface"), tmp_path_factory.mktemp("custom") / "with_custom_op.tflite")


def test_custom_op_refuses_every_route_at_once_before_reading_data(custom_op_tflite, tmp_path):
    # The calibration data does not exist: the refusal must come before anything reads it.
    with pytest.raises(ConversionError) as err:
        quantize(str(custom_op_tflite), str(tmp_path / "absent.npy"), tmp_path / "out.bundle")
    text = str(err.value)
    assert text.startswith("no target can take with_custom_op.tflite")
    assert "tflite: 1 custom op type(s) Convolution2DTransposeBias (2 nodes, first 'node " in text
    assert "LiteRT has no kernel for" in text
    assert "openvino: 1 custom op type(s) that OpenVINO's TFLite frontend cannot convert: " \
           "Convolution2DTransposeBias (2 nodes" in text
    assert not (tmp_path / "out.bundle").exists()


@pytest.mark.parametrize("target", ["tflite", "openvino"])
def test_custom_op_refuses_a_named_target(custom_op_tflite, tmp_path, target):
    with pytest.raises(ConversionError, match=f"cannot go to {target}: 1 custom op type.*Convolution2DTransposeBias"):
        quantize(str(custom_op_tflite), str(tmp_path / "absent.npy"), tmp_path / "out.bundle", targets=[target])


def test_custom_op_listing_reads_the_flatbuffer(custom_op_tflite):
    from edgesdk_converters.sources import open_source

    assert open_source(str(custom_op_tflite)).custom_ops() == [("Convolution2DTransposeBias", 2, "node 3")]
    assert open_source(str(zoo.model("blazeface"))).custom_ops() == []  # builtin ops only: both routes open


def test_flex_op_is_a_custom_op_too(tmp_path):
    from edgesdk_converters.sources import open_source

    flex = _with_custom_op(zoo.model("blazeface"), tmp_path / "flex.tflite", code="FlexErf")
    with pytest.raises(ConversionError, match="cannot go to tflite: 1 custom op type.*FlexErf.*LiteRT has no kernel"):
        open_source(str(flex)).check_targets(["tflite"])


def test_not_a_flatbuffer_is_refused(tmp_path):
    from edgesdk_converters.sources import open_source

    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x18\x00\x00\x00TFL3" + b"\xff" * 64)
    with pytest.raises(ConversionError, match="bad.tflite is not a loadable TFLite model"):
        open_source(str(bad))


# -- AI Edge Quantizer and the transposed convolution's bias ------------------------------------------------------


def _deconv_with_rank4_bias(out):
    """A float .tflite with a TRANSPOSE_CONV whose bias is [1, 1, 1, C], as litert-torch 0.10 writes the PP-OCRv4
    detector's (Paddle's ConvTranspose + Add + BatchNorm, imported from ONNX, folds into that shape): a tiny
    module through litert-torch, its 1-D bias then given that shape (same bytes)."""
    import litert_torch
    import torch
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.ConvTranspose2d(8, 6, 2, stride=2), torch.nn.Sigmoid()).eval()
    litert_torch.convert(net, (torch.zeros(1, 3, 16, 16),)).export(str(out))
    model = flatbuffer_utils.read_model(str(out))
    graph = model.subgraphs[0]
    deconv = next(op for op in graph.operators
                  if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.TRANSPOSE_CONV)
    graph.tensors[deconv.inputs[3]].shape = [1, 1, 1, 6]
    flatbuffer_utils.write_model(model, str(out))
    return net, out


def test_transposed_convolution_int8_loads_in_litert(tmp_path):
    """AI Edge Quantizer 0.10 quantized a [1, 1, 1, C] TRANSPOSE_CONV bias per channel along axis 0 and LiteRT
    refused the model (README, Known issues); the quantizer now gets the bias as [C]."""
    import torch

    net, source = _deconv_with_rank4_bias(tmp_path / "deconv.tflite")
    rng = np.random.default_rng(0)
    data = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
    result = quantize(str(source), data, tmp_path / "deconv.bundle", targets=["tflite"], samples=8, max_drop=100.0,
                      max_error_cap=1.0)
    method = next(a["method"] for a in result.manifest["artifacts"] if a["id"] == "litert-int8")
    assert "1 convolution bias tensors reshaped to 1-D" in method
    with edgesdk.load(result.bundle, artifact="litert-int8") as model:
        out = model.predict(data[:1]).outputs[0]
    assert out.shape == (1, 6, 32, 32)
    with torch.no_grad():
        assert np.abs(out - net(torch.from_numpy(data[:1])).numpy()).max() < 0.1
