"""Each source x target route, the refused routes, and the INT8 artifacts being really integer."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import Bundle
from edgesdk.engines import open_engine
from edgesdk.errors import ConversionError
from support import ARTIFACT_IDS, DIGITS_ONNX, INT8_CHECKS, quantize

# fixture -> (source kind in the manifest, targets it must hold when none were asked for)
ROUTES = {
    "digits_bundle": ("pytorch", ("tflite", "openvino", "onnx")),
    "module_bundle": ("pytorch", ("tflite", "openvino", "onnx")),
    "onnx_bundle": ("onnx", ("tflite", "openvino", "onnx")),
    "tflite_bundle": ("tflite", ("tflite", "openvino")),
}
ROUTE_ARTIFACTS = [(fixture, aid) for fixture, (_, targets) in ROUTES.items()
                   for t in targets for aid in ARTIFACT_IDS[t]]


def _artifact_ids(fixture, aid):
    return f"{fixture}-{aid}"


@pytest.mark.parametrize("fixture", list(ROUTES))
def test_default_targets_are_every_route_of_the_source(request, fixture):
    result = request.getfixturevalue(fixture)
    kind, targets = ROUTES[fixture]
    assert result.manifest["source"]["kind"] == kind
    expected = {aid for t in targets for aid in ARTIFACT_IDS[t]}
    assert {a["id"] for a in result.manifest["artifacts"]} == expected


@pytest.mark.parametrize(("fixture", "aid"), ROUTE_ARTIFACTS, ids=[_artifact_ids(*p) for p in ROUTE_ARTIFACTS])
def test_route_artifact_runs_and_reproduces_golden(request, fixture, aid):
    """Each artifact loads on its engine and answers the golden inputs within the manifest tolerance."""
    result = request.getfixturevalue(fixture)
    bundle = Bundle.open(result.bundle)
    art = bundle.artifact(aid)
    golden = bundle.golden()
    tolerance = bundle.manifest["golden"]["tolerance"][aid]
    # The fp32 OpenVINO reference is validated in true f32 (AMX/AVX512-BF16 CPUs default to bf16).
    hint = "f32" if art.engine == "openvino" and art.precision == "fp32" else None
    with open_engine(art.engine, art.model_path, precision_hint=hint) as engine:
        for i in range(len(golden["input_0"])):
            out = engine.run([golden["input_0"][i : i + 1]])
            assert out[0].dtype == np.float32
            assert np.max(np.abs(out[0] - golden["output_0"][i : i + 1])) <= tolerance


INT8_ARTIFACTS = [(f, aid) for f, aid in ROUTE_ARTIFACTS if aid.endswith("int8")]


@pytest.mark.parametrize(("fixture", "aid"), INT8_ARTIFACTS, ids=[_artifact_ids(*p) for p in INT8_ARTIFACTS])
def test_int8_artifact_is_really_integer(request, fixture, aid):
    bundle = Bundle.open(request.getfixturevalue(fixture).bundle)
    art = bundle.artifact(aid)
    INT8_CHECKS[art.engine](art.model_path)


def test_integer_only_tflite_has_int8_io(int8_io_bundle):
    """--tflite-io int8: integer-only, input and output tensors int8 too (Coral, microcontrollers)."""
    from support import assert_tflite_int8

    art = Bundle.open(int8_io_bundle.bundle).artifact("litert-int8")
    assert_tflite_int8(art.model_path, io="int8")
    with pytest.raises(AssertionError):
        assert_tflite_int8(art.model_path, io="float")
    assert int8_io_bundle.manifest["validation"]["litert-int8"]["passed"]


@pytest.mark.parametrize("aid", ["litert-fp32", "openvino-fp32", "onnxruntime-fp32"])
def test_float_reference_fails_the_integer_check(digits_bundle, aid):
    """The integer checks discriminate: the fp32 reference of each engine does not pass them."""
    art = Bundle.open(digits_bundle.bundle).artifact(aid)
    with pytest.raises(AssertionError):
        INT8_CHECKS[art.engine](art.model_path)


def test_int8_files_are_smaller_than_float(digits_bundle):
    sizes = {a["id"]: sum(f["bytes"] for f in a["files"]) for a in digits_bundle.manifest["artifacts"]}
    for engine in ("litert", "openvino", "onnxruntime"):
        assert sizes[f"{engine}-int8"] < 0.5 * sizes[f"{engine}-fp32"]


def test_digits_int8_artifacts_lose_at_most_half_a_point(digits_bundle, digits_images):
    """The issue's bar: on the digits sample every INT8 artifact passes with an accuracy drop <= 0.5 points."""
    validation = digits_bundle.manifest["validation"]
    val_count = len(list(digits_images.glob("val/*/*.png")))
    for aid in ("litert-int8", "openvino-int8", "onnxruntime-int8"):
        m = validation[aid]
        assert m["passed"] is True, aid
        assert m["gate"] == "accuracy_drop_points"
        assert m["samples"] == val_count
        assert m["accuracy_drop_points"] <= 0.5, (aid, m)
        assert m["reference_accuracy"] > 0.95, (aid, m)  # labels were mapped to the right classes


def test_module_source_needs_example_input():
    from support import tiny_cnn

    with pytest.raises(ConversionError, match="needs example_input"):
        quantize(tiny_cnn(), [np.zeros((1, 3, 16, 16), np.float32)], "unused", samples=1)


def test_tflite_to_onnx_is_refused_naming_the_routes(float_tflite, digits_npz, tmp_path):
    with pytest.raises(ConversionError, match=r"cannot build target 'onnx' from a tflite source") as info:
        quantize(float_tflite, digits_npz, tmp_path / "b", targets=["onnx", "tflite"], samples=20)
    assert ".tflite -> tflite, openvino" in str(info.value)


def test_postprocess_knows_a_model_that_already_outputs_probabilities(tmp_path):
    import torch

    from support import tiny_cnn

    model = torch.nn.Sequential(tiny_cnn(), torch.nn.Softmax(dim=1)).eval()
    data = np.random.default_rng(1).standard_normal((30, 1, 3, 16, 16)).astype(np.float32)
    m = quantize(model, list(data), tmp_path / "b", example_input=torch.zeros(1, 3, 16, 16), targets=["onnx"],
                 samples=20, max_drop=100.0).manifest
    assert m["postprocess"] == {"type": "classification", "softmax": False, "top_k": 5}
    assert m["outputs"][0]["shape"] == [1, 5]
    assert m["source"] == {"name": "Sequential", "kind": "pytorch"}
