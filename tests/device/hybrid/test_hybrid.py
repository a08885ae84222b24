"""Hybrid mode's device side: hardness signals, the escalation policy, options, and device-only staying offline.

The runs against a real V2 server on loopback (edgesdk serve on KServe's ModelServer), with faults injected, are
in test_hybrid_cloud.py.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle, EscalationPolicy, HybridOptions
from edgesdk.errors import InputError
from edgesdk.hybrid.model import DEFAULT_THRESHOLDS, signals


def test_signals_of_a_confident_and_an_unsure_distribution():
    sure = signals(np.array([0.97, 0.01, 0.01, 0.01]))
    unsure = signals(np.array([0.4, 0.35, 0.15, 0.1]))
    assert sure["max_prob"] == pytest.approx(0.97) and sure["margin"] == pytest.approx(0.96)
    assert unsure["max_prob"] == pytest.approx(0.4) and unsure["margin"] == pytest.approx(0.05)
    assert 0.0 <= sure["entropy"] < 0.2 < 0.8 < unsure["entropy"] <= 1.0
    uniform = signals(np.full(10, 0.1))
    assert uniform["entropy"] == pytest.approx(1.0) and uniform["margin"] == pytest.approx(0.0)
    assert sure["clipped_share"] is None  # no calibration range given


def test_clipped_share_counts_values_outside_the_calibrated_range():
    x = np.linspace(-1.0, 2.0, 100, dtype=np.float32).reshape(1, 100)
    sig = signals(None, [x], [{"name": "x", "min": 0.0, "max": 1.0}])
    assert sig["max_prob"] is None
    assert sig["clipped_share"] == pytest.approx(np.mean((x < 0) | (x > 1)))


def test_policy_reasons():
    policy = EscalationPolicy(signal="max_prob", threshold=0.8, max_clipped=0.1)
    assert policy.reason({"max_prob": 0.9, "clipped_share": 0.0}) is None
    assert policy.reason({"max_prob": 0.7, "clipped_share": 0.0}) == "low_confidence"
    assert policy.reason({"max_prob": 0.9, "clipped_share": 0.2}) == "out_of_range"
    entropy = EscalationPolicy(signal="entropy", threshold=0.5, max_clipped=None)
    assert entropy.reason({"entropy": 0.6, "clipped_share": 0.9}) == "low_confidence"
    assert entropy.reason({"entropy": 0.4, "clipped_share": 0.9}) is None


def test_an_unknown_calibrated_signal_is_refused_not_ignored():
    from edgesdk.errors import BundleError

    calibrated = {"hybrid": {"signal": "vibes", "threshold": 0.4}}
    with pytest.raises(BundleError, match=r"calibrated escalation signal 'vibes' \(manifest hybrid.signal\) is not one"):
        EscalationPolicy().resolved(calibrated)
    assert EscalationPolicy(signal="margin").resolved(calibrated).threshold == DEFAULT_THRESHOLDS["margin"]


def test_policy_threshold_comes_from_the_bundle_then_the_default():
    calibrated = {"hybrid": {"signal": "max_prob", "threshold": 0.83}}
    assert EscalationPolicy().resolved(calibrated).threshold == 0.83
    assert EscalationPolicy(signal="margin").resolved(calibrated).threshold == DEFAULT_THRESHOLDS["margin"]
    assert EscalationPolicy(threshold=0.5).resolved(calibrated).threshold == 0.5


@pytest.mark.parametrize("options, message", [
    ({"signal": "vibes"}, "signal must be one of max_prob, margin, entropy"),
    ({"threshold": 1.5}, "threshold must be a number in"),
    ({"max_clipped": -0.1}, "max_clipped must be a number in"),
])
def test_policy_misuse(options, message):
    with pytest.raises(InputError, match=message):
        EscalationPolicy(**options)


def test_hybrid_options_misuse():
    with pytest.raises(InputError, match="hybrid mode must be one of device-only, cloud-only"):
        HybridOptions(mode="sometimes")
    with pytest.raises(InputError, match="'prefer-device' needs a cloud endpoint"):
        HybridOptions(mode="prefer-device")


def test_a_plain_http_cloud_off_the_loopback_is_refused_at_load(digits_bundle):
    with pytest.raises(InputError, match="plain http to a non-loopback host"):
        edgesdk.load(digits_bundle.bundle, mode="prefer-device", cloud="http://cloud.example.com:8080")


def test_device_only_opens_no_socket(digits_bundle, monkeypatch):
    """In device-only mode nothing leaves the device: any socket creation fails the test."""
    opened = []

    class NoSockets(socket.socket):
        def __init__(self, *args, **kwargs):
            opened.append(args)
            raise AssertionError("device-only mode opened a socket")

    monkeypatch.setattr(socket, "socket", NoSockets)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: opened.append(a) or NoSockets())
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, mode="device-only", require="onnxruntime") as model:
        result = model.predict(x)
    assert result.source == "device" and not result.degraded and result.escalation_reason is None
    assert opened == []
    assert isinstance(model, edgesdk.Model)  # device-only is the plain device model


def test_one_deadline_covers_everything_a_prediction_asks_of_the_cloud(digits_bundle):
    """The model check, the binary-extension question and the call itself share the deadline: a predict whose
    every cloud request hangs answers from the device within the deadline, not a multiple of it. (A scripted
    transport that waits out each attempt's timeout in real time, then times out.)"""
    import json
    import time

    from edgesdk.hybrid.client import CloudClient, Response

    manifest = Bundle.open(digits_bundle.bundle).manifest
    metadata = json.dumps({"name": manifest["name"], "inputs": [
        {"name": t["name"], "datatype": "FP32", "shape": t["shape"]} for t in manifest["inputs"]]}).encode()

    class Hanging:
        def request(self, method, url, headers, body, timeout_s, max_bytes=None):
            if url.endswith(f"/v2/models/{manifest['name']}"):
                return Response(200, {}, metadata)  # the model check passes
            time.sleep(timeout_s)
            raise TimeoutError("no answer")

        def close(self):
            pass

    cloud = CloudClient("http://127.0.0.1:9", manifest["name"], transport=Hanging(), deadline_s=0.4, timeout_s=0.15)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=cloud,
                      escalation=EscalationPolicy(threshold=1.0)) as model:
        for _ in range(3):
            t0 = time.perf_counter()
            result = model.predict(x)
            took = time.perf_counter() - t0
            assert result.degraded and result.cloud_error == "timeout"
            assert took < 0.4 + 0.15, f"predict took {took:.3f} s against a 0.4 s deadline"


