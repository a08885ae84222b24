"""Accuracy recovery (quantize --recover), measured: ``make recovery``.

1. **Nothing to recover**: the digits sample (digits.pt2) and the MobileNetV2-shaped benchmark model quantized twice,
   ``--recover off`` and ``--recover on``, same data and seed. Per INT8 artifact: the recovery status, the layers
   kept in float (none expected), whether the two artifacts are byte-identical, and their p50 latencies measured
   side by side (interleaved, one process) with the ratio.
2. **The PP-OCRv4 recognizer** (rapidocr-onnxruntime 1.4.4, 48x320, tests/zoo.py): 32 readable calibration lines,
   100 validation lines with their text (tests.zoo.text_lines), ``--max-drop 3`` (lines of 100), recovery on its
   default (auto). Per engine: lines read right by float, by INT8 as quantized and after recovery, the layers kept in
   float and those back in INT8 with the other range choice on their inputs, the share of MACs still in INT8, p50
   latency against float; and, since the search chose the layers on those 100 lines, the lines read right of 100
   others it never saw (seed 2), by INT8 and by float.

Every number names the CPU class it was measured on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests"), str(HERE)]


def _sha(path: Path) -> str:
    """The file's sha256; an OpenVINO .xml with the counter-numbered names OpenVINO gives constants within one
    process (``Constant_145845``) masked, which differ between two builds of the same model in one process."""
    data = path.read_bytes()
    if path.suffix == ".xml":
        data = re.sub(rb"_[0-9]{3,}", b"_#", data)
    return hashlib.sha256(data).hexdigest()


def _interleaved_p50(paths: list[tuple[str, Path, dict]], sample: list[np.ndarray], rounds: int = 200) -> list[float]:
    from edgesdk.engines import open_engine
    from edgesdk.runtime.numerics import run_as_given

    engines = [open_engine(engine, path, **runtime) for engine, path, runtime in paths]
    times: list[list[float]] = [[] for _ in engines]
    try:
        for e in engines:
            for _ in range(5):
                run_as_given(e, sample)
        for _ in range(rounds):
            for k, e in enumerate(engines):
                t0 = time.perf_counter()
                run_as_given(e, sample)
                times[k].append(time.perf_counter() - t0)
    finally:
        for e in engines:
            e.close()
    return [float(np.median(t) * 1e3) for t in times]


def nothing_to_recover(name: str, build, tmp: Path) -> list[str]:
    """Quantize with recover off and on; compare the INT8 artifacts."""
    from edgesdk.bundle.reader import Bundle
    from edgesdk.runtime.numerics import golden_feeds

    bundles = {}
    for mode in ("off", "on"):
        t0 = time.perf_counter()
        bundles[mode] = Bundle.open(build(tmp / f"{name}-{mode}.bundle", mode))
        print(f"[{name}] recover={mode}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    sample = golden_feeds(bundles["on"].golden(), len(bundles["on"].manifest["inputs"]))[0]
    lines = []
    for art in bundles["on"].artifacts:
        if art.precision != "int8":
            continue
        off = bundles["off"].artifact(art.id)
        rec = art.entry.get("recovery") or {}
        same = all(_sha(a) == _sha(b) for a, b in zip(art.files, off.files))
        p_off, p_on = _interleaved_p50([(off.engine, off.model_path, off.runtime),
                                        (art.engine, art.model_path, art.runtime)], sample)
        lines.append(f"| {name} | {art.id} | {rec.get('status', '(none)')} | {len(rec.get('kept_float') or [])} | "
                     f"{_share(rec.get('int8_mac_share'))} | {'yes' if same else 'NO'} | {p_off:.3f} | {p_on:.3f} | "
                     f"{p_on / p_off:.2f} |")
    return lines


def recognizer(tmp: Path, max_drop: float, keep: Path | None = None) -> tuple[list[str], float]:
    import zoo
    from edgesdk.errors import ValidationFailed
    from edgesdk_converters.quantize import quantize

    xc, _ = zoo.text_lines(32, seed=0)
    xv, tv = zoo.text_lines(100, seed=1)
    np.savez(tmp / "rec-calib.npz", x=xc)
    np.savez(tmp / "rec-val.npz", x=xv, texts=np.array(tv))
    out = tmp / "ppocr_rec.bundle"
    t0 = time.perf_counter()
    try:
        quantize(zoo.model("ppocr_rec"), tmp / "rec-calib.npz", out, val=tmp / "rec-val.npz", samples=32,
                 max_drop=max_drop, recover="auto", overwrite=True, progress=False,
                 log=lambda s: print(f"[ppocr_rec] {s}", file=sys.stderr, flush=True),
                 **zoo.quantize_options("ppocr_rec", "full"))
    except ValidationFailed as exc:
        print(f"[ppocr_rec] {exc.args[0].splitlines()[0]}", file=sys.stderr)
    seconds = time.perf_counter() - t0
    if keep is not None:
        import shutil

        shutil.copytree(out, keep, dirs_exist_ok=True)
    manifest = json.loads((out / "manifest.json").read_text())
    unseen = held_out(out, tmp)
    validation = manifest["validation"]
    lines = []
    for art in manifest["artifacts"]:
        if art["precision"] != "int8":
            continue
        v, rec = validation[art["id"]], art.get("recovery") or {}
        ref = v.get("reference_metric_value")
        before = rec.get("metric_before", v.get("metric_value"))
        kept = rec.get("kept_float") or []
        names = ", ".join(k["layer"] for k in kept[:6]) + (f" (+{len(kept) - 6})" if len(kept) > 6 else "")
        ranged = ", ".join(r["layer"] for r in rec.get("layer_ranges") or []) or "-"
        lines.append(f"| {art['id']} | {_lines(ref)} | {_lines(before)} | {_lines(v.get('metric_value'))} | "
                     f"{'yes' if v.get('passed') else 'NO'} | {rec.get('status', '-')} | {len(kept)} | "
                     f"{_share(rec.get('int8_mac_share', rec.get('int8_mac_share_before')))} | "
                     f"{_ms(rec.get('latency_ms_before'))} -> {_ms(v.get('latency_ms'))} (float "
                     f"{_ms(v.get('reference_latency_ms'))}) | {rec.get('seconds', '-')} | "
                     f"{unseen.get(art['id'], '-')} | {ranged} | {names} |")
    return lines, seconds


def held_out(bundle: Path, tmp: Path, seed: int = 2) -> dict[str, str]:
    """Each INT8 artifact's and its float reference's lines read right of 100 lines the search never saw, as
    "int8 / float"."""
    import zoo
    from edgesdk_converters import calibration
    from edgesdk_converters.options import QuantizeOptions
    from edgesdk_converters.sources import open_source
    from edgesdk_converters.targets import Built
    from edgesdk_converters.task_choice import choose_task
    from edgesdk_converters.validation.validate import validate

    x, truth = zoo.text_lines(100, seed=seed)
    np.savez(tmp / "rec-unseen.npz", x=x, texts=np.array(truth))
    opts = QuantizeOptions(**zoo.quantize_options("ppocr_rec", "full"))
    src = open_source(zoo.model("ppocr_rec"))
    src.set_input_shapes(dict(opts.input_shapes))
    val = calibration.read_dataset(tmp / "rec-unseen.npz", src.inputs, None, None, "validation")
    src.fix_shapes(val.load(0))
    task = choose_task(opts.task, src)
    arts = {a["id"]: a for a in json.loads((bundle / "manifest.json").read_text())["artifacts"]}
    out = {}
    for aid, art in arts.items():
        if art["precision"] != "int8":
            continue
        pair = [Built(i, art["engine"], arts[i]["precision"], [bundle / arts[i]["files"][0]["path"]],
                      runtime=arts[i].get("runtime") or {}) for i in (aid, f"{art['engine']}-fp32")]
        entries = validate(pair, val, task=task, output_names=[s.name for s in src.outputs])[0]
        out[aid] = " / ".join(_lines(entries[i]["details"]["truth"]["text_accuracy"]) for i in (pair[0].id, pair[1].id))
    return out


def _lines(value) -> str:
    return "-" if value is None else f"{round(100 * value)}"


def _share(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    from edgesdk.cpu import cpu_class, describe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "noop", "recognizer"), default="all")
    parser.add_argument("--max-drop", type=float, default=3.0, help="the recognizer's gate, lines of 100")
    parser.add_argument("--keep", type=Path, help="copy the recognizer's bundle here (to inspect it after)")
    args = parser.parse_args()
    cpu = describe(cpu_class())
    with tempfile.TemporaryDirectory(prefix="recovery.") as tmp:
        tmp = Path(tmp)
        if args.part in ("all", "noop"):
            from bundles import _cli  # noqa: F401  (the benchmarks' own CLI runner)
            from edgesdk_converters.quantize import quantize
            from models import mobilenet_v2_shaped, synthetic_images

            images = ROOT / "build" / "recovery-digits"
            if not (images / "train").is_dir():
                import subprocess

                subprocess.run([sys.executable, str(ROOT / "samples" / "digits" / "export_images.py"), str(images)],
                               check=True, capture_output=True)
            digits = lambda out, mode: quantize(  # noqa: E731
                ROOT / "samples" / "digits" / "digits.pt2", images / "train", out, val=images / "val",
                preprocess=ROOT / "samples" / "digits" / "preprocess.toml", samples=300, recover=mode,
                overwrite=True, progress=False).bundle
            import torch

            model = mobilenet_v2_shaped(seed=0)
            torch.export.save(torch.export.export(model, (torch.from_numpy(synthetic_images(1, seed=99)),)),
                              tmp / "mobilenetv2.pt2")
            np.save(tmp / "calib.npy", synthetic_images(64, seed=1))
            np.save(tmp / "val.npy", synthetic_images(16, seed=2))
            mobilenet = lambda out, mode: quantize(  # noqa: E731
                tmp / "mobilenetv2.pt2", tmp / "calib.npy", out, val=tmp / "val.npy", samples=64, max_drop=100.0,
                max_error_cap=100.0, recover=mode, overwrite=True, progress=False).bundle
            rows = nothing_to_recover("digits", digits, tmp) + nothing_to_recover("mobilenetv2-shaped", mobilenet, tmp)
            print(f"\nNothing to recover, on {cpu}: --recover off against --recover on, same data and seed; p50 at "
                  f"batch 1 measured interleaved in one process; OpenVINO .xml compared with its counter-numbered "
                  f"constant names masked")
            print("| model | artifact | status | layers kept | INT8 MACs | identical files | p50 off (ms) | "
                  "p50 on (ms) | on/off |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            print("\n".join(rows), flush=True)
        if args.part in ("all", "recognizer"):
            rows, seconds = recognizer(tmp, args.max_drop, args.keep)
            print(f"\nPP-OCRv4 recognizer (48x320), on {cpu}: 32 calibration + 100 validation lines, --max-drop "
                  f"{args.max_drop:g} lines, recovery auto; quantize took {seconds:.0f} s")
            print("| artifact | float lines | INT8 lines | after recovery | passed | recovery | layers kept | "
                  "INT8 MACs | p50 ms before -> after (float) | recovery s | unseen lines INT8 / float | "
                  "INT8 with the other ranges | kept (first 6) |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
