"""INT8 that is right on every CPU: where validation ran, the capped golden tolerance, and an artifact whose
integer kernels saturate on some CPUs (ONNX Runtime's U8S8 without reduce_range on x86 without VNNI).

Nothing here assumes the CPU it runs on: what this CPU does with the saturating artifact is measured first
(ONNX Runtime's fused integer kernels against its own unfused QDQ reference), and the expectation follows.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgesdk
from edgesdk.cpu import cpu_class, isa_class
from edgesdk.errors import ValidationFailed
from support import quantize

SAT_SHAPE = (1, 16, 8, 8)


def saturating_model(path, seed: int = 0) -> None:
    """Conv 3x3 with all-positive weights over large positive activations, then a small classifier head.

    Quantized U8S8 with 8-bit weights, adjacent uint8 x int8 products add to about 2 * 200 * 100 = 40,000 per pair:
    over int16 (32,767), so VPMADDUBSW (x86 without VNNI) saturates on nearly every pair.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.uniform(0.5, 1.0, (32, 16, 3, 3)).astype(np.float32)
    b1 = np.full(32, -60.0, dtype=np.float32)  # centres the conv outputs so the head sees differences, not a bias
    w2 = (rng.uniform(-1.0, 1.0, (10, 32 * 6 * 6)) / 20).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["logits"], transB=1)],
        "saturating", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SAT_SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def saturating_data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.6, 1.0, (n, *SAT_SHAPE[1:])).astype(np.float32)


def build_saturating_bundle(tmp_path, monkeypatch, reduce_range: bool):
    """The saturating model through `edgesdk quantize --targets onnx`, with reduce_range as asked."""
    from edgesdk_converters.targets import onnx as onnx_target

    monkeypatch.setitem(onnx_target.OPTIONS, "reduce_range", reduce_range)
    src = tmp_path / "saturating.onnx"
    saturating_model(src)
    np.save(tmp_path / "calib.npy", saturating_data(64, 1))
    np.save(tmp_path / "val.npy", saturating_data(48, 2))
    out = tmp_path / f"sat-rr{int(reduce_range)}.bundle"
    try:
        quantize(src, tmp_path / "calib.npy", out, val=tmp_path / "val.npy", targets=["onnx"], samples=64,
                 max_drop=100.0)
    except ValidationFailed:
        pass  # written with passed=false: what a saturating CPU makes of it (checked by the caller)
    return out


