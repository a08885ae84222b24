"""ONNX models from other exporters: the PP-OCRv4 detector and recognizer (Paddle, opset 12, batch declared -1 or
dim_param), opsets 7-21, custom ops, constant control flow (Silero VAD's If on its sample rate).

The PP-OCR bundles are built at reduced sizes (160x160 detector, 48x160 recognizer) from rendered text, through
the openvino and onnx targets. Their validation gate is the classification one (issue 17), so it runs with
``max_drop=100`` and a wide ``max_error_cap``; what is checked here is that each INT8 artifact builds, loads and
answers close to the float model on a text image.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter
from PIL import Image, ImageDraw, ImageFont

import edgesdk
from edgesdk import Bundle
import zoo
from edgesdk.errors import ConversionError
from edgesdk_converters.onnx_import import import_onnx, unsupported_ops
from edgesdk_converters.onnx_prepare import control_flow, fold_constant_branches
from edgesdk_converters.sources import open_source
from support import quantize

DET_SHAPE = (1, 3, 160, 160)
REC_SHAPE = (1, 3, 48, 160)
WORDS = ["edge", "SDK", "2048", "text", "hello", "ocr", "quantize", "INT8", "model", "river", "7 up", "zoo"]


def rendered_text(shape: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    """``n`` images of dark words on light paper at ``shape`` (N, 3, H, W), normalized as PP-OCR does
    ((x / 255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    _, _, h, w = shape
    images = []
    for _ in range(n):
        paper = int(rng.integers(200, 256))
        img = Image.new("RGB", (w, h), (paper,) * 3)
        draw = ImageDraw.Draw(img)
        lines = 1 if h <= 64 else int(rng.integers(2, 5))
        for line in range(lines):
            font = ImageFont.load_default(size=int(rng.integers(max(12, h // 4), max(14, h // 2))) if h <= 64
                                          else int(rng.integers(14, 26)))
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 3))))
            y = (h - font.size) // 2 if lines == 1 else int(line * h / lines + rng.integers(0, 8))
            draw.text((int(rng.integers(2, 20)), y), text, fill=(int(rng.integers(0, 60)),) * 3, font=font)
        images.append(np.asarray(img, np.float32).transpose(2, 0, 1))
    return ((np.stack(images) / 255.0 - 0.5) / 0.5).astype(np.float32)


def _float_outputs(model_path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _build(key: str, shape, tmp_path_factory):
    folder = tmp_path_factory.mktemp(key)
    np.save(folder / "calib.npy", rendered_text(shape, 12, seed=1))
    said = []
    result = quantize(zoo.model(key), folder / "calib.npy", folder / "bundle", targets=["openvino", "onnx"],
                      input_shapes={"x": shape}, samples=8, max_drop=100, max_error_cap=1.0, log=said.append)
    return result, said


@pytest.fixture(scope="module")
def det_bundle(tmp_path_factory):
    return _build("ppocr_det", DET_SHAPE, tmp_path_factory)


@pytest.fixture(scope="module")
def rec_bundle(tmp_path_factory):
    return _build("ppocr_rec", REC_SHAPE, tmp_path_factory)


# -- PP-OCRv4 through openvino and onnx ----------------------------------------------------------------------

def _int8_method(manifest, aid):
    return next(a["method"] for a in manifest["artifacts"] if a["id"] == aid)


@pytest.mark.parametrize("fixture", ["det_bundle", "rec_bundle"])
def test_ppocr_opset_12_is_upgraded_for_the_onnx_target_and_says_so(request, fixture):
    result, _ = request.getfixturevalue(fixture)
    assert {a["id"] for a in result.manifest["artifacts"]} == {"openvino-fp32", "openvino-int8", "onnxruntime-fp32",
                                                               "onnxruntime-int8"}
    assert _int8_method(result.manifest, "onnxruntime-int8").endswith(
        "the opset 12 source upgraded to opset 13 with onnx.version_converter")
    assert "upgraded" not in _int8_method(result.manifest, "openvino-int8")  # OpenVINO reads opset 12 as it is
    assert result.manifest["source"]["opset"] == 12  # and the manifest's source section says what was done
    assert result.manifest["source"]["opset_upgrade"] == {"to": 13, "targets": ["onnx"], "tool": "onnx.version_converter"}
    fp32 = Bundle.open(result.bundle).artifact("onnxruntime-fp32").model_path  # the float reference is the same
    assert onnx.load(str(fp32)).opset_import[0].version == 13


def test_ppocr_det_int8_artifacts_load_and_find_the_text(det_bundle):
    """Each INT8 artifact's probability map, thresholded as PP-OCR does (0.3), covers the float model's text."""
    result, _ = det_bundle
    x = rendered_text(DET_SHAPE, 1, seed=99)
    want = _float_outputs(zoo.model("ppocr_det"), x) > 0.3
    assert want.sum() > 100  # the float model sees the rendered text
    for aid in ("openvino-int8", "onnxruntime-int8"):
        with edgesdk.load(result.bundle, artifact=aid, allow_failed=True) as model:
            out = model.predict(x).outputs[0]
            assert out.shape == (1, 1, 160, 160)
            got = out > 0.3
            iou = (got & want).sum() / (got | want).sum()
            assert iou > 0.5, (aid, iou)


def test_ppocr_rec_int8_artifacts_load_and_read_like_float(rec_bundle):
    """Each INT8 artifact's per-step best character (CTC argmax) mostly agrees with the float model's."""
    result, _ = rec_bundle
    x = rendered_text(REC_SHAPE, 4, seed=98)
    want = np.concatenate([_float_outputs(zoo.model("ppocr_rec"), x[i:i + 1]) for i in range(4)]).argmax(-1)
    for aid in ("openvino-int8", "onnxruntime-int8"):
        with edgesdk.load(result.bundle, artifact=aid, allow_failed=True) as model:
            outs = [model.predict(x[i:i + 1]).outputs[0] for i in range(4)]
            assert outs[0].shape == (1, 20, 6625)
            agree = float(np.mean(np.concatenate(outs).argmax(-1) == want))
            assert agree > 0.6, (aid, agree)


# -- dynamic dims ------------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, opset=13, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_minus_one_zero_named_and_unnamed_dims_are_all_dynamic(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", None])  # Paddle's -1, named, unnamed
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, [0, 3, 4, 4])  # another exporter's "any"
    model = _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x2"], ["y2"])], [x, x2],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, "h", None]),
                    helper.make_tensor_value_info("y2", TensorProto.FLOAT, [0, 3, 4, 4])])
    onnx.save(model, str(tmp_path / "m.onnx"))
    src = open_source(tmp_path / "m.onnx")
    assert [s.shape for s in src.inputs] == [(-1, 3, -1, -1), (-1, 3, 4, 4)]
    src.set_input_shapes({"x": (1, 3, 48, 192), "x2": (2, 3, 4, 4)})
    assert [s.shape for s in src.inputs] == [(1, 3, 48, 192), (2, 3, 4, 4)]
    module = import_onnx(model, {"x": (1, 3, 48, 192), "x2": (2, 3, 4, 4)})  # the LiteRT route's importer
    assert module is not None


