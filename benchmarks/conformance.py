"""The conformance zoo at full size: each real third-party model of tests/zoo.py through `edgesdk quantize` with the
default targets, one row per route (target) its source could take.

    python benchmarks/conformance.py [--models ppocr_det,silero_vad] [--samples 32] [--val 16] [--keep DIR]
    make conformance

For each route: built (fp32 + INT8 artifacts written and loaded), refused up front (the reason quantize logged
before reading any data), or failed (the first line of the error the manifest's build section keeps). For a built
route, the INT8 artifact against float as the bundle's validation table gives it: its task's metric (tests/zoo.py
TASKS: mask IoU for the text detector, exact-string agreement for the recognizer, box F1 for BlazeFace, p95 point
error for the face mesh, relative MAE for Silero's speech probability, top-1 for the angle classifier), cosine,
max|err|, the gate's verdict with the default gates (the task's, the dead-output check, the caps where they gate)
and why it failed, and its p50 latency at batch 1 beside the float artifact's, measured by quantize's validation on
this machine. The data are made here (rendered text, drawn faces, tone bursts in noise: tests/zoo.py), so the
numbers say how far INT8 moves each model's answer from float's on such inputs, not its accuracy on real ones.
Prints a plain table as each model finishes, then the whole table as markdown with the CPU and the date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import zoo  # noqa: E402

# key -> what it is, as a reader knows it
ABOUT = {
    "ppocr_det": "PP-OCRv4 text detector (Paddle, ONNX opset 12)",
    "ppocr_rec": "PP-OCRv4 text recognizer (Paddle, ONNX opset 12)",
    "ppocr_cls": "PP-OCR text angle classifier (Paddle, ONNX opset 11)",
    "blazeface": "BlazeFace short range (MediaPipe .tflite, no signature)",
    "face_landmark": "Face landmark (MediaPipe .tflite, no signature)",
    "silero_vad": "Silero VAD v6 (ONNX: 3 inputs, int64 sr, state, If)",
}
HEAD = ("model", "input", "route", "built?", "int8 metric", "int8 cosine", "int8 max|err|", "gate",
        "p50 fp32 ms", "p50 int8 ms", "int8/fp32")


def run_model(key: str, samples: int, val: int, work: Path) -> tuple[list[tuple[str, ...]], float]:
    """Quantize ``key`` at full size; its rows and the quantize wall time in seconds."""
    from edgesdk.bundle.reader import Bundle
    from edgesdk.errors import EdgeSDKError, TargetsFailed, ValidationFailed
    from edgesdk_converters.quantize import quantize
    from edgesdk_converters.sources import open_source
    from edgesdk_converters.targets import TARGET_ENGINES

    source = zoo.model(key)
    data = zoo.calibration(key, samples + val, "full")
    np.savez(work / f"{key}.npz", **data)
    said: list[str] = []
    bundle: Path | None = work / f"{key}.bundle"
    failed: dict[str, str] = {}
    crashed = None
    start = time.perf_counter()
    try:
        # the verdicts as quantized: recovery (minutes per failing artifact) is measured by benchmarks/recovery.py
        quantize(source, work / f"{key}.npz", bundle, samples=samples, recover="off",
                 progress=False, log=said.append, **zoo.quantize_options(key, "full"))
    except TargetsFailed as exc:
        failed, bundle = dict(exc.failed), (Path(exc.bundle) if exc.bundle else None)
    except ValidationFailed:
        pass  # recorded in the manifest: the gate column shows it
    except EdgeSDKError as exc:  # refused as a whole (no route takes it): one row says why
        crashed, bundle = f"{type(exc).__name__}: {str(exc).splitlines()[0]}", None
    seconds = time.perf_counter() - start
    shape = {s.name: list(s.shape) for s in open_source(source).inputs}
    size = ", ".join(f"{n} {'x'.join(map(str, (zoo.SHAPES[key]['full'].get(n) or shp)))}" if shp else f"{n} scalar"
                     for n, shp in shape.items())
    manifest = Bundle.open(bundle).manifest if bundle else {}
    validation = manifest.get("validation", {})
    rows = []
    for route in open_source(source).targets:
        engine = TARGET_ENGINES[route]
        refused = next((line.split(": ", 1)[1] for line in said if line.startswith(f"not building {route} ")), None)
        if route in failed:
            built = "failed: " + failed[route].strip().splitlines()[0]
        elif refused is not None:
            built = "refused: " + refused
        elif crashed or not bundle:
            built = crashed or "failed"
        else:
            built = "yes"
        int8 = validation.get(f"{engine}-int8") if built == "yes" else None
        fp32 = validation.get(f"{engine}-fp32") if built == "yes" else None
        if int8 is None:
            rows.append((key, size, route, built) + ("-",) * (len(HEAD) - 4))
            continue
        rows.append((key, size, route, built, _metric(int8), _num(int8.get("cosine_similarity"), ".4f"),
                     _num(int8.get("max_abs_error"), ".3g"), "passed" if int8.get("passed") else _why(int8),
                     _num((fp32 or {}).get("latency_ms"), ".3f"),
                     _num(int8.get("latency_ms"), ".3f"), _num(int8.get("latency_ratio"), ".2f")))
    return rows, seconds


def _metric(entry: dict) -> str:
    """The task's metric and its value ("mask_iou 0.941", "p95_point_error_px 1.9")."""
    name, value = entry.get("metric"), entry.get("metric_value")
    if name is None or value is None:
        agree = entry.get("top1_agreement")
        return "-" if agree is None else f"top1 {100 * agree:.1f}%"
    return f"{name} {value:.3g}"


