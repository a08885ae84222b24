"""Accuracy recovery in ``quantize`` (``recover`` auto|on|off, ``recover_time``), on real engines and real
quantization: a model whose INT8 artifacts fail their gate on every engine, and the same model without its
outlier, which passes.

The failing model: x[1,16] -> MatMul "embed" -> MatMul "hidden", one of whose output channels is 300x larger than
the others -> MatMul "head", which ignores that channel. Per-tensor INT8 activations spend their whole range on the
outlier and flatten the small channels "head" reads, so INT8 agrees with float on about half the inputs; keeping
"head" (and, where the engine quantizes its input at "hidden", "hidden" too) in float recovers it, while "embed"
can stay in INT8. Builds take seconds (a 16-wide model), so each test builds what it needs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgesdk
from edgesdk import Bundle
from edgesdk.errors import BundleError, ConversionError, ValidationFailed
from edgesdk_converters.layers import probe_for
from edgesdk_converters.options import QuantizeOptions
from onnx_graphs import save_graph
from support import quantize

INT8 = ("litert-int8", "openvino-int8", "onnxruntime-int8")
MECHANISMS = {"litert-int8": "ai-edge-quantizer no_quantize", "openvino-int8": "nncf IgnoredScope",
              "onnxruntime-int8": "onnxruntime nodes_to_exclude"}
LAYER_MACS = {"embed": 16 * 16, "hidden": 16 * 16, "head": 16 * 4}
SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def weights(outlier: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    w1 = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    if outlier:
        w1[:, 15] = 0.0
        w1[0, 15] = 300.0  # channel 15 of "hidden" is ~300x the others
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    w2[15] = 0.0  # "head" ignores channel 15
    return {"w0": w0, "w1": w1, "w2": w2}


def save_model(path: Path, outlier: bool) -> Path:
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w1"], ["h"], name="hidden"),
             helper.make_node("MatMul", ["h", "w2"], ["logits"], name="head")]
    save_graph(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], weights(outlier))
    return path


def float_logits(x: np.ndarray, outlier: bool = True) -> np.ndarray:
    w = weights(outlier)
    return x @ w["w0"] @ w["w1"] @ w["w2"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """failing.onnx, passing.onnx and x.npz (300 inputs: 100 calibrate, 200 validate)."""
    root = tmp_path_factory.mktemp("recover-models")
    save_model(root / "failing.onnx", outlier=True)
    save_model(root / "passing.onnx", outlier=False)
    np.savez(root / "x.npz", x=np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32))
    return root


def build(models: Path, model: str, out: Path, **options):
    """quantize(models/model) into ``out``: (manifest, the ValidationFailed raised or None)."""
    try:
        result = quantize(models / model, models / "x.npz", out, samples=100, **options)
    except ValidationFailed as exc:
        return json.loads((out / "manifest.json").read_text()), exc
    return result.manifest, None


@pytest.fixture(scope="module")
def recovered(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("recovered") / "failing.bundle"
    manifest, failed = build(models, "failing.onnx", out, recover="auto")
    assert failed is None, str(failed)
    return out, manifest


@pytest.fixture(scope="module")
def unrecovered(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("unrecovered") / "failing.bundle"
    return (out, *build(models, "failing.onnx", out, recover="off"))


def artifact(manifest: dict, aid: str) -> dict:
    return next(a for a in manifest["artifacts"] if a["id"] == aid)


def file_bytes(bundle: Path, manifest: dict, aid: str) -> list[bytes]:
    return [(bundle / f["path"]).read_bytes() for f in artifact(manifest, aid)["files"]]


# -- recover="off": the model really breaks INT8 -------------------------------------------------------------

def test_off_fails_every_int8_artifact_and_records_no_recovery(unrecovered):
    out, manifest, failed = unrecovered
    assert isinstance(failed, ValidationFailed)
    assert sorted(failed.failing) == sorted(INT8)
    for aid in INT8:
        assert manifest["validation"][aid]["passed"] is False
        assert manifest["validation"][aid]["metric_value"] < 0.8  # about half the inputs, where float-like INT8 is 99%+
        entry = artifact(manifest, aid)
        assert "recovery" not in entry
        assert "kept in float" not in (entry.get("method") or "")


# -- recover="auto" on the failing model ---------------------------------------------------------------------

def test_auto_recovers_every_int8_artifact(recovered, unrecovered):
    out, manifest = recovered
    _, before, _ = unrecovered
    for aid in INT8:
        entry, judged = artifact(manifest, aid), manifest["validation"][aid]
        rec = entry["recovery"]
        assert judged["passed"] is True, (aid, judged)
        assert rec["status"] == "recovered", (aid, rec)
        assert rec["mechanism"] == MECHANISMS[aid]
        assert rec["layers_ranked"] == 3 and rec["macs"] == sum(LAYER_MACS.values())

        kept = rec["kept_float"]
        names = [k["layer"] for k in kept]
        assert "head" in names and len(set(names)) == len(names), (aid, names)  # "head" is what INT8 breaks
        assert set(names) <= set(LAYER_MACS), (aid, names)  # source names, whatever the engine calls them
        for k in kept:
            assert k["macs"] == LAYER_MACS[k["layer"]], (aid, k)
            assert k["op"] in ("MatMul", "FULLY_CONNECTED") and k["engine_node"], (aid, k)
            # a multiplying layer's harm was measured (alone in INT8, everything else float) before its added error
            assert re.fullmatch(r"alone in INT8 \(everything else float\) it moves the outputs to cosine -?[\d.]+, "
                                r"top1_agreement [\d.]+; rank \d+ by added error: -?\d+\.\d dB SNR alone on float "
                                r"inputs", k["reason"]), k
        if aid == "onnxruntime-int8":
            assert [k["engine_node"] for k in kept] == names  # ORT keeps the source's node names

        # before: the numbers of the same artifact built without recovery (quantization is deterministic)
        assert rec["metric"] == judged["metric"] == "top1_agreement"
        assert rec["metric_before"] == before["validation"][aid]["metric_value"]
        assert rec["drop_before"] == before["validation"][aid]["drop"]
        assert rec["metric_after"] == judged["metric_value"] and rec["drop_after"] == judged["drop"]
        assert rec["metric_before"] < rec["metric_after"]
        assert rec["latency_ms_before"] > 0 and rec["latency_ms_after"] > 0

        assert rec["int8_mac_share_before"] == 1.0
        assert rec["int8_mac_share"] < rec["int8_mac_share_before"]
        assert math.isclose(rec["int8_mac_share"] * rec["macs"], rec["macs"] - sum(k["macs"] for k in kept))

        # the set kept was tried and passed; every trial is recorded with its numbers
        assert any(t["passed"] and t["kept"] == len(kept) for t in rec["trials"]), (aid, rec["trials"])
        for t in rec["trials"]:
            # 0 layers: the first trial, every layer in INT8 under the engine's other range choice
            assert 0 <= t["kept"] <= 3 and t["seconds"] >= 0 and 0 <= t["metric_value"] <= 1, t
            assert t["calibration"] in ("minmax", "percentile", "mean_minmax"), t
        first = rec["trials"][0]
        assert first["kept"] == 0 and first["calibration"] == {"onnxruntime-int8": "percentile"}.get(aid, "mean_minmax")

        plural = "s" if len(kept) > 1 else ""
        assert f"{len(kept)} layer{plural} kept in float" in entry["method"], entry["method"]
        assert "kept in float" not in artifact(before, aid)["method"]


@pytest.mark.parametrize("aid", ["litert-int8", "openvino-int8", "onnxruntime-int8"])
def test_recovery_leaves_the_harmless_layer_in_int8(recovered, aid):
    """"embed" quantizes well (its input and output have no outlier): the fewest layers that pass never include
    it, so some MACs stay in INT8."""
    rec = artifact(recovered[1], aid)["recovery"]
    assert "embed" not in [k["layer"] for k in rec["kept_float"]], rec["kept_float"]
    assert rec["int8_mac_share"] > 0


def test_head_and_hidden_in_float_are_enough_for_onnxruntime(recovered, models, tmp_path):
    """ONNX Runtime's own quantize_static with the settings the bundle's method states and nodes_to_exclude
    head and hidden agrees with float on 99%+ of the held-out inputs (the gate allows a 1-point drop): a set that
    keeps "embed" in INT8 exists."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    out, manifest = recovered
    x = np.load(models / "x.npz")["x"]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter({"x": row[None]} for row in x[:100])

        def get_next(self):
            return next(self.rows, None)

    fp32 = out / artifact(manifest, "onnxruntime-fp32")["files"][0]["path"]
    quantize_static(str(fp32), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=["head", "hidden"])
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    got = np.array([int(session.run(None, {"x": row[None]})[0].argmax()) for row in x[100:]])
    assert float(np.mean(got == float_logits(x[100:]).argmax(1))) >= 0.99


