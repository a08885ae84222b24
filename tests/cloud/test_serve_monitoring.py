"""``edgesdk serve --monitor FILE --otel``: the cloud side watches what it answers with the device's monitor and
exports the same OpenTelemetry instruments (read back by a loopback OTLP receiver: nothing leaves the machine), with
the served artifact's identity on every figure; its JSON-lines file is what ``edgesdk monitor`` reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from cloud_server import CloudServer
from edgesdk import Bundle
from edgesdk.bundle.tensors import BundleIO
from edgesdk.errors import InputError
from edgesdk.monitor.sink import read_records
from otlp_receiver import OtlpReceiver, documented

ROWS, BATCH, BAD = 320, 40, 3  # 320 rows: past the monitor's first evaluation (min_window 300)
IDENTITY = {"edgesdk.bundle.name": "digits", "edgesdk.artifact.id": "onnxruntime-fp32",
            "edgesdk.engine.name": "onnxruntime", "edgesdk.precision": "fp32", "edgesdk.device": "CPU"}


def _loopback_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and "proxy" not in k.lower()}
    return env | {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "500"}


@pytest.fixture(scope="module")
def watched(digits_bundle, digits_images, tmp_path_factory):
    """A server watched and exported over OTLP, after ROWS answered rows (in batches) and BAD refused requests."""
    from PIL import Image

    where = tmp_path_factory.mktemp("serve-monitor")
    io = BundleIO(Bundle.open(digits_bundle.bundle))
    files = sorted(digits_images.glob("val/*/*.png"))
    rows = np.concatenate([io.prepare(np.asarray(Image.open(files[i % len(files)]).convert("L")))[0][0]
                           for i in range(ROWS)])
    with OtlpReceiver() as receiver:
        with CloudServer(digits_bundle.bundle, "--monitor", str(where / "serve.jsonl"), "--otel", log_dir=where,
                         env=_loopback_env(receiver.url)) as server:
            for start in range(0, ROWS, BATCH):
                x = rows[start:start + BATCH]
                status, _ = server.infer({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                                      "data": x.ravel().tolist()}]})
                assert status == 200, _
            for _ in range(BAD):
                status, _ = server.infer({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                                                      "data": [0.0, 0.0, 0.0]}]})
                assert status == 400
            deadline = time.monotonic() + 30
            while "edgesdk.monitor.drift" not in receiver.names and time.monotonic() < deadline:
                time.sleep(0.2)
        assert server.returncode == 0, server.output()[-4000:]
        yield receiver, server, where / "serve.jsonl"


def test_serve_exports_the_devices_instruments_with_the_served_artifacts_identity(watched):
    receiver, server, _ = watched
    assert "monitoring: JSON lines to" in server.output() and "OpenTelemetry over OTLP/HTTP to http://127.0.0.1" \
        in server.output()
    assert receiver.paths == {"/v1/metrics"}
    expected = {name for name in documented() if not name.startswith("edgesdk.hybrid.")} | \
        {"edgesdk.hybrid.escalation_shift"}
    assert receiver.names == expected
    for name, points in receiver.points.items():
        for attributes in points:
            assert IDENTITY.items() <= attributes.items(), (name, attributes)
    assert {"InputError"} == {p["error.type"] for p in receiver.points["edgesdk.errors"]}
    assert any(r.get("service.name") == "edgesdk-serve" for r in receiver.resources)


def test_serve_writes_a_monitor_file_that_edgesdk_monitor_reads(watched):
    _, _, path = watched
    records = read_records(path)
    last = [r for r in records if r.get("type") == "snapshot"][-1]
    assert last["predictions"] == ROWS and last["errors"] == {"InputError": BAD}
    assert last["identity"]["artifact"] == "onnxruntime-fp32"
    assert last["signals"]["input_drift"]["level"] == "ok"  # the bundle's own validation images
    proc = subprocess.run([sys.executable, "-m", "edgesdk", "monitor", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "input_drift" in proc.stdout


def test_nothing_is_watched_unless_asked_and_otel_names_its_extra(digits_bundle, monkeypatch):
    from edgesdk_cloud.telemetry import Telemetry

    bundle = Bundle.open(digits_bundle.bundle)
    artifact = bundle.artifact("onnxruntime-fp32")
    assert Telemetry.start(bundle, artifact, None, False).monitor is None
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.metrics", None)  # as where the otel extra is missing
    with pytest.raises(InputError, match=r"pip install 'edgesdk-cloud\[otel\]'"):
        Telemetry.start(bundle, artifact, None, True)