class ScriptedCloud:
    """A V2 endpoint in a function: answers the model check from the bundle's manifest (or ``metadata``) and an
    infer with fixed logits; counts requests. For the hybrid logic only; the real server is in
    test_hybrid_cloud.py."""

    def __init__(self, manifest: dict, metadata: dict | None = None):
        import json

        self.requests: list[str] = []
        self.metadata = json.dumps(metadata or {"name": manifest["name"], "inputs": [
            {"name": t["name"], "datatype": "FP32", "shape": t["shape"]} for t in manifest["inputs"]]}).encode()
        self.answer = {"outputs": [{"name": manifest["outputs"][0]["name"], "shape": [1, 10], "datatype": "FP32",
                                    "data": [0.0] * 9 + [9.0]}]}

    def request(self, method, url, headers, body, timeout_s, max_bytes=None):
        import json

        from edgesdk.hybrid.client import Response

        self.requests.append(f"{method} {url.split('/v2', 1)[1]}")
        if url.endswith("/infer"):
            return Response(200, {}, json.dumps({**self.answer, "id": json.loads(body)["id"]}).encode())
        if url.endswith("/v2"):
            return Response(200, {}, b'{"name": "scripted", "extensions": []}')
        return Response(200, {}, self.metadata)

    def close(self):
        pass


def scripted_model(digits_bundle, metadata=None, **options):
    from edgesdk.hybrid.client import CloudClient

    manifest = Bundle.open(digits_bundle.bundle).manifest
    cloud = ScriptedCloud(manifest, metadata)
    client = CloudClient("http://127.0.0.1:9", manifest["name"], transport=cloud)
    options = {"require": "onnxruntime", "mode": "prefer-device", "cloud": client,
               "escalation": EscalationPolicy(threshold=1.0), **options}
    return edgesdk.load(digits_bundle.bundle, **options), cloud


def test_a_model_mismatch_fails_every_escalation_at_once(digits_bundle):
    wrong = {"name": "digits", "inputs": [{"name": "x", "datatype": "FP16", "shape": [1, 1, 8, 8]}]}
    model, cloud = scripted_model(digits_bundle, metadata=wrong)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with model:
        first, second = model.predict(x), model.predict(x)
    assert first.degraded and first.cloud_error == "model_mismatch" and second.cloud_error == "model_mismatch"
    assert cloud.requests == [f"GET /models/{Bundle.open(digits_bundle.bundle).name}"]  # asked once, never infer


def test_device_only_per_call_on_a_hybrid_model_sends_nothing(digits_bundle):
    model, cloud = scripted_model(digits_bundle)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with model:
        result = model.predict(x, mode="device-only")
    assert result.source == "device" and cloud.requests == []


def test_a_device_backend_failing_at_run_time_escalates(digits_bundle):
    from edgesdk.engines import register_backend, unregister_backend
    from fakes import NAME, ThrowingNPUEngine

    register_backend(NAME, ThrowingNPUEngine)  # a fake NPU whose delegate throws at run time
    try:
        # speed_check="off": the load-time race would run it, find it failing and serve LiteRT instead
        model, cloud = scripted_model(digits_bundle, require=None, check_numerics=False, speed_check="off",
                                      escalation=EscalationPolicy(threshold=0.0))
        x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
        with model:
            assert model.device.placement.engine == NAME
            result = model.predict(x)
    finally:
        unregister_backend(NAME)
    assert result.source == "cloud" and result.escalation_reason == "no_backend"
    assert int(result.outputs[0].argmax()) == 9


def test_the_device_error_is_raised_fresh_each_time(digits_bundle):
    """With no device backend and a failing cloud, each call raises its own exception (no shared traceback)."""
    from edgesdk.hybrid.client import CloudClient
    from edgesdk.errors import BackendUnavailable

    client = CloudClient(f"http://127.0.0.1:{_free_port()}", "digits", max_attempts=1)
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]
    with edgesdk.load(digits_bundle.bundle, require="NPU", mode="prefer-device", cloud=client) as model:
        errors = []
        for _ in range(3):
            with pytest.raises(BackendUnavailable) as caught:
                model.predict(x)
            errors.append(caught.value)
    assert len({id(e) for e in errors}) == 3 and all(e.reason == "device_missing" for e in errors)
    assert all(e.__cause__ is not None for e in errors)  # the cloud's failure, chained


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
