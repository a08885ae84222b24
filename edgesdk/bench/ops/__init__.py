"""``edgesdk bench --ops``: where the time of one inference goes, op by op, on every engine, INT8 beside float.

Each engine reports through its own profiler, in a fresh child process per artifact (as ``edgesdk bench`` measures):
LiteRT has none in Python, so each op is cut out and timed alone (:mod:`.litert`); ONNX Runtime's profiling JSON
(:mod:`.onnxruntime`); OpenVINO's performance counters (:mod:`.openvino`). Every op row carries the same fields:
``name``, ``type``, ``kernel`` (what ran it), ``precision`` (what it computed in), ``ms`` (median per inference),
and ``fast``: False where the op ran outside the engine's fast kernels, with ``why``:

- LiteRT: outside XNNPACK (LiteRT's builtin kernels, one op at a time, with a copy at each partition edge);
- ONNX Runtime: in an INT8 artifact, a multiplying node (Conv, MatMul, Gemm...) that runs a float kernel because its
  QDQ group was not fused into an integer kernel;
- OpenVINO: a oneDNN reference kernel (``ref_*``), or in an INT8 artifact a multiplying layer that did not run in
  int8.

The report pairs each engine's ``-fp32`` and ``-int8`` artifacts: time per op type side by side, the ops aligned by
name where both graphs have them, and the INT8 ops off the fast kernels counted (``slow_int8_ops``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from ...choices import BackendReason
from ...errors import BackendUnavailable, InputError

MIN_RUNS = 30  # timed runs per op (LiteRT) or per model (ONNX Runtime, OpenVINO), after warm-up ...
MIN_SECONDS = 0.02  # ... and at least this long
CHILD_TIMEOUT_S = 1800
PROFILERS = ("litert", "onnxruntime", "openvino")
INTEGER_TYPES = ("int8", "uint8", "int16")  # what a quantized op computes in (int32 index math is not INT8's)
# each engine's spelling of an element type -> numpy's (ONNX Runtime's profiler says "float", OpenVINO "f32")
PRECISION_NAMES = {"float": "float32", "f32": "float32", "fp32": "float32", "double": "float64", "f16": "float16",
                   "fp16": "float16", "bf16": "bfloat16", "i8": "int8", "u8": "uint8", "i16": "int16",
                   "i32": "int32", "i64": "int64", "boolean": "bool"}


def profile_artifact(bundle_path: str | Path, artifact_id: str, threads: int | None = None,
                     min_runs: int = MIN_RUNS, min_seconds: float = MIN_SECONDS) -> dict:
    """One artifact's op rows, in this process (the child's side of :func:`ops_report`), on the bundle's golden
    input 0 (preprocessed, batch 1)."""
    from ...bundle.reader import Bundle
    from ...runtime.numerics import golden_feeds

    bundle = Bundle.open(bundle_path)
    art = bundle.artifact(artifact_id)
    feeds = golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]
    return {"artifact": art.id, **profile_model(art.engine, art.model_path, art.precision, feeds, threads, min_runs,
                                                min_seconds, precision_hint=art.runtime.get("precision_hint"))}


def profile_model(engine: str, model_path: Path, precision: str, feeds: list, threads: int | None = None,
                  min_runs: int = MIN_RUNS, min_seconds: float = MIN_SECONDS,
                  precision_hint: str | None = None) -> dict:
    """The op rows of one model file on ``engine``'s CPU, in this process, with ``fast``/``why`` set per row
    (``precision``: the artifact's, fp32 or int8; ``precision_hint``: OpenVINO's, as the artifact records it)."""
    if engine not in PROFILERS:
        raise BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT, f"no op profiler for engine {engine!r}")
    if engine == "litert":
        from . import litert as profiler

        found = profiler.profile(Path(model_path), feeds, threads, min_runs, min_seconds)
    elif engine == "onnxruntime":
        from . import onnxruntime as profiler

        found = profiler.profile(Path(model_path), feeds, threads, min_runs, min_seconds)
    else:
        from . import openvino as profiler

        found = profiler.profile(Path(model_path), feeds, threads, min_runs, min_seconds,
                                 precision_hint=precision_hint)
    for row in found["ops"]:
        row["precision"] = PRECISION_NAMES.get(str(row["precision"]).lower(), str(row["precision"]).lower())
        row["fast"], why = _fast(engine, precision, row)
        if why:
            row["why"] = why
    timed = [r["ms"] for r in found["ops"] if r.get("ms") is not None]
    return {"engine": engine, "precision": precision, **found, "ops_ms": round(sum(timed), 4),
            "slow_ops": sum(1 for r in found["ops"] if not r["fast"])}


def why_slower(comparison: dict, top: int = 4) -> str:
    """One line on where an engine's INT8 artifact loses to its float one (an entry of :func:`compare`): the op
    types slower in int8, and the int8 ops off the fast kernels."""
    total = sum(e["int8_ms"] for e in comparison["by_type"]) or 1.0
    slower = [e for e in comparison["by_type"] if e["int8_ops"] and e["fp32_ops"]
              and e["int8_ms"] - e["fp32_ms"] > 0.02 * total]  # a type that changes nothing is noise here
    parts = []
    if slower:
        parts.append("op types slower in int8 (summed per inference): " + ", ".join(
            f"{e['type']} {e['int8_ms']:.3f} vs {e['fp32_ms']:.3f} ms ({e['int8_ops']} ops)" for e in slower[:top]))
    if comparison["slow_int8_ops"]:
        parts.append(f"{comparison['slow_int8_ops']} int8 op(s) off the engine's fast kernels "
                     f"({', '.join(comparison['slow_int8_types'][:top])})")
    else:
        parts.append("every int8 op in the engine's fast kernels")
    return "; ".join(parts)


def _fast(engine: str, precision: str, row: dict) -> tuple[bool, str | None]:
    """Whether ``row`` ran in the engine's fast kernels, and why not."""
    if engine == "litert":
        from .litert import KERNEL_FAST

        if row["kernel"] == KERNEL_FAST:
            return True, None
        return False, f"outside XNNPACK: XNNPACK takes no {row['precision']} {row['type']} here, so LiteRT's builtin " \
                      "kernel runs it, with a copy at each edge of an XNNPACK partition"
    if engine == "onnxruntime":
        from .onnxruntime import MULTIPLYING, NO_INTEGER_KERNEL

        if precision == "int8" and row["type"] in MULTIPLYING and not row.get("integer_kernel") \
                and row["precision"].startswith("float"):
            if row["type"] in NO_INTEGER_KERNEL:
                return False, f"float {row['type']} kernel in an INT8 model: ONNX Runtime's CPU provider has no " \
                              f"integer {row['type']} kernel, so its QDQ group runs as DequantizeLinear, float " \
                              f"{row['type']}, QuantizeLinear"
            return False, f"float {row['type']} kernel in an INT8 model: its QuantizeLinear/DequantizeLinear group " \
                          "was not fused into an integer kernel"
        return True, None
    from .openvino import MULTIPLYING as OV_MULTIPLYING

    if row.get("reference_kernel"):
        return False, f"oneDNN reference kernel ({row['kernel']}): no optimized {row['precision']} {row['type']} here"
    if precision == "int8" and row["type"] in OV_MULTIPLYING and row["precision"] not in ("int8", "uint8"):
        return False, f"{row['type']} ran in {row['precision']}, not int8 (its FakeQuantize was not folded into it)"
    return True, None


