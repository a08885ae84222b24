"""Where int8 gains and where it does not: a per-operator profile of the int8 and fp32 artifacts of one bundle.

Issue 6 asks for an int8/fp32 p50 ratio of at most 0.5 for LiteRT and OpenVINO on the MobileNetV2-shaped
model, and for a profile that shows why where an engine cannot reach it. This script prints:

- the whole-model p50 of int8 and fp32, interleaved in one run (the ratio the target is about);
- **LiteRT**: every operator of each ``.tflite`` cut out into a one-operator model (same tensors, same
  quantization, same weights) and timed alone with ``invoke`` on the XNNPACK delegate the interpreter applies
  by default; inputs are set once, outside the timing. The interpreter has no per-operator profiler in Python,
  and timing prefixes of the graph is confounded by XNNPACK fusing a PAD into the next convolution;
- **OpenVINO**: the CPU plugin's own per-layer counters (``PERF_COUNT``), with the kernel each layer ran
  (``exec_type``), fp32 compiled with ``INFERENCE_PRECISION_HINT=f32``.

Both are summed by operator kind, and by the three parts of the network: the stem (input QUANTIZE, the NCHW to
NHWC TRANSPOSE, the explicit PAD and the first 3-channel convolution), the body, and the head.

    .venv/bin/python benchmarks/int8_profile.py [--bundle build/bench/mobilenetv2.bundle] [--iters 200]
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from timing import OtherLoad, interleaved  # noqa: E402

PRECISIONS = ("int8", "fp32")


def tflite_model(path: Path):
    """The model as flatbuffer objects, with weights that litert-torch stores past the flatbuffer pulled inside."""
    from ai_edge_litert import schema_py_generated as schema

    raw = path.read_bytes()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(raw, 0))
    for buf in model.buffers:
        if buf.offset and buf.offset > 1:
            buf.data = np.frombuffer(raw[buf.offset:buf.offset + buf.size], np.uint8)
            buf.offset = buf.size = 0
    return model


def one_operator(model, k: int) -> bytes:
    """A model that runs only operator ``k``: its non-constant inputs become the model's inputs."""
    import flatbuffers

    sub = copy.copy(model.subgraphs[0])
    op = sub.operators[k]
    sub.operators = [op]
    sub.inputs = [i for i in op.inputs if i >= 0 and model.buffers[sub.tensors[i].buffer].data is None]
    sub.outputs = list(op.outputs)
    cut = copy.copy(model)
    cut.subgraphs, cut.signatureDefs = [sub], None
    builder = flatbuffers.Builder(1024)
    builder.Finish(cut.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def op_kind(model, op) -> str:
    from ai_edge_litert import schema_py_generated as schema

    code = model.operatorCodes[op.opcodeIndex]
    number = max(code.builtinCode, code.deprecatedBuiltinCode)
    return next(name for name, value in vars(schema.BuiltinOperator).items() if value == number)


def litert_profile(bundle: Path, iters: int) -> dict[str, list[tuple[str, str, float]]]:
    """Per precision: (kind, input shape, p50 us) for every operator, in graph order."""
    from ai_edge_litert.interpreter import Interpreter

    out = {}
    for precision in PRECISIONS:
        model = tflite_model(bundle / "tflite" / f"model_{precision}.tflite")
        sub = model.subgraphs[0]
        calls, rows = {}, []
        for k, op in enumerate(sub.operators):
            interp = Interpreter(model_content=one_operator(model, k), num_threads=os.cpu_count())
            interp.allocate_tensors()
            rng = np.random.default_rng(k)
            for d in interp.get_input_details():
                dtype = np.dtype(d["dtype"])
                value = (rng.integers(-100, 100, d["shape"]) if dtype.kind in "iu" else rng.standard_normal(d["shape"]))
                interp.set_tensor(d["index"], value.astype(dtype))
            calls[k] = interp.invoke
            rows.append((op_kind(model, op), "x".join(map(str, sub.tensors[op.inputs[0]].shape))))
        times = interleaved(calls, iters, warmup=10, block=20)
        out[precision] = [(kind, shape, float(np.median(times[k])) * 1e6) for k, (kind, shape) in enumerate(rows)]
    return out


def litert_part(rows: list[tuple[str, str, float]], k: int) -> str:
    first_conv = next(i for i, r in enumerate(rows) if r[0] == "CONV_2D")
    last_conv = max(i for i, r in enumerate(rows) if r[0] in ("CONV_2D", "DEPTHWISE_CONV_2D"))
    return "stem" if k <= first_conv else "head" if k > last_conv else "body"


def openvino_profile(bundle: Path, x: np.ndarray, iters: int) -> dict[str, list[tuple[str, str, str, float]]]:
    """Per precision: (layer type, exec_type, layer name, us per inference) from the plugin's PERF_COUNT."""
    import openvino as ov

    core, out = ov.Core(), {}
    for precision in PRECISIONS:
        config = {"PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": "YES"}
        if precision == "fp32":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        request = core.compile_model(str(bundle / "openvino" / f"model_{precision}.xml"), "CPU", config) \
            .create_infer_request()
        for _ in range(20):
            request.infer([x], share_inputs=True)
        total: dict[str, float] = collections.defaultdict(float)
        meta = {}
        for _ in range(iters):
            request.infer([x], share_inputs=True)
            for info in request.profiling_info:
                if info.status == info.Status.EXECUTED:
                    total[info.node_name] += info.real_time.total_seconds() * 1e6
                    meta[info.node_name] = (info.node_type, info.exec_type)
        out[precision] = [(*meta[name], name, t / iters) for name, t in total.items()]
    return out


def whole_model(bundle: Path, x: np.ndarray, iters: int) -> dict[str, dict[str, float]]:
    from bare import bare_call

    p50 = {}
    for engine, folder, suffix in (("litert", "tflite", "tflite"), ("openvino", "openvino", "xml")):
        calls = {p: bare_call(engine, bundle / folder / f"model_{p}.{suffix}", x, "f32" if p == "fp32" and
                              engine == "openvino" else None) for p in PRECISIONS}
        times = interleaved(calls, iters, block=20)
        p50[engine] = {p: float(np.median(t)) * 1e3 for p, t in times.items()}
    return p50


def print_groups(title: str, groups: dict[str, dict[str, float]]) -> None:
    print(f"  {title:<28} {'int8 us':>9} {'fp32 us':>9} {'int8/fp32':>9}  {'share of int8':>13}")
    total8 = sum(g.get("int8", 0.0) for g in groups.values())
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1].get("fp32", 0.0)):
        i8, f32 = g.get("int8", 0.0), g.get("fp32", 0.0)
        ratio = f"{i8 / f32:9.2f}" if f32 else f"{'-':>9}"
        print(f"  {name:<28} {i8:9.0f} {f32:9.0f} {ratio}  {100 * i8 / total8:12.1f}%")
    print(f"  {'sum':<28} {total8:9.0f} {sum(g.get('fp32', 0.0) for g in groups.values()):9.0f} "
          f"{total8 / sum(g.get('fp32', 0.0) for g in groups.values()):9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=Path("build/bench/mobilenetv2.bundle"))
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    if not (args.bundle / "manifest.json").is_file():
        sys.exit(f"{args.bundle} is not a bundle; build it with: .venv/bin/python benchmarks/overhead.py "
                 "--models large  (it caches build/bench/mobilenetv2.bundle)")
    from edgesdk import Bundle

    x = np.ascontiguousarray(Bundle.open(args.bundle).golden()["input_0"][:1])
    print(f"{args.bundle}, batch 1, {os.cpu_count()} threads, {args.iters} iterations each")
    with OtherLoad() as load:
        p50 = whole_model(args.bundle, x, args.iters)
    print(f"\nwhole model, bare engine calls, int8 and fp32 interleaved (other processes: {load}):")
    for engine, t in p50.items():
        print(f"  {engine:<9} int8 {t['int8']:.3f} ms  fp32 {t['fp32']:.3f} ms  int8/fp32 {t['int8'] / t['fp32']:.3f}")

    with OtherLoad() as load:
        lite = litert_profile(args.bundle, args.iters)
    print(f"\nLiteRT, each operator alone on XNNPACK (other processes: {load}):")
    by_kind: dict[str, dict[str, float]] = collections.defaultdict(dict)
    by_part: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for precision, rows in lite.items():
        for k, (kind, shape, us) in enumerate(rows):
            by_kind[kind][precision] = by_kind[kind].get(precision, 0.0) + us
            part = litert_part(rows, k)
            by_part[part][precision] = by_part[part].get(precision, 0.0) + us
    print_groups("operator kind", by_kind)
    print()
    print_groups("part of the network", by_part)
    print("\n  the stem, operator by operator:")
    for precision, rows in lite.items():
        stem = [f"{kind} {shape} {us:.0f} us" for k, (kind, shape, us) in enumerate(rows)
                if litert_part(rows, k) == "stem"]
        print(f"    {precision}: " + ", ".join(stem))

    with OtherLoad() as load:
        ov = openvino_profile(args.bundle, x, args.iters)
    print(f"\nOpenVINO, PERF_COUNT per layer (other processes: {load}):")
    groups: dict[str, dict[str, float]] = collections.defaultdict(dict)
    kernels: dict[str, collections.Counter] = {p: collections.Counter() for p in PRECISIONS}
    for precision, rows in ov.items():
        for node_type, exec_type, _, us in rows:
            groups[node_type][precision] = groups[node_type].get(precision, 0.0) + us
            kernels[precision][f"{node_type}:{exec_type}"] += 1
    print_groups("layer type", groups)
    for precision in PRECISIONS:
        top = ", ".join(f"{k} x{n}" for k, n in kernels[precision].most_common(6))
        print(f"  {precision} kernels: {top}")


if __name__ == "__main__":
    main()
