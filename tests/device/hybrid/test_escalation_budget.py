"""Budgeted escalation (edgesdk.hybrid.budget): the target rate holds under a hardness shift where a fixed threshold
runs off, the token bucket and the hard cap hold exactly, and the misuses are refused.

The stream is issue 28's: 20,000 held-out digits, Gaussian noise (sigma 0.3 of the pixel range) on the second half.
The device is the bundle's ONNX Runtime INT8 model, the cloud its FP32 artifact answering through the client's mock
transport (the hybrid logic without sockets; the interop runs against real servers are test_hybrid_cloud.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle, EscalationPolicy, HybridOptions
from edgesdk.errors import InputError
from edgesdk.hybrid.budget import EscalationBudget, warm_start
from edgesdk.hybrid.client import CloudClient
from edgesdk.hybrid.transport import MockTransport, Response

N, TARGET, NOISE = 20_000, 0.1, 0.3 * 255


@pytest.fixture(scope="module")
def stream(digits_images):
    """(images, labels) of the stream: held-out digits drawn with replacement, noise on the second half."""
    from PIL import Image

    files = sorted(digits_images.glob("val/*/*.png"))
    images = np.stack([np.asarray(Image.open(f).convert("L"), dtype=np.float64) for f in files])
    labels = np.array([int(f.parent.name) for f in files])
    rng = np.random.default_rng(28)
    pick = rng.integers(0, len(files), N)
    xs = images[pick]
    xs[N // 2:] += rng.normal(0.0, NOISE, xs[N // 2:].shape)
    return np.clip(xs, 0, 255).astype(np.uint8), labels[pick]


def _cloud(bundle_path) -> CloudClient:
    """The bundle's FP32 artifact answering V2 requests through the mock transport."""
    bundle = Bundle.open(bundle_path)
    engine = bundle.artifact("onnxruntime-fp32").open()
    out = bundle.manifest["outputs"][0]

    def handler(request):
        sent = json.loads(request.body)
        x = np.asarray(sent["inputs"][0]["data"], np.float32).reshape(sent["inputs"][0]["shape"])
        y = engine.run([x])[0]
        return Response(200, {}, json.dumps({"model_name": bundle.name, "id": sent["id"], "outputs": [
            {"name": out["name"], "shape": list(y.shape), "datatype": "FP32", "data": y.ravel().tolist()}]}).encode())

    return CloudClient("http://127.0.0.1:9", bundle.name, transport=MockTransport(handler), binary=False)


def _hybrid(bundle_path, policy):
    return edgesdk.load(bundle_path, artifact="onnxruntime-int8", monitor=False,
                        hybrid=HybridOptions(mode="prefer-device", cloud=_cloud(bundle_path), policy=policy,
                                             check_model=False))


def _run(model, xs, labels):
    escalated, right = np.zeros(len(xs), bool), np.zeros(len(xs), bool)
    for i, (x, y) in enumerate(zip(xs, labels)):
        r = model.predict(x)
        escalated[i] = r.source == "cloud"
        right[i] = int(np.argmax(r.outputs[0])) == y
    return escalated, right


@pytest.fixture(scope="module")
def runs(onnx_bundle, stream):
    xs, labels = stream
    # the fixed threshold: escalates TARGET of the clean stream (what calibrate-escalation would choose for it)
    with edgesdk.load(onnx_bundle.bundle, artifact="onnxruntime-int8", monitor=False) as device:
        top = np.array([edgesdk.hybrid.model.signals(device.io.probabilities(device.predict(x).outputs))["max_prob"]
                        for x in xs[:2000]])
    fixed = float(np.quantile(top, TARGET))
    out = {}
    for name, policy in (("fixed", EscalationPolicy(signal="max_prob", threshold=fixed)),
                         ("budget", EscalationPolicy(signal="max_prob", threshold=fixed, target_rate=TARGET))):
        with _hybrid(onnx_bundle.bundle, policy) as model:
            out[name] = _run(model, xs, labels)
            if name == "budget":
                out["state"] = model.escalation.state()
    return out


def _windows(escalated):
    """The escalated share of every 1,000-input window (step 100) after 500 inputs of adaptation, to the start and
    to the shift."""
    half = N // 2
    return {start: escalated[start:start + 1000].mean() for start in range(500, N - 999, 100)
            if not half - 1000 < start < half + 500}


