"""Does ``auto`` pick a fast backend? Every CPU candidate timed side by side, against auto's and autotune's picks.

    python benchmarks/selection.py [--bundle DIGITS_BUNDLE] [--iters-tiny 2000] [--iters-large 200]

For each bundle (the digits sample and the MobileNetV2-shaped model of models.py), every artifact is
loaded on the CPU (``edgesdk.load(b, engine=E, artifact=A, policy="cpu-only")``) and timed with
``model.predict`` on an already preprocessed array: warm-up, then rounds in which each candidate runs
``--block`` predictions in a row, the order rotating per round; median per candidate (blocks, because
ONNX Runtime's workers keep spinning after a run and slow whatever runs next on this 2-CPU machine). Then it reports
which candidate ``edgesdk.load(b)`` (policy auto) places on, which ``policy="autotune"`` picks (with
EDGESDK_CACHE_DIR in a temporary directory, so it measures instead of reading a cache), and whether
auto's pick is within 10% of the fastest candidate measured here (issue 3).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bundles import digits_bundle, mobilenet_bundle, model_input  # noqa: E402
from timing import OtherLoad, interleaved, p50_us  # noqa: E402

WITHIN = 0.10


def picks(bundle: Path) -> tuple[str, str, dict]:
    """(auto's artifact, autotune's artifact, autotune's decision) on this machine."""
    import edgesdk

    with edgesdk.load(bundle) as auto:
        auto_pick = auto.placement.artifact
        if auto.placement.kind != "CPU":
            print(f"  note: auto placed on {auto.placement.kind} ({auto.placement.device})")
    old = os.environ.get("EDGESDK_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["EDGESDK_CACHE_DIR"] = cache
        try:
            with edgesdk.load(bundle, policy="autotune") as tuned:
                decision = tuned.placement.autotune or {}
                tuned_pick = tuned.placement.artifact
        finally:
            if old is None:
                del os.environ["EDGESDK_CACHE_DIR"]
            else:
                os.environ["EDGESDK_CACHE_DIR"] = old
    if decision.get("cached"):
        sys.exit("autotune read a cached decision from an empty cache dir: the cache location is not honoured")
    return auto_pick, tuned_pick, decision


def run(bundle_path: Path, iters: int, block: int) -> None:
    import edgesdk
    from edgesdk import Bundle

    print(f"\n{bundle_path} ({iters} predictions per candidate, blocks of {block})")
    with OtherLoad() as tuning_load:
        auto_pick, tuned_pick, decision = picks(bundle_path)
    x = model_input(bundle_path)
    models, notes = {}, {}
    for art in Bundle.open(bundle_path).artifacts:
        model = edgesdk.load(bundle_path, engine=art.engine, artifact=art.id, policy="cpu-only")
        if model.placement.artifact != art.id:
            print(f"  {art.id}: not viable here, edgesdk fell back to {model.placement.artifact} "
                  f"({'; '.join(f'{s.reason}: {s.detail}' for s in model.placement.skipped)})")
            model.close()
            continue
        models[art.id] = model
        effective = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
            model.placement.effective_precision, model.placement.effective_precision)
        # OpenVINO's hint covers the ops left in float: "int8 (bf16)" is int8 convolutions, bf16 elsewhere.
        notes[art.id] = art.precision + (f" ({effective})" if effective and effective != art.precision else "")
    with OtherLoad() as others:
        times = interleaved({k: (lambda m=m: m.predict(x)) for k, m in models.items()}, iters, block=block)
    p50 = {k: p50_us(v) for k, v in times.items()}
    for model in models.values():
        model.close()
    tuned_ms = {label.rsplit(":", 1)[-1]: ms for label, ms in decision.get("timings_ms", {}).items()}
    fastest = min(p50, key=p50.get)
    print(f"  other processes kept {others} busy meanwhile ({tuning_load} while autotune measured)")
    print(f"  {'candidate (CPU)':<18} {'precision':<11} {'predict p50':>12} {'vs fastest':>10} {'autotune saw':>12}")
    for k in sorted(p50, key=p50.get):
        marks = " ".join(m for m, pick in (("<- auto", auto_pick), ("<- autotune", tuned_pick)) if pick == k)
        seen = f"{tuned_ms[k] * 1e3:9.1f} us" if k in tuned_ms else f"{'-':>12}"
        print(f"  {k:<18} {notes[k]:<11} {p50[k]:9.1f} us {100 * (p50[k] / p50[fastest] - 1):+9.1f}% {seen}  {marks}")
    if auto_pick not in p50:
        print(f"  auto picked {auto_pick}, which is not among the CPU candidates timed here: MISSED")
        return
    ratio = p50[auto_pick] / p50[fastest]
    print(f"  auto picks {auto_pick}: {100 * (ratio - 1):+.1f}% vs the fastest measured ({fastest}); "
          f"target within {WITHIN:.0%}  {'OK' if ratio <= 1 + WITHIN else 'MISSED'}")
    if tuned_ms and auto_pick in tuned_ms:
        t_ratio = tuned_ms[auto_pick] / min(tuned_ms.values())
        verdict = "OK" if t_ratio <= 1 + WITHIN else "MISSED"
        print(f"  by autotune's own timings (engine.run, golden input, median of its runs): auto's pick is "
              f"{100 * (t_ratio - 1):+.1f}% vs its fastest ({tuned_pick})  {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="the digits bundle (default: build/demo/digits.bundle)")
    ap.add_argument("--large-bundle", type=Path, help="the >= 1 ms bundle (default: build/bench/mobilenetv2.bundle)")
    ap.add_argument("--rebuild", action="store_true", help="quantize the MobileNetV2-shaped bundle again")
    ap.add_argument("--models", default="tiny,large", help="which of tiny,large to measure")
    ap.add_argument("--iters-tiny", type=int, default=2000)
    ap.add_argument("--iters-large", type=int, default=200)
    ap.add_argument("--block", type=int, default=40, help="consecutive predictions of one candidate per round")
    args = ap.parse_args()

    print(f"backend selection on this machine ({os.cpu_count()} CPUs): every CPU candidate timed with "
          "model.predict, interleaved, median")
    models = args.models.split(",")
    if "tiny" in models:
        run(digits_bundle(args.bundle), args.iters_tiny, args.block)
    if "large" in models:
        run(mobilenet_bundle(args.large_bundle, rebuild=args.rebuild), args.iters_large, args.block)


if __name__ == "__main__":
    main()
