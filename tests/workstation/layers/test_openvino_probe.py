"""The OpenVINO layer probe on real IRs: digits.onnx through ``ov.convert_model`` (float) and ``nncf.quantize``
(INT8), built by the converters; and a small IR written here with a Split, a shape subgraph and a mask."""

from __future__ import annotations

import numpy as np
import pytest
from support import DIGITS_ONNX, DIGITS_TOML, quantize

from edgesdk.errors import ConversionError
from edgesdk_converters.layers import probe_for


@pytest.fixture(scope="module")
def irs(tmp_path_factory, digits_images):
    """digits.onnx -> openvino only: (model_fp32.xml, model_int8.xml)."""
    out = tmp_path_factory.mktemp("ov-probe") / "digits-ov.bundle"
    result = quantize(DIGITS_ONNX, digits_images / "train", out, val=digits_images / "val", preprocess=DIGITS_TOML,
                      targets=["openvino"], samples=100, val_samples=100)
    return result.bundle / "openvino" / "model_fp32.xml", result.bundle / "openvino" / "model_int8.xml"


@pytest.fixture(scope="module")
def probes(irs):
    fp32 = probe_for("openvino", irs[0], {"precision_hint": "f32"})
    int8 = probe_for("openvino", irs[1], {})
    yield fp32, int8
    fp32.close()
    int8.close()


@pytest.fixture(scope="module")
def samples(digits_arrays):
    x, _ = digits_arrays
    return [[x[k:k + 1]] for k in range(0, 400, 50)]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-6))


def test_layers_are_the_ops_that_compute_activations(probes):
    fp32, _ = probes
    layers = fp32.layers()
    ops = [l.op for l in layers]
    assert ops.count("Convolution") == 3 and ops.count("MatMul") == 2
    assert not {"Parameter", "Result", "Constant", "Convert", "FakeQuantize"} & set(ops)
    # the ONNX tensor names where OpenVINO kept them; the bias-free Convolution an ONNX Conv becomes has none
    assert [l.name for l in layers[:3]] == ["node_conv2d/WithoutBiases", "conv2d", "relu"]
    assert [l.node for l in layers[:3]] == ["node_conv2d/WithoutBiases", "node_conv2d", "node_relu"]
    assert layers[-1].name == "logits" and layers[-1].shape == (1, 10)
    seen = {"image"}
    for layer in layers:  # each after what it reads
        assert layer.inputs and set(layer.inputs) <= seen, layer
        seen.add(layer.name)
    assert not any(l.quantized for l in layers)


def test_macs_of_the_digits_cnn_match_a_hand_count(probes):
    fp32, _ = probes
    macs = {l.node: l.macs for l in fp32.layers() if l.macs}
    assert macs == {
        "node_conv2d/WithoutBiases": 16 * 8 * 8 * (1 * 3 * 3),  # out channels x 8x8 x (in channels x 3x3)
        "node_conv2d_1/WithoutBiases": 32 * 8 * 8 * (16 * 3 * 3),
        "node_conv2d_2/WithoutBiases": 64 * 4 * 4 * (32 * 3 * 3),  # after a 2x2 max pool
        "node_linear/WithoutBiases": 64 * 256,
        "node_linear_1/WithoutBiases": 10 * 64,
    }


def test_int8_layers_have_the_float_names(probes):
    fp32, int8 = probes
    by_name = {l.name: l for l in fp32.layers()}
    quantized = [l for l in int8.layers() if l.quantized]
    assert {l.op for l in quantized} >= {"Convolution", "MatMul"}
    assert len([l for l in quantized if l.macs]) == 5  # every conv and matmul runs on int8
    for layer in quantized:
        twin = by_name.get(layer.name)
        assert twin is not None, layer
        assert (twin.node, twin.op, twin.inputs, twin.shape, twin.macs) == \
               (layer.node, layer.op, layer.inputs, layer.shape, layer.macs)
    assert [l.name for l in int8.layers()] == [l.name for l in fp32.layers()]


