"""The LiteRT layer probe on the digits CNN as litert-torch and AI Edge Quantizer build it (float, INT8 with float
I/O, INT8 with int8 I/O), run on the real interpreter."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgesdk.errors import ConversionError
from edgesdk_converters.layers import probe_for
from support import DIGITS_PT2, DIGITS_TOML, quantize

# The digits CNN (samples/digits/train.py) by hand: output elements x kernel elements x input channels per group.
HAND_MACS = [("DEPTHWISE_CONV_2D", 8 * 8 * 16 * 3 * 3 * 1), ("CONV_2D", 8 * 8 * 32 * 3 * 3 * 16),
             ("CONV_2D", 4 * 4 * 64 * 3 * 3 * 32), ("FULLY_CONNECTED", 64 * 256), ("FULLY_CONNECTED", 10 * 64)]


@pytest.fixture(scope="module")
def tflites(tmp_path_factory, digits_images):
    """litert-fp32 and litert-int8 of digits.pt2, built for this module alone (tflite only: seconds)."""
    out = tmp_path_factory.mktemp("litert-probe")
    result = quantize(DIGITS_PT2, digits_images / "train", out / "digits.bundle", val=digits_images / "val",
                      preprocess=DIGITS_TOML, targets=["tflite"], samples=100, val_samples=100)
    paths = {}
    for artifact in result.manifest["artifacts"]:
        paths[artifact["id"]] = out / f"{artifact['id']}.tflite"
        shutil.copy(result.bundle / artifact["files"][0]["path"], paths[artifact["id"]])
    return paths


@pytest.fixture(scope="module")
def probes(tflites):
    with probe_for("litert", tflites["litert-fp32"]) as fp32, probe_for("litert", tflites["litert-int8"]) as int8:
        yield fp32, int8


@pytest.fixture(scope="module")
def samples(digits_arrays):
    return [x[None] for x in digits_arrays[0][:24]]


def _interpreter(path, resolver=None):
    from ai_edge_litert.interpreter import Interpreter

    kwargs = {} if resolver is None else {"experimental_op_resolver_type": resolver}
    interpreter = Interpreter(model_path=str(path), **kwargs)
    interpreter.allocate_tensors()
    return interpreter


def _output(interpreter, x):
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_layers_are_the_ops_and_int8_keeps_the_float_names(probes):
    fp32, int8 = probes
    ops = ["RESHAPE", "DEPTHWISE_CONV_2D", "CONV_2D", "MAX_POOL_2D", "CONV_2D", "MAX_POOL_2D", "TRANSPOSE", "RESHAPE",
           "FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert [l.op for l in fp32.layers()] == ops == [l.op for l in int8.layers()]  # no QUANTIZE/DEQUANTIZE
    assert [(l.name, l.inputs, l.shape) for l in int8.layers()] == [(l.name, l.inputs, l.shape) for l in fp32.layers()]
    assert fp32.layers()[0].inputs == ("serving_default_args_0",)  # the float input, behind the int8 model's QUANTIZE
    assert [l.node for l in fp32.layers()] == [f"op {k}" for k in range(10)]
    assert [l.node for l in int8.layers()] == [f"op {k}" for k in range(1, 11)]
    assert not any(l.quantized for l in fp32.layers()) and all(l.quantized for l in int8.layers())
    for before, after in zip(fp32.layers(), fp32.layers()[1:]):
        assert after.inputs == (before.name,)


def test_macs_of_the_weighted_layers_match_a_hand_count(probes):
    for probe in probes:
        assert [(l.op, l.macs) for l in probe.layers() if l.macs] == HAND_MACS
        assert all(l.macs == 0 for l in probe.layers() if l.op not in {op for op, _ in HAND_MACS})


def test_float_capture_ends_in_the_interpreters_output(probes, tflites, samples):
    from ai_edge_litert.interpreter import OpResolverType

    fp32, _ = probes
    x = samples[0]
    found = fp32.capture([x])
    assert set(found) == {l.name for l in fp32.layers()} | {"serving_default_args_0"}
    assert all(v.dtype == np.float32 for v in found.values())
    np.testing.assert_array_equal(found["serving_default_args_0"], x)
    last = found[fp32.layers()[-1].name]
    builtin = _interpreter(tflites["litert-fp32"], OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    np.testing.assert_array_equal(last, _output(builtin, x))
    np.testing.assert_allclose(last, _output(_interpreter(tflites["litert-fp32"]), x), rtol=1e-5, atol=1e-5)  # XNNPACK


def test_int8_capture_is_close_to_float_but_not_equal(probes, tflites, samples):
    fp32, int8 = probes
    x = samples[1]
    expected, found = fp32.capture([x]), int8.capture([x])
    assert set(found) == set(expected)
    last = fp32.layers()[-1].name
    np.testing.assert_allclose(found[last], _output(_interpreter(tflites["litert-int8"]), x), atol=1e-6)
    for layer in fp32.layers():
        span = np.abs(expected[layer.name]).max()
        error = np.abs(found[layer.name] - expected[layer.name]).max()
        assert 0 < error < 0.1 * span, layer.name


def test_isolated_float_layers_reproduce_the_capture(probes, samples):
    fp32, _ = probes
    found = fp32.capture([samples[2]])
    for layer in fp32.layers():
        alone = fp32.isolated(layer, {i: found[i] for i in layer.inputs})
        assert alone.dtype == np.float32 and alone.shape == layer.shape
        np.testing.assert_allclose(alone, found[layer.name], rtol=1e-5, atol=1e-5, err_msg=layer.name)


def test_isolated_int8_layers_on_their_own_values_reproduce_the_capture(probes, samples):
    """A dequantized int8 value quantizes back to the same integers: each layer alone gives what the model gave."""
    _, int8 = probes
    found = int8.capture([samples[3]])
    for layer in int8.layers():
        np.testing.assert_array_equal(int8.isolated(layer, found), found[layer.name], err_msg=layer.name)


def test_isolated_int8_layers_on_float_inputs_err_less_than_the_whole_model(probes, samples):
    fp32, int8 = probes
    last = [l for l in int8.layers() if l.macs][-3:]
    alone, accumulated = np.zeros(len(last)), np.zeros(len(last))
    for x in samples:
        expected, found = fp32.capture([x]), int8.capture([x])
        for n, layer in enumerate(last):
            alone[n] += np.abs(int8.isolated(layer, expected) - expected[layer.name]).mean()
            accumulated[n] += np.abs(found[layer.name] - expected[layer.name]).mean()
    assert np.all(alone > 0)
    assert alone.sum() < accumulated.sum(), (alone, accumulated)


def test_int8_io_model_takes_floats_or_its_own_integers(int8_io_bundle, probes, tmp_path, samples):
    fp32, _ = probes
    path = tmp_path / "int8io.tflite"
    artifact = next(a for a in int8_io_bundle.manifest["artifacts"] if a["id"] == "litert-int8")
    shutil.copy(int8_io_bundle.bundle / artifact["files"][0]["path"], path)
    with probe_for("litert", path) as probe:
        assert [l.name for l in probe.layers()] == [l.name for l in fp32.layers()]
        assert all(l.quantized for l in probe.layers())
        x = samples[4]
        from_floats = probe.capture([x])
        (scale, zero), (out_scale, out_zero) = _quantization(path)
        q = np.clip(np.sign(x / scale) * np.floor(np.abs(x / scale) + 0.5) + zero, -128, 127).astype(np.int8)
        from_ints = probe.capture([q])
        for name, value in from_floats.items():
            np.testing.assert_array_equal(value, from_ints[name], err_msg=name)
        np.testing.assert_allclose(from_floats["serving_default_args_0"], x, atol=scale / 2 + 1e-6)
        last = probe.layers()[-1]
        np.testing.assert_array_equal(probe.isolated(last, from_floats), from_floats[last.name])
        integers = _output(_interpreter(path), q)
        np.testing.assert_array_equal(from_ints[last.name], (integers.astype(np.float32) - out_zero) * out_scale)


def _quantization(path):
    """(scale, zero point) of the model's input and of its output, as the interpreter reports them."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    return [(np.float32(d["quantization"][0]), d["quantization"][1])
            for d in (interpreter.get_input_details()[0], interpreter.get_output_details()[0])]


