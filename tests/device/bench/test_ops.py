"""edgesdk bench --ops: per-op profiles of a bundle's artifacts on every engine, each engine's INT8 beside its float.

The digits bundle (every target) is profiled once through the CLI (``--ops --json``, each artifact in a child process
as the CLI runs it); a float model with an op XNNPACK does not take (CUMSUM) is profiled in-process. Real engines,
real converters. No timing asserts: times are whatever this machine gives; what is checked is the structure, which
kernels ran each op and in what precision, and what is reported off the fast kernels and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.bench.ops import artifacts_to_profile, compare, ops_report, profile_artifact, table
from edgesdk.bench.ops.litert import KERNEL_BUILTIN, KERNEL_FAST, ops_outside_xnnpack, outside_xnnpack
from edgesdk.bundle.reader import Bundle
from edgesdk.errors import BackendUnavailable, BundleError, InputError
from support import quantize

EDGESDK = str(Path(sys.executable).parent / "edgesdk")
ROW_FIELDS = ("name", "type", "kernel", "precision", "ms", "fast")
ENGINES = ("litert", "openvino", "onnxruntime")
# the convolution kernels each engine names (its fp32 and int8 forms): each of them multiplies for micro-seconds at
# least, so its median time is > 0 even at OpenVINO's whole-microsecond counters
CONVOLUTIONS = {"CONV_2D", "DEPTHWISE_CONV_2D", "Conv", "FusedConv", "NhwcFusedConv", "QLinearConv", "NhwcQLinearConv",
                "ConvInteger", "Convolution", "GroupConvolution"}
MULTIPLYING = CONVOLUTIONS | {"FULLY_CONNECTED", "Gemm", "FusedGemm", "QGemm", "MatMul", "QLinearMatMul",
                              "FullyConnected", "FullyConnectedQuantizedLegacy"}
QUICK = {"min_runs": 3, "min_seconds": 0.001}  # in-process profiles: enough runs for a median, no more


def run_ops(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EDGESDK, "bench", *args, "--ops", "-q"], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def report(digits_bundle) -> dict:
    proc = run_ops(str(digits_bundle.bundle), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _profile(report: dict, artifact: str) -> dict:
    return next(p for p in report["profiles"] if p["artifact"] == artifact)


def _comparison(report: dict, engine: str) -> dict:
    return next(c for c in report["comparisons"] if c["engine"] == engine)


# -- the report's structure ------------------------------------------------------------------------------------

def test_the_report_has_a_profile_per_artifact_and_a_row_per_op(report, digits_bundle):
    assert report["failed"] == []
    ids = [a["id"] for a in digits_bundle.manifest["artifacts"]]
    assert sorted(p["artifact"] for p in report["profiles"]) == sorted(ids)
    for p in report["profiles"]:
        assert p["engine"] in ENGINES and p["precision"] in ("fp32", "int8"), p["artifact"]
        assert p["whole_ms"] > 0 and p["ops"], p["artifact"]
        for row in p["ops"]:
            assert all(key in row for key in ROW_FIELDS), (p["artifact"], row)
            assert isinstance(row["fast"], bool) and row["ms"] is not None and row["ms"] >= 0, (p["artifact"], row)
            assert row["fast"] or row["why"], (p["artifact"], row)  # an op off the fast kernels says why
        assert p["slow_ops"] == sum(1 for r in p["ops"] if not r["fast"])
        assert p["ops_ms"] == pytest.approx(sum(r["ms"] for r in p["ops"]), abs=1e-3)


def test_each_engine_pairs_its_fp32_and_int8_artifacts(report):
    assert sorted(c["engine"] for c in report["comparisons"]) == sorted(ENGINES)
    prefix = {"litert": "litert", "openvino": "openvino", "onnxruntime": "onnxruntime"}
    for c in report["comparisons"]:
        assert (c["fp32"], c["int8"]) == (f"{prefix[c['engine']]}-fp32", f"{prefix[c['engine']]}-int8")
        assert c["ratio"] == pytest.approx(c["whole_ms"]["int8"] / c["whole_ms"]["fp32"])
        # every op of both artifacts is counted in one op type's row (ONNX Runtime's QLinearConv beside its Conv)
        for side in ("fp32", "int8"):
            assert sum(e[f"{side}_ops"] for e in c["by_type"]) == len(_profile(report, c[side])["ops"]), side
        assert all(e["fp32_ops"] + e["int8_ops"] > 0 for e in c["by_type"])


def test_multiplying_ops_are_there_and_convolutions_take_time(report):
    for p in report["profiles"]:
        multiplying = [r for r in p["ops"] if r["type"] in MULTIPLYING]
        # the digits CNN: three convolutions and two fully-connected layers, on every engine in either precision
        assert len(multiplying) >= 5, (p["artifact"], [r["type"] for r in p["ops"]])
        convolutions = [r for r in multiplying if r["type"] in CONVOLUTIONS]
        assert len(convolutions) >= 3 and all(r["ms"] > 0 for r in convolutions), (p["artifact"], convolutions)


# -- which kernels ran the INT8 ops ----------------------------------------------------------------------------

def test_litert_int8_convolutions_are_int8_inside_xnnpack(report):
    comparison = _comparison(report, "litert")
    assert comparison["slow_int8_ops"] == 0 and comparison["slow_int8_types"] == []
    int8 = _profile(report, "litert-int8")
    assert int8["partitions"] == 1 and all(r["kernel"] == KERNEL_FAST for r in int8["ops"])
    convs = [r for r in int8["ops"] if r["type"] == "CONV_2D"]
    assert len(convs) == 2 and all((r["precision"], r["fast"]) == ("int8", True) for r in convs), convs
    fp32_convs = [r for r in _profile(report, "litert-fp32")["ops"] if r["type"] == "CONV_2D"]
    assert [r["precision"] for r in fp32_convs] == ["float32", "float32"]


def test_onnxruntime_int8_convolutions_run_integer_kernels(report):
    assert _comparison(report, "onnxruntime")["slow_int8_ops"] == 0
    fp32 = _profile(report, "onnxruntime-fp32")["ops"]
    int8 = _profile(report, "onnxruntime-int8")["ops"]
    float_convs = [r for r in fp32 if r["type"] in ("Conv", "FusedConv", "NhwcFusedConv")]
    integer_convs = [r for r in int8 if r["type"] in ("QLinearConv", "NhwcQLinearConv", "ConvInteger")]
    assert len(float_convs) == 3 and not any(r.get("integer_kernel") for r in fp32)
    assert len(integer_convs) == len(float_convs), [r["type"] for r in int8]
    assert not [r for r in int8 if r["type"] in ("Conv", "FusedConv", "NhwcFusedConv")]  # no float conv left
    for r in integer_convs:
        assert r["integer_kernel"] and r["fast"] and r["precision"] in ("int8", "uint8"), r
    assert all(r["conversion"] for r in int8 if r["type"] in ("QuantizeLinear", "DequantizeLinear"))


def test_openvino_int8_convolutions_run_in_int8(report):
    assert _comparison(report, "openvino")["slow_int8_ops"] == 0
    fp32_convs = [r for r in _profile(report, "openvino-fp32")["ops"] if r["type"] == "Convolution"]
    int8_convs = [r for r in _profile(report, "openvino-int8")["ops"] if r["type"] == "Convolution"]
    assert len(fp32_convs) == len(int8_convs) == 3
    for r in int8_convs:
        assert r["precision"] in ("int8", "uint8") and r["kernel"].lower().endswith(("_i8", "_u8")) and r["fast"], r
    assert not [r for r in fp32_convs if r["precision"] in ("int8", "uint8")]


@pytest.mark.parametrize("engine", ENGINES)
def test_float_convolutions_name_their_precision_as_every_engine_does(report, engine):
    """Every engine names element types as numpy does: ONNX Runtime's profiler says 'float' and OpenVINO's exec types
    'f32', which read differently per engine and cannot be filtered with one list (INTEGER_TYPES)."""
    convs = [r for r in _profile(report, f"{engine}-fp32")["ops"] if r["type"] in CONVOLUTIONS]
    assert convs and {r["precision"] for r in convs} == {"float32"}, {r["precision"] for r in convs}


# -- the CLI's options -----------------------------------------------------------------------------------------

def test_backend_profiles_only_that_engines_artifacts(digits_bundle):
    proc = run_ops(str(digits_bundle.bundle), "--backend", "onnxruntime:CPUExecutionProvider:onnxruntime-int8",
                   "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert sorted(p["artifact"] for p in out["profiles"]) == ["onnxruntime-fp32", "onnxruntime-int8"]
    assert [c["engine"] for c in out["comparisons"]] == ["onnxruntime"]


def test_text_table_shows_each_engine_int8_beside_fp32(report):
    text = table(report)
    for engine in ENGINES:
        assert f"== {engine}: {engine}-int8 against {engine}-fp32: whole model" in text, text
    assert text.count("int8 ops off the fast kernels: 0") == 3
    assert "measured on " + report["machine"]["isa_class"] in text


def test_top_limits_the_rows_of_each_table(digits_bundle):
    proc = run_ops(str(digits_bundle.bundle), "--backend", "litert:cpu:litert-int8", "--top", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("== litert: litert-int8 against litert-fp32") and "== openvino" not in proc.stdout
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("op type"))
    assert lines[header + 2].lstrip().startswith("slowest int8 ops beside fp32")  # one op type listed
    assert " -> " in lines[header + 3] and lines[header + 4].lstrip().startswith("int8 ops off the fast kernels: 0")


def test_table_misuse_negative_top(report):
    with pytest.raises(InputError, match="top must be >= 0, got -1"):
        table(report, top=-1)


@pytest.mark.parametrize("args, message", [
    (["--plot", "cdf.png"], "--plot draws latency CDFs; it does not apply to --ops"),
    (["--top", "0"], "--top must be >= 1, got 0"),
    (["--all", "--backend", "onnxruntime:CPUExecutionProvider:onnxruntime-int8"], "give --backend or --all"),
    (["--backend", "onnxruntime-int8"], "--backend must be ENGINE:DEVICE:ARTIFACT"),
    (["--backend", "tvm:cpu:onnxruntime-int8"], "no artifact of digits.bundle for tvm"),
])
def test_misuse_is_refused_naming_the_option(digits_bundle, tmp_path, args, message):
    args = [str(tmp_path / a) if a.endswith(".png") else a for a in args]
    proc = run_ops(str(digits_bundle.bundle), *args)
    assert proc.returncode != 0 and message in proc.stderr, (proc.returncode, proc.stderr[-1000:])
    assert proc.stdout == "" and not (tmp_path / "cdf.png").exists()


def test_an_artifact_the_bundle_does_not_have_is_refused(digits_bundle):
    """As plain ``edgesdk bench --backend`` refuses it (``--ops`` once kept only the engine and profiled its
    every artifact)."""
    proc = run_ops(str(digits_bundle.bundle), "--backend", "onnxruntime:CPUExecutionProvider:nosuch", "--json")
    assert proc.returncode != 0 and "has no artifact 'nosuch' (artifacts: litert-fp32" in proc.stderr, (
        proc.returncode, proc.stderr[-1000:])
    assert proc.stdout == ""


def test_profiling_an_artifact_the_bundle_does_not_have(digits_bundle):
    with pytest.raises(BundleError, match="has no artifact 'nosuch' .artifacts: litert-fp32, litert-int8"):
        profile_artifact(digits_bundle.bundle, "nosuch")
    out = ops_report(digits_bundle.bundle, ["nosuch"])
    assert out["profiles"] == [] and out["comparisons"] == []
    (failed,) = out["failed"]
    assert failed["artifact"] == "nosuch" and "no artifact 'nosuch'" in failed["detail"], failed


def test_artifacts_to_profile_names_what_it_looked_for(digits_bundle):
    assert artifacts_to_profile(digits_bundle.bundle, [("openvino", "CPU", "openvino-int8")]) == [
        "openvino-fp32", "openvino-int8"]
    with pytest.raises(BundleError, match="has no artifact 'nosuch'"):
        artifacts_to_profile(digits_bundle.bundle, [("openvino", "CPU", "nosuch")])
    with pytest.raises(BackendUnavailable, match="no artifact of digits.bundle for tvm that edgesdk can profile"):
        artifacts_to_profile(digits_bundle.bundle, [("tvm", "cpu", "onnxruntime-int8")])


# -- a LiteRT op outside XNNPACK -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cumsum_bundle(tmp_path_factory):
    """conv -> cumsum, tflite target only: XNNPACK has no CUMSUM kernel, so LiteRT's builtin one runs it (in float in
    both artifacts: AI Edge Quantizer leaves CUMSUM float between a DEQUANTIZE and a QUANTIZE)."""
    import torch
    from torch import nn

    class ConvCumsum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            return torch.cumsum(self.conv(x), dim=3)

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((3, 16, 16)).astype(np.float32) for _ in range(16)]
    out = tmp_path_factory.mktemp("cumsum") / "cumsum.bundle"
    # random weights and data: the route is what is exercised, so the accuracy gates are opened
    result = quantize(ConvCumsum().eval(), data, out, example_input=torch.zeros(1, 3, 16, 16), targets=["tflite"],
                      recover="off", samples=8, val_samples=8, max_drop=100.0, max_error_cap=10.0)
    return result.bundle


def test_an_op_outside_xnnpack_is_reported_slow_with_why(cumsum_bundle):
    found = profile_artifact(cumsum_bundle, "litert-fp32", **QUICK)
    (cumsum,) = [r for r in found["ops"] if r["type"] == "CUMSUM"]
    assert (cumsum["kernel"], cumsum["precision"], cumsum["fast"]) == (KERNEL_BUILTIN, "float32", False)
    assert "outside XNNPACK: XNNPACK takes no float32 CUMSUM here" in cumsum["why"]
    assert all(r["fast"] and r["kernel"] == KERNEL_FAST for r in found["ops"] if r is not cumsum)
    assert found["slow_ops"] == 1 and found["partitions"] == 2  # CUMSUM cuts the graph in two XNNPACK partitions
    assert "1 of 4 ops run outside XNNPACK on LiteRT's builtin kernels (CUMSUM)" in found["notes"][0]


def test_ops_outside_xnnpack_names_each_op(cumsum_bundle, digits_bundle):
    bundle = Bundle.open(cumsum_bundle)
    for aid in ("litert-fp32", "litert-int8"):
        path = bundle.artifact(aid).model_path
        ((kind, name, dtype),) = ops_outside_xnnpack(path)
        assert (kind, dtype) == ("CUMSUM", "float32") and name, aid
        assert outside_xnnpack(path) == {"CUMSUM": 1}
    digits = Bundle.open(digits_bundle.bundle)
    for aid in ("litert-fp32", "litert-int8"):
        assert ops_outside_xnnpack(digits.artifact(aid).model_path) == [], aid


def test_a_float_op_outside_xnnpack_in_both_models_is_no_int8_loss(cumsum_bundle):
    profiles = [profile_artifact(cumsum_bundle, aid, **QUICK) for aid in ("litert-fp32", "litert-int8")]
    (comparison,) = compare(profiles)
    assert comparison["slow_int8_ops"] == 0 and comparison["slow_int8_types"] == []
    (cumsum,) = [r for r in profiles[1]["ops"] if r["type"] == "CUMSUM"]
    assert not cumsum["fast"] and "float model" in cumsum["why"] and "too" in cumsum["why"], cumsum["why"]
    convs = [r for r in profiles[1]["ops"] if r["type"] == "CONV_2D"]
    assert len(convs) == 1 and convs[0]["fast"] and convs[0]["kernel"] == KERNEL_FAST