def test_paddle_minus_one_batch_takes_an_input_shape_on_the_litert_importer():
    """ch_ppocr_mobile_v2.0_cls declares its batch as dim_value -1: the importer took it as a size."""
    path = zoo.model("ppocr_cls")
    model = onnx.load(str(path))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1
    src = open_source(path)
    assert src.inputs[0].shape == (-1, 3, -1, -1)
    src.set_input_shapes({"x": (1, 3, 48, 192)})
    module = import_onnx(model, {"x": (1, 3, 48, 192)})
    import torch

    x = rendered_text((1, 3, 48, 192), 1, seed=5)
    got = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, _float_outputs(path, x), atol=1e-4)


# -- opsets ------------------------------------------------------------------------------------------------

def _small_cnn(opset: int) -> onnx.ModelProto:
    """A conv net written at opset 7 and IR 3 (BatchNormalization with ``spatial``, initializers as inputs) and
    upgraded by onnx's converter to ``opset``: what older exporters write."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b")]
    for name, value in (("scale", 1 + rng.normal(0, 0.1, 8)), ("bias", rng.normal(0, 0.1, 8)),
                        ("mean", rng.normal(0, 0.1, 8)), ("var", 1 + rng.uniform(0, 0.2, 8))):
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    inits += [numpy_helper.from_array(np.array([1, 8 * 4 * 4], np.int64), "flat"),
              numpy_helper.from_array(rng.normal(0, 0.1, (10, 128)).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"], spatial=1),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], opset=7, inits=inits)
    model.ir_version = 3  # as then: every initializer is also listed as a graph input
    model.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in inits)
    return model if opset == 7 else version_converter.convert_version(model, opset)


@pytest.mark.parametrize("opset", [7, 9, 11, 12, 13, 17, 21])
def test_every_opset_from_7_to_21_quantizes_for_onnx_runtime(tmp_path, opset):
    path = tmp_path / f"cnn{opset}.onnx"
    onnx.save(_small_cnn(opset), str(path))
    np.save(tmp_path / "calib.npy", np.random.default_rng(1).normal(0, 1, (24, 1, 8, 8)).astype(np.float32))
    said = []
    result = quantize(path, tmp_path / "calib.npy", tmp_path / "b", targets=["onnx"], samples=16, max_drop=100,
                      log=said.append)
    method = _int8_method(result.manifest, "onnxruntime-int8")
    assert ("upgraded to opset 13" in method) == (opset < 13), method
    with edgesdk.load(result.bundle, artifact="onnxruntime-int8", allow_failed=True) as model:
        assert model.predict(np.zeros((1, 1, 8, 8), np.float32)).outputs[0].shape == (1, 10)


@pytest.mark.parametrize("opset", [7, 12])
def test_old_opsets_quantize_for_openvino(tmp_path, opset):
    path = tmp_path / f"cnn{opset}.onnx"
    onnx.save(_small_cnn(opset), str(path))
    np.save(tmp_path / "calib.npy", np.random.default_rng(1).normal(0, 1, (24, 1, 8, 8)).astype(np.float32))
    result = quantize(path, tmp_path / "calib.npy", tmp_path / "b", targets=["openvino"], samples=16, max_drop=100)
    with edgesdk.load(result.bundle, artifact="openvino-int8", allow_failed=True) as model:
        assert model.predict(np.zeros((1, 1, 8, 8), np.float32)).outputs[0].shape == (1, 10)


@pytest.mark.parametrize(("opset", "message"), [
    (6, r"cnn.onnx is ONNX opset 6; opsets 7-\d+ are supported"),
    (onnx.defs.onnx_opset_version() + 1, r"cnn.onnx is ONNX opset \d+, newer than the installed onnx"),
])
def test_opsets_no_route_takes_are_refused_before_any_work(tmp_path, opset, message):
    model = _small_cnn(7)
    model.opset_import[0].version = opset
    onnx.save(model, str(tmp_path / "cnn.onnx"))
    with pytest.raises(ConversionError, match=message):
        quantize(tmp_path / "cnn.onnx", tmp_path / "no-calibration-read.npy", tmp_path / "b")
    assert not (tmp_path / "b").exists()


# -- custom ops --------------------------------------------------------------------------------------------

def _custom_op_model(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Swizzle", ["a"], ["b"], domain="acme.ops", name="swz_1"),
             helper.make_node("Swizzle", ["b"], ["y"], domain="acme.ops", name="swz_2")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model.opset_import.append(helper.make_opsetid("acme.ops", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    return path


def test_custom_ops_are_named_for_every_route_before_any_work(tmp_path):
    with pytest.raises(ConversionError) as info:
        quantize(_custom_op_model(tmp_path), tmp_path / "no-calibration-read.npy", tmp_path / "b")
    text = str(info.value)
    assert text.startswith("no target can take custom.onnx: ")
    assert "tflite: 1 op type(s) are not supported by the ONNX importer: acme.ops.Swizzle (2 nodes, first 'swz_1')" \
        in text
    assert "openvino: 1 op type(s) that OpenVINO cannot convert: acme.ops.Swizzle (2 nodes, first 'swz_1')" in text
    assert "onnx: 1 custom op type(s) that ONNX Runtime does not implement: acme.ops.Swizzle (2 nodes, first " \
           "'swz_1')" in text


def test_a_named_target_that_cannot_take_the_ops_is_refused(tmp_path):
    with pytest.raises(ConversionError, match=r"custom.onnx cannot go to onnx: 1 custom op type\(s\) that ONNX "
                                              r"Runtime does not implement: acme.ops.Swizzle"):
        quantize(_custom_op_model(tmp_path), tmp_path / "no-calibration-read.npy", tmp_path / "b", targets=["onnx"])


def test_default_targets_skip_tflite_when_the_importer_lacks_an_op_and_say_why(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("LpNormalization", ["a"], ["y"], name="lp")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    onnx.save(model, str(tmp_path / "lp.onnx"))
    said = []
    src = open_source(tmp_path / "lp.onnx")
    assert src.default_targets(said.append) == ["openvino", "onnx"]
    assert said == ["not building tflite from lp.onnx: 1 op type(s) are not supported by the ONNX importer: "
                    "LpNormalization (1 node, first 'lp')"]


# -- control flow ------------------------------------------------------------------------------------------

def _branchy(cond_from_input: bool) -> onnx.ModelProto:
    """y = Relu(x) if <cond> else Neg(x); the condition is Shape(x)[0] == 1, or the bool input ``flag``."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])]
    if cond_from_input:
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
        nodes = [helper.make_node("Identity", ["flag"], ["c"])]
    else:
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"]),
                 helper.make_node("Equal", ["b", "one"], ["c"])]
    nodes.append(helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branchy"))
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                  inits=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                         numpy_helper.from_array(np.array(1, np.int64), "one")])