def test_float16_weights_behind_dequantize_are_constants(probes, tflites, tmp_path, samples):
    """MediaPipe's form: each weight a float16 constant and a DEQUANTIZE op; those ops are not layers."""
    fp32, _ = probes
    path = tmp_path / "fp16_weights.tflite"
    _float16_weights(tflites["litert-fp32"], path)
    with probe_for("litert", path) as probe:
        assert [(l.name, l.op, l.inputs, l.macs) for l in probe.layers()] == \
               [(l.name, l.op, l.inputs, l.macs) for l in fp32.layers()]
        found = probe.capture([samples[5]])
        np.testing.assert_allclose(found[probe.layers()[-1].name], fp32.capture([samples[5]])[fp32.layers()[-1].name],
                                   atol=0.05)
        for layer in probe.layers():
            np.testing.assert_allclose(probe.isolated(layer, found), found[layer.name], rtol=1e-5, atol=1e-5)


def _float16_weights(src, out):
    """``src`` with its convolution and fully-connected weights stored as float16 behind DEQUANTIZE ops."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(src))
    graph = model.subgraphs[0]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.DEQUANTIZE
    model.operatorCodes.append(code)
    weighted = {getattr(schema.BuiltinOperator, n) for n in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")}
    dequantize = []
    for op in graph.operators:
        if model.operatorCodes[op.opcodeIndex].builtinCode not in weighted:
            continue
        weight = graph.tensors[op.inputs[1]]
        half = schema.TensorT()
        half.name, half.shape, half.type = weight.name + b"_fp16", weight.shape, schema.TensorType.FLOAT16
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(np.frombuffer(bytes(model.buffers[weight.buffer].data), "<f4").astype("<f2")
                                    .tobytes(), np.uint8)
        model.buffers.append(buffer)
        half.buffer = len(model.buffers) - 1
        weight.buffer = 0
        graph.tensors.append(half)
        node = schema.OperatorT()
        node.opcodeIndex, node.inputs, node.outputs = len(model.operatorCodes) - 1, [len(graph.tensors) - 1], \
            [op.inputs[1]]
        dequantize.append(node)
    graph.operators = dequantize + graph.operators
    flatbuffer_utils.write_model(model, str(out))


def test_truncated_file_is_refused(tflites, tmp_path):
    path = tmp_path / "cut.tflite"
    data = tflites["litert-int8"].read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(ConversionError, match="cut.tflite"):
        probe_for("litert", path)
    path.write_bytes(b"not a model at all")
    with pytest.raises(ConversionError, match="TFL3"):
        probe_for("litert", path)


def test_misuse_names_the_layer_or_tensor(probes, tflites, samples):
    fp32, _ = probes
    layer = fp32.layers()[2]
    with pytest.raises(ConversionError, match=r"reads '.*Conv2d_0;1', which were not given"):
        fp32.isolated(layer, {})
    with pytest.raises(ConversionError, match="has 1 inputs \\(serving_default_args_0\\); the sample has 2"):
        fp32.capture([samples[0], samples[0]])
    with pytest.raises(ConversionError, match="no layer named 'nope'"):
        fp32.isolated(type(layer)("nope", "CONV_2D", "op 99", ()), {})
    with pytest.raises(ConversionError, match="num_threads must be an integer from 1"):
        probe_for("litert", tflites["litert-fp32"], {"num_threads": 0})
    closed = probe_for("litert", tflites["litert-fp32"])
    closed.close()
    with pytest.raises(ConversionError, match="closed"):
        closed.capture([samples[0]])
