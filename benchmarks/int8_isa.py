"""INT8 options across x86 classes (issue 13): accuracy where U8S8 kernels saturate, and speed here.

    python benchmarks/int8_isa.py [--iters 300] [--mobilenet-iters 100] [--no-mobilenet] [--cloud] [--keep DIR]

On x86 CPUs without VNNI (AVX2, e.g. AMD Zen 3 or Intel Haswell..Comet Lake; AVX-512 without VNNI) ONNX Runtime's
U8S8 kernels multiply with VPMADDUBSW, whose int16 pair sums saturate. This script quantizes the digits sample as
`edgesdk quantize` does (digits.pt2, 300 calibration images drawn with seed 0, the 540 validation images), then
builds the INT8 ONNX model once per quantization option from the same float model and samples, and prints per option:

- top-1 accuracy on this machine (with --cloud also on digits_cloud.onnx, the sample's larger float model);
- top-1 accuracy on the lowest x86 class (AVX2 + FMA, no AVX-512, no VNNI), emulated by ``tests/isa.py``:
  ``qemu-x86_64 -cpu Haswell`` for ONNX Runtime and LiteRT, ``ONEDNN_MAX_CPU_ISA=AVX2`` for OpenVINO. The ONNX
  Runtime and LiteRT rows are skipped, saying why, when qemu-x86_64 is missing;
- the largest logit difference between the two runs (0 = the same integer results; saturation shows here first),
  and each option's logit RMS error against its float model on this machine (what 7-bit weights cost everywhere);
- the int8/fp32 p50 latency ratio at batch 1 on this machine, each engine's models interleaved in one loop; for the
  ONNX options also on a MobileNetV2-shaped model (benchmarks/models.py, fixed-seed weights: speed only).

Timings under emulation mean nothing (TCG translates every SIMD instruction; the digits float model runs ~40x slower
than its INT8 one there, a ratio no real CPU has), so none are taken; the emulated part reports its wall time only, to
show what a test would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DIGITS = REPO / "samples" / "digits"
CLASS_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")

# (key, label, quantize_static arguments, session settings); a None quantize entry reuses the model of the key named
# in the session settings. Types are QuantType names (activation, weight).
ONNX_OPTIONS = [
    ("u8s8_pc", "U8S8 per-channel (8-bit weights)", {"act": "QUInt8", "wt": "QInt8", "per_channel": True}, {}),
    ("u8s8_pc_rr", "U8S8 per-channel, reduce_range", {"act": "QUInt8", "wt": "QInt8", "per_channel": True,
                                                      "reduce_range": True}, {}),
    ("u8u8_pc", "U8U8 per-channel", {"act": "QUInt8", "wt": "QUInt8", "per_channel": True}, {}),
    ("s8s8_pc", "S8S8 per-channel", {"act": "QInt8", "wt": "QInt8", "per_channel": True}, {}),
    ("u8s8_pt_rr", "U8S8 per-tensor, reduce_range", {"act": "QUInt8", "wt": "QInt8", "per_channel": False,
                                                     "reduce_range": True}, {}),
    ("u8u8_pt", "U8U8 per-tensor", {"act": "QUInt8", "wt": "QUInt8", "per_channel": False}, {}),
    ("u8s8_pc_x64", "U8S8 per-channel + session.x64quantprecision=1", None,
     {"model": "u8s8_pc", "config": {"session.x64quantprecision": "1"}}),
    ("u8s8_pc_noopt", "U8S8 per-channel, graph optimizations off", None, {"model": "u8s8_pc", "optimizations": "off"}),
]


# -- engines (also run by the emulated worker: numpy and the engine only) ---------------------------------------

def open_runner(engine: str, path: str, session: dict):
    """x (1, ...) float32 -> logits, configured as edgesdk runs the artifact plus the option's session settings."""
    if engine == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        for key, value in session.get("config", {}).items():
            options.add_session_config_entry(key, value)
        if session.get("optimizations") == "off":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})[0]
    if engine == "openvino":
        import openvino as ov

        config = {"PERFORMANCE_HINT": "LATENCY"}
        if session.get("precision_hint"):
            config["INFERENCE_PRECISION_HINT"] = session["precision_hint"]
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        return lambda x: request.infer([x], share_inputs=True)[0].copy()
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=os.cpu_count())
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]

    def call(x):
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        return interp.get_tensor(out["index"]).copy()
    return call


def logits_of(engine: str, models: list[dict], x: np.ndarray) -> dict[str, np.ndarray]:
    out = {}
    for m in models:
        run = open_runner(engine, m["path"], m.get("session", {}))
        out[m["key"]] = np.concatenate([run(x[i:i + 1]) for i in range(len(x))])
    return out


def worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    np.savez(spec["out"], **logits_of(spec["engine"], spec["models"], np.load(spec["x"])))


# -- this machine -------------------------------------------------------------------------------------------

def cpu_class() -> tuple[str, str]:
    """(model name and flags, class) from /proc/cpuinfo."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    have = {f: f in flags for f in CLASS_FLAGS}
    cls = ("AMX" if have["amx_int8"] else "AVX-512 VNNI" if have["avx512_vnni"] else "AVX-VNNI" if have["avx_vnni"]
           else "AVX-512 without VNNI (U8S8 saturates)" if have["avx512f"]
           else "AVX2 without VNNI (U8S8 saturates)" if have["avx2"] else "below AVX2")
    return f"{model}; " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in have.items()), cls


def interleaved_p50(calls: dict, iters: int, warmup: int = 10) -> dict[str, float]:
    from quantize import interleaved

    return {k: float(np.median(v)) * 1e3 for k, v in interleaved(calls, iters, warmup).items()}


# -- building -----------------------------------------------------------------------------------------------

def digits_data(work: Path):
    """Build the digits bundle (all three targets); return (bundle dir, calibration samples, val x, val y)."""
    from edgesdk.bundle.preprocess import Preprocess
    from edgesdk_converters import calibration
    from edgesdk_converters.quantize import quantize

    images = work / "digits"
    subprocess.run([sys.executable, str(DIGITS / "export_images.py"), str(images)], check=True, capture_output=True)
    bundle = work / "digits.bundle"
    quantize(DIGITS / "digits.pt2", images / "train", bundle, val=images / "val", preprocess=DIGITS / "preprocess.toml",
             samples=300, progress=False)
    pre = Preprocess.from_toml(DIGITS / "preprocess.toml")
    ds = calibration.read_dataset(images / "train", None, pre)
    picked, _ = calibration.draw(ds, 300, 0)  # the samples `quantize` drew (seed 0)
    samples = calibration.materialize(ds.subset(picked))
    files = sorted((images / "val").glob("*/*.png"))
    x = np.concatenate([pre(f) for f in files]).astype(np.float32)
    y = np.array([int(f.parent.name) for f in files])
    return bundle, samples, x, y


def quantize_onnx_options(fp32: Path, samples: list[list[np.ndarray]], out: Path) -> dict[str, Path]:
    """One INT8 model per ONNX_OPTIONS entry, each from the same pre-processed float model and samples."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(str(fp32), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in inits]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(samples)

        def get_next(self):
            sample = next(self._it, None)
            return None if sample is None else dict(zip(names, sample))

    prepared = out / f"{fp32.stem}_prepared.onnx"
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    paths = {}
    for key, _, q, _ in ONNX_OPTIONS:
        if q is None:
            continue
        paths[key] = out / f"{fp32.stem}_{key}.onnx"
        quantize_static(str(prepared), str(paths[key]), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=q["per_channel"], reduce_range=q.get("reduce_range", False),
                        activation_type=QuantType[q["act"]], weight_type=QuantType[q["wt"]],
                        calibrate_method=CalibrationMethod.MinMax)
    return paths


def openvino_overflow_enable(fp32_xml: Path, samples, out: Path) -> Path:
    """The openvino target's nncf.quantize call with overflow_fix=ENABLE instead of the default FIRST_LAYER."""
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    advanced = AdvancedQuantizationParameters(activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
                                              overflow_fix=OverflowFix.ENABLE)
    q = nncf.quantize(ov.Core().read_model(str(fp32_xml)), nncf.Dataset(samples, lambda s: s),
                      subset_size=len(samples), preset=nncf.QuantizationPreset.PERFORMANCE,
                      advanced_parameters=advanced)
    path = out / "ov_overflow_enable.xml"
    ov.save_model(q, str(path), compress_to_fp16=False)
    return path


# -- running ------------------------------------------------------------------------------------------------

def emulated(engine: str, tag: str, models: list[dict], x: np.ndarray, work: Path) -> tuple[dict | None, str]:
    """Logits of ``models`` on the lowest x86 class, or (None, why not); the note gives the wall time."""
    import isa

    reason = isa.unavailable(engine)
    if reason:
        return None, reason
    if engine == "openvino":  # what the plugin picks on a real AVX2 CPU; under the cap it would still pick bf16
        models = [{**m, "session": {"precision_hint": "f32", **m["session"]}} for m in models]
    np.save(work / "x.npy", x)
    spec = work / f"worker_{engine}_{tag}.json"
    out = work / f"emulated_{engine}_{tag}.npz"
    spec.write_text(json.dumps({"engine": engine, "models": models, "x": str(work / "x.npy"), "out": str(out)}))
    start = time.perf_counter()
    cmd, env = isa.lowest_x86_command(engine, [sys.executable, __file__, "--worker", str(spec)])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"emulated run failed: {proc.stderr.strip()[-500:]}"
    how = "qemu-x86_64 -cpu Haswell" if engine != "openvino" else "ONEDNN_MAX_CPU_ISA=AVX2"
    with np.load(out) as data:
        return {k: data[k] for k in data.files}, (f"{engine} on {tag}, {how}: {len(models)} models x {len(x)} "
                                                  f"inputs in {time.perf_counter() - start:.1f} s")


