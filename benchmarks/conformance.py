"""The conformance zoo at full size: each real third-party model of tests/zoo.py through `edgesdk quantize` with the
default targets, then `edgesdk bench` on the bundle; one row per route (target) its source could take.

    python benchmarks/conformance.py [--models ppocr_det,silero_vad] [--samples 32] [--val 16] [--det-size 320]
                                     [--duration 5] [--recover] [--keep DIR]
    python benchmarks/conformance.py --bench-only DIR [--models ...] [--duration 5]
    make conformance

For each route: built (fp32 + INT8 artifacts written and loaded), refused up front, or failed (the first line of the
error the manifest's build section keeps). For a built route, the INT8 artifact against float as the bundle's
validation table gives it: its task's metric (tests/zoo.py TASKS: mask IoU for the text detector, exact-string
agreement for the recognizer, box F1 for BlazeFace, p95 point error for the face mesh, relative MAE for Silero's
speech probability, top-1 for the angle classifier), cosine, max|err|, the gate's verdict with the default gates and
why it failed. Speed is not quantize's (few runs): the bundle is measured by the `edgesdk` command in a child
process, as a user runs it, `bench --all --allow-failed --scenario single-stream --no-cold-start --json`, and each
engine's p50 of its fp32 and INT8 artifacts come from that one run (each backend in a fresh process, at least 662
queries), with the precision the engine computes "fp32" in where it differs (OpenVINO on AMX may use bf16), or why
bench could not measure an artifact. Each row of the four models issue 26 names gets its done-when verdict for this
machine's CPU class (edgesdk.cpu, read at run time): with VNNI or AMX int8/fp32 <= 0.6 on LiteRT and OpenVINO and
<= 0.8 on ONNX Runtime; on AVX2 without VNNI <= 0.9 where the engine has integer kernels, never above 1.0.

The data are made here (rendered text, drawn faces, tone bursts in noise: tests/zoo.py), so the numbers say how far
INT8 moves each model's answer from float's on such inputs, not its accuracy on real ones. The detector is quantized
at --det-size (320x320 by default, issue 26's size). `--bench-only DIR` measures again the bundles an earlier
`--keep DIR` run left, without quantizing (the validation columns are the bundles' own). Prints each model's rows as
it finishes (stderr), then the CPU class, the whole table plain and as markdown, and the timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
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
        "p50 fp32 ms", "fp32 computed in", "p50 int8 ms", "int8/fp32", "done-when")

# Issue 26's done-when: the models it names, and int8/fp32 (bench p50) per engine on a CPU with VNNI or AMX ...
DONE_WHEN_MODELS = ("ppocr_det", "ppocr_rec", "blazeface", "face_landmark")
VNNI_TARGET = {"litert": 0.6, "openvino": 0.6, "onnxruntime": 0.8}
# ... and on AVX2 without VNNI: 0.9 where the engine has integer kernels for that class (XNNPACK's QS8, oneDNN's
# AVX2 int8 and MLAS's U8S8 all do), and never slower than float.
NO_VNNI_TARGET, NEVER_SLOWER = 0.9, 1.0
INTEGER_KERNELS_ON_AVX2 = {"litert": True, "openvino": True, "onnxruntime": True}
MIN_QUERIES = 662  # what bench runs on to (MLPerf's least for a p99) unless its cap of 10 durations comes first


@dataclass
class Quantized:
    """One model's bundle (None: none was written) and what quantize said about the routes it did not build."""
    bundle: Path | None
    failed: dict[str, str] = field(default_factory=dict)  # target -> error, from TargetsFailed
    said: list[str] = field(default_factory=list)
    crashed: str | None = None  # refused as a whole, or (bench-only) no bundle to read
    seconds: float | None = None


def detector_size(side: int) -> str:
    """The tests/zoo.py size name for a side x side detector input, added to zoo.SHAPES where it is not one of its
    own (the zoo knows its reduced and its 640x640 sizes; issue 26 measures 320x320)."""
    name = f"{side}x{side}"
    zoo.SHAPES["ppocr_det"].setdefault(name, {"x": (1, 3, side, side)})
    return name