# -- the parent: which artifacts, children, pairing ----------------------------------------------------------------

def artifacts_to_profile(bundle_path: str | Path, backends: Sequence[tuple[str, str, str]] | None) -> list[str]:
    """The artifacts ``--ops`` profiles: for each engine named by ``backends`` (None: every engine installed here
    that can run one of the bundle's artifacts), all of that engine's artifacts in the bundle (its fp32 and int8)."""
    from ...bundle.reader import Bundle
    from ...engines import backend_names

    bundle = Bundle.open(bundle_path)
    for _, _, artifact in backends or ():
        bundle.artifact(artifact)  # one the bundle does not have is refused, as plain bench refuses it
    engines = [b[0] for b in backends] if backends else [e for e in backend_names() if e in PROFILERS]
    chosen = [a.id for a in bundle.artifacts if a.engine in engines]
    if not chosen:
        raise BackendUnavailable(BackendReason.NO_CANDIDATE,
                                 f"no artifact of {Path(bundle_path).name} for {', '.join(engines) or 'any engine'} "
                                 "that edgesdk can profile (litert, onnxruntime, openvino)")
    return chosen


def ops_report(bundle_path: str | Path, artifacts: Sequence[str], threads: int | None = None,
               min_runs: int = MIN_RUNS, min_seconds: float = MIN_SECONDS,
               progress: Callable[[str], None] | None = None) -> dict:
    """Profile each artifact in a fresh child process and pair each engine's fp32 and int8 artifacts."""
    from ..warm import _machine

    say = progress or (lambda text: None)
    bundle_path = str(Path(bundle_path).resolve())
    profiles, failed = [], []
    for i, artifact in enumerate(artifacts, 1):
        say(f"[{i}/{len(artifacts)}] {artifact}: profiling op by op")
        try:
            profiles.append(_child(bundle_path, artifact, threads, min_runs, min_seconds))
        except BackendUnavailable as exc:
            failed.append({"artifact": artifact, "reason": exc.reason, "detail": exc.detail})
            say(f"  failed: {exc.reason}: {exc.detail[:200]}")
    return {"bundle": bundle_path, "machine": _machine(), "profiles": profiles, "failed": failed,
            "comparisons": compare(profiles)}