def mobilenet_ratios(work: Path, iters: int) -> dict[str, tuple[float, float]]:
    """{key: (int8/fp32 p50, p50 ms)} of each ONNX option on a MobileNetV2-shaped model (16 synthetic images)."""
    import torch
    from edgesdk_converters.sources import open_source
    from models import mobilenet_v2_shaped, synthetic_images

    fp32 = work / "mobilenetv2.onnx"
    open_source(mobilenet_v2_shaped(seed=0), torch.zeros(1, 3, 224, 224)).float_onnx(fp32)
    calib = [[img[None]] for img in synthetic_images(16, seed=2)]
    paths = quantize_onnx_options(fp32, calib, work)
    x = synthetic_images(1, seed=3)
    runs = {"fp32": open_runner("onnxruntime", str(fp32), {})}
    for key, _, _, session in ONNX_OPTIONS:
        runs[key] = open_runner("onnxruntime", str(paths[session.get("model", key)]), session)
    p50 = interleaved_p50({k: (lambda run: lambda: run(x))(run) for k, run in runs.items()}, iters)
    return {k: (v / p50["fp32"], v) for k, v in p50.items()}


def accuracy_rows(engine: str, tag: str, float_model: dict, rows: list[tuple], x, y, work: Path, notes: list):
    """{label: (acc here, acc AVX2 or None, max |logit difference| here vs AVX2 or None, rms error vs float here)}."""
    models = [{"key": k, "path": str(p), "session": s} for k, _, p, s, _ in rows]
    here = logits_of(engine, models + [{"key": "fp32", **float_model}], x)
    there, note = emulated(engine, tag, [m for m, r in zip(models, rows) if r[4]], x, work)
    notes.append(note if there is not None else f"{engine} on {tag}, not emulated: {note}")
    out = {"float reference": (_acc(here["fp32"], y), None, None, 0.0)}
    for k, label, _, _, _ in rows:
        alt = None if there is None else there.get(k)
        out[label] = (_acc(here[k], y), None if alt is None else _acc(alt, y),
                      None if alt is None else float(np.abs(alt - here[k]).max()),
                      float(np.sqrt(np.mean((here[k] - here["fp32"]) ** 2))))
    return out


def _acc(logits: np.ndarray, y: np.ndarray) -> float:
    return 100 * float((logits.argmax(1) == y).mean())


def speed_rows(engine: str, float_model: dict, rows: list[tuple], x: np.ndarray, iters: int) -> dict[str, tuple]:
    """{label: (int8/fp32 p50, p50 ms)}, every model of the engine interleaved in one loop at batch 1."""
    runs = {k: open_runner(engine, str(p), s) for k, _, p, s, _ in rows}
    runs["fp32"] = open_runner(engine, float_model["path"], float_model["session"])
    p50 = interleaved_p50({k: (lambda run: lambda: run(x[:1]))(run) for k, run in runs.items()}, iters)
    return {"float reference": (1.0, p50["fp32"])} | {label: (p50[k] / p50["fp32"], p50[k]) for k, label, *_ in rows}


def print_table(head: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths]] + lines:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


