"""Cold start: bundle open to first result, each run in a fresh Python process.

A process that has already loaded an engine keeps its libraries, allocator and code pages warm, so
cold start is only honest in a new interpreter. Each run is a child of :func:`edgesdk.child_process.run_child`: it
imports edgesdk, opens and verifies the bundle, opens the artifact with its manifest runtime options (as
:meth:`edgesdk.Artifact.open` does), runs the first golden input and answers its timings.
The child imports what a device would import, never torch or the converters.

With ``cache_dir``, one priming run fills the engine's compile cache first (not counted), so the
counted runs measure a warm cache: OpenVINO ``CACHE_DIR``, ONNX Runtime's saved optimized model.
LiteRT's CPU interpreter has none ("n/a").
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..child_process import run_child, tail
from ..choices import BackendReason
from ..errors import BackendUnavailable, BundleError, EdgeSDKError, InputError

TIMINGS = ("import_ms", "bundle_open_ms", "engine_import_ms", "engine_open_ms", "first_inference_ms",
           "open_to_first_result_ms", "process_ms")

# The child reads its arguments as JSON from argv[1]. Times are perf_counter differences in ms;
# the golden file is read outside the timed span (it is test data, not part of serving).
_CHILD = r"""
import time
t0 = time.perf_counter()
import edgesdk
from edgesdk.bundle.reader import Bundle
from edgesdk.engines import engine_class, open_engine
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.numerics import golden_feeds, golden_outputs
t1 = time.perf_counter()
args = ARGS
try:
    bundle = Bundle.open(args["bundle"])
    art = bundle.artifact(args["artifact"])
    t2 = time.perf_counter()
    golden = bundle.golden()
    feeds = golden_feeds(golden, len(bundle.manifest["inputs"]))[0]  # each input's exact shape and dtype
    options = art.engine_options(device=args["device"], cache_dir=args["cache_dir"])
    if args["threads"] is not None:
        options["num_threads"] = args["threads"]
    t3 = time.perf_counter()
    backend = engine_class(args["engine"])
    t3b = time.perf_counter()
    engine = open_engine(args["engine"], art.model_path, **options)
    t4 = time.perf_counter()
    outs = engine.run(feeds)
    t5 = time.perf_counter()
except EdgeSDKError as exc:
    answer({"error": type(exc).__name__, "reason": getattr(exc, "reason", None),
            "detail": getattr(exc, "detail", str(exc))})
    sys.exit(3)
