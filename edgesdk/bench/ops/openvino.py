"""Per-layer time of an OpenVINO IR on the CPU, from its performance counters (``PERF_COUNT``).

The model is compiled as edgesdk's engine compiles it (the artifact's recorded precision hint: ``f32`` for the float
reference, latency hint, the same threads) with ``PERF_COUNT=YES``; each executed primitive then reports its time,
its layer type and its ``exec_type``: the oneDNN kernel and the precision it ran in (``brgconv_avx512_amx_1x1_I8``,
``jit_avx512_FP32``, ``ref_any_FP32``). ``ref`` kernels are oneDNN's reference implementations: slow, and what a
precision or layout the fast kernels lack falls back to.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...choices import BackendReason
from ...errors import BackendUnavailable
from .timing import time_call

MULTIPLYING = {"Convolution", "GroupConvolution", "MatMul", "FullyConnected", "Deconvolution",
               "ConvolutionBackpropData", "GroupConvolutionBackpropData"}


def profile(model_path: Path, feeds: list[np.ndarray], threads: int | None, min_runs: int, min_seconds: float,
            precision_hint: str | None = None) -> dict:
    import openvino as ov

    config = {"PERF_COUNT": "YES", "PERFORMANCE_HINT": "LATENCY"}
    if precision_hint:
        config["INFERENCE_PRECISION_HINT"] = precision_hint
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    try:
        compiled = ov.Core().compile_model(str(model_path), "CPU", config)
    except Exception as exc:  # OpenVINO's RuntimeError on a model it cannot read or compile
        raise BackendUnavailable(BackendReason.COMPILE_FAILED,
                                 f"OpenVINO cannot compile {model_path.name}: {exc}") from exc
    request = compiled.create_infer_request()
    feed = {port.any_name: x for port, x in zip(compiled.inputs, feeds)}
    for _ in range(2):
        request.infer(feed)
    per_node: dict[str, dict] = {}
    runs = 0
    start = time.perf_counter()
    while runs < min_runs or time.perf_counter() - start < min_seconds:
        request.infer(feed)
        runs += 1
        for info in request.get_profiling_info():
            if str(info.status).endswith("NOT_RUN") or str(info.status).endswith("OPTIMIZED_OUT"):
                continue
            node = per_node.setdefault(info.node_name, {"name": info.node_name, "type": info.node_type,
                                                        "exec_type": info.exec_type, "times": []})
            node["times"].append(info.real_time.total_seconds() * 1e3)
        if runs >= 20 * min_runs:
            break
    # the whole model's time without the counters, which cost something per primitive
    plain = ov.Core().compile_model(str(model_path), "CPU", {k: v for k, v in config.items() if k != "PERF_COUNT"})
    plain_request = plain.create_infer_request()
    whole_ms = time_call(lambda: plain_request.infer(feed), min_runs, min_seconds)
    rows = []
    for index, node in enumerate(per_node.values()):
        exec_type = str(node["exec_type"])
        precision = exec_type.rsplit("_", 1)[-1].lower() if "_" in exec_type else "?"
        row = {"index": index, "name": node["name"], "type": node["type"], "kernel": exec_type,
               "precision": precision, "ms": float(np.median(node["times"]))}  # named as numpy's by the caller
        if exec_type.startswith("ref"):
            row["reference_kernel"] = True
        rows.append(row)
    return {"whole_ms": whole_ms, "ops": rows, "notes": [],
            "method": "OpenVINO's performance counters (PERF_COUNT=YES): each executed primitive's real time, median "
                      "over the timed runs; exec_type names the oneDNN kernel and the precision it ran in"}
