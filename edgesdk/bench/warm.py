"""``edgesdk bench``: MLPerf-style numbers for a bundle on this device, per backend, measured the same way for all.

What is measured, for each backend (engine, device, artifact), in a fresh child process of its own (so one engine's
threads and memory do not colour the next one's numbers, and the peak RSS is that backend's alone):

- **single-stream**: one query at a time on the same preprocessed input (the golden input of the bundle), after a
  warm-up (``WARMUP_S`` seconds and at least ``WARMUP_QUERIES`` queries, excluded and stated); latency p50, p90,
  p99 by the nearest-rank method. MLPerf LoadGen's early-stopping rule needs at least 64 queries for a p90 and 662
  for a p99: the run continues until ``duration_s`` has passed *and* 662 queries were made (capped at
  ``MAX_DURATION_FACTOR`` times the duration), and says so when fewer were run.
- **offline**: throughput in inferences per second with the backend's best parallel setting: 1 to ``os.cpu_count()``
  streams, each a model instance of its own on its own thread (threads split between them), and the engine's own
  throughput mode where it has one (OpenVINO ``PERFORMANCE_HINT=THROUGHPUT`` with its optimal number of requests in
  flight, through ``Model.predict_batch``); the best is reported with its setting. (Artifacts are compiled for
  batch 1, so there is no batch to raise.)
- **cold start**: bundle open to first result in a fresh process, without and with the engine's compile cache
  (:mod:`edgesdk.bench.cold`), where one applies.
- **memory**: the child's peak RSS, and the model's memory (RSS growth over the load).
- the placement's precision and effective precision (what the engine computes in).

``--all`` runs every viable backend and marks the fastest (by single-stream p50). An artifact that failed its
validation gate at quantize time is measured only with ``allow_failed`` (CLI ``--allow-failed``), as it is served.

Each backend is loaded as asked and only so (``edgesdk.load(..., engine=, device=, artifact=, fallback=False,
speed_check="off")``): no other artifact stands in for one that does not load, and no speed decision (an INT8
measured slower than FP32 here, cached by an earlier load) moves it. One that does not load (its numerics check
refuses it, the engine cannot read or compile it, the device is missing) is reported in ``failed`` with load's
reason and detail, and the other backends are still measured.
The report is a dict (``--json`` prints it) whose ``backends`` entries carry ``engine``, ``device``, ``artifact``,
``precision``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``queries``, ``throughput``, ``cold_start_ms`` and
``peak_rss_mb``, among others.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..choices import BackendReason
from ..errors import BackendUnavailable, InputError
from ..runtime import timing

SCENARIOS = ("single-stream", "offline", "both")
MIN_QUERIES_P90 = 64  # MLPerf LoadGen early stopping: the fewest queries for a p90 ...
MIN_QUERIES_P99 = 662  # ... and for a p99
WARMUP_S = 1.0
WARMUP_QUERIES = 50
MAX_DURATION_FACTOR = 10.0  # a slow model stops at this many durations even if 662 queries were not reached
CHILD_TIMEOUT_S = 1800


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100): the smallest value with at least q% of the values at or
    below it, as MLPerf LoadGen reports latencies. Raises :class:`InputError` on an empty sample."""
    if not 0 < q <= 100:
        raise InputError(f"percentile must be in (0, 100], got {q}")
    data = sorted(values)
    if not data:
        raise InputError("percentile of an empty sample")
    rank = math.ceil(q / 100.0 * len(data))
    return float(data[max(rank, 1) - 1])