def quantize_model(key: str, size: str, samples: int, val: int, work: Path, recover: bool) -> Quantized:
    """Quantize ``key`` at ``size`` (a tests/zoo.py SHAPES name) into ``work/<key>.bundle``."""
    from edgesdk.errors import EdgeSDKError, TargetsFailed, ValidationFailed
    from edgesdk_converters.quantize import quantize

    source = zoo.model(key)
    # the recognizer reads lines it can read (zoo.text_lines, as benchmarks/recovery.py feeds it): the strips of
    # zoo.calibration are in an 11-pixel bitmap font that float itself reads as noise, so its INT8 gate measured
    # noise against noise and failed every route, and bench could not time a failed artifact
    data = {"x": zoo.text_lines(samples + val, seed=0)[0]} if key == "ppocr_rec" else \
        zoo.calibration(key, samples + val, size)
    np.savez(work / f"{key}.npz", **data)
    done = Quantized(work / f"{key}.bundle")
    # the verdicts as quantized unless --recover: recovery (minutes per failing artifact) is benchmarks/recovery.py's
    options = {} if recover else {"recover": "off"}
    start = time.perf_counter()
    try:
        quantize(source, work / f"{key}.npz", done.bundle, samples=samples, progress=False, log=done.said.append,
                 **options, **zoo.quantize_options(key, size))
    except TargetsFailed as exc:
        done.failed, done.bundle = dict(exc.failed), (Path(exc.bundle) if exc.bundle else None)
    except ValidationFailed:
        pass  # recorded in the manifest: the gate column shows it
    except EdgeSDKError as exc:  # refused as a whole (no route takes it): one row says why
        done.crashed, done.bundle = f"{type(exc).__name__}: {str(exc).splitlines()[0]}", None
    done.seconds = time.perf_counter() - start
    return done


def edgesdk_command() -> list[str]:
    """The `edgesdk` command of this environment, as a user runs it (its console script, else ``-m edgesdk``)."""
    script = Path(sys.executable).with_name("edgesdk")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "edgesdk"]


def bench_bundle(bundle: Path, duration: float) -> tuple[dict, float]:
    """`edgesdk bench` of every viable backend of ``bundle`` (single-stream, failed artifacts too): its JSON report
    ({"backends": [], "failed": [{"backend": "<bench's error>"}]} when it printed none) and its wall time."""
    command = edgesdk_command() + ["bench", str(bundle), "--all", "--allow-failed", "--scenario", "single-stream",
                                   "--no-cold-start", "--duration", f"{duration:g}", "--json"]
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    for line in run.stderr.splitlines():  # its progress and warnings, as the user sees them
        print(f"    {line}", file=sys.stderr)
    try:
        return json.loads(run.stdout), seconds
    except json.JSONDecodeError:
        last = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        return {"backends": [], "failed": [{"backend": "*", "reason": "bench_failed", "detail": last}]}, seconds


def speed(engine: str, report: dict, skipped: list[dict]) -> dict[str, object]:
    """Engine ``engine``'s fp32 and INT8 artifacts in ``report`` (measured by that engine, on the CPU where it has a
    choice): {"fp32": row or "not measured: why", "int8": ...}."""
    found: dict[str, object] = {}
    for precision in ("fp32", "int8"):
        artifact = f"{engine}-{precision}"
        rows = [r for r in report.get("backends", []) if r["engine"] == engine and r["artifact"] == artifact]
        if rows:
            found[precision] = next((r for r in rows if r.get("kind") == "CPU"), rows[0])
            continue
        why = [f for f in report.get("failed", []) if f["backend"] == "*" or
               f["backend"].split(":")[::2] == [engine, artifact]]
        why = why or [s for s in skipped if s.get("artifact") == artifact]
        found[precision] = "not measured: " + (f"{why[0]['reason']}" if why else "bench had no backend for it")
    return found