def _f(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=300, help="timed iterations per digits model (default 300)")
    parser.add_argument("--mobilenet-iters", type=int, default=100)
    parser.add_argument("--no-mobilenet", action="store_true", help="skip the MobileNetV2-shaped speed column")
    parser.add_argument("--cloud", action="store_true",
                        help="also measure accuracy on digits_cloud.onnx (a 15-conv ensemble; ~2.5 min more, emulated)")
    parser.add_argument("--keep", type=Path, help="keep the models in this folder (default: a temporary one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path[:0] = [str(HERE), str(REPO / "tests")]
    started = time.perf_counter()
    flags, cls = cpu_class()
    print(f"CPU: {flags}\nclass here: {cls}\n", flush=True)

    work = args.keep or Path(tempfile.mkdtemp(prefix="int8_isa."))
    work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    try:
        bundle, samples, x, y = digits_data(work)
        onnx_paths = quantize_onnx_options(bundle / "onnx" / "model_fp32.onnx", samples, work)
        ov_enable = openvino_overflow_enable(bundle / "openvino" / "model_fp32.xml", samples, work)
        # engine -> (float model, [(key, label, path, session, emulate)]); the graph-optimizations-off row runs float
        # kernels, ~40 s under emulation on digits: emulated on digits only.
        engines = {
            "onnxruntime": ({"path": str(bundle / "onnx/model_fp32.onnx"), "session": {}},
                            [(k, label, onnx_paths[s.get("model", k)], s, True) for k, label, _, s in ONNX_OPTIONS]),
            "openvino": ({"path": str(bundle / "openvino/model_fp32.xml"), "session": {"precision_hint": "f32"}},
                         [("ov_first", "nncf overflow_fix FIRST_LAYER (today)", bundle / "openvino/model_int8.xml",
                           {}, True),
                          ("ov_enable", "nncf overflow_fix ENABLE", ov_enable, {}, True)]),
            "litert": ({"path": str(bundle / "tflite/model_fp32.tflite"), "session": {}},
                       [("litert", "AI Edge Quantizer static_wi8_ai8 (today)", bundle / "tflite/model_int8.tflite",
                         {}, True)]),
        }
        acc = {e: accuracy_rows(e, "digits", f, rows, x, y, work, notes) for e, (f, rows) in engines.items()}
        print(f"[digits accuracy] {time.perf_counter() - started:.0f} s", flush=True)
        cloud = {}
        if args.cloud:
            fp32 = work / "digits_cloud.onnx"
            shutil.copy(DIGITS / "digits_cloud.onnx", fp32)
            paths = quantize_onnx_options(fp32, samples, work)
            rows = [(k, label, paths[s.get("model", k)], s, "optimizations" not in s)
                    for k, label, _, s in ONNX_OPTIONS]
            cloud = accuracy_rows("onnxruntime", "digits_cloud", {"path": str(fp32), "session": {}}, rows, x, y, work,
                                  notes)
            print(f"[digits_cloud accuracy] {time.perf_counter() - started:.0f} s", flush=True)
        speed = {e: speed_rows(e, f, rows, x, args.iters) for e, (f, rows) in engines.items()}
        built = logits_of("onnxruntime", [{"key": "b", "path": str(bundle / "onnx/model_int8.onnx")}], x)["b"]
        same = [label for k, label, _, s in ONNX_OPTIONS if not s and np.array_equal(
            built, logits_of("onnxruntime", [{"key": k, "path": str(onnx_paths[k])}], x)[k])]
        notes.append(f"the onnx target as checked out builds: {same[0] if same else 'none of these options'}")
        mobile = None if args.no_mobilenet else mobilenet_ratios(work, args.mobilenet_iters)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nAccuracy (top-1 %, {len(y)} digits validation images; calibration: 300 train images, seed 0), "
          f"measured on: {cls}")
    print("here = this CPU; AVX2 = lowest x86 class (AVX2+FMA, no AVX-512/VNNI), emulated; max|d| = largest logit "
          "difference here vs AVX2 (saturation); rms = logit RMS error vs float, here")
    head = ["engine", "option", "digits here", "AVX2", "max|d|", "rms"]
    if cloud:
        head += ["cloud here", "AVX2", "max|d|", "rms"]
    lines = []
    for engine, rows in acc.items():
        for label, (a, a2, d, rms) in rows.items():
            line = [engine, label, f"{a:.2f}", _f(a2, ".2f"), _f(d, ".3f"), f"{rms:.3f}"]
            if cloud:
                c = cloud.get(label) if engine == "onnxruntime" else None
                line += ["-"] * 4 if c is None else [f"{c[0]:.2f}", _f(c[1], ".2f"), _f(c[2], ".3f"), f"{c[3]:.3f}"]
            lines.append(line)
    print_table(head, lines)

    print(f"\nSpeed here ({cls}): int8/fp32 p50 at batch 1, interleaved per engine (digits: {args.iters} iterations; "
          "its 8x8 model is so small that call overhead dominates)")
    head = ["engine", "option", "digits int8/fp32", "p50 ms"] + (["MobileNetV2 int8/fp32", "p50 ms"] if mobile else [])
    keys = {label: k for k, label, _, _ in ONNX_OPTIONS} | {"float reference": "fp32"}
    lines = []
    for engine, rows in speed.items():
        for label, (ratio, ms) in rows.items():
            line = [engine, label, f"{ratio:.2f}", f"{ms:.3f}"]
            if mobile:
                m = mobile.get(keys[label]) if engine == "onnxruntime" else None
                line += ["-", "-"] if m is None else [f"{m[0]:.2f}", f"{m[1]:.2f}"]
            lines.append(line)
    print_table(head, lines)
    print("\n" + "\n".join(notes))
    print(f"Timings under emulation mean nothing; none are reported. Total {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