def compare(profiles: list[dict]) -> list[dict]:
    """Per engine with both an fp32 and an int8 profile: time per op type side by side, the ops aligned by name,
    and the int8 ops off the fast kernels."""
    by_engine: dict[str, dict[str, dict]] = defaultdict(dict)
    for p in profiles:
        by_engine[p["engine"]][p["precision"]] = p
    out = []
    for engine, pair in by_engine.items():
        if "fp32" not in pair or "int8" not in pair:
            continue
        fp32, int8 = pair["fp32"], pair["int8"]
        types: dict[str, dict[str, Any]] = defaultdict(lambda: {"fp32_ms": 0.0, "int8_ms": 0.0, "fp32_ops": 0,
                                                               "int8_ops": 0})
        for side, prof in (("fp32", fp32), ("int8", int8)):
            for row in prof["ops"]:
                entry = types[_base_type(engine, row["type"])]
                entry[f"{side}_ms"] += row.get("ms") or 0.0
                entry[f"{side}_ops"] += 1
        fp32_by_name = {(_align(engine, r["name"]), r["type"]): r for r in fp32["ops"]}
        aligned = []
        for row in int8["ops"]:  # the same name and type (a fused op takes over its activation's output name)
            twin = fp32_by_name.get((_align(engine, row["name"]), row["type"]))
            if twin is not None and row.get("ms") is not None and twin.get("ms") is not None:
                aligned.append({"name": row["name"], "type": row["type"], "fp32_ms": twin["ms"], "int8_ms": row["ms"],
                                "int8_kernel": row["kernel"], "fp32_kernel": twin["kernel"], "fast": row["fast"]})
        # the float model's own ops off the fast kernels: an int8 op of the same type there is no INT8 loss
        float_slow = {r["type"] for r in fp32["ops"] if not r["fast"]}
        for r in int8["ops"]:
            if r["fast"]:
                continue
            if r["type"] in float_slow:
                r["why"] += f"; the float model's {r['type']} ops are off the fast kernels too"
                r["float_too"] = True
            elif engine == "litert" and any(o["type"] == r["type"] and o["fast"] for o in int8["ops"]):
                r["why"] = (f"outside XNNPACK, which takes the other int8 {r['type']} ops: its int8 kernels refuse "
                            "some quantization parameters (an input scale far from the output's, a broadcast shape)")
        slow = [r for r in int8["ops"] if not r["fast"] and not r.get("float_too")
                and (r["precision"] in INTEGER_TYPES or engine != "litert")]
        out.append({"engine": engine, "fp32": fp32["artifact"], "int8": int8["artifact"],
                    "whole_ms": {"fp32": fp32.get("whole_ms"), "int8": int8.get("whole_ms")},
                    "ratio": (int8["whole_ms"] / fp32["whole_ms"]) if fp32.get("whole_ms") and int8.get("whole_ms")
                    else None,
                    "by_type": sorted(({"type": t, **v} for t, v in types.items()),
                                      key=lambda e: -max(e["fp32_ms"], e["int8_ms"])),
                    "aligned": aligned, "slow_int8_ops": len(slow),
                    "slow_int8_types": sorted({f"{r['type']} ({r['precision']})" for r in slow})})
    return out