@pytest.mark.parametrize("aid", ["litert-int8", "openvino-int8", "onnxruntime-int8"])
def test_kept_reasons_rank_by_added_error(recovered, aid):
    """A kept layer's reason gives its rank by added error and that error: worse SNR, lower rank."""
    kept = artifact(recovered[1], aid)["recovery"]["kept_float"]
    parsed = [(int(m[1]), float(m[2])) for m in (re.search(r"rank (\d+) by added error: (-?[\d.]+) dB", k["reason"])
                                                 for k in kept)]
    assert sorted(parsed) == sorted(parsed, key=lambda pair: pair[1]), kept


def test_recovered_bundle_opens_and_inspect_shows_what_was_kept(recovered):
    out, manifest = recovered
    assert Bundle.open(out).manifest["artifacts"] == manifest["artifacts"]
    proc = subprocess.run([str(SCRIPT), "inspect", str(out)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    shown = [line.strip() for line in lines if line.strip().startswith("recovery: ")]
    assert len(shown) == 3, proc.stdout
    for aid, line in zip(INT8, shown):
        rec = artifact(manifest, aid)["recovery"]
        assert line.startswith(f"recovery: recovered ({MECHANISMS[aid]}), {len(rec['kept_float'])} layer(s) kept "
                               f"in float, top1_agreement "), line
        assert f"INT8 MACs 100.0% -> {rec['int8_mac_share']:.1%}" in line, line
        assert f"{len(rec['trials'])} trial(s)" in line, line
    floats = [line.strip() for line in lines if line.strip().startswith("float: ")]
    assert sum(len(artifact(manifest, aid)["recovery"]["kept_float"]) for aid in INT8) == len(floats)
    assert any(line.startswith("float: head (MatMul, ") and "rank 1 by added error" in line for line in floats)
    assert any(line.startswith("float: head (FULLY_CONNECTED, ") for line in floats)


@pytest.mark.parametrize("aid", INT8)
def test_recovered_artifact_serves_on_the_device_and_agrees_with_float(recovered, models, aid):
    """The device loads the recovered artifact (its golden self-check, recomputed after recovery, passes) and its
    top-1 is float's on held-out inputs (numpy's float product of the weights)."""
    x = np.load(models / "x.npz")["x"][100:160]
    want = float_logits(x).argmax(1)
    with edgesdk.load(recovered[0], artifact=aid) as model:
        assert model.placement.artifact == aid and model.placement.numerics["checked"] is True
        got = np.array([int(np.argmax(model.predict({"x": row[None]}).outputs[0])) for row in x])
    assert float(np.mean(got == want)) >= 0.95


def recovered_layers(recovered, models, aid: str) -> list:
    """The weighted layers of the recovered artifact as its engine's probe sees them, each with its source name:
    the model is a chain, so the three multiplying layers are "embed", "hidden", "head" in that order."""
    out, manifest = recovered
    entry = artifact(manifest, aid)
    probe = probe_for(entry["engine"], out / entry["files"][0]["path"], entry.get("runtime"))
    try:
        probe.capture([np.load(models / "x.npz")["x"][:1]])
        weighted = [l for l in probe.layers() if l.macs]
    finally:
        probe.close()
    assert [l.macs for l in weighted] == list(LAYER_MACS.values()), weighted
    return list(zip(LAYER_MACS, weighted))


@pytest.mark.parametrize("aid", ["litert-int8", "openvino-int8"])
def test_kept_layers_are_float_in_the_recovered_artifact(recovered, models, aid):
    """The engine's probe of the shipped artifact: the layers the manifest says were kept in float are not
    quantized, the others are, so its INT8 MACs are the manifest's share. (ONNX Runtime: read from the graph in
    the next test; its probe calls a float layer that reads a Q/DQ'd input quantized, see test_debug.py.)"""
    rec = artifact(recovered[1], aid)["recovery"]
    layers = recovered_layers(recovered, models, aid)
    assert {name for name, l in layers if not l.quantized} == {k["layer"] for k in rec["kept_float"]}
    int8_macs = sum(l.macs for _, l in layers if l.quantized)
    assert math.isclose(int8_macs / sum(LAYER_MACS.values()), rec["int8_mac_share"])


@pytest.mark.parametrize("aid", ["litert-int8", "openvino-int8", "onnxruntime-int8"])
def test_kept_engine_nodes_name_ops_of_the_shipped_artifact(recovered, models, aid):
    """A kept layer's engine_node is that layer's node in the artifact the bundle ships (LiteRT: its output tensor,
    which the recipe matched: its ops are numbered, and recovery adds (de)quantize ops)."""
    rec = artifact(recovered[1], aid)["recovery"]
    nodes = {name: l.name if aid == "litert-int8" else l.node for name, l in recovered_layers(recovered, models, aid)}
    assert {k["layer"]: k["engine_node"] for k in rec["kept_float"]} == {k["layer"]: nodes[k["layer"]]
                                                                         for k in rec["kept_float"]}


def test_onnxruntime_keeps_the_named_nodes_in_float(recovered):
    """Read from the recovered ONNX graph itself: a kept MatMul multiplies float weights, "embed" dequantized
    int8 ones."""
    out, manifest = recovered
    entry = artifact(manifest, "onnxruntime-int8")
    graph = onnx.load(str(out / entry["files"][0]["path"])).graph
    producer = {o: n for n in graph.node for o in n.output}
    inits = {i.name for i in graph.initializer}
    kept = {k["engine_node"] for k in entry["recovery"]["kept_float"]}
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        weight = node.input[1]
        if node.name in kept:
            assert weight in inits, node.name  # the float initializer itself
        else:
            assert producer[weight].op_type == "DequantizeLinear", node.name


# -- a model that passes ------------------------------------------------------------------------------------

def test_on_records_not_needed_and_changes_no_byte(models, tmp_path):
    """recover="on" on a model whose INT8 passes: "not_needed" per artifact, nothing kept, and every artifact
    and golden file is byte for byte the recover="off" build's (quantization here is deterministic: same seed,
    same bytes), but for the names OpenVINO makes up for its constants, which carry a counter that runs on across
    builds in one process (two "off" builds differ alike; separate processes give identical XML)."""
    on, on_failed = build(models, "passing.onnx", tmp_path / "on.bundle", recover="on")
    off, off_failed = build(models, "passing.onnx", tmp_path / "off.bundle", recover="off")
    assert on_failed is None and off_failed is None, (on_failed, off_failed)
    for aid in INT8:
        rec = artifact(on, aid)["recovery"]
        assert rec["status"] == "not_needed", rec
        assert rec["kept_float"] == [] and rec["trials"] == [] and rec["layers_ranked"] == 0
        assert rec["int8_mac_share"] == rec["int8_mac_share_before"] == 1.0
        assert rec["metric_before"] == rec["metric_after"] == on["validation"][aid]["metric_value"]
        assert "recovery" not in artifact(off, aid)
        assert artifact(on, aid)["method"] == artifact(off, aid)["method"]
    for a in on["artifacts"]:
        got, want = file_bytes(tmp_path / "on.bundle", on, a["id"]), file_bytes(tmp_path / "off.bundle", off, a["id"])
        if a["engine"] == "openvino":  # OpenVINO numbers the names it makes up (Constant_183137) process-wide
            got, want = ([re.sub(rb"_[0-9]{3,}", b"_#", data) for data in files] for files in (got, want))
        assert got == want, a["id"]
    assert [f["sha256"] for f in on["golden"]["files"]] == [f["sha256"] for f in off["golden"]["files"]]


def test_auto_leaves_a_passing_artifact_without_a_recovery_entry(models, tmp_path):
    manifest, failed = build(models, "passing.onnx", tmp_path / "auto.bundle", recover="auto", targets=["onnx"])
    assert failed is None
    assert all("recovery" not in a for a in manifest["artifacts"])


def test_the_other_range_choice_passing_first_skips_the_layer_ranking(models, tmp_path, monkeypatch):
    """One calibration input 100x the others: OpenVINO's min/max ranges span it and the artifact fails the gate; the
    mean of per-sample min/max, recovery's first trial, passes with every layer in INT8, so the layers are never
    ranked (the ranking runs a probe per layer: 38 s on the PP-OCRv4 recognizer, longer than that trial)."""
    import edgesdk_converters.recovery.recover as recover

    ranked = []
    real = recover.sensitivity
    monkeypatch.setattr(recover, "sensitivity", lambda *a, **k: ranked.append(1) or real(*a, **k))
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((100, 16)).astype(np.float32)
    calib[7] *= 100.0
    np.savez(tmp_path / "calib.npz", x=calib)
    np.savez(tmp_path / "val.npz", x=rng.standard_normal((200, 16)).astype(np.float32))
    said: list[str] = []
    result = quantize(models / "passing.onnx", tmp_path / "calib.npz", tmp_path / "o.bundle", val=tmp_path / "val.npz",
                      samples=100, max_drop=3.0, targets=["openvino"], recover="auto", log=said.append)
    rec = artifact(result.manifest, "openvino-int8")["recovery"]
    assert rec["drop_before"] > 3.0, rec  # min/max ranges fail: the premise
    assert rec["status"] == "recovered" and rec["calibration"] == "mean_minmax" and rec["kept_float"] == []
    assert [(t["step"], t["passed"]) for t in rec["trials"]] == [("calibration", True)]
    assert ranked == [] and rec["layers_ranked"] == 0 and rec["ranking"].startswith("none: the other range choice")
    assert not any("ranked by added error" in line for line in said), said
    assert rec["macs"] == sum(LAYER_MACS.values()) and rec["int8_mac_share"] == rec["int8_mac_share_before"] == 1.0
    assert result.manifest["validation"]["openvino-int8"]["passed"]


# -- limits: time, and a gate nothing can pass ----------------------------------------------------------------

def test_tiny_recover_time_keeps_the_original_and_still_fails(models, unrecovered, tmp_path):
    manifest, failed = build(models, "failing.onnx", tmp_path / "t.bundle", recover="auto", recover_time=1e-3,
                             targets=["onnx"])
    assert isinstance(failed, ValidationFailed) and failed.failing == ["onnxruntime-int8"]
    rec = artifact(manifest, "onnxruntime-int8")["recovery"]
    assert rec["status"] == "out_of_time", rec
    assert rec["kept_float"] == [] and rec["trials"] == []
    assert rec["int8_mac_share"] == rec["int8_mac_share_before"] == 1.0
    assert "metric_after" not in rec and "within" in rec["note"]
    out, before, _ = unrecovered
    assert file_bytes(tmp_path / "t.bundle", manifest, "onnxruntime-int8") == file_bytes(out, before,
                                                                                          "onnxruntime-int8")
    assert "kept in float" not in artifact(manifest, "onnxruntime-int8")["method"]


def test_a_gate_no_split_passes_ends_failed_with_every_layer_tried(models, unrecovered, tmp_path):
    """max_drop=-1 (the artifact must beat float): even every layer in float fails, so recovery ends "failed"
    after trying all three layers in float together, and keeps the original artifact."""
    manifest, failed = build(models, "failing.onnx", tmp_path / "f.bundle", max_drop=-1.0, recover="auto",
                             targets=["onnx"])
    assert isinstance(failed, ValidationFailed)
    rec = artifact(manifest, "onnxruntime-int8")["recovery"]
    assert rec["status"] == "failed", rec
    assert max(t["kept"] for t in rec["trials"]) == 3 and not any(t["passed"] for t in rec["trials"])
    assert rec["kept_float"] == [] and "every quantized layer in float" in rec["note"]
    assert rec["int8_mac_share"] == 1.0 and "metric_after" not in rec
    out, before, _ = unrecovered
    assert file_bytes(tmp_path / "f.bundle", manifest, "onnxruntime-int8") == file_bytes(out, before,
                                                                                          "onnxruntime-int8")


# -- options ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["sometimes", "AUTO", "", True])
def test_recover_refuses_a_mode_naming_the_allowed_ones(value):
    with pytest.raises(ConversionError, match=r"recover must be one of auto, on, off .*got " + repr(value)):
        QuantizeOptions(recover=value)


@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), True, "60"])
def test_recover_time_refuses_what_is_not_a_positive_number(value):
    with pytest.raises(ConversionError, match="recover_time must be a positive number of seconds"):
        QuantizeOptions(recover_time=value)