@pytest.mark.parametrize("batch", [1, 2])
def test_if_on_a_fixed_shape_folds_and_imports_for_litert(batch):
    model = _branchy(cond_from_input=False)
    assert unsupported_ops(model) == []  # the condition is a constant once the input shape is fixed
    x = np.random.default_rng(0).normal(size=(batch, 4)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    folded = fold_constant_branches(model, input_shapes={"x": (batch, 4)})
    assert control_flow(folded) == []
    assert [n.op_type for n in folded.graph.node] == ["Relu" if batch == 1 else "Neg", "Identity"]
    np.testing.assert_array_equal(ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0], want)
    import torch

    np.testing.assert_array_equal(import_onnx(model, {"x": (batch, 4)})(torch.from_numpy(x)).numpy(), want)


def test_if_on_an_input_folds_for_a_given_value_and_is_refused_for_litert_otherwise(tmp_path):
    model = _branchy(cond_from_input=True)
    assert unsupported_ops(model) == [("If", 1, "branchy")]
    assert control_flow(fold_constant_branches(model, input_shapes={"x": (1, 4)})) == [("If", "branchy")]
    folded = fold_constant_branches(model, {"flag": np.array(False)})
    assert [n.op_type for n in folded.graph.node] == ["Neg", "Identity"]
    assert [v.name for v in folded.graph.input] == ["x", "flag"]  # the input stays; only that value is right
    onnx.save(model, str(tmp_path / "branchy.onnx"))
    with pytest.raises(ConversionError, match=r"branchy.onnx cannot go to tflite: 1 op type\(s\) are not supported "
                                              r"by the ONNX importer: If \(1 node, first 'branchy'\)"):
        open_source(tmp_path / "branchy.onnx").check_targets(["tflite"])


