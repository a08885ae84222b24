"""The digits model watched in the field: the monitor catches the camera going dark.

    .venv/bin/python samples/digits/monitor.py [--bundle build/demo/digits.bundle] [--telemetry OUT.jsonl]

1. Loads the demo's digits bundle (``edgesdk demo`` builds it when it is missing) with the default monitor, writing
   its telemetry to a JSON-lines file (``MonitorOptions(sink=...)``), and registers an ``on_alert`` hook.
2. Predicts 1,000 digits drawn from scikit-learn's set (what the bundle was calibrated on): nothing is raised.
3. Predicts 1,000 more from the same set made 30% darker (a camera whose exposure drifted): ``input_drift`` goes
   to warn, then alert, within a few hundred predictions, naming the feature that moved most; the confidence
   features move too.
4. Prints the snapshot's signals and the drift of the features that moved most, then
   ``edgesdk monitor OUT.jsonl`` reads the same file back.

Nothing leaves the machine: the telemetry is a local file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUNDLE = REPO / "build" / "demo" / "digits.bundle"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=BUNDLE)
    parser.add_argument("--telemetry", type=Path, default=REPO / "build" / "demo" / "digits-telemetry.jsonl")
    args = parser.parse_args()

    import edgesdk
    from edgesdk.monitor import MonitorOptions
    from sklearn.datasets import load_digits

    if not (args.bundle / "manifest.json").is_file():
        print(f"$ edgesdk demo --workdir {args.bundle.parent}", flush=True)
        subprocess.run([sys.executable, "-m", "edgesdk", "demo", "--workdir", str(args.bundle.parent), "-q"],
                       check=True)
    args.telemetry.unlink(missing_ok=True)
    images = (load_digits().images * 16).clip(0, 255).astype(np.uint8)
    rng = np.random.default_rng(0)

    with edgesdk.load(args.bundle, monitor=MonitorOptions(sink=args.telemetry, sink_every_s=5)) as model:
        model.monitor.on_alert(lambda a: print(f"  [{a.predictions:5d}] {a.signal}: {a.previous} -> {a.level} "
                                               f"({a.statistic} {a.value:.3f}, most: {a.feature})"))
        print(f"{model.bundle.name} on {model.placement.artifact}; 1,000 digits as calibrated:")
        for i in rng.integers(0, len(images), 1000):
            model.predict(images[i])
        print("1,000 digits 30% darker:")
        for i in rng.integers(0, len(images), 1000):
            model.predict((images[i] * 0.7).astype(np.uint8))
        snap = model.monitor.snapshot()
    print("\nsignals:", ", ".join(f"{k} {v['level']} ({v['value']})" for k, v in snap["signals"].items()))
    moved = sorted(snap["drift"]["inputs"].items(), key=lambda kv: -kv[1]["psi"])[:3]
    for name, d in moved:
        print(f"  {name}: psi {d['psi']:.2f}, mean {d['reference_mean']:.3f} -> {d['mean']:.3f}")
    print(f"\n$ edgesdk monitor {args.telemetry}", flush=True)
    subprocess.run([sys.executable, "-m", "edgesdk", "monitor", str(args.telemetry)], check=True)


if __name__ == "__main__":
    main()