ref = golden_outputs(golden, 1)[0][0]  # the first sample's first output
diff = float(abs(outs[0] - ref).max()) if ref.shape == outs[0].shape else None
ms = lambda a, b: (b - a) * 1e3
answer({
    "import_ms": ms(t0, t1), "bundle_open_ms": ms(t1, t2), "engine_import_ms": ms(t3, t3b),
    "engine_open_ms": ms(t3, t4), "first_inference_ms": ms(t4, t5), "open_to_first_result_ms": ms(t1, t2) + ms(t3, t5),
    "cache": backend.compile_cache(args["device"]), "cache_state": engine.cache_state,
    "executing": list(engine.executing), "max_abs_diff": diff,
    "heavy_modules": sorted(m for m in ("torch", "nncf", "litert_torch", "edgesdk_converters", "converters",
                                        "tensorflow", "ai_edge_quantizer", "onnx") if m in sys.modules),
})
"""


def cold_start(bundle_path: str | Path, engine: str, device: str, artifact: str, *,
               cache_dir: str | Path | None = None, runs: int = 3, threads: int | None = None,
               timeout: float = 300.0) -> dict[str, Any]:
    """Measure bundle open to first result for one artifact on ``engine``/``device``, ``runs`` times.

    Returns the medians over the counted runs under the keys of :data:`TIMINGS` (all in ms), with
    ``median_ms`` the median of ``open_to_first_result_ms`` (bundle open and verify, engine open or
    compile, first inference; the import of edgesdk is ``import_ms``, apart; ``engine_open_ms``
    includes importing the engine package, ``engine_import_ms``, as an application's first load
    does; ``process_ms`` is the whole child process, interpreter start to exit, as the parent saw it),
    and:

    - ``runs``: each counted run's timings plus ``cache_state``, ``executing`` and ``max_abs_diff``
      (first output against the golden reference);
    - ``priming``: the uncounted run that filled the cache (None without ``cache_dir``);
    - ``cache``: what compile cache the engine has on this device: "CACHE_DIR", "optimized model"
      or "n/a"; ``cached``: whether the counted runs used it. With ``cache_dir`` on an engine that
      has no cache, only the priming run happens and the timings are None.

    Each child is killed after ``timeout`` seconds. A child that fails raises the child's own error
    type when it was an edgesdk error (``BackendUnavailable`` with its reason, ``BundleError``...),
    else ``BackendUnavailable("cold_start_failed")`` quoting the end of its stderr.
    """
    if runs < 1:
        raise ValueError(f"cold_start needs runs >= 1, got {runs}")
    if threads is not None and threads < 1:
        raise ValueError(f"cold_start needs threads >= 1 or None, got {threads}")
    args = {"bundle": str(Path(bundle_path).resolve()), "engine": engine, "device": device, "artifact": artifact,
            "cache_dir": str(Path(cache_dir).resolve()) if cache_dir is not None else None, "threads": threads}
    result: dict[str, Any] = {"bundle": args["bundle"], "engine": engine, "device": device, "artifact": artifact,
                              "threads": threads, "cache_dir": args["cache_dir"], "priming": None}
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        result["priming"] = _child(args, timeout)
        if result["priming"]["cache"] is None:
            return {**result, "cache": "n/a", "cached": False, "runs": [], "median_ms": None,
                    **{key: None for key in TIMINGS}}
    measured = [_child(args, timeout) for _ in range(runs)]
    applies = measured[0]["cache"]
    medians = {key: statistics.median(run[key] for run in measured) for key in TIMINGS}
    return {**result, "cache": applies or "n/a",
            "cached": cache_dir is not None and all(run["cache_state"] == "hit" for run in measured),
            "runs": measured, "median_ms": medians["open_to_first_result_ms"], **medians}


def _child(args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One fresh process (:func:`edgesdk.child_process.run_child`); its timings, with ``process_ms`` measured from
    here."""
    where = f"cold start of {args['artifact']} on {args['engine']}:{args['device']}"
    try:
        run = run_child(_CHILD, args, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BackendUnavailable(BackendReason.COLD_START_TIMEOUT, f"{where} did not finish in {timeout:g} s (killed); "
                                                                   f"stderr tail: {tail(exc.stderr)}") from exc
    except OSError as exc:
        raise BackendUnavailable(BackendReason.COLD_START_FAILED,
                                 f"{where}: cannot start {sys.executable}: {exc}") from exc
    report = run.answer if isinstance(run.answer, dict) else None
    if report is None:
        raise BackendUnavailable(BackendReason.COLD_START_FAILED,
                                 f"{where}: the child {run.how_it_ended()} and no result; "
                                 f"stderr tail: {run.stderr_tail()}")
    if "error" in report:
        raise _child_error(report, where)
    report["process_ms"] = run.elapsed_ms
    return report


def _child_error(report: dict[str, Any], where: str) -> EdgeSDKError:
    """The child's edgesdk error, as the same type where it has one, saying it came from the cold start."""
    kind, reason, detail = report.get("error"), report.get("reason"), report.get("detail") or ""
    if kind == "BackendUnavailable":
        return BackendUnavailable(BackendReason.lookup(reason or "") or BackendReason.COLD_START_FAILED,
                                  f"{where}: {detail}")
    if kind == "BundleError":
        return BundleError(f"{where}: {detail}")
    if kind == "InputError":
        return InputError(f"{where}: {detail}")
    return EdgeSDKError(f"{where}: {kind}: {detail}")
