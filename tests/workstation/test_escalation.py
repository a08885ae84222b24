"""edgesdk calibrate-escalation: the sweep, the choice, and the manifest entry the runtime then uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle
# private: the sweep and the choice rule, tested apart from the cloud
from edgesdk_converters.escalation import _choose, _sweep

EDGESDK = str(Path(sys.executable).parent / "edgesdk")


def test_the_sweep_traces_escalation_rate_against_hybrid_accuracy():
    # Five samples; the device is wrong on the two least confident, the cloud on the most confident one.
    sig = np.array([0.2, 0.4, 0.7, 0.9, 0.99])
    device_ok = np.array([False, False, True, True, True])
    cloud_ok = np.array([True, True, True, True, False])
    curve = _sweep(sig, np.zeros(5, bool), device_ok, cloud_ok, "max_prob")
    rates = [(p["escalation_rate"], p["accuracy"]) for p in curve]
    assert rates == [(0.0, 0.6), (0.2, 0.8), (0.4, 1.0), (0.6, 1.0), (0.8, 1.0), (1.0, 0.8)]
    at_40 = next(p for p in curve if p["escalation_rate"] == 0.4)
    assert 0.4 < at_40["threshold"] < 0.7  # between the values it separates
    best, why = _choose(curve, None, None, cloud_acc=0.8)
    assert best["escalation_rate"] == 0.2 and "fewest escalations within" in why  # 0.8 >= 0.8 - 0.003
    assert _choose(curve, 0.5, None, 0.8)[0]["escalation_rate"] == 0.4
    assert _choose(curve, None, 0.95, 0.8)[0]["escalation_rate"] == 0.4
    best, why = _choose(curve, None, 1.01, 0.8)
    assert best["accuracy"] == 1.0 and "out of reach" in why


def test_entropy_escalates_above_the_threshold():
    sig = np.array([0.1, 0.9])
    curve = _sweep(sig, np.zeros(2, bool), np.array([True, False]), np.array([True, True]), "entropy")
    half = next(p for p in curve if p["escalation_rate"] == 0.5)
    assert half["accuracy"] == 1.0 and 0.1 < half["threshold"] < 0.9


def test_out_of_range_inputs_always_escalate():
    curve = _sweep(np.array([0.9, 0.9]), np.array([True, False]), np.array([False, True]), np.array([True, True]),
                   "max_prob")
    assert curve[0]["escalation_rate"] == 0.5 and curve[0]["accuracy"] == 1.0


def test_calibrate_escalation_writes_the_threshold_the_runtime_uses(bundle_copy, digits_bundle, digits_images):
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(bundle_copy), "--val", str(digits_images / "val"),
                           "--cloud-bundle", str(digits_bundle.bundle), "--target-escalation", "0.25", "--json",
                           "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(proc.stdout)
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    assert manifest["hybrid"] == entry
    assert entry["signal"] == "max_prob" and 0 < entry["threshold"] <= 1 and entry["escalation_rate"] <= 0.25
    assert entry["samples"] == len(list((digits_images / "val").glob("*/*.png")))
    assert entry["curve"][0]["escalation_rate"] == 0.0 and entry["curve"][-1]["escalation_rate"] >= 0.99
    assert entry["hybrid_accuracy"] >= entry["device_accuracy"]
    Bundle.open(bundle_copy)  # the checksums still hold: only the manifest changed
    with edgesdk.load(bundle_copy, mode="prefer-device", cloud="http://127.0.0.1:9") as model:
        assert model.policy.threshold == entry["threshold"]


@pytest.mark.parametrize("args, message", [
    (["--cloud", "http://127.0.0.1:9", "--cloud-bundle", "x"], "exactly one of --cloud URL or --cloud-bundle"),
    (["--cloud-bundle", "{bundle}", "--target-escalation", "0.2", "--target-accuracy", "0.9"], "not both"),
    (["--cloud-bundle", "{bundle}", "--target-escalation", "25"], "must be a fraction in"),
    (["--cloud-bundle", "{bundle}", "--signal", "vibes"], "signal must be one of"),
])
def test_calibrate_escalation_misuse(digits_bundle, digits_images, args, message):
    args = [a.replace("{bundle}", str(digits_bundle.bundle)) for a in args]
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(digits_bundle.bundle), "--val",
                           str(digits_images / "val"), *args, "--dry-run", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr


def test_unlabelled_validation_data_is_refused(digits_bundle, tmp_path):
    x = Bundle.open(digits_bundle.bundle).golden()["input_0"]
    np.savez(tmp_path / "nolabels.npz", x=x)
    proc = subprocess.run([EDGESDK, "calibrate-escalation", str(digits_bundle.bundle), "--val",
                           str(tmp_path / "nolabels.npz"), "--cloud-bundle", str(digits_bundle.bundle), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has no labels" in proc.stderr


def test_a_target_below_what_out_of_range_inputs_force_is_said_so():
    curve = _sweep(np.array([0.9, 0.9, 0.9, 0.9]), np.array([True, True, False, False]),
                   np.array([True, True, True, True]), np.array([True, True, True, True]), "max_prob")
    best, why = _choose(curve, 0.25, None, 1.0)
    assert best["escalation_rate"] == 0.5 and "out of reach" in why


def test_the_escalate_all_point_is_what_the_runtime_does():
    """A top-1 probability of exactly 1.0 is not below any threshold in [0, 1]: the sweep says so too."""
    curve = _sweep(np.array([0.5, 1.0]), np.zeros(2, bool), np.array([True, True]), np.array([True, True]),
                   "max_prob")
    assert max(p["escalation_rate"] for p in curve) == 0.5 and all(p["threshold"] <= 1.0 for p in curve)


def test_a_cloud_answering_the_wrong_shape_stops_the_sweep_with_a_typed_error(bundle_copy, digits_images):
    """The sweep's cloud accuracy comes from the server's answers: they are checked against the bundle's outputs as
    hybrid mode checks them, so a server answering [1, 3] stops the command (exit 2) and the manifest is untouched."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    spec = manifest["inputs"][0]

    class WrongShape(BaseHTTPRequestHandler):
        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            self._answer({"name": manifest["name"], "inputs": [{"name": spec["name"], "datatype": "FP32",
                                                                "shape": spec["shape"]}], "outputs": []})

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer({"model_name": manifest["name"], "outputs": [
                {"name": manifest["outputs"][0]["name"], "shape": [1, 3], "datatype": "FP32", "data": [1, 0, 0]}]})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), WrongShape)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run([EDGESDK, "calibrate-escalation", str(bundle_copy), "--val", str(digits_images / "val"),
                               "--cloud", f"http://127.0.0.1:{server.server_port}", "-q"],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "bad_response" in proc.stderr and "has shape [1, 3], expected [1, 10]" in proc.stderr
    assert json.loads((bundle_copy / "manifest.json").read_text()) == manifest
