"""Hybrid mode against a real V2 server on loopback: ``edgesdk serve`` (KServe's ModelServer) in the cloud venv,
reached by our client, directly or through a fault-injecting proxy. No fakes: a real server, real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle, EscalationPolicy
from edgesdk.hybrid.client import CircuitBreaker, CloudClient, RetryBudget
from edgesdk.errors import CloudRejected, CloudUnavailable

from cloud_server import CloudServer, free_port
from fault_proxy import FaultProxy

EDGESDK = str(Path(sys.executable).parent / "edgesdk")


@pytest.fixture(scope="module")
def server(digits_bundle, tmp_path_factory):
    with CloudServer(digits_bundle.bundle, log_dir=tmp_path_factory.mktemp("hybrid-serve")) as srv:
        yield srv


@pytest.fixture(scope="module")
def golden(digits_bundle) -> np.ndarray:
    return Bundle.open(digits_bundle.bundle).golden()["input_0"]


def local_fp32(bundle_path, x: np.ndarray) -> np.ndarray:
    with Bundle.open(bundle_path).artifact("onnxruntime-fp32").open() as engine:
        return engine.run([x])[0]


def test_our_client_against_kserve(server, digits_bundle, golden):
    with CloudClient(server.url, server.model) as client:
        assert client.live() and client.ready()
        meta = client.check_inputs(Bundle.open(digits_bundle.bundle).manifest["inputs"])
        assert meta["name"] == server.model
        x = golden[:1]
        out = client.infer([x], ["x"])
        np.testing.assert_allclose(out[0], local_fp32(digits_bundle.bundle, x), atol=1e-5)
        with pytest.raises(CloudRejected) as caught:
            client.infer([np.zeros((1, 1, 8, 9), np.float32)], ["x"])
        assert caught.value.status == 400 and "shape" in caught.value.detail  # the server's own message
        stats = client.stats()
        assert stats["ok"] >= 4 and stats["retries"] == 0 and stats["breaker"] == "closed"
        assert "binary_tensor_data" not in client.server_metadata().get("extensions", [])  # kserve 0.21: unlisted
    # ... so the client sends JSON by itself; binary works when asked for explicitly.
    with CloudClient(server.url, server.model, binary=True) as client:
        out = client.infer([golden[:1]], ["x"])
        np.testing.assert_allclose(out[0], local_fp32(digits_bundle.bundle, golden[:1]), atol=1e-5)


def test_an_unknown_model_is_a_rejection_carrying_the_servers_message(server, golden):
    with CloudClient(server.url, "no-such-model") as client:
        with pytest.raises(CloudRejected) as caught:
            client.infer([golden[:1]], ["x"])
    assert caught.value.status == 404 and "no-such-model" in caught.value.detail


def test_prefer_device_escalates_hard_inputs_to_the_cloud(server, digits_bundle, golden):
    always = EscalationPolicy(threshold=1.0)  # every input is "hard": the cloud answers all
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-int8",
                      mode="prefer-device", cloud=server.url, escalation=always) as model:
        result = model.predict(golden[:1])
    assert result.source == "cloud" and result.escalation_reason == "low_confidence" and not result.degraded
    assert result.signals["max_prob"] is not None and "cloud" in result.timings_ms
    np.testing.assert_allclose(result.outputs[0], local_fp32(digits_bundle.bundle, golden[:1]), atol=1e-5)
    assert result.top[0].label is not None  # the same postprocessing reads the cloud's answer


def test_prefer_device_keeps_confident_answers_on_the_device(server, digits_bundle, golden):
    never = EscalationPolicy(threshold=0.0, max_clipped=None)
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=server.url,
                      escalation=never) as model:
        results = [model.predict(x) for x in golden[:5]]
    assert all(r.source == "device" and r.escalation_reason is None for r in results)
    assert model.cloud.stats()["calls"] == 0  # nothing was sent


def test_a_failed_cloud_call_still_returns_the_device_answer(digits_bundle, golden):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    always = EscalationPolicy(threshold=1.0)
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=down,
                      escalation=always) as model:
        result = model.predict(golden[:1])
        assert result.source == "device" and result.degraded and result.escalation_reason == "low_confidence"
        assert result.cloud_error in ("unreachable", "timeout")
        with pytest.raises(CloudUnavailable):
            model.predict(golden[:1], mode="cloud-only")
        fallback = model.predict(golden[:1], mode="prefer-cloud")
        assert fallback.source == "device" and fallback.degraded


def test_prefer_cloud_answers_from_the_cloud(server, digits_bundle, golden):
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-cloud", cloud=server.url) as model:
        result = model.predict(golden[:1])
    assert result.source == "cloud" and not result.degraded and result.escalation_reason is None


def test_no_device_backend_escalates_with_reason_no_backend(server, digits_bundle, golden):
    with edgesdk.load(digits_bundle.bundle, require="NPU", mode="prefer-device", cloud=server.url) as model:
        assert model.device is None and model.device_error.reason == "device_missing"
        result = model.predict(golden[:1])
    assert result.source == "cloud" and result.escalation_reason == "no_backend"


def test_a_thermal_refusal_escalates_with_reason_thermal(server, digits_bundle, golden, tmp_path):
    from edgesdk.budgets.thermal import LinuxThermalZones, ThermalGovernor

    zone = tmp_path / "class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("95000\n")  # critical
    gov = ThermalGovernor(LinuxThermalZones(tmp_path), warm_c=70, hot_c=80, critical_c=90)
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=server.url,
                      thermal=gov) as model:
        result = model.predict(golden[:1])
    assert result.source == "cloud" and result.escalation_reason == "thermal"


def test_a_model_mismatch_is_found_before_the_first_call(server, digits_bundle, golden, bundle_copy):
    """A cloud model that takes other inputs is named as such, and the device answers (degraded)."""
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["name"] = "digits-renamed"  # the server knows no such model: metadata says 404
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with edgesdk.load(bundle_copy, require="onnxruntime", mode="prefer-device", cloud=server.url,
                      escalation=EscalationPolicy(threshold=1.0)) as model:
        result = model.predict(golden[:1])
    assert result.source == "device" and result.degraded and result.cloud_error == "rejected"


def test_no_request_is_lost_at_a_30_percent_fault_rate(server, digits_bundle, golden):
    """1,000 hard inputs through a proxy that delays, resets, or answers 429/503 to 30% of requests: every one
    gets a result (the cloud's, or the device's marked degraded) within its deadline plus a small margin; the
    retries stay within the budget; an outage opens the breaker (the device answers at once) and it recovers."""
    deadline_s, margin_s = 0.5, 0.25
    budget = RetryBudget(ratio=0.2, reserve=10)
    with FaultProxy(server.url, fault_rate=0.3, delay_s=0.3, seed=7) as proxy:
        client = CloudClient(proxy.url, server.model, timeout_s=0.15, deadline_s=deadline_s, max_attempts=3,
                             backoff_base_s=0.02, backoff_cap_s=0.1, retry_budget=budget,
                             breaker=CircuitBreaker(failure_rate=0.5, window=50, min_calls=20, cooldown_s=0.5))
        with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=client,
                          escalation=EscalationPolicy(threshold=1.0)) as model:
            sources, slowest, short_circuited = {"cloud": 0, "degraded": 0}, 0.0, 0
            for i in range(1000):
                t0 = time.perf_counter()
                result = model.predict(golden[i % len(golden)][None])
                slowest = max(slowest, time.perf_counter() - t0)
                assert result.outputs and result.outputs[0].shape == (1, 10)
                sources["degraded" if result.degraded else "cloud"] += 1
                short_circuited += result.cloud_error == "circuit_open"
                assert result.source == ("device" if result.degraded else "cloud")
            stats = client.stats()
            assert sources["cloud"] + sources["degraded"] == 1000  # every request answered
            assert slowest <= deadline_s + margin_s, f"a request took {slowest:.3f} s"
            sent = stats["calls"] - stats["failures"].get("circuit_open", 0)  # what the budget was paid on
            assert stats["retries"] <= budget.ratio * sent + budget.reserve
            # Of the calls that were sent (not failed fast by an open circuit), the cloud answered most: first
            # attempts succeed 70% of the time and the budget rescues some more.
            assert sources["cloud"] >= 0.6 * (1000 - short_circuited)
            assert proxy.counts["reset"] > 0 and proxy.counts["delay"] > 0 and proxy.counts["503"] > 0

            proxy.outage = True
            during = [model.predict(golden[0][None]) for _ in range(60)]
            assert all(r.degraded and r.source == "device" for r in during) and client.breaker.state == "open"
            assert during[-1].cloud_error == "circuit_open"  # failing fast, nothing sent
            opened = client.breaker.opened
            proxy.outage, proxy.fault_rate = False, 0.0
            time.sleep(0.6)  # the cool-down passes; the next call is the probe
            after = model.predict(golden[0][None])
            assert after.source == "cloud" and client.breaker.state == "closed"
            assert client.breaker.recovered >= 1 and opened >= 1


def test_cli_run_in_prefer_device_mode_reports_source_and_escalation(server, digits_bundle, digits_images):
    image = sorted((digits_images / "val" / "3").iterdir())[0]
    proc = subprocess.run([EDGESDK, "run", str(digits_bundle.bundle), str(image), "--mode", "prefer-device",
                           "--cloud", server.url, "--require", "onnxruntime", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    row = out["results"][0]
    assert row["source"] in ("device", "cloud") and row["degraded"] is False
    assert set(row) >= {"source", "escalation_reason", "degraded", "signals", "top"}
    assert out["hybrid"]["mode"] == "prefer-device" and out["hybrid"]["threshold"] > 0
    down = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run([EDGESDK, "run", str(digits_bundle.bundle), str(image), "--mode", "cloud-only",
                           "--cloud", down, "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["results"][0]["error"]["type"] == "CloudUnavailable"


def test_a_wrong_datatype_is_rejected_with_the_servers_message(server, golden):
    with CloudClient(server.url, server.model) as client:
        with pytest.raises(CloudRejected) as caught:
            client.infer([golden[:1].astype(np.int64)], ["x"])
    assert caught.value.status == 400 and "INT64" in caught.value.detail


def test_calibrate_escalation_against_the_real_server(server, digits_bundle, digits_images):
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(digits_bundle.bundle), "--val",
                           str(digits_images / "val"), "--cloud", server.url, "--dry-run", "--json", "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(proc.stdout)
    assert entry["cloud"] == server.url and entry["samples"] > 500
    assert entry["hybrid_accuracy"] >= entry["cloud_accuracy"] - 0.003  # the default goal was reachable


def test_the_digits_hybrid_sample_meets_its_goal(digits_bundle, digits_images, tmp_path):
    """samples/digits/hybrid.py end to end (the device bundle of the fixture, the cloud model of the sample):
    hybrid accuracy within 0.3 points of cloud-only, escalating at most 25%."""
    import shutil

    work = tmp_path / "demo"
    work.mkdir()
    shutil.copytree(digits_bundle.bundle, work / "digits.bundle")
    (work / "digits-images").symlink_to(digits_images)
    sample = Path(__file__).resolve().parents[2] / "samples" / "digits" / "hybrid.py"
    proc = subprocess.run([sys.executable, str(sample), "--workdir", str(work), "--json"], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    hybrid, cloud = summary["prefer-device"], summary["cloud-only"]
    assert cloud["accuracy"] > summary["device-only"]["accuracy"]  # the cloud model is the better one
    assert hybrid["accuracy"] >= cloud["accuracy"] - 0.003 and hybrid["escalated"] <= 0.25
    assert hybrid["degraded"] == 0
    assert "device-only" in proc.stdout and "split-half check" in proc.stdout


def test_the_cloud_token_never_reaches_the_logs_the_results_or_the_bundle(server, bundle_copy, digits_images, golden,
                                                                          monkeypatch, caplog):
    """The token travels only in the Authorization header: not in any log record (every logger, DEBUG), not in a
    result, an error or the model's repr, and not in the bundle that calibrate-escalation rewrites."""
    import logging

    secret = "tok-7c1e9f-DO-NOT-LEAK"
    monkeypatch.setenv("EDGESDK_TEST_CLOUD_TOKEN", secret)
    with caplog.at_level(logging.DEBUG):
        with edgesdk.load(bundle_copy, mode="prefer-cloud", cloud=server.url,
                          token_env="EDGESDK_TEST_CLOUD_TOKEN") as model:  # every input goes to the cloud
            results = [model.predict(golden[i : i + 1]) for i in range(5)]
            assert {r.source for r in results} == {"cloud"}
            shown = repr(model) + "".join(json.dumps(r.to_dict(), default=str) + repr(r) for r in results)
        with edgesdk.load(bundle_copy, mode="cloud-only", cloud=f"http://127.0.0.1:{free_port()}",
                          token_env="EDGESDK_TEST_CLOUD_TOKEN") as dead:
            with pytest.raises(CloudUnavailable) as caught:
                dead.predict(golden[:1])
            shown += str(caught.value) + repr(caught.value)
    assert caplog.records and secret not in caplog.text and secret not in shown
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(bundle_copy), "--val", str(digits_images / "val"),
                           "--cloud", server.url, "--token-env", "EDGESDK_TEST_CLOUD_TOKEN", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert secret not in proc.stdout + proc.stderr
    assert all(secret.encode() not in f.read_bytes() for f in bundle_copy.rglob("*") if f.is_file())