def latency_summary(seconds: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99 in milliseconds of per-query latencies, with notes when too few queries were run for one."""
    ms = [s * 1e3 for s in seconds]
    n = len(ms)
    notes = []
    if n < MIN_QUERIES_P90:
        notes.append(f"{n} queries: fewer than the {MIN_QUERIES_P90} a p90 needs (MLPerf early stopping); p90 and "
                     "p99 are indicative only")
    elif n < MIN_QUERIES_P99:
        notes.append(f"{n} queries: fewer than the {MIN_QUERIES_P99} a p99 needs (MLPerf early stopping); p99 is "
                     "indicative only")
    return {"p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
            "mean_ms": float(np.mean(ms)), "min_ms": min(ms), "max_ms": max(ms), "queries": n, "notes": notes}


@dataclass(frozen=True)
class BenchOptions:
    scenario: str = "both"
    duration_s: float = 5.0
    cold_start: bool = True
    cold_runs: int = 3
    threads: int | None = None
    allow_failed: bool = False  # measure artifacts that failed their validation gate too (load's allow_failed)

    def __post_init__(self):
        if self.scenario not in SCENARIOS:
            raise InputError(f"scenario must be one of {', '.join(SCENARIOS)}, got {self.scenario!r}")
        if not self.duration_s > 0:
            raise InputError(f"duration must be > 0 seconds, got {self.duration_s}")


# -- inside the child: one backend ------------------------------------------------------------------------------

def measure_backend(bundle_path: str, engine: str, device: str, artifact: str, options: BenchOptions,
                    progress: Callable[[str], None] = lambda text: None) -> dict:
    """Single-stream and offline numbers for one backend, in this process (the child's side of :func:`bench`)."""
    import edgesdk
    from edgesdk import Bundle
    from edgesdk.budgets.memory import rss_mb

    bundle = Bundle.open(bundle_path)
    from edgesdk.runtime.numerics import golden_feeds

    x = golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]  # each input's exact shape and dtype
    x = x[0] if len(x) == 1 else x
    before = rss_mb()
    # Exactly this backend: no other candidate stands in when it does not load (fallback=False: load raises its
    # reason), and no speed decision, timed now or cached by an earlier load here, moves it (with an artifact named
    # none applies; "off" says so).
    load = {"engine": engine, "device": device, "artifact": artifact, "fallback": False, "speed_check": "off",
            "policy": "auto", "threads": options.threads, "allow_failed": options.allow_failed}
    model = edgesdk.load(bundle_path, **load)
    model_mb = max(rss_mb() - before, 0.0)
    placement = model.placement
    if (placement.engine, placement.artifact) != (engine, artifact):  # a guard: fallback=False rules this out
        model.close()
        raise BackendUnavailable(BackendReason.NOT_PLACED, f"asked for {engine}:{device}:{artifact}, load placed it on "
                                 f"{placement.engine}:{placement.device}:{placement.artifact}")
    row: dict[str, Any] = {"engine": engine, "device": placement.device, "kind": placement.kind,
                           "artifact": artifact, "precision": placement.precision,
                           "effective_precision": placement.effective_precision or placement.precision,
                           "executing": placement.executing, "model_mb": round(model_mb, 1)}
    # The warm-up, then (single-stream) queries until duration_s has passed and a p99's worth were made, or the cap:
    # timed by the one timing loop autotune and the speed checks use (edgesdk.runtime.timing).
    warm = timing.run_times(lambda: model.predict(x), warmup=WARMUP_QUERIES, warmup_s=WARMUP_S, max_runs=0)
    row["warmup"] = {"queries": warm.warmup_runs, "seconds": round(warm.warmup_s, 3)}
    if options.scenario in ("single-stream", "both"):
        progress(f"{engine}:{placement.device}:{artifact}: single-stream")
        lat = list(timing.run_times(lambda: model.predict(x), min_runs=MIN_QUERIES_P99, min_s=options.duration_s,
                                    max_s=options.duration_s * MAX_DURATION_FACTOR, wall=True).seconds)
        row.update(latency_summary(lat))
        row["latencies_ms"] = [round(v * 1e3, 4) for v in lat]
    if options.scenario in ("offline", "both"):
        progress(f"{engine}:{placement.device}:{artifact}: offline")
        row.update(_offline(bundle_path, load, x, options, model))
    model.close()
    row["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    return row


def _offline(bundle_path: str, load: dict, x: Any, options: BenchOptions, first: Any) -> dict:
    """Throughput with 1..cpu_count streams (model instances on threads of their own), and, where the engine has
    one, its own throughput mode (``performance="throughput"``: OpenVINO's parallel streams fed by
    ``predict_batch``); the best one wins."""
    import edgesdk
    from edgesdk.engines import engine_class

    cpus = os.cpu_count() or 1
    seconds = max(options.duration_s / 2, 0.5)
    tried = {}
    for streams in range(1, cpus + 1):
        threads = max(1, (options.threads or cpus) // streams)
        models = [first] if streams == 1 else [edgesdk.load(bundle_path, **{**load, "threads": threads,
                                                                           "check_numerics": False})
                                               for _ in range(streams)]
        counts = _run_for(seconds, [lambda m=m: (m.predict(x), 1)[1] for m in models])
        tried[str(streams)] = {"streams": streams, "threads_per_stream": threads if streams > 1 else
                               (load.get("threads") or None), "performance": "latency", **counts}
        for m in models[1:]:
            m.close()
    if engine_class(load["engine"]).throughput_mode:  # an engine that overlaps inferences itself
        model = edgesdk.load(bundle_path, **{**load, "performance": "throughput", "check_numerics": False})
        requests = model.parallel_requests
        if requests > 1:  # one stream on one CPU: nothing to overlap
            chunk = [x] * (4 * requests)
            counts = _run_for(seconds, [lambda: len(model.predict_batch(chunk))])
            tried["throughput"] = {"streams": 1, "threads_per_stream": load.get("threads") or None,
                                   "performance": "throughput", "parallel_requests": requests, **counts}
        model.close()
    best = max(tried, key=lambda k: tried[k]["throughput"])
    setting = {k: v for k, v in tried[best].items() if k not in ("throughput", "inferences", "seconds")}
    return {"throughput": round(tried[best]["throughput"], 1), "offline_setting": setting,
            "offline_tried": {k: {**v, "throughput": round(v["throughput"], 1)} for k, v in tried.items()}}


def _run_for(seconds: float, calls: list[Callable[[], int]]) -> dict:
    """Run each call on a thread of its own, over and over, for ``seconds``; each returns its inference count."""
    counts = [0] * len(calls)
    stop = threading.Event()

    def work(i: int) -> None:
        call = calls[i]
        while not stop.is_set():
            counts[i] += call()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    return {"throughput": sum(counts) / elapsed, "inferences": sum(counts), "seconds": round(elapsed, 3)}


def _peak_rss_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


# -- the parent: which backends, children, the report -------------------------------------------------------------

def viable_backends(bundle_path: str | Path,
                    allow_failed: bool = False) -> tuple[list[tuple[str, str, str]], list[dict]]:
    """Every (engine, device, artifact) that could serve the bundle here, and the artifacts no engine runs or that
    failed their validation gate (those are viable with ``allow_failed``)."""
    from ..bundle.reader import Bundle
    from ..engines import backend_names, discover
    from ..runtime.selection import enumerate_candidates, failed_artifacts, screen_failed

    bundle = Bundle.open(bundle_path)
    discoveries = {name: discover(name) for name in backend_names()}
    cands, skipped = enumerate_candidates(bundle, discoveries)
    cands, refused = screen_failed(cands, failed_artifacts(bundle), allow_failed)
    skipped += refused
    return [(c.engine, c.device, c.artifact) for c in cands], [s.to_dict() for s in skipped]


def parse_backend(text: str) -> tuple[str, str, str]:
    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise InputError(f"--backend must be ENGINE:DEVICE:ARTIFACT (e.g. onnxruntime:CPUExecutionProvider:"
                         f"onnxruntime-int8), got {text!r}")
    return parts[0], parts[1], parts[2]


def bench(bundle_path: str | Path, backends: Sequence[tuple[str, str, str]] | None = None,
          options: BenchOptions | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Measure each backend in a child process (``backends`` None: the one ``edgesdk.load`` picks here) and
    return the report."""
    from .. import __version__
    from ..runtime.loading import load

    options = options or BenchOptions()
    say = progress or (lambda text: None)
    bundle_path = str(Path(bundle_path).resolve())
    if backends is None:
        with load(bundle_path, allow_failed=options.allow_failed) as model:
            p = model.placement
            backends = [(p.engine, p.device, p.artifact)]
    rows, failed = [], []
    for i, (engine, device, artifact) in enumerate(backends, 1):
        label = f"{engine}:{device}:{artifact}"
        say(f"[{i}/{len(backends)}] {label}")
        try:
            row = _child(bundle_path, engine, device, artifact, options)
        except BackendUnavailable as exc:
            failed.append({"backend": label, "reason": exc.reason, "detail": exc.detail})
            say(f"  skipped: {exc.reason}: {exc.detail[:200]}")
            continue
        if options.cold_start:
            row["cold_start_ms"] = _cold(bundle_path, engine, device, artifact, options)
        rows.append(row)
    timed = [r for r in rows if "p50_ms" in r]
    fastest = min(timed, key=lambda r: r["p50_ms"]) if timed else \
        max(rows, key=lambda r: r.get("throughput", 0)) if rows else None
    for r in rows:
        r["fastest"] = r is fastest
    return {"bundle": bundle_path, "edgesdk": __version__, "scenario": options.scenario,
            "options": asdict(options), "machine": _machine(),
            "method": {"input": "the bundle's golden input 0, preprocessed, batch 1",
                       "warmup": f"at least {WARMUP_S:g} s and {WARMUP_QUERIES} queries",
                       "percentiles": "nearest rank", "process": "a fresh child process per backend",
                       "min_queries": {"p90": MIN_QUERIES_P90, "p99": MIN_QUERIES_P99}},
            "backends": rows, "failed": failed,
            "fastest": f"{fastest['engine']}:{fastest['device']}:{fastest['artifact']}" if fastest else None}


def _child(bundle_path: str, engine: str, device: str, artifact: str, options: BenchOptions) -> dict:
    """Measure one backend in a fresh process (:func:`child_answer`): its row, or its error."""
    args = {"bundle": bundle_path, "engine": engine, "device": device, "artifact": artifact,
            "options": asdict(options)}
    return child_answer("edgesdk.bench.warm", args, "benchmark")


def child_answer(module: str, args: dict, what: str) -> dict:
    """Run ``module._child_main(ARGS, answer)`` in a fresh process (:func:`edgesdk.child_process.run_child`) and
    return its dict answer, or raise its error as :class:`BackendUnavailable` (``what`` names the child in it)."""
    from ..child_process import run_child

    try:
        run = run_child(f"from {module} import _child_main\n_child_main(ARGS, answer)\n", args,
                        timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BackendUnavailable(BackendReason.BENCH_TIMEOUT,
                                 f"the {what} child did not finish in {CHILD_TIMEOUT_S} s") \
            from exc
    if run.returncode != 0 or not isinstance(run.answer, dict) or "error" in run.answer:
        err = run.answer if isinstance(run.answer, dict) else {}
        # the child's reason where it is one of ours; another error (InputError, BundleError) is bench_failed,
        # named in the detail
        reason = BackendReason.lookup(err.get("reason") or "") or BackendReason.BENCH_FAILED
        detail = err.get("detail") or f"the {what} child {run.how_it_ended()}: {run.stderr[-1500:].strip()}"
        raise BackendUnavailable(reason, detail if reason != BackendReason.BENCH_FAILED or not err.get("error")
                                 else f"{err['error']}: {detail}")
    return run.answer


def _child_main(args: dict, answer) -> None:
    """Entry of the child process: measure one backend and answer its row (or its edgesdk error)."""
    from ..errors import EdgeSDKError

    options = BenchOptions(**args["options"])
    try:
        row = measure_backend(args["bundle"], args["engine"], args["device"], args["artifact"], options)
    except EdgeSDKError as exc:
        answer({"error": type(exc).__name__, "reason": getattr(exc, "reason", None),
                "detail": getattr(exc, "detail", None) or str(exc)})  # str() would repeat the reason
        return
    answer(row)


def _cold(bundle_path: str, engine: str, device: str, artifact: str, options: BenchOptions) -> dict:
    """Cold start without and with the engine's compile cache (edgesdk.bench.cold), where it applies."""
    try:
        from .cold import cold_start
    except ImportError:
        return {"uncached": None, "cached": None, "note": "cold start measurement is not available"}
    import tempfile

    out: dict[str, Any] = {}
    try:
        plain = cold_start(bundle_path, engine, device, artifact, runs=options.cold_runs, threads=options.threads)
        out["uncached"] = plain.get("median_ms", plain.get("total_ms"))
        out["uncached_detail"] = plain
        with tempfile.TemporaryDirectory(prefix="edgesdk-bench-cache-") as cache:
            cached = cold_start(bundle_path, engine, device, artifact, cache_dir=cache, runs=options.cold_runs,
                                threads=options.threads)
        applies = cached.get("cache")
        out["cached"] = cached.get("median_ms", cached.get("total_ms")) if applies not in (None, "n/a") else None
        out["cache"] = applies
        out["cached_detail"] = cached
    except Exception as exc:  # a cold-start failure must not lose the rest of the report
        out.setdefault("uncached", None)
        out.setdefault("cached", None)
        out["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return out


def _machine() -> dict:
    import platform

    from ..cpu import cpu_class

    cls = cpu_class()
    return {"system": platform.system(), "machine": platform.machine(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": cls["model"], "isa_class": cls["isa_class"], "flags": cls["flags"],
            "isa_caps": cls["isa_caps"]}


# -- output ----------------------------------------------------------------------------------------------------

def table(report: dict) -> str:
    """The report as a text table, one row per backend; the fastest is marked with *."""
    head = f"{'backend':<52} {'precision':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'queries':>7} " \
           f"{'inf/s':>8} {'cold ms':>8} {'cached':>8} {'peak MB':>8}"
    lines = [head, "-" * len(head)]
    for r in report["backends"]:
        cold = r.get("cold_start_ms") or {}
        label = f"{'*' if r.get('fastest') else ' '} {r['engine']}:{r['device']}:{r['artifact']}"
        prec = _short(r["precision"]) + ("" if _short(r["effective_precision"]) == _short(r["precision"]) else
                                         f"/{_short(r['effective_precision'])}")
        lines.append(f"{label:<52} {prec:>9} {_f(r.get('p50_ms'))} {_f(r.get('p90_ms'))} "
                     f"{_f(r.get('p99_ms'))} {r.get('queries', '-'):>7} {_f(r.get('throughput'), 1)} "
                     f"{_f(cold.get('uncached'), 1)} {_f(cold.get('cached'), 1)} {_f(r.get('peak_rss_mb'), 1)}")
        for note in r.get("notes", []):
            lines.append(f"    note: {note}")
        if "offline_setting" in r:
            s = r["offline_setting"]
            mode = (f"performance=throughput, {s['parallel_requests']} requests in flight"
                    if s.get("performance") == "throughput" else f"{s['streams']} stream(s)")
            lines.append(f"    offline: {mode}, {s['threads_per_stream'] or 'default'} thread(s) each")
    for f in report.get("failed", []):
        lines.append(f"  failed {f['backend']}: {f['reason']}: {f['detail'][:160]}")
    lines.append(f"warm-up excluded ({report['method']['warmup']}); percentiles: nearest rank; * fastest p50; "
                 "precision: the artifact's, /what the engine computes in where it differs")
    return "\n".join(lines)


_SHORT = {"float32": "fp32", "f32": "fp32", "bfloat16": "bf16", "float16": "fp16", "f16": "fp16"}


def _short(precision: str | None) -> str:
    return _SHORT.get(str(precision).lower(), str(precision))


def _f(value: float | None, digits: int = 3) -> str:
    return f"{value:>8.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>8}"


def plot(report: dict, path: str | Path) -> Path:
    """A latency CDF per backend (single-stream), as a PNG. Needs matplotlib (``pip install matplotlib``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InputError("--plot needs matplotlib: pip install matplotlib") from exc
    rows = [r for r in report["backends"] if r.get("latencies_ms")]
    if not rows:
        raise InputError("--plot needs single-stream latencies: run with --scenario single-stream or both")
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        ms = np.sort(r["latencies_ms"])
        ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=f"{r['engine']}:{r['artifact']} "
                f"(p50 {r['p50_ms']:.3f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency per query (ms, log scale)")
    ax.set_ylabel("share of queries at or below")
    ax.set_title(f"edgesdk bench: {Path(report['bundle']).name}, single-stream")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


__all__ = ["bench", "BenchOptions", "percentile", "latency_summary", "viable_backends", "parse_backend", "table",
           "plot", "SCENARIOS", "MIN_QUERIES_P90", "MIN_QUERIES_P99"]