def test_quantize_refuses_a_bad_recover_before_any_work(models, tmp_path):
    with pytest.raises(ConversionError, match="recover must be one of auto, on, off"):
        quantize(models / "failing.onnx", models / "x.npz", tmp_path / "b.bundle", recover="sometimes")
    assert not (tmp_path / "b.bundle").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--recover", "sometimes"), "recover must be one of auto, on, off"),
    (("--recover-time", "0"), "recover_time must be a positive number of seconds"),
])
def test_cli_refuses_bad_recover_options_in_one_line(models, tmp_path, args, message):
    proc = subprocess.run([str(SCRIPT), "quantize", str(models / "failing.onnx"), "--calib", str(models / "x.npz"),
                           "-o", str(tmp_path / "c.bundle"), *args], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "c.bundle").exists()


# -- the manifest's schema ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.update(status="maybe"), r"recovery\.status must be one of .*got \"maybe\""),
    (lambda r: r.update(int8_mac_share=1.5), r"recovery\.int8_mac_share must be a number in \[0, 1\]"),
    (lambda r: r.update(int8_mac_share_before=-0.1), r"recovery\.int8_mac_share_before must be a number in \[0, 1\]"),
    (lambda r: r["kept_float"][0].pop("layer"), r"recovery\.kept_float\[0\] is missing key\(s\) layer"),
    (lambda r: r["trials"][0].update(kept=-1), r"recovery\.trials\[0\]\.kept must be a non-negative integer"),
    (lambda r: r.pop("status"), r"recovery is missing key\(s\) status"),
], ids=["status", "share", "share_before", "kept_layer", "trial_kept", "no_status"])
def test_manifest_refuses_a_bad_recovery_entry(recovered, tmp_path, edit, message):
    out, _ = recovered
    copy = tmp_path / "copy.bundle"
    shutil.copytree(out, copy)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    index = next(k for k, a in enumerate(manifest["artifacts"]) if a["id"] == "onnxruntime-int8")
    edit(manifest["artifacts"][index]["recovery"])
    path.write_text(json.dumps(manifest))  # the manifest is not checksummed: no rehash needed
    with pytest.raises(BundleError, match=rf"artifacts\[{index}\]\.{message}"):
        Bundle.open(copy)