def done_when(key: str, engine: str, ratio: float | None, cls: dict) -> str:
    """Issue 26's verdict for one route on this CPU class: "met (<= 0.6)", "MISSED (> 0.6)", or why there is none."""
    if key not in DONE_WHEN_MODELS:
        return "-"
    flags = cls.get("flags") or {}
    vnni = any(flags.get(f) for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    cap = (cls.get("isa_caps") or {}).get("ONEDNN_MAX_CPU_ISA", "").upper()
    if engine == "openvino" and cap and not any(t in cap for t in ("VNNI", "AMX", "BF16", "FP16", "ALL", "DEFAULT")):
        vnni = False  # OpenVINO told to use less than the CPU has: its class is the cap's
    if vnni:
        limit = VNNI_TARGET[engine]
    elif flags.get("avx2"):
        limit = NO_VNNI_TARGET if INTEGER_KERNELS_ON_AVX2[engine] else NEVER_SLOWER
    else:
        return f"no target for {cls.get('isa_class')}"
    if ratio is None:
        return f"not measured (<= {limit:g})"
    return f"met (<= {limit:g})" if ratio <= limit else f"MISSED (> {limit:g})"


def rows_for(key: str, size: str, made: Quantized, report: dict, skipped: list[dict],
             cls: dict) -> list[tuple[str, ...]]:
    """The table's rows for one model: the bundle's build and validation sections beside bench's numbers."""
    from edgesdk.bundle.reader import Bundle
    from edgesdk_converters.sources import open_source
    from edgesdk_converters.targets import TARGET_ENGINES

    source = open_source(zoo.model(key))
    manifest = Bundle.open(made.bundle).manifest if made.bundle else {}
    if manifest:
        shapes = {t["name"]: t.get("shape") for t in manifest["inputs"]}
    else:
        shapes = {s.name: (zoo.SHAPES[key][size].get(s.name) or s.shape) for s in source.inputs}
    shown = ", ".join(f"{n} {'x'.join(map(str, shp))}" if shp else f"{n} scalar" for n, shp in shapes.items())
    validation, build = manifest.get("validation", {}), manifest.get("build") or {}
    rows = []
    for route in source.targets:
        engine = TARGET_ENGINES[route]
        said = next((line.split(": ", 1)[1] for line in made.said if line.startswith(f"not building {route} ")), None)
        entry = build.get(route)
        if entry is not None:
            built = "yes" if entry["status"] == "built" else \
                f"{entry['status']}: " + (entry.get("error") or "see inspect").strip().splitlines()[0]
        elif route in made.failed:
            built = "failed: " + made.failed[route].strip().splitlines()[0]
        elif said is not None:
            built = "refused: " + said
        else:
            built = made.crashed or ("yes" if made.bundle else "failed")
        int8 = validation.get(f"{engine}-int8") if built == "yes" else None
        if int8 is None:
            rows.append((key, shown, route, built) + ("-",) * (len(HEAD) - 4))
            continue
        measured = speed(engine, report, skipped)
        fp32, q8 = measured["fp32"], measured["int8"]
        ratio = q8["p50_ms"] / fp32["p50_ms"] if isinstance(fp32, dict) and isinstance(q8, dict) else None
        computed = "-"
        if isinstance(fp32, dict) and _short(fp32.get("effective_precision")) != _short(fp32.get("precision")):
            computed = _short(fp32.get("effective_precision"))
        rows.append((key, shown, route, built, _metric(int8), _num(int8.get("cosine_similarity"), ".4f"),
                     _num(int8.get("max_abs_error"), ".3g"), "passed" if int8.get("passed") else _why(int8),
                     _p50(fp32), computed, _p50(q8), _num(ratio, ".2f"), done_when(key, engine, ratio, cls)))
    return rows


def _p50(row) -> str:
    return format(row["p50_ms"], ".3f") if isinstance(row, dict) else str(row)


def _short(precision) -> str:
    return {"float32": "fp32", "f32": "fp32", "bfloat16": "bf16", "float16": "fp16", "f16": "fp16"}.get(
        str(precision).lower(), str(precision))


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


def bench_notes(key: str, report: dict) -> list[str]:
    """What a reader of the table needs from bench's report: short runs, and the whole reason an artifact was not
    measured."""
    notes = [f"{key}: {r['engine']}:{r['artifact']} ran {r.get('queries')} queries (fewer than {MIN_QUERIES}: "
             "raise --duration)" for r in report.get("backends", []) if (r.get("queries") or 0) < MIN_QUERIES]
    notes += [f"{key}: {f['backend']} not measured: {f['reason']}: {str(f.get('detail'))[:300]}"
              for f in report.get("failed", [])]
    return notes


def commit() -> str:
    """The checkout's short commit, "+ changes" when its tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> int:
    from edgesdk.bench.warm import viable_backends
    from edgesdk.cpu import cpu_class, describe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(zoo.MODELS), help="zoo keys, comma separated")
    parser.add_argument("--samples", type=int, default=32, help="calibration samples per model")
    parser.add_argument("--val", type=int, default=16, help="validation samples per model (held out)")
    parser.add_argument("--det-size", type=int, help="the text detector's input side, a multiple of 32 (default 320; "
                        "the zoo's full size is 640)")
    parser.add_argument("--duration", type=float, default=5.0, help="bench seconds per backend (default 5; bench runs "
                        f"on to {MIN_QUERIES} queries within 10 durations: 5 s covers a p50 up to 75 ms)")
    parser.add_argument("--recover", action="store_true", help="quantize with the default accuracy recovery "
                        "($EDGESDK_RECOVER, else auto) instead of off")
    parser.add_argument("--keep", type=Path, help="write the bundles (and data) into this folder and keep them")
    parser.add_argument("--bench-only", type=Path, metavar="DIR", help="bench the bundles an earlier --keep DIR left, "
                        "without quantizing")
    args = parser.parse_args()
    keys = [k for k in args.models.split(",") if k]
    unknown = [k for k in keys if k not in zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(zoo.MODELS)}")
    if args.bench_only is not None:
        given = [flag for flag, on in (("--keep", args.keep), ("--recover", args.recover),
                                       ("--det-size", args.det_size is not None)) if on]
        if given:
            parser.error(f"--bench-only measures the bundles in {args.bench_only} as they are: {', '.join(given)} "
                         "would change nothing")
        if not args.bench_only.is_dir():
            parser.error(f"--bench-only {args.bench_only}: no such folder (make one with --keep)")
    side = 320 if args.det_size is None else args.det_size
    if side <= 0 or side % 32:
        parser.error(f"--det-size must be a positive multiple of 32 (the detector's strides), got {side}")
    if not args.duration > 0:
        parser.error(f"--duration must be > 0 seconds, got {args.duration}")

    cls, checkout = cpu_class(), commit()  # the code this run starts from (others may change it while it runs)
    print(f"CPU: {describe(cls)}; flags: " + ", ".join(f"{f} {'yes' if on else 'no'}" for f, on in
                                                      cls["flags"].items()), file=sys.stderr, flush=True)
    began = time.perf_counter()
    rows, notes, times = [], [], {}
    with tempfile.TemporaryDirectory(prefix="conformance.") as tmp:
        work = args.bench_only or args.keep or Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for key in keys:
                shutil.rmtree(args.keep / f"{key}.bundle", ignore_errors=True)  # a rerun replaces its bundles
        for key in keys:
            size = detector_size(side) if key == "ppocr_det" else "full"
            if args.bench_only:
                bundle = work / f"{key}.bundle"
                made = Quantized(bundle) if bundle.is_dir() else Quantized(None, crashed=f"no {bundle.name} in {work}")
            else:
                print(f"[{key}] {ABOUT[key]}: quantizing ({args.samples} calibration + {args.val} validation "
                      "samples)", file=sys.stderr, flush=True)
                made = quantize_model(key, size, args.samples, args.val, work, args.recover)
            report, skipped, bench_s = {}, [], None
            if made.bundle:
                print(f"[{key}] edgesdk bench --all (single-stream, {args.duration:g} s and {MIN_QUERIES} queries "
                      "per backend)", file=sys.stderr, flush=True)
                report, bench_s = bench_bundle(made.bundle, args.duration)
                skipped = viable_backends(made.bundle, allow_failed=True)[1]  # artifacts bench had no backend for
                notes += bench_notes(key, report)
            times[key] = (made.seconds, bench_s)
            found = rows_for(key, size, made, report, skipped, cls)
            rows += found
            print(plain(found) + "\n(" + _times(times[key]) + ")\n", file=sys.stderr, flush=True)
    total = time.perf_counter() - began
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    how = (f"bundles of {args.bench_only} as kept" if args.bench_only else
           f"{args.samples} calibration + {args.val} validation samples per model, default targets, recovery "
           f"{'default' if args.recover else 'off'}, detector at {side}x{side}")
    print(f"Conformance zoo, {date}, commit {checkout}; {how}; each model's task (tests/zoo.py TASKS) and the default "
          f"gates; speed: edgesdk bench --all --allow-failed --scenario single-stream --no-cold-start --duration "
          f"{args.duration:g}; total {total:.0f} s")
    print(f"CPU class: {describe(cls)}; integer-kernel flags: " +
          ", ".join(f"{f} {'yes' if on else 'no'}" for f, on in cls["flags"].items()))
    print()
    print(plain(rows))
    print()
    print(markdown(rows))
    print()
    for note in notes or [f"every backend ran at least {MIN_QUERIES} queries"]:
        print(f"note: {note}")
    print("models: " + "; ".join(f"{k}: {ABOUT[k]}, {_times(times[k])}" for k in keys))
    return 0


def _times(seconds: tuple[float | None, float | None]) -> str:
    quantized, benched = seconds
    return ", ".join(part for part in (f"quantize {quantized:.0f} s" if quantized is not None else "",
                                       f"bench {benched:.0f} s" if benched is not None else "") if part) or "not run"


if __name__ == "__main__":
    sys.exit(main())
