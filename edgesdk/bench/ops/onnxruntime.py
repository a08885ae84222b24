"""Per-node time of an ONNX model on ONNX Runtime's CPU provider, from its own profiler.

The session is opened as edgesdk's engine opens it (all graph optimizations, the same threads) with
``enable_profiling``; ONNX Runtime then writes one ``<node>_kernel_time`` event per node and run, naming the kernel
(``op_name``: ``QLinearConv`` once a QDQ group is fused into an integer kernel, ``Conv`` when it runs in float) and
the provider. A node's time is its median over the timed runs. In an INT8 (QDQ) model a multiplying node that still
runs a float kernel, or a DequantizeLinear/QuantizeLinear left standing, is where INT8 loses its gain.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from ...choices import BackendReason
from ...errors import BackendUnavailable
from ...runtime import timing
from .timing import time_call

# kernels that compute on integers (ONNX Runtime's contrib and standard quantized ops)
INTEGER_KERNELS = {"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
                   "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax",
                   "QLinearReduceMean", "QLinearWhere", "QGemm", "ConvInteger", "MatMulInteger",
                   "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention", "QLinearConvTranspose",
                   "NhwcQLinearConv", "QEmbedLayerNormalization"}
CONVERSIONS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# multiplying ops ONNX Runtime's CPU provider has no integer kernel for (onnxruntime 1.32): their QDQ group stays
# DequantizeLinear -> float op -> QuantizeLinear
NO_INTEGER_KERNEL = {"ConvTranspose"}
# kernels that multiply (where INT8 pays): in an INT8 model one of these in float is a lost gain
MULTIPLYING = {"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm", "NhwcFusedConv",
               "Attention"}


def profile(model_path: Path, feeds: list[np.ndarray], threads: int | None, min_runs: int, min_seconds: float) -> dict:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgesdk-ort-profile-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        try:
            session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT's Fail/InvalidGraph/... on a model it cannot take
            raise BackendUnavailable(BackendReason.LOAD_FAILED,
                                     f"ONNX Runtime cannot load {model_path.name}: {exc}") from exc
        names = [i.name for i in session.get_inputs()]
        feed = dict(zip(names, feeds))
        warm = 2
        for _ in range(warm):
            session.run(None, feed)
        runs = _repeat(lambda: session.run(None, feed), min_runs, min_seconds)
        trace = json.loads(Path(session.end_profiling()).read_text())
        # the whole model's time without the profiler, which costs something per node
        so.enable_profiling = False
        plain = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        whole_ms = time_call(lambda: plain.run(None, feed), min_runs, min_seconds)
    per_node: dict[str, dict] = {}
    for event in trace:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        name = event["name"][: -len("_kernel_time")]
        node = per_node.setdefault(name, {"name": name, "type": args.get("op_name", "?"),
                                          "provider": args.get("provider", "?"), "durations": [],
                                          "precision": _precision(args)})
        node["durations"].append(event["dur"])
    rows = []
    for index, node in enumerate(per_node.values()):
        timed = node["durations"][-runs:] if len(node["durations"]) > runs else node["durations"]
        kind = node["type"]
        kernel = f"{node['provider'].replace('ExecutionProvider', '')} {kind}"
        row = {"index": index, "name": node["name"], "type": kind, "kernel": kernel, "precision": node["precision"],
               "ms": float(np.median(timed)) / 1e3}
        if kind in INTEGER_KERNELS:
            row["integer_kernel"] = True
        elif kind in CONVERSIONS:
            row["conversion"] = True
        rows.append(row)
    return {"whole_ms": whole_ms, "ops": rows, "notes": [],
            "method": "ONNX Runtime's profiler (enable_profiling): each node's kernel time, median over the timed "
                      "runs; kernels as fused by its graph optimizations"}


def _precision(args: dict) -> str:
    """The element type of the node's first input (its output's where it has none), from the profiler's shapes."""
    for key in ("input_type_shape", "output_type_shape"):
        for entry in args.get(key) or []:
            if isinstance(entry, dict) and entry:
                return next(iter(entry))
    return "?"


def _repeat(call, min_runs: int, min_seconds: float) -> int:
    """Run ``call`` as :func:`~.timing.time_call` would (no warm-up); how many runs that was."""
    return len(timing.run_times(call, min_runs=min_runs, max_runs=20 * min_runs, min_s=min_seconds, wall=True).seconds)