def test_a_fixed_threshold_runs_off_under_the_shift(runs):
    escalated, _ = runs["fixed"]
    assert escalated[N // 2:].mean() >= 3 * TARGET, escalated[N // 2:].mean()


def test_a_target_rate_holds_every_window_after_adaptation(runs):
    escalated, right = runs["budget"]
    windows = _windows(escalated)
    worst = max(windows.items(), key=lambda kv: abs(kv[1] - TARGET))
    assert abs(worst[1] - TARGET) <= 0.02, f"window at {worst[0]}: {worst[1]:.3f}"
    fixed_escalated, fixed_right = runs["fixed"]
    print(f"\nsecond half: fixed escalates {fixed_escalated[N // 2:].mean():.3f} (accuracy {fixed_right[N // 2:].mean():.4f})"
          f", budget {escalated[N // 2:].mean():.3f} (accuracy {right[N // 2:].mean():.4f}); windows "
          f"{min(windows.values()):.3f}-{max(windows.values()):.3f}; state {runs['state']}")
    state = runs["state"]
    assert state["inputs"] == N and state["skipped"] == 0 and abs(state["rate"] - TARGET) <= 0.02


class Clock:
    """A hand-moved clock for the token bucket (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_token_bucket_caps_a_burst_exactly_and_refills_at_its_rate():
    clock = Clock()
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.5, max_per_minute=60, burst=5), False,
                              None, clock)
    assert sum(budget.admit() for _ in range(100)) == 5  # a burst at one instant: exactly `burst`
    clock.now = 1.0
    assert sum(budget.admit() for _ in range(100)) == 1  # 60 a minute: one a second
    clock.now = 100.0
    assert sum(budget.admit() for _ in range(100)) == 5  # refilled up to `burst`, no more
    assert budget.state()["skipped"] == 289 and budget.state()["escalations"] == 11


def test_a_bucket_of_less_than_one_a_minute_still_admits_at_its_rate():
    clock = Clock()
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.5, max_per_minute=0.5), False, None,
                              clock)
    went = []
    for k in range(10):  # one input wanting the cloud every 10 minutes: 0.5 a minute refills one token per 2 min
        clock.now = 600.0 * k
        went.append(budget.admit())
    assert went == [True] * 10


@pytest.mark.parametrize("window, rate", [(10, 0.1), (100, 0.05), (1000, 0.1)])
def test_the_hard_cap_admits_exactly_its_share_of_every_window(window, rate):
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.5, max_rate=rate, rate_window=window),
                              False, None)
    went = [budget.admit() for _ in range(20 * window)]  # every input wants the cloud
    allowed = round(rate * window)
    assert max(sum(went[i:i + window]) for i in range(len(went) - window + 1)) == allowed
    assert sum(went) == 20 * allowed  # not fewer either


def test_the_hard_cap_holds_every_window():
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.5, max_rate=0.05, rate_window=100),
                              False, None)
    went = [budget.admit() for _ in range(1000)]  # every input wants the cloud
    assert sum(went[:100]) == 5
    assert max(sum(went[i:i + 100]) for i in range(901)) == 5


def test_a_hybrid_model_over_its_budget_answers_on_the_device_and_says_so(onnx_bundle, stream, tmp_path):
    xs, _ = stream
    policy = EscalationPolicy(signal="max_prob", threshold=1.0, max_per_minute=0.001, burst=3)  # every input wants
    with edgesdk.load(onnx_bundle.bundle, artifact="onnxruntime-int8",
                      hybrid=HybridOptions(mode="prefer-device", cloud=_cloud(onnx_bundle.bundle), policy=policy,
                                           check_model=False)) as model:
        results = [model.predict(x) for x in xs[:20]]
        snap = model.monitor.snapshot()
    assert [r.source for r in results].count("cloud") == 3
    skipped = [r for r in results if r.escalation_skipped is not None]
    assert len(skipped) == 17
    assert all(r.source == "device" and r.escalation_skipped == "budget" and r.escalation_reason == "low_confidence"
               and not r.degraded for r in skipped)
    assert skipped[0].to_dict(outputs=False)["escalation_skipped"] == "budget"
    assert snap["hybrid"]["skipped:budget"] == 17 and snap["hybrid"]["escalated:low_confidence"] == 3
    assert snap["escalation"]["skipped"] == 17 and snap["escalation"]["escalations"] == 3
    saved = tmp_path / "snapshot.json"
    saved.write_text(json.dumps(snap))
    shown = subprocess.run([sys.executable, "-m", "edgesdk", "monitor", str(saved)], capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "escalation budget: max_prob threshold 1, rate" in shown.stdout and "3 escalated, 17 skipped" in shown.stdout


def test_escalate_more_raises_the_target_rate_of_a_budget():
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.5, target_rate=0.1, step=0.1), False,
                              0.5)
    rng = np.random.default_rng(0)
    signal = rng.random(20_000)
    escalated = []
    for k, v in enumerate(signal):
        wanted = v < budget.threshold
        budget.observe(wanted, 0.1 if k >= 10_000 else 0.0)  # the monitor's shift from half-way
        escalated.append(wanted)
    assert np.mean(escalated[5_000:10_000]) == pytest.approx(0.1, abs=0.02)
    assert np.mean(escalated[15_000:]) == pytest.approx(0.2, abs=0.02)


def test_the_threshold_starts_from_the_calibrated_curve():
    manifest = {"hybrid": {"signal": "max_prob", "threshold": 0.9, "curve": [
        {"threshold": 0.5, "escalation_rate": 0.02, "accuracy": 0.97},
        {"threshold": 0.8, "escalation_rate": 0.09, "accuracy": 0.98},
        {"threshold": 0.95, "escalation_rate": 0.2, "accuracy": 0.99}]}}
    assert warm_start(manifest, "max_prob", 0.1) == 0.8
    assert warm_start(manifest, "margin", 0.1) is None  # calibrated on another signal
    assert warm_start({}, "max_prob", 0.1) is None


def _logit(p):
    return float(np.log(p / (1 - p)))


def test_the_threshold_moves_by_at_most_its_step_and_stays_bounded():
    budget = EscalationBudget(EscalationPolicy(signal="entropy", threshold=0.3, target_rate=0.1, step=0.1), True, 0.3)
    before = budget.threshold
    budget.observe(True)  # a high-is-hard signal escalating: the threshold goes up (fewer escalate)
    assert budget.threshold > before and _logit(budget.threshold) - _logit(before) == pytest.approx(0.1 * 0.9)
    before = budget.threshold
    budget.observe(False)  # not escalating: down by step x target
    assert _logit(before) - _logit(budget.threshold) == pytest.approx(0.1 * 0.1)
    low = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.9, target_rate=0.1, step=0.1), False, 0.9)
    low.observe(True)  # a low-is-hard signal escalating: the threshold goes down
    assert _logit(0.9) - _logit(low.threshold) == pytest.approx(0.09)
    for _ in range(100_000):
        budget.observe(True)
    assert 0.999998 < budget.threshold < 1.0


@pytest.mark.parametrize("options, message", [
    ({"target_rate": 1.0}, "target_rate must be a number in"),
    ({"target_rate": 0}, "target_rate must be a number in"),
    ({"step": 0}, "step must be a number in"),
    ({"max_per_minute": -1}, "max_per_minute must be a number in"),
    ({"burst": 0, "max_per_minute": 1}, "burst must be an integer from 1"),
    ({"burst": 3}, "burst sizes a token bucket: set max_per_minute too"),
    ({"max_rate": 1.5}, "max_rate must be a number in"),
    ({"rate_window": 5}, "rate_window must be an integer from 10"),
    ({"target_rate": True}, "target_rate must be a number in"),
])
def test_budget_misuse(options, message):
    with pytest.raises(InputError, match=message):
        EscalationPolicy(**options)


def test_a_target_rate_needs_a_hardness_signal():
    with pytest.raises(InputError, match=r"target_rate tracks a hardness signal; this bundle's task \(embedding\)"):
        EscalationPolicy(target_rate=0.1).resolved({"task": {"type": "embedding"}})
    assert EscalationPolicy(max_rate=0.1).resolved({"task": {"type": "embedding"}}).signal is None
