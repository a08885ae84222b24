"""Recovery's per-layer range choice on real engines and real quantization: a layer kept in float by the search goes
back to INT8 when the other range choice on the tensors it reads lets the artifact pass (ONNX Runtime Percentile
99.99 through ``TensorQuantOverrides``, LiteRT the mean of per-sample min/max through AI Edge Quantizer's statistics).

The model: x[1,16] -> MatMul "embed" -> e[1,256] -> MatMul "head" -> logits[1,4]. Channel 0 of e carries x[15] alone
and "head" ignores it. Two of the 100 calibration samples have x[15] = 300: running min/max (the artifacts' own
choice) stretches the ranges of x and e to 300, which flattens everything "head" reads. The whole model under the
other range choice still fails (x's range is stretched too), "embed" cannot be saved by it, and "head" with the
other ranges on e passes. The validation data carry no outlier. About a minute: two recoveries of a tiny model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk_converters.layers.compare import LayerError
# private: _check_kept reads the share from the artifact after the search; a real record never disagrees with its
# artifact, so its note has no public door
from edgesdk_converters.recovery.recover import Recovery, _check_kept
from edgesdk_converters.targets import Built
from onnx_graphs import save_graph
from support import quantize

OUTLIER = 300.0
INT8 = ("litert-int8", "onnxruntime-int8")
RANGES = {"litert-int8": "mean of per-sample min/max", "onnxruntime-int8": "Percentile 99.99"}
MACS = {"embed": 16 * 256, "head": 256 * 4}
SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("recover-ranges")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((16, 256)).astype(np.float32) * 0.3
    w0[:, 0] = 0.0
    w0[15, :] = 0.0
    w0[15, 0] = 1.0  # e[0] = x[15]
    w2 = rng.standard_normal((256, 4)).astype(np.float32)
    w2[0] = 0.0  # "head" ignores e[0]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w2"], ["logits"], name="head")]
    save_graph(root / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], {"w0": w0, "w2": w2})
    x = rng.standard_normal((300, 16)).astype(np.float32)
    np.savez(root / "val.npz", x=x[100:])
    calib = x[:100].copy()
    calib[::50, 15] = OUTLIER
    np.savez(root / "calib.npz", x=calib)
    out = root / "m.bundle"
    # the error cap is opened: the other ranges clip a few large values of e, which the cap (a share of the output
    # range, 10% by default) would fail on this 4-logit model whatever the top-1 agreement
    result = quantize(root / "m.onnx", root / "calib.npz", out, samples=100, val=root / "val.npz", max_drop=4.0,
                      max_error_cap=1.0, recover="auto", targets=("tflite", "onnx"))
    return out, result.manifest, calib


def artifact(manifest: dict, aid: str) -> dict:
    return next(a for a in manifest["artifacts"] if a["id"] == aid)


@pytest.mark.parametrize("aid", INT8)
def test_head_goes_back_to_int8_with_the_other_ranges_and_embed_stays_float(bundle, aid):
    _, manifest, _ = bundle
    entry = artifact(manifest, aid)
    rec = entry["recovery"]
    assert manifest["validation"][aid]["passed"] is True
    assert rec["status"] == "recovered"
    assert [k["layer"] for k in rec["kept_float"]] == ["embed"]
    ranged = rec["layer_ranges"]
    assert [r["layer"] for r in ranged] == ["head"]
    assert ranged[0]["ranges"] == RANGES[aid] and ranged[0]["macs"] == MACS["head"]
    # head was measured alone in INT8 with the artifact's ranges, and failed: the reason carries that measurement
    assert "alone in INT8 with the artifact's ranges it moved the outputs to cosine" in ranged[0]["reason"]
    assert "onnxruntime TensorQuantOverrides" in rec["mechanism"] or "statistics per tensor" in rec["mechanism"]
    assert rec["int8_mac_share"] == pytest.approx(MACS["head"] / sum(MACS.values()))
    steps = [(t["step"], t["layer_ranges"], t["passed"]) for t in rec["trials"]]
    assert ("ranges", 1, True) in steps
    assert ("calibration", 0, False) in steps  # the other choice for the whole model is not enough
    assert "1 layer reading with" in entry["method"] and "1 layer kept in float" in entry["method"]


def test_the_shipped_onnxruntime_artifact_reads_e_with_a_clipped_range(bundle):
    out, manifest, _ = bundle
    model = onnx.load(str(out / artifact(manifest, "onnxruntime-int8")["files"][0]["path"]))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    quantize_e = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "e"]
    assert len(quantize_e) == 1, "e, which head reads, is quantized once"
    scale = float(inits[quantize_e[0].input[1]])
    assert scale < OUTLIER / 255 / 4, scale  # running min/max would span the outlier: scale >= 300/255
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in model.graph.node)  # embed: float


def test_the_shipped_litert_artifact_quantizes_head_only_with_a_clipped_input_range(bundle):
    from ai_edge_litert.interpreter import Interpreter

    out, manifest, _ = bundle
    interpreter = Interpreter(model_path=str(out / artifact(manifest, "litert-int8")["files"][0]["path"]))
    int8 = [t for t in interpreter.get_tensor_details() if t["dtype"] == np.int8 and len(t["shape"]) == 2
            and t["shape"][0] == 1]  # activations [1, n]; weights are [n, m]
    widths = sorted(int(t["shape"][1]) for t in int8)
    assert widths == [4, 256], widths  # e as head reads it, and head's output; x stays float for embed
    e = next(t for t in int8 if t["shape"][1] == 256)
    assert e["quantization"][0] < OUTLIER / 255 / 4, e["quantization"]


def test_inspect_shows_the_layer_with_the_other_ranges(bundle):
    out, manifest, _ = bundle
    proc = subprocess.run([str(SCRIPT), "inspect", str(out)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    shown = [line for line in lines if line.startswith("recovery: ")]
    assert len(shown) == 2 and all("1 layer(s) kept in float, 1 in INT8 with the other range choice" in line
                                   for line in shown), proc.stdout
    ranged = [line for line in lines if line.startswith("INT8, ")]
    assert len(ranged) == 2, proc.stdout
    assert any(line.startswith(f"INT8, {RANGES['onnxruntime-int8']} ranges: head (MatMul, ") for line in ranged)
    assert any(line.startswith(f"INT8, {RANGES['litert-int8']} ranges: head (FULLY_CONNECTED, ") for line in ranged)


@pytest.mark.parametrize("aid", INT8)
def test_the_share_is_read_from_the_artifact_and_a_mismatch_is_noted(bundle, aid):
    out, manifest, calib = bundle
    art = artifact(manifest, aid)
    shipped = Built(aid, art["engine"], "int8", [out / art["files"][0]["path"]], runtime=art.get("runtime") or {})
    sample = [calib[:1]]
    embed = LayerError(name="embed", op="MatMul", node="embed", position=0, macs=MACS["embed"], quantized=True)
    total = sum(MACS.values())
    # as recovery asked it: "embed" in float, "head" in INT8 (with the other ranges): the artifact agrees, no note
    head = LayerError(name="head", op="MatMul", node="head", position=1, macs=MACS["head"], quantized=True)
    honest = Recovery("recovered", kept=[embed], ranged=[head], macs=total, int8_macs_before=total)
    _check_kept(shipped, honest, sample)
    assert honest.int8_macs_after / honest.macs_after == pytest.approx(MACS["head"] / total)
    assert honest.note == ""
    # a record that says nothing was kept in float: the artifact itself says otherwise, and the note says so
    wrong = Recovery("recovered", kept=[], macs=total, int8_macs_before=total)
    _check_kept(shipped, wrong, sample)
    assert "keeps 20.0% of its MACs in INT8 where the layers asked for leave 100.0%" in wrong.note, wrong.note
    assert wrong.as_dict()["int8_mac_share"] == pytest.approx(0.2)