# ONNX Runtime's kernels by the op they compute: an integer or fused kernel beside the float op it replaces
_ORT_BASE = {"QGemm": "Gemm", "NhwcQLinearConv": "Conv", "FusedConv": "Conv", "NhwcFusedConv": "Conv",
             "FusedMatMul": "MatMul", "FusedGemm": "Gemm", "MatMulInteger": "MatMul", "ConvInteger": "Conv",
             "QLinearConvTranspose": "ConvTranspose"}


def _base_type(engine: str, kind: str) -> str:
    """The op a kernel computes, so that int8 and float kernels of one op share a row (ONNX Runtime's QLinearConv
    and Conv are both Conv)."""
    if engine != "onnxruntime":
        return kind
    return _ORT_BASE.get(kind) or (kind[len("QLinear"):] if kind.startswith("QLinear") else kind)


_SUFFIXES = ("_quant", "_QuantizeLinear", "_DequantizeLinear")


def _align(engine: str, name: str) -> str:
    """A node's name as both of an engine's artifacts spell it (ONNX Runtime's quantizer renames fused nodes)."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _child(bundle_path: str, artifact: str, threads: int | None, min_runs: int, min_seconds: float) -> dict:
    from ..warm import child_answer

    args = {"bundle": bundle_path, "artifact": artifact, "threads": threads, "min_runs": min_runs,
            "min_seconds": min_seconds}
    return child_answer("edgesdk.bench.ops", args, "profiling")


def _child_main(args: dict, answer) -> None:
    from ...errors import EdgeSDKError

    try:
        found = profile_artifact(args["bundle"], args["artifact"], args["threads"], args["min_runs"],
                                 args["min_seconds"])
    except EdgeSDKError as exc:
        answer({"error": type(exc).__name__, "reason": getattr(exc, "reason", None), "detail": str(exc)})
        return
    answer(found)


# -- output ----------------------------------------------------------------------------------------------------

def table(report: dict, top: int = 12) -> str:
    """Per engine: the whole model's time and the sum of its ops, time by op type int8 beside fp32, the slowest
    int8 ops beside their fp32 twins, and every int8 op off the fast kernels with why."""
    if top < 0:
        raise InputError(f"top must be >= 0, got {top}")
    lines = []
    paired = {c["engine"] for c in report["comparisons"]}
    for comp in report["comparisons"]:
        prof = {p["artifact"]: p for p in report["profiles"]}
        fp32, int8 = prof[comp["fp32"]], prof[comp["int8"]]
        ratio = f"{comp['ratio']:.2f}" if comp["ratio"] is not None else "-"
        lines.append(f"== {comp['engine']}: {comp['int8']} against {comp['fp32']}: whole model "
                     f"{_ms(int8.get('whole_ms'))} vs {_ms(fp32.get('whole_ms'))} ms (int8/fp32 {ratio}); "
                     f"ops summed {_ms(int8['ops_ms'])} vs {_ms(fp32['ops_ms'])} ms")
        lines.append(f"   {'op type':<28} {'fp32 ms':>9} {'n':>4} {'int8 ms':>9} {'n':>4} {'int8/fp32':>9}")
        for e in comp["by_type"][: max(top, 1)]:
            r = f"{e['int8_ms'] / e['fp32_ms']:.2f}" if e["fp32_ms"] > 0 and e["int8_ops"] else "-"
            lines.append(f"   {e['type'][:28]:<28} {_ms(e['fp32_ms']):>9} {e['fp32_ops']:>4} {_ms(e['int8_ms']):>9} "
                         f"{e['int8_ops']:>4} {r:>9}")
        slowest = sorted(comp["aligned"], key=lambda a: -a["int8_ms"])[:top]
        if slowest:
            lines.append(f"   slowest int8 ops beside fp32 (aligned by name, {len(comp['aligned'])} of "
                         f"{len(int8['ops'])}):")
            for a in slowest:
                lines.append(f"     {_short(a['name']):<48} {a['type'][:20]:<20} {_ms(a['fp32_ms']):>8} -> "
                             f"{_ms(a['int8_ms']):>8} ms  {a['int8_kernel'][:36]}")
        lines.append(f"   int8 ops off the fast kernels: {comp['slow_int8_ops']}"
                     + (f" ({', '.join(comp['slow_int8_types'])})" if comp["slow_int8_types"] else ""))
        lines.extend(_slow_lines(int8, top))
        lines.extend(f"   note: {n}" for n in int8.get("notes", []) + fp32.get("notes", []))
    for p in report["profiles"]:
        if p["engine"] in paired:
            continue
        lines.append(f"== {p['engine']}: {p['artifact']} ({p['precision']}): whole model {_ms(p.get('whole_ms'))} ms, "
                     f"ops summed {_ms(p['ops_ms'])} ms, {p['slow_ops']} op(s) off the fast kernels")
        for row in sorted(p["ops"], key=lambda r: -(r.get("ms") or 0))[:top]:
            lines.append(f"     {_short(row['name']):<48} {row['type'][:20]:<20} {_ms(row.get('ms')):>8} ms  "
                         f"{row['kernel'][:36]} {row['precision']}")
        lines.extend(_slow_lines(p, top))
    for f in report["failed"]:
        lines.append(f"failed {f['artifact']}: {f['reason']}: {f['detail'][:200]}")
    m = report["machine"]
    lines.append(f"measured on {m['isa_class']} ({m['processor']}, {m['cpus']} cpus); golden input 0, batch 1; "
                 "per-op times are medians, an op's alone (LiteRT) or its kernel's (ONNX Runtime, OpenVINO)")
    return "\n".join(lines)


def _slow_lines(profile: dict, top: int) -> list[str]:
    slow = [r for r in profile["ops"] if not r["fast"]]
    lines = [f"     off the fast kernels: {_short(r['name'])} ({r['type']}, {r['precision']}, {_ms(r.get('ms'))} ms): "
             f"{r['why']}" for r in sorted(slow, key=lambda r: -(r.get("ms") or 0))[:top]]
    if len(slow) > top:
        lines.append(f"     ... and {len(slow) - top} more (--json lists every op)")
    return lines


def _short(name: str, width: int = 48) -> str:
    """A name cut to ``width`` from its end (litert-torch's tensor names share a long prefix)."""
    return name if len(name) <= width else "..." + name[-(width - 3):]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


__all__ = ["ops_report", "profile_artifact", "artifacts_to_profile", "compare", "table", "PROFILERS"]