def test_float_capture_ends_in_the_model_output(probes, irs, samples):
    import openvino as ov

    fp32, _ = probes
    compiled = ov.Core().compile_model(str(irs[0]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for sample in samples[:3]:
        found = fp32.capture(sample)
        assert set(found) >= {l.name for l in fp32.layers()} | {"image"}
        assert all(v.dtype == np.float32 for v in found.values())
        np.testing.assert_allclose(found["logits"], compiled(sample)[0], rtol=0, atol=1e-6)
        np.testing.assert_array_equal(found["image"], sample[0])


def test_int8_capture_is_close_to_float_but_not_equal(probes, samples):
    fp32, int8 = probes
    for sample in samples[:3]:
        f, q = fp32.capture(sample), int8.capture(sample)
        assert set(q) == set(f)
        assert 1e-4 < _rel(q["logits"], f["logits"]) < 0.2
        assert np.argmax(q["logits"]) == np.argmax(f["logits"])


@pytest.mark.parametrize("which", [0, 1], ids=["fp32", "int8"])
def test_isolated_reproduces_capture(probes, samples, which):
    probe = probes[which]
    found = probe.capture(samples[0])
    for layer in probe.layers():
        alone = probe.isolated(layer, {i: found[i] for i in layer.inputs})
        assert alone.shape == found[layer.name].shape
        np.testing.assert_allclose(alone, found[layer.name], rtol=1e-5, atol=1e-5 * np.abs(found[layer.name]).max(),
                                   err_msg=layer.name)


def test_int8_isolated_quantizes_its_inputs_on_entry(probes, samples):
    """Fed float values, every INT8 op quantizes them as the whole model would: also a Reshape or a conv whose
    FakeQuantize sits before the MaxPool that computes its input."""
    fp32, int8 = probes
    f = fp32.capture(samples[1])
    for layer in [l for l in int8.layers() if l.quantized]:
        alone = int8.isolated(layer, {i: f[i] for i in layer.inputs})
        assert _rel(alone, f[layer.name]) > 1e-3, layer.name
        assert _rel(alone, f[layer.name]) < 0.05, layer.name


def test_int8_isolated_on_float_inputs_is_closer_to_float_than_int8_all_along(probes, samples):
    fp32, int8 = probes
    late = [l for l in int8.layers() if l.quantized][-4:]  # from the last conv on
    local, accumulated = [], []
    for sample in samples:
        f, q = fp32.capture(sample), int8.capture(sample)
        for layer in late:
            alone = int8.isolated(layer, {i: f[i] for i in layer.inputs})
            local.append(_rel(alone, f[layer.name]))
            accumulated.append(_rel(q[layer.name], f[layer.name]))
    assert 0 < np.mean(local) < np.mean(accumulated)


def test_ignored_scope_by_node_keeps_that_layer_float(probes, irs, samples, tmp_path):
    import nncf
    import openvino as ov

    fp32, _ = probes
    conv = [l for l in fp32.layers() if l.op == "Convolution"][1]
    model = ov.Core().read_model(str(irs[0]))
    data = nncf.Dataset(samples, lambda sample: sample)
    quantized = nncf.quantize(model, data, subset_size=len(samples), ignored_scope=nncf.IgnoredScope(names=[conv.node]))
    path = tmp_path / "model_int8.xml"
    ov.save_model(quantized, str(path), compress_to_fp16=False)
    with probe_for("openvino", path, {}) as probe:
        flags = {l.node: l.quantized for l in probe.layers() if l.op == "Convolution"}
    assert flags == {n: n != conv.node for n in flags}


def test_isolated_without_an_input_names_it(probes):
    fp32, _ = probes
    layer = fp32.layers()[3]
    with pytest.raises(ConversionError, match=r"node_conv2d_1/WithoutBiases.*reads relu, which were not given"):
        fp32.isolated(layer, {"conv2d": np.zeros((1, 16, 8, 8), np.float32)})


def test_capture_refuses_a_sample_that_does_not_fit(probes, samples):
    fp32, _ = probes
    with pytest.raises(ConversionError, match=r"has 1 inputs \(image\); the sample has 2"):
        fp32.capture(samples[0] * 2)
    with pytest.raises(ConversionError, match="input 'image' of model_fp32.xml is float32; the sample gives float64"):
        fp32.capture([samples[0][0].astype(np.float64)])
    with pytest.raises(ConversionError, match="running model_fp32.xml with its layers read failed"):
        fp32.capture([np.zeros((1, 1, 9, 9), np.float32)])


def test_an_unreadable_ir_is_refused(tmp_path):
    path = tmp_path / "model.xml"
    path.write_text("<net>")
    with pytest.raises(ConversionError, match="OpenVINO cannot read model.xml"):
        probe_for("openvino", path, {})


def test_split_outputs_shape_subgraphs_and_masks(tmp_path):
    """A Split whose second output is read, a Reshape to a shape computed by ShapeOf, a Select on a mask."""
    import openvino as ov
    import openvino.opset13 as op

    x = op.parameter([2, 6], np.float32, name="x")
    x.output(0).set_names({"x"})
    halves = op.split(x, op.constant(np.int64(1)), 2)
    added = op.add(halves.output(0), halves.output(1), name="sum")
    added.output(0).set_names({"sum"})
    flat = op.reshape(added, op.divide(op.reduce_prod(op.shape_of(x), op.constant(np.int64(0)), keep_dims=True),
                                     op.constant(np.int64(2))), False)
    flat.set_friendly_name("flat")
    mask = op.greater(flat, op.constant(np.float32(0)))
    chosen = op.select(mask, flat, op.multiply(flat, op.constant(np.float32(0.1))))
    chosen.set_friendly_name("leaky")
    path = tmp_path / "graph.xml"
    ov.save_model(ov.Model([chosen], [x], "g"), str(path))

    with probe_for("openvino", path, {}) as probe:
        layers = {l.node: l for l in probe.layers()}
        split = next(l for l in probe.layers() if l.op == "Split")
        assert layers["sum"].name == "sum" and set(layers["sum"].inputs) == {split.name, split.node + ":1"}
        assert layers["flat"].inputs == ("sum",)  # the ShapeOf reads x for its shape, not its values
        assert layers["leaky"].inputs[0] == "flat" and "ShapeOf" not in {l.op for l in probe.layers()}
        assert not {"Greater", "ShapeOf", "ReduceProd"} & {l.op for l in probe.layers()}
        value = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
        found = probe.capture([value])
        np.testing.assert_allclose(found["sum"], value[:, :3] + value[:, 3:])
        for layer in probe.layers():
            np.testing.assert_allclose(probe.isolated(layer, found), found[layer.name], err_msg=layer.name)