def kernels_vs_reference(bundle) -> float:
    """Largest gap between ONNX Runtime's fused integer kernels and its unfused QDQ reference (dequantize -> float op
    -> quantize) on the bundle's validation-like inputs: 0 where the kernels are exact, large where they saturate."""
    import onnxruntime as ort

    manifest = json.loads((bundle / "manifest.json").read_text())
    path = str(bundle / next(a["files"][0]["path"] for a in manifest["artifacts"] if a["id"] == "onnxruntime-int8"))

    def session(level):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    fused, reference = session(ort.GraphOptimizationLevel.ORT_ENABLE_ALL), session(
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    xs = saturating_data(16, 2)
    return max(float(np.abs(fused.run(None, {"x": x[None]})[0] - reference.run(None, {"x": x[None]})[0]).max())
               for x in xs)


# -- where validation ran -------------------------------------------------------------------------------------------

def test_validation_records_the_cpu_class(digits_bundle):
    machine = digits_bundle.manifest["validation"]["machine"]
    here = cpu_class()
    assert machine["isa_class"] == here["isa_class"] and machine["model"] == here["model"]
    assert set(machine["flags"]) >= ({"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}
                                     if here["arch"] == "x86_64" else {"asimddp"})
    assert machine["flags"] == here["flags"]


def test_validation_table_names_the_cpu(digits_bundle):
    from edgesdk.bundle.report import validation_table

    here = cpu_class()
    assert f", measured on {here['isa_class']}: {here['model']} ({here['cpus']} cpus); " in \
        validation_table(digits_bundle.manifest).splitlines()[0]


@pytest.mark.parametrize("flags, arch, expected", [
    ({"avx2", "avx512f", "avx512_vnni", "amx_int8"}, "x86_64", "x86-64 AMX"),
    ({"avx2", "avx512f", "avx512_vnni"}, "x86_64", "x86-64 AVX-512 VNNI"),
    ({"avx2", "avx_vnni"}, "x86_64", "x86-64 AVX2+VNNI"),
    ({"avx2", "avx512f"}, "x86_64", "x86-64 AVX-512 (no VNNI)"),
    ({"avx2", "fma"}, "x86_64", "x86-64 AVX2 (no VNNI)"),
    ({"sse4_2"}, "x86_64", "x86-64 SSE"),
    ({"asimd", "asimddp"}, "aarch64", "arm64 dotprod"),
    ({"asimd"}, "aarch64", "arm64 NEON"),
])
def test_isa_class_names(flags, arch, expected):
    assert isa_class(flags, arch) == expected


def test_cpu_class_of_an_amd_zen3(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                    "flags\t\t: fpu sse4_2 avx avx2 fma bmi2\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\n")
    cls = cpu_class(str(info))
    assert cls["vendor"] == "AuthenticAMD" and cls["model"] == "AMD EPYC 7B13"
    if cls["arch"] == "x86_64":
        assert cls["isa_class"] == "x86-64 AVX2 (no VNNI)"
        assert cls["flags"] == {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx_vnni": False,
                                "amx_int8": False, "amx_bf16": False}


# -- the golden tolerance -------------------------------------------------------------------------------------------

def test_int8_tolerance_is_capped_by_the_output_range(digits_bundle):
    from edgesdk_converters.validation.validate import INT8_ERROR_CAP

    m = digits_bundle.manifest
    tolerance = m["golden"]["tolerance"]
    for art in m["artifacts"]:
        v = m["validation"][art["id"]]
        assert v["max_abs_error_golden"] <= tolerance[art["id"]] <= v["max_abs_error_cap"]
        if art["precision"] == "int8":
            # digits logits span about 60: the cap is a few units, under the saturated error (7.5 on Zen 3)
            assert INT8_ERROR_CAP * 40 < v["max_abs_error_cap"] < 7.4


def test_an_int8_artifact_over_the_cap_fails_and_cannot_meet_its_tolerance(tmp_path, small_digits, digits_images):
    """Calibrated on inputs a hundredth of the real ones, the INT8 activations clip: far off the float outputs.
    The gate fails it on any CPU, and the tolerance it is given (the cap) is one it does not meet at load here (its
    error on the golden inputs is over the cap too), so even allow_failed gets the float artifact instead."""
    from PIL import Image

    from support import DIGITS_PT2, DIGITS_TOML, digits_pixels_to_input

    calib = tmp_path / "calib.npy"
    files = sorted(small_digits.glob("*/*.png"))
    np.save(calib, digits_pixels_to_input(np.stack([np.asarray(Image.open(f)) for f in files])) / 100.0)
    out = tmp_path / "clipped.bundle"
    with pytest.raises(ValidationFailed, match=r"onnxruntime-int8 off the float outputs by more than "
                                                r"max_error_cap=0.1 of their range"):
        quantize(DIGITS_PT2, calib, out, val=digits_images / "val", preprocess=DIGITS_TOML, targets=["onnx"],
                 samples=40, val_samples=100)
    m = json.loads((out / "manifest.json").read_text())
    v = m["validation"]["onnxruntime-int8"]
    assert v["passed"] is False and v["max_abs_error_cap_exceeded"] is True
    assert m["golden"]["tolerance"]["onnxruntime-int8"] == pytest.approx(v["max_abs_error_cap"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with edgesdk.load(out, artifact="onnxruntime-int8", allow_failed=True) as model:
            assert model.placement.artifact == "onnxruntime-fp32"
    skip = next(s for s in model.placement.skipped if s.candidate.artifact == "onnxruntime-int8")
    assert skip.reason == "numerics_mismatch" and "tolerance" in skip.detail


# -- an artifact whose kernels saturate on some CPUs ----------------------------------------------------------------

def test_saturating_artifact_is_accurate_here_or_refused(tmp_path, monkeypatch):
    """U8S8 with 8-bit weights on large activations: on VNNI/AMX/ARM exact, on AVX2/AVX-512F without VNNI saturated.
    Whichever this CPU is, the artifact is never loaded and wrong."""
    bundle = build_saturating_bundle(tmp_path, monkeypatch, reduce_range=False)
    gap = kernels_vs_reference(bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    v = m["validation"]["onnxruntime-int8"]
    saturates_here = gap > v["max_abs_error_cap"] / 2
    print(f"\n{cpu_class()['isa_class']}: fused kernels vs QDQ reference {gap:.4g}, cap {v['max_abs_error_cap']:.4g}")
    if saturates_here:
        assert v["passed"] is False and v["max_abs_error_cap_exceeded"] is True
        with edgesdk.load(bundle) as model:  # the failed artifact is skipped for the float one
            assert model.placement.artifact == "onnxruntime-fp32"
    else:  # exact, or off by kernel rounding only: within what the device's golden check allows
        assert gap <= m["golden"]["tolerance"]["onnxruntime-int8"] and v["passed"] is True
        with edgesdk.load(bundle, artifact="onnxruntime-int8", require="onnxruntime") as model:
            assert model.placement.artifact == "onnxruntime-int8"
            assert model.placement.numerics["checked"] is True


def test_reduce_range_default_holds_here(tmp_path, monkeypatch):
    """The default ONNX recipe (7-bit weights) on the saturating model: the fused kernels match the QDQ reference on
    this CPU, whatever it is (exactly on x86 with or without VNNI; within the golden tolerance anywhere)."""
    from edgesdk_converters.targets import onnx as onnx_target

    assert onnx_target.OPTIONS["reduce_range"] is True
    bundle = build_saturating_bundle(tmp_path, monkeypatch, reduce_range=True)
    m = json.loads((bundle / "manifest.json").read_text())
    assert kernels_vs_reference(bundle) <= m["golden"]["tolerance"]["onnxruntime-int8"] / 10
    assert m["validation"]["onnxruntime-int8"]["passed"] is True
    assert "7-bit (reduce_range)" in next(a["method"] for a in m["artifacts"] if a["id"] == "onnxruntime-int8")


# -- the lowest x86 class (AVX2, no AVX-512, no VNNI), emulated: see tests/isa.py ------------------------------------

_LOAD_CHILD = """
import json, sys, warnings
import numpy as np
import edgesdk
from edgesdk.cpu import cpu_class
warnings.simplefilter("ignore")
bundle, artifact, engine, data = sys.argv[1:5]
out = {"cpu": cpu_class()}
try:
    model = edgesdk.load(bundle, artifact=artifact, engine=engine, require=engine, allow_failed=True)
except edgesdk.BackendUnavailable as exc:
    out.update(loaded=False, reason=exc.reason, detail=exc.detail)
else:
    with model:
        out.update(loaded=True, artifact=model.placement.artifact, numerics=model.placement.numerics,
                   skipped=[s.to_dict() for s in model.placement.skipped])
        if data != "-":
            xs = np.load(data)
            out["predictions"] = [int(model.predict(x[None]).outputs[0].argmax()) for x in xs]
print("RESULT " + json.dumps(out))
"""


def _child_result(proc) -> dict:
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"the emulated child printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(line[len("RESULT "):])


_GAP_CHILD = """
import json, sys
sys.path[:0] = [sys.argv[2], str(__import__("pathlib").Path(sys.argv[2]).parent)]
from pathlib import Path
from test_int8_cpu import kernels_vs_reference
print("RESULT " + json.dumps({"gap": kernels_vs_reference(Path(sys.argv[1]))}))
"""


def test_lowest_x86_refuses_an_artifact_that_saturates_there(tmp_path, monkeypatch):
    """Built and validated here, loaded on an AVX2 CPU without VNNI (qemu, Haswell): the U8S8 artifact with 8-bit
    weights saturates there and the golden check refuses it; the default recipe (7-bit weights) loads and is exact."""
    from isa import run_lowest_x86

    tests_dir = str(Path(__file__).parent)  # the child imports kernels_vs_reference from this module
    saturating = build_saturating_bundle(tmp_path, monkeypatch, reduce_range=False)
    default = build_saturating_bundle(tmp_path, monkeypatch, reduce_range=True)
    cap = json.loads((saturating / "manifest.json").read_text())["validation"]["onnxruntime-int8"]["max_abs_error_cap"]

    gap = _child_result(run_lowest_x86("onnxruntime", _GAP_CHILD, args=(saturating, tests_dir)))["gap"]
    assert gap > cap, f"the emulated AVX2 kernels did not saturate (gap {gap:.4g}, cap {cap:.4g}): nothing was tested"
    # Asked for by name, it is refused by the golden check and the float artifact serves instead.
    refused = _child_result(run_lowest_x86("onnxruntime", _LOAD_CHILD,
                                           args=(saturating, "onnxruntime-int8", "onnxruntime", "-")))
    assert refused["loaded"] is True and refused["artifact"] == "onnxruntime-fp32", refused
    skip = next(s for s in refused["skipped"] if s["artifact"] == "onnxruntime-int8")
    assert skip["reason"] == "numerics_mismatch" and "tolerance" in skip["detail"], skip

    assert _child_result(run_lowest_x86("onnxruntime", _GAP_CHILD, args=(default, tests_dir)))["gap"] < 1e-3
    served = _child_result(run_lowest_x86("onnxruntime", _LOAD_CHILD,
                                          args=(default, "onnxruntime-int8", "onnxruntime", "-")))
    assert served["loaded"] is True and served["numerics"]["checked"] is True, served


@pytest.mark.parametrize("engine", ["onnxruntime", "litert", "openvino"])
def test_digits_int8_holds_on_the_lowest_x86_class(engine, digits_bundle, digits_images, tmp_path):
    """Each engine's INT8 digits artifact, built here, run as on an AVX2 CPU without VNNI (qemu for ONNX Runtime and
    XNNPACK, ONEDNN_MAX_CPU_ISA=AVX2 for OpenVINO): it passes the golden check there and stays within 0.5 points of
    the float accuracy measured at quantize time."""
    from PIL import Image

    from isa import run_lowest_x86
    from support import digits_pixels_to_input

    files = sorted(digits_images.glob("val/*/*.png"))
    xs = digits_pixels_to_input(np.stack([np.asarray(Image.open(f)) for f in files]))
    labels = np.asarray([int(f.parent.name) for f in files])
    np.save(tmp_path / "val.npy", xs)
    artifact = f"{engine}-int8"
    result = _child_result(run_lowest_x86(engine, _LOAD_CHILD,
                                          args=(digits_bundle.bundle, artifact, engine, tmp_path / "val.npy")))
    if engine == "openvino":  # oneDNN capped; the CPU itself is what it is
        assert result["cpu"]["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    else:  # what the emulated process itself sees (CPUID), not the host's /proc/cpuinfo
        assert result["cpu"]["isa_class"] == "x86-64 AVX2 (no VNNI)"
    assert result["loaded"] is True and result["artifact"] == artifact and result["numerics"]["checked"], result
    accuracy = float(np.mean(np.asarray(result["predictions"]) == labels))
    float_accuracy = digits_bundle.manifest["validation"][artifact]["reference_accuracy"]
    print(f"\n{artifact} as on x86-64 AVX2 (no VNNI): {100 * accuracy:.2f}% (float {100 * float_accuracy:.2f}%)")
    assert 100 * (float_accuracy - accuracy) <= 0.5


def test_onnx_int8_weights_are_7_bit(digits_bundle):
    """What keeps VPMADDUBSW from saturating: every int8 weight within [-64, 64], so a pair sum of uint8 x int8
    products is at most 255 * 64 * 2 = 32640, inside int16."""
    m = digits_bundle.manifest
    path = digits_bundle.bundle / next(a["files"][0]["path"] for a in m["artifacts"] if a["id"] == "onnxruntime-int8")
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = [inits[n.input[0]] for n in model.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dtype == np.int8]
    assert weights, "no int8 weight feeds a DequantizeLinear"
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= 64