def test_default_mode_comes_from_the_environment(monkeypatch):
    """Unset, recover is auto (the issue's default: a failing artifact is recovered); $EDGESDK_RECOVER overrides it
    (the test session sets off), and a bad value there is refused like a bad option."""
    from edgesdk_converters.options import QuantizeOptions

    monkeypatch.delenv("EDGESDK_RECOVER", raising=False)
    assert QuantizeOptions().recover == "auto"
    monkeypatch.setenv("EDGESDK_RECOVER", "on")
    assert QuantizeOptions().recover == "on"
    assert QuantizeOptions(recover="off").recover == "off"
    monkeypatch.setenv("EDGESDK_RECOVER", "always")
    with pytest.raises(ConversionError, match="EDGESDK_RECOVER"):
        QuantizeOptions()


def test_layers_that_cannot_be_read_keep_the_artifact_and_quantize_goes_on(models, tmp_path, monkeypatch):
    """A model whose layers a probe cannot read (an op its engine will not expose): recovery records why and keeps
    the artifact as quantized; quantize still writes the bundle and raises ValidationFailed, never the probe's error.
    (The probe is made to fail here: no real model at hand breaks a probe.)"""
    import edgesdk_converters.recovery.recover as recover

    def unreadable(*args, **kwargs):
        raise ConversionError("layer 'x' cannot be read")

    monkeypatch.setattr(recover, "sensitivity", unreadable)
    manifest, failed = build(models, "failing.onnx", tmp_path / "u.bundle", recover="auto", targets=["onnx"])
    assert isinstance(failed, ValidationFailed)
    rec = artifact(manifest, "onnxruntime-int8")["recovery"]
    # the other range choice is tried before the layers are ranked; it fails here, and nothing is kept in float
    assert rec["status"] == "failed" and [t["step"] for t in rec["trials"]] == ["calibration"]
    assert rec["kept_float"] == [] and not rec["trials"][0]["passed"]
    assert "could not be read" in rec["note"] and "layer 'x'" in rec["note"]
