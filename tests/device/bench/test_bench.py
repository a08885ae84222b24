"""edgesdk bench: the percentile arithmetic on known samples, the report's structure, and misuse. No timing asserts:
the numbers are whatever this machine gives; only their presence, types and internal consistency are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.bench.warm import MIN_QUERIES_P90, MIN_QUERIES_P99, BenchOptions, latency_summary, parse_backend, percentile
from edgesdk.errors import InputError
from support import fail_validation

EDGESDK = str(Path(sys.executable).parent / "edgesdk")


def test_nearest_rank_percentiles_on_a_known_sample():
    values = list(range(1, 101))  # 1..100
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50, 90, 99)
    assert percentile(values, 100) == 100 and percentile(values, 0.5) == 1
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0  # ceil(0.5 * 3) = 2nd smallest
    assert percentile([5.0, 1.0, 3.0, 7.0], 50) == 3.0  # ceil(0.5 * 4) = 2nd smallest, not the mean of two
    assert percentile([2.0] * 7, 99) == 2.0
    ten = [0.1 * i for i in range(1, 11)]
    assert percentile(ten, 90) == pytest.approx(0.9) and percentile(ten, 99) == pytest.approx(1.0)


@pytest.mark.parametrize("values, q, message", [([], 50, "empty"), ([1.0], 0, r"in \(0, 100\]"),
                                                ([1.0], 101, r"in \(0, 100\]")])
def test_percentile_misuse(values, q, message):
    with pytest.raises(InputError, match=message):
        percentile(values, q)


def test_the_summary_says_when_too_few_queries_were_run():
    few = latency_summary([0.001] * 10)
    assert few["queries"] == 10 and str(MIN_QUERIES_P90) in few["notes"][0]
    some = latency_summary([0.001] * 100)
    assert str(MIN_QUERIES_P99) in some["notes"][0] and "p99 is indicative" in some["notes"][0]
    enough = latency_summary([i / 1000 for i in range(1, MIN_QUERIES_P99 + 1)])
    assert enough["notes"] == [] and enough["p50_ms"] == pytest.approx(331.0) and enough["max_ms"] == 662.0


def test_options_and_backend_parsing_misuse():
    with pytest.raises(InputError, match="scenario must be one of single-stream, offline, both"):
        BenchOptions(scenario="server")
    with pytest.raises(InputError, match="duration must be > 0"):
        BenchOptions(duration_s=0)
    with pytest.raises(InputError, match="ENGINE:DEVICE:ARTIFACT"):
        parse_backend("onnxruntime-int8")
    assert parse_backend("onnxruntime:CPUExecutionProvider:onnxruntime-int8") == (
        "onnxruntime", "CPUExecutionProvider", "onnxruntime-int8")


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EDGESDK, "bench", *args, "-q"], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def report(digits_bundle, tmp_path_factory) -> dict:
    plot = tmp_path_factory.mktemp("bench") / "cdf.png"
    proc = run_bench(str(digits_bundle.bundle), "--backend", "onnxruntime:CPUExecutionProvider:onnxruntime-int8",
                     "--duration", "0.2", "--json", "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    out["_plot"] = plot
    return out


def test_the_report_has_the_fields_the_issue_names(report):
    (row,) = report["backends"]
    for key in ("engine", "device", "artifact", "precision", "p50_ms", "p90_ms", "p99_ms", "queries", "throughput",
                "cold_start_ms", "peak_rss_mb"):
        assert key in row, key
    assert (row["engine"], row["artifact"], row["precision"]) == ("onnxruntime", "onnxruntime-int8", "int8")
    assert row["queries"] >= MIN_QUERIES_P99 and row["notes"] == []  # enough for a p99, whatever the duration
    assert 0 < row["min_ms"] <= row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert row["throughput"] > 0 and row["offline_setting"]["streams"] >= 1
    assert row["peak_rss_mb"] > row["model_mb"] >= 0 and row["warmup"]["queries"] >= 50
    assert row["fastest"] and report["fastest"] == f"onnxruntime:{row['device']}:onnxruntime-int8"
    assert "latencies_ms" not in row  # kept out of the JSON (the plot has them)
    assert report["method"]["percentiles"] == "nearest rank" and report["machine"]["cpus"] >= 1


def test_cold_start_is_measured_without_and_with_the_compile_cache(report):
    cold = report["backends"][0]["cold_start_ms"]
    assert isinstance(cold["uncached"], (int, float)) and cold["uncached"] > 0, cold
    assert "cached" in cold


def test_plot_writes_a_png(report):
    data = report["_plot"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_all_marks_one_fastest_and_lists_every_viable_backend(digits_bundle):
    proc = run_bench(str(digits_bundle.bundle), "--all", "--scenario", "single-stream", "--duration", "0.1",
                     "--no-cold-start", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    artifacts = {r["artifact"] for r in out["backends"]}
    assert {"litert-int8", "openvino-int8", "onnxruntime-int8", "litert-fp32"} <= artifacts
    assert sum(r["fastest"] for r in out["backends"]) == 1
    fastest = next(r for r in out["backends"] if r["fastest"])
    assert fastest["p50_ms"] == min(r["p50_ms"] for r in out["backends"])
    assert all("throughput" not in r for r in out["backends"])  # single-stream only


@pytest.mark.parametrize("args, message", [
    (["--backend", "onnxruntime-int8"], "ENGINE:DEVICE:ARTIFACT"),
    (["--backend", "onnxruntime:CPUExecutionProvider:onnxruntime-int8", "--all"], "not both"),
    (["--scenario", "server"], "scenario must be one of"),
])
def test_bench_misuse(digits_bundle, args, message):
    proc = run_bench(str(digits_bundle.bundle), *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_backend_is_reported_not_crashed(digits_bundle):
    proc = run_bench(str(digits_bundle.bundle), "--backend", "onnxruntime:CPUExecutionProvider:no-such-artifact",
                     "--duration", "0.1", "--no-cold-start", "--json")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["backends"] == [] and "no-such-artifact" in out["failed"][0]["detail"]


def test_a_failed_artifact_is_measured_only_with_allow_failed(bundle_copy):
    from edgesdk.bench.warm import viable_backends

    fail_validation(bundle_copy, "onnxruntime-int8")
    viable, skipped = viable_backends(bundle_copy)
    assert "onnxruntime-int8" not in {aid for _, _, aid in viable}
    assert {(s["artifact"], s["reason"]) for s in skipped} >= {("onnxruntime-int8", "validation_failed")}
    assert "onnxruntime-int8" in {aid for _, _, aid in viable_backends(bundle_copy, allow_failed=True)[0]}
    backend = "onnxruntime:CPUExecutionProvider:onnxruntime-int8"
    proc = run_bench(str(bundle_copy), "--backend", backend, "--duration", "0.1", "--no-cold-start", "--json")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    failed = json.loads(proc.stdout)["failed"][0]
    assert failed["reason"] == "bench_failed" and failed["detail"].startswith("BundleError: ")  # a member, the type kept
    assert "failed its validation gate" in failed["detail"]
    proc = run_bench(str(bundle_copy), "--backend", backend, "--scenario", "single-stream", "--duration", "0.1",
                     "--no-cold-start", "--allow-failed", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["artifact"] for r in json.loads(proc.stdout)["backends"]] == ["onnxruntime-int8"]


def test_offline_tries_openvinos_throughput_mode_and_reports_the_setting(digits_bundle):
    """In-process (the child's side): every setting tried is listed, the reported one is the best of them."""
    import os

    from edgesdk.bench.warm import measure_backend

    if (os.cpu_count() or 1) < 2:
        pytest.skip("OpenVINO makes a single stream on one CPU: there is no throughput mode to try")
    row = measure_backend(str(digits_bundle.bundle), "openvino", "CPU", "openvino-int8",
                          BenchOptions(scenario="offline", duration_s=0.4, cold_start=False))
    tried = row["offline_tried"]
    assert {"1", "throughput"} <= set(tried), tried
    assert tried["throughput"]["performance"] == "throughput" and tried["throughput"]["parallel_requests"] >= 2
    assert all(t["inferences"] > 0 for t in tried.values())
    best = max(tried.values(), key=lambda t: t["throughput"])
    assert row["throughput"] == best["throughput"]
    assert row["offline_setting"]["performance"] == best["performance"]
    assert "p50_ms" not in row  # offline only
