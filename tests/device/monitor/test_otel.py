"""The monitor published through OpenTelemetry (edgesdk.monitor.otel), read back with the SDK's in-memory reader:
every instrument of the module docstring's table, with its kind, unit and attributes (parsed from the table, so the
documentation and the code cannot diverge), the identity on every figure and nothing of an input in any attribute;
the misuses refused; the deployment sample exporting over OTLP/HTTP to a receiver on loopback, and through a real
OpenTelemetry Collector to Prometheus where one is installed.

opentelemetry-sdk is imported at the top on purpose: these tests fail, never skip, where the ``otel`` extra is
missing (``make test`` installs it)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum

import edgesdk
from edgesdk.choices import MonitorSignal
from edgesdk.errors import InputError
from edgesdk.monitor import MonitorOptions, otel
from edgesdk.hybrid.budget import EscalationBudget
from edgesdk.hybrid.model import SIGNALS, EscalationPolicy
from edgesdk.monitor.otel import publish
from otlp_receiver import OtlpReceiver, documented

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "samples" / "monitoring"
QUICK = dict(every=10, min_window=10, window=200)
PREDICTIONS = 120
CANARY = "canary-7f3a"  # in the path of an input that cannot be read: it must not reach any attribute
# Monitor.hybrid is what a hybrid model reports each answer with; a device model reports none, so the test reports
# the answers a hybrid model would (source, escalation reason, degraded, skipped reason).
HYBRID = [("cloud", "low_confidence", False, None), ("device", None, True, "circuit_open")]


def documented_identity() -> set[str]:
    paragraph = otel.__doc__.split("Every figure also carries", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"``(edgesdk\.[a-z_.]+)``", paragraph))


@pytest.fixture(scope="module")
def digits(digits_images):
    from PIL import Image

    files = sorted(digits_images.glob("val/*/*.png"))
    return np.stack([np.asarray(Image.open(f).convert("L")) for f in files])


def _load(bundle, **options):
    return edgesdk.load(bundle, engine="onnxruntime", monitor=MonitorOptions(**(QUICK | options)))


def _collect(reader) -> dict:
    data = reader.get_metrics_data()
    return {m.name: m for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
            for m in sm.metrics}


def _kind(metric) -> str:
    if isinstance(metric.data, Histogram):
        return "histogram"
    if isinstance(metric.data, Sum) and metric.data.is_monotonic:
        return "counter"
    return "gauge" if isinstance(metric.data, Gauge) else type(metric.data).__name__


def _identity(model) -> dict[str, str]:
    return {otel.IDENTITY[k]: str(v) for k, v in model.identity().items() if v is not None}


def _run(model, digits, n=PREDICTIONS):
    for x in digits[:n]:
        model.predict(x)
    with pytest.raises(InputError):
        model.predict(np.zeros((3, 3, 3, 3, 3), np.float32))  # no input takes it
    with pytest.raises(edgesdk.EdgeSDKError):
        model.predict(f"/nonexistent/{CANARY}.png")
    for answer in HYBRID:
        model.monitor.hybrid(*answer)
    # a hybrid model's escalation budget, as HybridModel attaches it (its own tests: tests/device/hybrid)
    budget = EscalationBudget(EscalationPolicy(signal="max_prob", threshold=0.6, target_rate=0.1), False, 0.6)
    model.monitor.watch_escalation(budget.state)
    for wanted in (True, False, False):
        budget.observe(wanted)
        budget.admit() if wanted else budget.settle(False)


@pytest.fixture(scope="module")
def published(onnx_bundle, digits):
    """One model, 120 predictions and two failed calls, read back: (metrics by name, its identity, its monitor's
    snapshot, the reference's feature names)."""
    reader = InMemoryMetricReader()
    with _load(onnx_bundle.bundle) as model:
        publish(model, MeterProvider(metric_readers=[reader]))
        _run(model, digits)
        metrics = _collect(reader)
        snapshot = model.monitor.snapshot()
        identity = _identity(model)
    reference = onnx_bundle.manifest["monitoring"]
    return metrics, identity, snapshot, set(reference["inputs"]) | set(reference["outputs"])


def test_the_table_documents_the_instruments_the_code_makes():
    table = documented()
    made = {"edgesdk.inference.duration": ("histogram", "s")} | {n: (k, u) for n, k, u, _ in otel.INSTRUMENTS}
    assert {name: (row["kind"], row["unit"]) for name, row in table.items()} == made
    assert documented_identity() == set(otel.IDENTITY.values())


def test_every_documented_instrument_is_published_with_its_attributes(published):
    metrics, identity, _, _ = published
    table = documented()
    assert set(metrics) == set(table)
    assert set(identity) == documented_identity()  # every identity figure is known for this model
    for name, row in table.items():
        metric = metrics[name]
        assert (_kind(metric), metric.unit) == (row["kind"], row["unit"]), name
        points = list(metric.data.data_points)
        assert points, name
        for point in points:
            attributes = dict(point.attributes)
            assert set(attributes) == set(identity) | row["attributes"], name
            assert {k: attributes[k] for k in identity} == identity, name


def test_the_figures_are_the_monitors(published):
    metrics, _, snapshot, _ = published

    def points(name):
        return list(metrics[name].data.data_points)

    durations = {dict(p.attributes)["edgesdk.stage"]: p for p in points("edgesdk.inference.duration")}
    assert set(durations) == {"preprocess", "inference"}
    assert all(p.count == PREDICTIONS for p in durations.values())  # every latency, each once
    mean_s, p50_s = durations["inference"].sum / PREDICTIONS, snapshot["latency_ms"]["inference"]["p50"] / 1e3
    assert 0.2 < mean_s / p50_s < 50  # seconds (milliseconds would make it 1000)
    assert [p.value for p in points("edgesdk.predictions")] == [PREDICTIONS]
    errors = {dict(p.attributes)["error.type"]: p.value for p in points("edgesdk.errors")}
    assert errors == snapshot["errors"] and sum(errors.values()) == 2
    levels = {dict(p.attributes)["edgesdk.monitor.signal"]: p.value for p in points("edgesdk.monitor.signal.level")}
    assert levels == {s: ["ok", "warn", "alert"].index(v["level"]) for s, v in snapshot["signals"].items()}
    values = {dict(p.attributes)["edgesdk.monitor.signal"]: p.value for p in points("edgesdk.monitor.signal.value")}
    assert values == pytest.approx({s: v["value"] for s, v in snapshot["signals"].items()})
    drift = {dict(p.attributes)["edgesdk.monitor.feature"]: p.value for p in points("edgesdk.monitor.drift")}
    assert drift == pytest.approx({f: e["psi"] for group in snapshot["drift"].values() for f, e in group.items()})
    assert points("edgesdk.memory.usage")[0].value == pytest.approx(snapshot["memory_mb"] * 2 ** 20, rel=0.2)
    answers = {dict(p.attributes)["edgesdk.hybrid.source"]: p.value for p in points("edgesdk.hybrid.answers")}
    assert answers == {"cloud": 1, "device": 1}
    assert [dict(p.attributes)["edgesdk.hybrid.reason"] for p in points("edgesdk.hybrid.escalations")] == [
        "low_confidence"]
    assert [dict(p.attributes)["edgesdk.hybrid.reason"] for p in points("edgesdk.hybrid.skipped")] == ["circuit_open"]


def test_no_attribute_holds_anything_of_an_input(published):
    metrics, identity, snapshot, features = published
    allowed = {  # attribute -> the values it may take; anything else (an input's path, pixels, text) fails
        "edgesdk.stage": set(otel.STAGES), "edgesdk.monitor.signal": set(MonitorSignal.values()),
        "edgesdk.monitor.statistic": {"psi", "js", "share"}, "edgesdk.monitor.feature": features,
        "error.type": set(snapshot["errors"]), "edgesdk.hybrid.source": {"device", "cloud"},
        "edgesdk.hybrid.reason": {"low_confidence", "circuit_open"},
        "edgesdk.hybrid.signal": set(SIGNALS)} | {k: {v} for k, v in identity.items()}
    seen = set()
    for metric in metrics.values():
        for point in metric.data.data_points:
            for key, value in point.attributes.items():
                assert value in allowed[key], (metric.name, key, value)
                assert CANARY not in str(value)
                seen.add(key)
    assert seen == set(allowed)


def test_two_models_of_one_bundle_add_up_and_close_stops_one(onnx_bundle, digits):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with _load(onnx_bundle.bundle) as first, _load(onnx_bundle.bundle) as second:
        one, _ = publish(first, provider), publish(second.monitor, provider)
        for x in digits[:30]:
            first.predict(x)
        for x in digits[:20]:
            second.predict(x)
        assert [p.value for p in _collect(reader)["edgesdk.predictions"].data.data_points] == [50]
        one.close()
        one.close()  # idempotent
        assert [p.value for p in _collect(reader)["edgesdk.predictions"].data.data_points] == [20]
        publish(first, provider).close()  # published again once closed


def test_a_monitor_is_published_once_per_provider(onnx_bundle):
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    with _load(onnx_bundle.bundle) as model:
        with publish(model, provider):
            with pytest.raises(InputError, match="already published on this meter provider"):
                publish(model.monitor, provider)
            publish(model, MeterProvider(metric_readers=[InMemoryMetricReader()])).close()  # another provider


@pytest.mark.parametrize("source, message", [
    (object(), "publish takes a loaded model or its monitor; a object has no monitor"),
    ("model", "publish takes a loaded model or its monitor; a str has no monitor"),
])
def test_publish_refuses_what_is_not_a_model(source, message):
    with pytest.raises(InputError, match=message):
        publish(source)


def test_publish_refuses_a_model_loaded_without_monitor(onnx_bundle):
    with edgesdk.load(onnx_bundle.bundle, engine="onnxruntime", monitor=False) as model:
        with pytest.raises(InputError, match="monitor=False"):
            publish(model)


def test_publish_refuses_what_is_not_a_meter_provider(onnx_bundle):
    with _load(onnx_bundle.bundle) as model:
        with pytest.raises(InputError, match="meter_provider must be an OpenTelemetry MeterProvider, got dict"):
            publish(model, {})


LAZY_SCRIPT = """
import sys
import numpy as np
import edgesdk, edgesdk.monitor.otel
model = edgesdk.load(sys.argv[1], engine="onnxruntime")
model.predict(np.zeros((8, 8), np.uint8))
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""

MISSING_SCRIPT = """
import sys
sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
import edgesdk, edgesdk.monitor.otel
from edgesdk.errors import InputError
model = edgesdk.load(sys.argv[1], engine="onnxruntime")
try:
    edgesdk.monitor.otel.publish(model)
except InputError as exc:
    print("REFUSED", exc)
"""


def _python(script: str, *args, cwd) -> str:
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_opentelemetry_is_imported_only_by_publish(onnx_bundle, tmp_path):
    assert "LOADED []" in _python(LAZY_SCRIPT, onnx_bundle.bundle, cwd=tmp_path)


def test_without_opentelemetry_edgesdk_imports_and_publish_names_the_extra(onnx_bundle, tmp_path):
    out = _python(MISSING_SCRIPT, onnx_bundle.bundle, cwd=tmp_path)
    assert "REFUSED" in out and "pip install 'edgesdk[otel]'" in out


# -- the deployment sample -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _loopback_env() -> dict[str, str]:
    """The sample's environment: no OTEL_* setting and no proxy from outside, so nothing leaves the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and "proxy" not in k.lower()}
    return env | {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def _sample(bundle, endpoint: str, images: Path, tmp_path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SAMPLE / "app.py"), str(bundle), "--images", str(images),
                           "--predictions", "400", "--interval", "1", "--endpoint", endpoint, "--engine",
                           "onnxruntime"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=_loopback_env())
    assert proc.returncode == 0, proc.stderr
    return proc


def test_the_sample_exports_every_device_instrument_over_otlp_http(onnx_bundle, digits_images, tmp_path):
    with OtlpReceiver() as receiver:
        proc = _sample(onnx_bundle.bundle, receiver.url, digits_images / "val", tmp_path)
    assert "400 predictions" in proc.stdout
    assert receiver.paths == {"/v1/metrics"}
    # all but the hybrid counters and the errors (the sample's model is a device model whose calls all answer)
    answered = {name for name in documented() if not name.startswith("edgesdk.hybrid.")} - {"edgesdk.errors"}
    assert receiver.names == answered | {"edgesdk.hybrid.escalation_shift"}


COLLECTORS = ("otelcol-contrib", "otelcol")


def test_the_collector_example_serves_the_figures_to_prometheus(onnx_bundle, digits_images, tmp_path):
    collector = next((shutil.which(c) for c in COLLECTORS if shutil.which(c)), None)
    if collector is None:
        pytest.skip(f"no OpenTelemetry Collector on PATH ({' or '.join(COLLECTORS)}): the sample's OTLP export is "
                    f"tested against a loopback receiver instead (test_the_sample_exports_...)")
    otlp, prometheus = _free_port(), _free_port()
    config = (SAMPLE / "otel-collector.yaml").read_text()
    assert "127.0.0.1:4318" in config and "127.0.0.1:9464" in config  # loopback only
    config = config.replace("127.0.0.1:4318", f"127.0.0.1:{otlp}").replace("127.0.0.1:9464", f"127.0.0.1:{prometheus}")
    (tmp_path / "collector.yaml").write_text(config)
    log = open(tmp_path / "collector.log", "wb")
    proc = subprocess.Popen([collector, "--config", str(tmp_path / "collector.yaml")], stdout=log,
                            stderr=subprocess.STDOUT, env=_loopback_env())
    try:
        deadline = time.monotonic() + 60
        while not _listening(otlp):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "collector.log").read_text()
            time.sleep(0.2)
        _sample(onnx_bundle.bundle, f"http://127.0.0.1:{otlp}", digits_images / "val", tmp_path)
        text = ""
        while "edgesdk_predictions_total" not in text and time.monotonic() < deadline:
            time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{prometheus}/metrics", timeout=5) as resp:
                text = resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    for name in ("edgesdk_predictions_total", "edgesdk_inference_duration_seconds_bucket",
                 "edgesdk_monitor_signal_level", "edgesdk_memory_usage_bytes"):
        assert name in text, name
    assert 'edgesdk_bundle_name="' in text and 'edgesdk_stage="inference"' in text
