"""The monitor's mechanics on a real bundle and engine: levels and hysteresis, errors, hooks, responses, the sink, the
snapshot's identity, what it never keeps (inputs), options refused at construction, and the manifest's reference
checked like every other manifest field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import edgesdk
from edgesdk.choices import AlertLevel, BudgetReason, MonitorSignal
from edgesdk.errors import BudgetExceeded, BundleError, InputError
from edgesdk.monitor import MonitorOptions

QUICK = dict(every=10, min_window=100, window=200, rise=2, clear=3)
DARK = np.zeros((8, 8), np.uint8)  # far from every digit: drift at once


@pytest.fixture(scope="module")
def digits(digits_images):
    from PIL import Image

    files = sorted(digits_images.glob("val/*/*.png"))
    rng = np.random.default_rng(0)
    images = np.stack([np.asarray(Image.open(f).convert("L")) for f in files])
    return images[rng.permutation(len(images))]


def _load(bundle, **options):
    return edgesdk.load(bundle, engine="onnxruntime", monitor=MonitorOptions(**(QUICK | options)))


def test_levels_rise_after_rise_evaluations_and_fall_after_clear_ones(onnx_bundle, digits):
    with _load(onnx_bundle.bundle) as model:
        changes = []
        model.monitor.on_alert(changes.append)
        for x in digits[:200]:
            model.predict(x)
        assert model.monitor.level("input_drift") is AlertLevel.OK
        for _ in range(200):  # the whole window dark
            model.predict(DARK)
        assert model.monitor.level(MonitorSignal.INPUT_DRIFT) is AlertLevel.ALERT
        rise = [c for c in changes if c.signal is MonitorSignal.INPUT_DRIFT]
        assert rise[0].previous is AlertLevel.OK and rise[-1].level is AlertLevel.ALERT
        assert rise[-1].threshold == 0.25 and rise[-1].statistic == "psi"
        n = len(changes)
        for x in np.concatenate([digits, digits])[:400]:  # the window back to digits: it clears, after `clear`
            model.predict(x)
        fell = [c for c in changes[n:] if c.signal is MonitorSignal.INPUT_DRIFT]
        assert fell and fell[-1].level is AlertLevel.OK
        assert all(_rank(c.level) < _rank(c.previous) for c in fell)


def _rank(level):
    return ["ok", "warn", "alert"].index(level)


def test_a_single_evaluation_over_the_level_does_not_raise(onnx_bundle, digits):
    with _load(onnx_bundle.bundle, rise=3) as model:
        for x in digits[:200]:
            model.predict(x)
        for _ in range(20):  # two evaluations' worth: short of rise=3
            model.predict(DARK)
        assert model.monitor.level("input_drift") is AlertLevel.OK


def test_errors_are_counted_by_reason_and_raise_the_error_rate(onnx_bundle, digits):
    with _load(onnx_bundle.bundle) as model:
        for k in range(150):
            model.predict(digits[k])
            if k % 3 == 0:
                with pytest.raises(InputError):
                    model.predict(np.zeros((3, 3, 3, 3, 3), np.float32))  # no input takes it
        snap = model.monitor.snapshot()
    assert snap["errors"] == {"InputError": 50}
    assert snap["calls"] == 200 and snap["predictions"] == 150
    assert snap["signals"]["error_rate"]["level"] == "alert"


def test_a_hook_that_raises_never_fails_a_prediction(onnx_bundle, digits, caplog):
    with _load(onnx_bundle.bundle) as model:
        model.monitor.on_alert(lambda alert: 1 / 0)
        model.monitor.on_evaluate(lambda monitor, recent: 1 / 0)
        for _ in range(150):
            assert model.predict(DARK).outputs
    assert "hook raised" in caplog.text


def test_refuse_response_refuses_while_at_alert_and_serves_again_once_cleared(onnx_bundle, digits):
    with _load(onnx_bundle.bundle, respond={"input_drift": "refuse"}) as model:
        for x in digits[:150]:
            model.predict(x)
        with pytest.raises(BudgetExceeded) as refused:
            for _ in range(400):
                model.predict(DARK)
        assert refused.value.reason is BudgetReason.MONITOR
        assert "input_drift" in str(refused.value)
        assert model.monitor.refusing == ("input_drift",)
        refusals = 0
        for x in np.concatenate([digits, digits])[:600]:  # refused, but seen: the window fills with digits again
            try:
                model.predict(x)
            except BudgetExceeded:
                refusals += 1
        assert refusals > 0 and model.monitor.refusing == ()
        assert model.predict(digits[0]).outputs
        snap = model.monitor.snapshot()
    assert snap["errors"] == {}, "a refusal the app asked for is not an error"


def test_the_error_rate_is_judged_after_warm_up_too(onnx_bundle, digits):
    with _load(onnx_bundle.bundle) as model:
        for x in digits[:300]:
            model.predict(x)
        for _ in range(200):  # the backend's answers now all fail
            with pytest.raises(InputError):
                model.predict(np.zeros((3, 3, 3, 3, 3), np.float32))
        assert model.monitor.level("error_rate") is AlertLevel.ALERT


def test_a_few_predictions_leave_no_figure_of_an_input(onnx_bundle, digits, tmp_path):
    sink = tmp_path / "t.jsonl"
    with _load(onnx_bundle.bundle, sink=sink, sink_every_s=0) as model:
        for x in digits[:3]:
            model.predict(x)
        model.monitor.evaluate()
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    assert records and all(r.get("drift", {"inputs": {}}) == {"inputs": {}, "outputs": {}} for r in records
                           if r["type"] == "snapshot")
    assert all(r.get("outputs") == {} for r in records if r["type"] == "snapshot")


def test_escalate_more_moves_the_shift_up_to_its_cap_and_back(onnx_bundle, digits):
    with _load(onnx_bundle.bundle, respond={"output_drift": "escalate_more"}, escalate_step=0.02,
               escalate_cap=0.05) as model:
        for _ in range(400):
            model.predict(DARK)
        assert model.monitor.level("output_drift") is AlertLevel.ALERT
        assert model.monitor.escalation_shift == pytest.approx(0.05)
        for x in np.concatenate([digits, digits])[:800]:
            model.predict(x)
        assert model.monitor.escalation_shift == 0.0


def test_snapshot_is_plain_data_with_the_version_identity(onnx_bundle, digits):
    with _load(onnx_bundle.bundle) as model:
        for x in digits[:50]:
            model.predict(x)
        snap = model.monitor.snapshot()
    json.dumps(snap, allow_nan=False)
    ident = snap["identity"]
    assert ident["bundle"] == model.bundle.name and len(ident["fingerprint"]) == 16
    assert ident["engine"] == "onnxruntime" and ident["artifact"] == model.placement.artifact
    assert ident["engine_version"] and ident["cpu_class"] and ident["edgesdk"] == edgesdk.__version__
    assert set(snap["latency_ms"]) == {"preprocess", "inference", "total"}
    assert snap["latency_ms"]["inference"]["p50"] > 0
    assert set(snap["outputs"]) == {"max_prob", "margin", "entropy", "predicted_class"}


def test_the_sink_keeps_summaries_never_an_input(onnx_bundle, tmp_path):
    sink = tmp_path / "telemetry.jsonl"
    rng = np.random.default_rng(7)
    secret = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    with _load(onnx_bundle.bundle, sink=sink, sink_every_s=0) as model:
        for _ in range(120):
            model.predict(secret)
        for _ in range(120):
            model.predict(DARK)
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    assert {r["type"] for r in records} == {"snapshot", "alert"}
    assert records[-1]["type"] == "snapshot" and records[-1]["predictions"] == 240  # the last one, at close

    def longest_list(value):
        if isinstance(value, dict):
            return max((longest_list(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return max([len(value)] + [longest_list(v) for v in value])
        return 0

    assert max(longest_list(r) for r in records) < 64  # nothing input-sized


def test_monitor_false_turns_it_off(onnx_bundle, digits):
    with edgesdk.load(onnx_bundle.bundle, engine="onnxruntime", monitor=False) as model:
        assert model.monitor is None
        assert model.predict(digits[0]).outputs


@pytest.mark.parametrize("options, message", [
    (dict(window=0), "window must be an integer"),
    (dict(min_window=600), "min_window"),
    (dict(statistic="kl"), "statistic must be one of psi, js"),
    (dict(warn=0.5, alert=0.2), "warn levels must not exceed"),
    (dict(respond={"latency": "refuse"}), "respond signal"),
    (dict(respond={"input_drift": "reboot"}), "respond"),
    (dict(warn=float("nan")), "finite number"),
    (dict(pending=0), "pending must be an integer"),
])
def test_bad_options_are_refused_where_they_are_built(options, message):
    with pytest.raises(InputError, match=message):
        MonitorOptions(**options)


def test_a_bad_monitor_option_type_is_refused_by_load(onnx_bundle):
    with pytest.raises(InputError, match="monitor must be True, False or a MonitorOptions"):
        edgesdk.load(onnx_bundle.bundle, monitor="on")


@pytest.mark.parametrize("tamper, message", [
    (lambda f: f.update(edges=[0.5, 0.1], p=[0.2, 0.3, 0.5]), "increasing order"),
    (lambda f: f.update(p=[0.5]), "one share per bin"),
    (lambda f: f.update(edges=list(range(100)), p=[0.01] * 101), "at most 63"),
    (lambda f: f.update(p=[2.0] * len(f["p"])), r"in \[0, 1\]"),
    (lambda f: f.update(n="abc"), "n must be an integer"),
    (lambda f: f.update(n=-5), "n must be an integer"),
    (lambda f: f.update(mean=[1]), "mean must be a finite number"),
])
def test_a_tampered_reference_is_refused_at_open(onnx_bundle, tmp_path, tamper, message):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(onnx_bundle.bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    tamper(manifest["monitoring"]["inputs"]["image.mean"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=message):
        edgesdk.Bundle.open(copy)


def test_a_bundle_without_a_reference_is_watched_for_errors_only(onnx_bundle, tmp_path, digits):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(onnx_bundle.bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["monitoring"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with _load(copy) as model:
        for _ in range(150):
            model.predict(DARK)
        snap = model.monitor.snapshot()
    assert snap["reference"] is False and snap["drift"] == {"inputs": {}, "outputs": {}}
    assert snap["signals"]["input_drift"]["level"] == "ok" and snap["signals"]["input_drift"]["value"] is None


@pytest.mark.parametrize("setting, called", [("", True), ("on", False)])
def test_onnx_runtime_telemetry_is_off_unless_asked_for(setting, called):
    code = ("import onnxruntime as ort\ncalls = []\nort.disable_telemetry_events = lambda: calls.append(1)\n"
            "import edgesdk.engines.onnxruntime\nprint(len(calls))")
    env = dict(os.environ, EDGESDK_ENGINE_TELEMETRY=setting)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("1" if called else "0")


def test_a_pool_gives_each_loaded_models_snapshot(onnx_bundle, digits):
    with edgesdk.ModelPool(memory_mb=4096, engine="onnxruntime") as pool:
        for x in digits[:20]:
            pool.predict(onnx_bundle.bundle, x)
        snaps = pool.monitors()
    assert len(snaps) == 1
    assert next(iter(snaps.values()))["predictions"] == 20


def test_a_hybrid_model_counts_its_answers_and_escalates_more_at_alert(onnx_bundle, digits):
    """prefer-device against a closed loopback port: every escalation comes back degraded with the device's answer;
    escalate_more (the step and cap at 0.5) moves max_prob's threshold from 0.6 to 1.0 while input_drift is at
    alert, so every answer then escalates."""
    options = MonitorOptions(**(QUICK | dict(respond={"input_drift": "escalate_more"}, escalate_step=0.5,
                                             escalate_cap=0.5)))
    with edgesdk.load(onnx_bundle.bundle, engine="onnxruntime", mode="prefer-device", cloud="http://127.0.0.1:9",
                      monitor=options) as model:
        for x in digits[:150]:
            model.predict(x)
        before = dict(model.monitor.snapshot()["hybrid"])
        for _ in range(150):
            model.predict(DARK)
        assert model.monitor.escalation_shift == 0.5
        results = [model.predict(x) for x in digits[:50]]
        after = model.monitor.snapshot()["hybrid"]
    assert before.get("source:device") == 150
    assert all(r.escalation_reason == "low_confidence" and r.degraded for r in results)
    assert after["escalated:low_confidence"] - before.get("escalated:low_confidence", 0) >= 50 + 0
    assert after["degraded"] >= 50


@pytest.mark.parametrize("shape, layout, real", [
    ([1, 3, -1, -1], "nchw", (1, 3, 32, 40)),
    ([1, -1, -1, 3], "nhwc", (1, 24, 36, 3)),
    ([1, -1], None, (1, 5000)),
])
def test_dynamic_dimensions_get_every_feature(shape, layout, real):
    from edgesdk.monitor.summaries import InputSummary

    summary = InputSummary("x", shape, layout, window=4)
    rng = np.random.default_rng(0)
    for i in range(4):
        summary.record(rng.random(real, dtype=np.float32), i)
    features = summary.features(4)
    assert features.shape == (4, len(summary.names)) and np.isfinite(features).all()


def test_the_spread_of_offset_data_survives():
    """101325 +- 50 (pressure in Pa): the spread is a difference of two large sums, kept in float64."""
    from edgesdk.monitor.summaries import InputSummary

    rng = np.random.default_rng(1)
    x = (101325 + 50 * rng.standard_normal((1, 64))).astype(np.float32)
    for center in (0.0, 101300.0):  # 0: a bundle without calibrated ranges; else the middle of the range
        summary = InputSummary("p", [1, 64], window=1, center=center)
        summary.record(x, 0)
        std = summary.features(1)[0][summary.names.index("p.std")]
        assert std == pytest.approx(float(x.astype(np.float64).std()), rel=1e-3)
    smooth = summary.features(1)[0][summary.names.index("p.smooth")]
    assert -0.6 < smooth < 0.6  # white noise: near 0 once centred


@pytest.mark.parametrize("shape, layout, dtype", [
    ((1, 1, 8, 8), "nchw", np.float32),
    ((1, 40, 40, 3), "nhwc", np.uint8),
    ((1, 3, 160, 160), "nchw", np.float32),  # 76,800 values: read with a stride
])
def test_held_inputs_give_the_rows_of_inputs_summarized_at_once(shape, layout, dtype):
    """hold() (the device's path: copies aside, summarized in bulk) and record() (at once, as at quantize time)
    give the same features, the buffer is zeroed once summarized, and another shape is recorded at once."""
    from edgesdk.monitor.summaries import InputSummary

    rng = np.random.default_rng(2)
    xs = [(rng.random(shape) * 200).astype(dtype) for _ in range(23)]
    held, direct = InputSummary("x", shape, layout, window=16, center=100.0, pending=5), \
        InputSummary("x", shape, layout, window=16, center=100.0)
    for k, x in enumerate(xs):
        held.hold(x.copy(), k % 16, owned=k % 2 == 0)  # every other one kept by reference until summarized
        direct.record(x, k % 16)
    assert held._held_at and held._held[:len(held._held_at)].any()  # three of them wait for their rows
    np.testing.assert_allclose(held.features(16), direct.features(16), rtol=1e-9, atol=1e-9)
    assert not held._held_at and not held._held.any()  # summarized, then zeroed
    odd = (rng.random(shape[:1] + tuple(d + 2 if d > 3 else d for d in shape[1:])) * 200).astype(dtype)
    held.hold(odd, 3)
    direct.record(odd, 3)
    assert not held._held_at  # another shape: recorded at once
    np.testing.assert_allclose(held.features(16), direct.features(16), rtol=1e-9, atol=1e-9)


def test_held_inputs_stay_under_the_byte_cap_and_a_cleared_row_is_not_written_back():
    from edgesdk.monitor.summaries import MAX_PENDING_BYTES, InputSummary

    big = InputSummary("x", (1, 3, 512, 512), "nchw", window=500, pending=500)
    big.hold(np.ones((1, 3, 512, 512), np.float32), 0)
    # private: the buffer's size is the contract under test (no public view of it)
    assert big._held.nbytes <= MAX_PENDING_BYTES and big._pending_rows < 500
    small = InputSummary("x", (1, 16), window=8, pending=4)
    small.hold(np.ones((1, 16), np.float32), 1)
    small.clear(1)
    small.hold(np.ones((1, 16), np.float32), 2)
    assert np.isnan(small.features(3)[1]).all() and np.isfinite(small.features(3)[2][:2]).all()


def test_pending_1_keeps_no_input_after_the_call(onnx_bundle, digits):
    with _load(onnx_bundle.bundle, pending=1) as model:
        model.predict(digits[0])
        summary = model.monitor.inputs[0]
        assert not summary._held_at and not summary._held.any()  # private: nothing held after the call
        assert np.isfinite(summary.ring[0]).all()


def test_float_artifact_response_serves_the_float_artifact_while_at_alert_and_goes_back(onnx_bundle, digits):
    with edgesdk.load(onnx_bundle.bundle, artifact="onnxruntime-int8",
                      monitor=MonitorOptions(**QUICK, respond={"input_drift": "float_artifact"})) as model:
        home = model.placement.artifact
        assert home == "onnxruntime-int8"
        assert all(model.predict(x).placement.artifact == home for x in digits[:150])
        served = [model.predict(DARK).placement.artifact for _ in range(300)]
        assert model.monitor.level("input_drift") is AlertLevel.ALERT and model.monitor.wants_float
        assert served[-1] == "onnxruntime-fp32" and served[0] == home  # switched once the alert came
        switch = served.index("onnxruntime-fp32")
        assert set(served[switch:]) == {"onnxruntime-fp32"}  # never back and forth while at alert
        assert model.identity()["artifact"] == "onnxruntime-fp32" and model.identity()["precision"] == "fp32"
        for x in np.concatenate([digits, digits])[:600]:
            model.predict(x)
        assert model.monitor.level("input_drift") is AlertLevel.OK
        assert model.predict(digits[0]).placement.artifact == home  # the next call after the level cleared
        snap = model.monitor.snapshot()
    assert snap["placement_switches"] == 2 and snap["errors"] == {}


def test_float_artifact_response_stays_put_without_a_float_artifact(onnx_bundle, digits, caplog):
    with edgesdk.load(onnx_bundle.bundle, artifact="onnxruntime-int8",
                      monitor=MonitorOptions(**QUICK, respond={"input_drift": "float_artifact"})) as model:
        model._float.target = None  # as a bundle that ships INT8 only
        for _ in range(300):
            assert model.predict(DARK).placement.artifact == "onnxruntime-int8"
    assert sum("has no float artifact" in r.message for r in caplog.records) == 1


def test_float_artifact_response_is_refused_with_a_thermal_budget(onnx_bundle, tmp_path):
    from edgesdk.budgets.thermal import LinuxThermalZones, ThermalGovernor

    zone = tmp_path / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("40000\n")
    governor = ThermalGovernor(LinuxThermalZones(tmp_path / "sys"), warm_c=70, hot_c=78, critical_c=90)
    with pytest.raises(InputError, match="float_artifact cannot be combined with a thermal budget"):
        edgesdk.load(onnx_bundle.bundle, engine="onnxruntime", thermal=governor,
                     monitor=MonitorOptions(respond={"input_drift": "float_artifact"}))


def test_inputs_held_by_two_threads_at_once_are_never_zeroed_or_lost():
    """edgesdk serve observes from several threads: a copy made while another thread summarizes the buffer must not
    be zeroed under it (it was: an all-zero row is a drifted input)."""
    import threading

    from edgesdk.monitor.summaries import InputSummary

    summary = InputSummary("x", (1, 224, 224, 3), "nhwc", window=4000, pending=50)
    rng = np.random.default_rng(0)
    xs = [(rng.random((1, 224, 224, 3)) * 0.5 + 0.5).astype(np.float32) for _ in range(8)]  # every mean in [0.5, 1]

    def run(k):
        for i in range(2000):
            summary.hold(xs[(i + k) % 8], 2000 * k + i)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    means = summary.features(4000)[:, :3]
    assert np.isfinite(means).all() and means.min() > 0.5


def test_float_artifact_response_applies_to_predict_batch_too(onnx_bundle, digits):
    with edgesdk.load(onnx_bundle.bundle, artifact="onnxruntime-int8",
                      monitor=MonitorOptions(**QUICK, respond={"input_drift": "float_artifact"})) as model:
        model.predict_batch(list(digits[:150]))
        served = [r.placement.artifact for _ in range(30) for r in model.predict_batch([DARK] * 10)]
        assert model.monitor.wants_float
    assert served[0] == "onnxruntime-int8" and served[-1] == "onnxruntime-fp32"
