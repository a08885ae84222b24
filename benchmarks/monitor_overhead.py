"""What the monitor (issue 27) adds to a prediction: ``predict`` with the default monitor against ``monitor=False``,
on the digits bundle, each engine's INT8 artifact, interleaved in one run.

    python benchmarks/monitor_overhead.py [--bundle DIGITS_BUNDLE] [--iters 20000] [--block 10]

Both models run the same digits images (scikit-learn's, 8x8, preprocessed by the bundle as an app's would be), in
rounds of --block calls each, the order rotating (benchmarks/timing.py). Printed per engine: p50 with and without
the monitor and their difference (the target: <= 5 us), the mean difference (which carries the evaluations: every
50 predictions the monitor reads its window, bins it and updates the levels), and one evaluation's own cost.
The CPU class is printed first: the numbers hold for that class only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bundles import digits_bundle  # noqa: E402
from timing import interleaved  # noqa: E402

ENGINES = ("litert", "openvino", "onnxruntime")
TARGET_US = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=None)
    parser.add_argument("--iters", type=int, default=20_000)
    parser.add_argument("--block", type=int, default=10)
    args = parser.parse_args()

    import edgesdk
    from edgesdk.cpu import cpu_class
    from sklearn.datasets import load_digits

    cpu = cpu_class()
    print(f"CPU: {cpu['isa_class']}: {cpu['model']} ({cpu['cpus']} cpus)")
    bundle = digits_bundle(args.bundle)
    images = (load_digits().images * 16).clip(0, 255).astype(np.uint8)
    rows = []
    for engine in ENGINES:
        artifact = f"{engine}-int8"
        try:
            on = edgesdk.load(bundle, engine=engine, artifact=artifact, policy="cpu-only")
            off = edgesdk.load(bundle, engine=engine, artifact=artifact, policy="cpu-only", monitor=False)
        except edgesdk.EdgeSDKError as exc:
            print(f"{engine}: not measured ({exc})")
            continue
        turn = {"on": 0, "off": 0}

        def call(model, key):
            def run():
                k = turn[key]
                turn[key] = k + 1
                model.predict(images[k % len(images)])
            return run

        times = interleaved({"on": call(on, "on"), "off": call(off, "off")}, args.iters, warmup=500, block=args.block)
        monitor = on.monitor
        started = time.perf_counter()
        for _ in range(200):
            monitor._evaluated_seen = -1  # as if new predictions had come (else the drift is not recomputed)
            monitor.evaluate()
        evaluation_ms = (time.perf_counter() - started) / 200 * 1e3
        p50 = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
        mean = {k: float(np.mean(v)) * 1e6 for k, v in times.items()}
        rows.append((engine, p50["off"], p50["on"], p50["on"] - p50["off"], mean["on"] - mean["off"], evaluation_ms,
                     monitor.options.every))
        on.close()
        off.close()
    print(f"\n{args.iters} predictions per model, blocks of {args.block}, interleaved; digits bundle {bundle}\n")
    print("| engine | p50 off (us) | p50 on (us) | p50 on - off (us) | mean on - off (us) | one evaluation (ms) "
          "| target |")
    print("|---|---|---|---|---|---|---|")
    for engine, off_us, on_us, diff, mean_diff, eval_ms, every in rows:
        verdict = "met" if diff <= TARGET_US else "missed"
        print(f"| {engine} | {off_us:.1f} | {on_us:.1f} | {diff:.2f} | {mean_diff:.2f} | {eval_ms:.3f} (every "
              f"{every}: {eval_ms * 1e3 / every:.1f} us a prediction) | {verdict} (<= {TARGET_US:g} us p50) |")


if __name__ == "__main__":
    main()