def _why(entry: dict) -> str:
    """FAILED and the reasons: the task's gate, dead outputs, the error cap, a task's own failure."""
    reasons = []
    limit, drop = entry.get("max_drop"), entry.get("drop")
    if isinstance(limit, (int, float)) and isinstance(drop, (int, float)) and drop > limit:
        reasons.append(f"drop {drop:.3g} > {limit:g} {entry.get('drop_unit') or 'points'}")
    if entry.get("dead_output"):
        reasons.append("dead output " + ", ".join(entry["dead_output"]))
    if entry.get("max_abs_error_cap_exceeded"):
        reasons.append("over the error cap")
    if entry.get("task_failure"):
        reasons.append(str(entry["task_failure"]).split(":")[0])
    return "FAILED (" + "; ".join(reasons or ["see inspect"]) + ")"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plain(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [HEAD, *rows]) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [HEAD, *rows])


def markdown(rows: list[tuple[str, ...]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, HEAD)) + " |", "|" + "---|" * len(HEAD)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])


def main() -> int:
    from edgesdk.cpu import cpu_class, describe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(zoo.MODELS), help="zoo keys, comma separated")
    parser.add_argument("--samples", type=int, default=32, help="calibration samples per model")
    parser.add_argument("--val", type=int, default=16, help="validation samples per model (held out)")
    parser.add_argument("--keep", type=Path, help="write the bundles (and data) into this folder and keep them")
    args = parser.parse_args()
    keys = [k for k in args.models.split(",") if k]
    unknown = [k for k in keys if k not in zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(zoo.MODELS)}")

    cpu = cpu_class()
    began = time.perf_counter()
    rows, times = [], {}
    with tempfile.TemporaryDirectory(prefix="conformance.") as tmp:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for key in keys:
                shutil.rmtree(args.keep / f"{key}.bundle", ignore_errors=True)  # a rerun replaces its bundles
        for key in keys:
            print(f"[{key}] {ABOUT[key]}: quantizing ({args.samples} calibration + {args.val} validation samples)",
                  file=sys.stderr, flush=True)
            made, times[key] = run_model(key, args.samples, args.val, args.keep or Path(tmp))
            rows += made
            print(plain(made) + f"\n({times[key]:.0f} s)\n", file=sys.stderr, flush=True)
    total = time.perf_counter() - began
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Conformance zoo, {date}, on {describe(cpu)}; {args.samples} calibration + {args.val} validation samples "
          f"per model, default targets, each model's task (tests/zoo.py TASKS) and the default gates; total {total:.0f} s")
    print()
    print(plain(rows))
    print()
    print(markdown(rows))
    print()
    print("models: " + "; ".join(f"{k}: {ABOUT[k]}, quantize {times[k]:.0f} s" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
