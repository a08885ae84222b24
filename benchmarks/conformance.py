"""The conformance zoo at full size: each real third-party model of tests/zoo.py through `edgesdk quantize` with the
default targets, one row per route (target) its source could take.

    python benchmarks/conformance.py [--models ppocr_det,silero_vad] [--samples 32] [--val 16] [--keep DIR]
    make conformance

For each route: built (fp32 + INT8 artifacts written and loaded), refused up front (the reason quantize logged
before reading any data), or failed (the first line of the error the manifest's build section keeps). For a built
route, the INT8 artifact against float as the bundle's validation table gives it (cosine, max|err|, top-1
agreement of the outputs, the gate's verdict) and its p50 latency at batch 1 beside the float artifact's, measured
by quantize's validation on this machine. The data are made here (rendered text, drawn faces, tone bursts in
noise: tests/zoo.py), so the numbers say whether a route works and how far INT8 moves the outputs, not task
accuracy; the top-1 gate is opened (max_drop=100: arg-max agreement means nothing for maps, boxes and
states; issue 17 brings task gates) while the INT8 error cap stays the default (10% of each output's range, per
output), so the gate column says what a device would serve.
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
HEAD = ("model", "input", "route", "built?", "int8 cosine", "int8 max|err|", "int8 agree", "gate",
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
        quantize(source, work / f"{key}.npz", bundle, samples=samples, max_drop=100.0,
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
        agree = int8.get("top1_agreement", int8.get("golden_agreement"))
        rows.append((key, size, route, built, _num(int8.get("cosine_similarity"), ".4f"),
                     _num(int8.get("max_abs_error"), ".3g"), "-" if agree is None else f"{100 * agree:.1f}%",
                     "passed" if int8.get("passed") else "FAILED", _num((fp32 or {}).get("latency_ms"), ".3f"),
                     _num(int8.get("latency_ms"), ".3f"), _num(int8.get("latency_ratio"), ".2f")))
    return rows, seconds


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
          f"per model, default targets, top-1 gate opened (max_drop=100), default INT8 error cap; total {total:.0f} s")
    print()
    print(plain(rows))
    print()
    print(markdown(rows))
    print()
    print("models: " + "; ".join(f"{k}: {ABOUT[k]}, quantize {times[k]:.0f} s" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