def test_fold_refuses_a_constant_for_an_input_the_model_lacks():
    with pytest.raises(ConversionError, match=r"constants name 'rate', which the model does not have "
                                              r"\(inputs: x, flag\)"):
        fold_constant_branches(_branchy(cond_from_input=True), {"rate": np.array(1)})


def test_silero_vad_folds_to_no_control_flow_for_16k_and_keeps_its_answers():
    """Silero VAD branches on ``sr`` (16 kHz / 8 kHz) and, inside, on shapes: all of it folds once ``sr`` and the
    chunk and state shapes are fixed, and 20 chunks carrying the state give the same probabilities."""
    model = onnx.load(str(zoo.model("silero_vad")))
    sr = np.array(16000, np.int64)
    folded = fold_constant_branches(model, {"sr": sr}, {"input": (1, 512), "state": (2, 1, 128)})
    assert control_flow(model) == [("If", "If_0")] and control_flow(folded) == []
    original, fixed = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                       for m in (model, folded))
    state_a = state_b = np.zeros((2, 1, 128), np.float32)
    rng = np.random.default_rng(0)
    for _ in range(20):
        chunk = rng.uniform(-0.5, 0.5, (1, 512)).astype(np.float32)
        prob_a, state_a = original.run(None, {"input": chunk, "state": state_a, "sr": sr})
        prob_b, state_b = fixed.run(None, {"input": chunk, "state": state_b, "sr": sr})
        np.testing.assert_array_equal(prob_a, prob_b)
        np.testing.assert_array_equal(state_a, state_b)
