"""The shapes detector in hybrid mode: the INT8 detector on the device, the same detector's float artifact in the cloud.

    make demo-hybrid    # after the digits one; or: .venv/bin/python samples/shapes/hybrid.py [--cloud-venv DIR]

1. Builds what is missing: the device bundle (``edgesdk demo --sample shapes``: shapes_detector.onnx -> INT8 for the
   three engines) and the cloud bundle (the same detector quantized for ONNX Runtime alone; its float artifact is
   what the cloud serves). Both are named ``shapes``, with the same input ``image`` and output ``predictions``.
2. Writes validation images half of which are hard (``data.py --hard 0.5``: faint shapes under heavy noise), so that
   some inputs leave the detector unsure: candidate boxes scored inside its uncertain band [0.3, 0.7).
3. Serves the cloud bundle with ``edgesdk serve`` (KServe's ModelServer, from the cloud venv) on loopback.
4. Calibrates the device bundle's escalation threshold against it (``edgesdk calibrate-escalation``): no labels, the
   detection task's signal ``uncertain_share`` (the share of the candidates scored at least 0.3 that score under
   0.7), and "accuracy" is agreement with the cloud's answer (an image agrees when the device's boxes pass the
   detection gate against the cloud's: box F1 >= 0.9 at IoU 0.5, matched scores within 0.1 on average). The goal
   here: the best agreement escalating at most 30% of the images (``--target-escalation``).
5. Runs the validation images three ways through ``edgesdk.load(..., mode=...)``: device-only, cloud-only and
   prefer-device (hybrid), and prints per mode the escalation rate, the agreement with the cloud (also on the easy and
   the hard half), box F1 against the generated ground truth, and latency p50/p95 per source. As a check on choosing
   and measuring on the same images, it also picks the threshold on the even-numbered images and measures on the
   odd-numbered ones.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from detect import Detections, f1, match_counts  # this sample's reference matching (samples/shapes/detect.py)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORK = REPO / "build" / "demo"  # --workdir
HARD_SHARE = 0.5


def run(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def ensure_bundles(edgesdk_cli: str) -> tuple[Path, Path]:
    """The device bundle (every engine's INT8) and the cloud bundle (ONNX Runtime's float is served), made if
    missing."""
    device, cloud, data = WORK / "shapes.bundle", WORK / "shapes-cloud.bundle", WORK / "shapes-data"
    if '"detection"' not in _read(device / "manifest.json"):
        run(edgesdk_cli, "demo", "--sample", "shapes", "--workdir", str(WORK), "-q")
    if not (cloud / "manifest.json").is_file():
        run(edgesdk_cli, "quantize", str(HERE / "shapes_detector.onnx"), "--calib", str(data / "calib"),
            "--val", str(data / "val"), "--preprocess", str(HERE / "preprocess.toml"),
            "--task-config", str(HERE / "task.toml"), "--labels", str(data / "labels.txt"), "--targets", "onnx",
            "--name", "shapes", "--samples", "100", "-q", "-o", str(cloud), "--force")
    return device, cloud


def ensure_images() -> Path:
    """Validation images, every second one hard (data.py --hard 0.5); returns the folder holding val/ and val.json."""
    out = WORK / "shapes-hybrid-data"
    if not (out / "val.json").is_file():
        run(sys.executable, str(HERE / "data.py"), str(out), "--hard", str(HARD_SHARE))
    return out


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


class Server:
    """``edgesdk serve`` from the cloud venv on a free loopback port."""

    def __init__(self, venv: Path, bundle: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(venv / "bin" / "edgesdk"), "serve", str(bundle), "--port", str(self.port)]
        self.log = WORK / "serve-shapes.log"

    def __enter__(self) -> "Server":
        print("$", " ".join(self.command), f"> {self.log}", flush=True)
        self.proc = subprocess.Popen(self.command, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"edgesdk serve exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        sys.exit(f"edgesdk serve was not ready after 120 s:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def percentiles(ms: list[float]) -> str:
    if not ms:
        return "-"
    p50, p95 = np.percentile(ms, [50, 95])
    return f"p50 {p50:.3f} ms, p95 {p95:.3f} ms (n={len(ms)})"


def predict_all(edgesdk, device_bundle: Path, url: str, images: list[Path], mode: str, artifact: str) -> list:
    with edgesdk.load(device_bundle, mode=mode, cloud=url, artifact=artifact) as model:
        return [model.predict(p) for p in images]


def summarize(results: list, cloud_results: list, truth: list[dict], hard: np.ndarray, task) -> dict:
    """Escalation rate, agreement with the cloud's answers (all, easy, hard), F1 against the ground truth and the
    latency (preprocess + inference, or + the cloud call) per source."""
    from edgesdk_converters.escalation import agrees

    agree = np.array([agrees(task, r.decoded, c.decoded, r.outputs, c.outputs)
                      for r, c in zip(results, cloud_results)])
    counts = []
    for r, t in zip(results, truth):
        found = Detections(np.array([d.box for d in r.decoded.detections], np.float32).reshape(-1, 4),
                           np.array([d.score for d in r.decoded.detections]),
                           np.array([d.class_index for d in r.decoded.detections], np.int64))
        counts.append(match_counts(found, np.array(t["boxes"], np.float32).reshape(-1, 4), np.array(t["classes"])))
    latency = {"device": [], "cloud": []}
    for r in results:
        latency[r.source].append(r.timings_ms["preprocess"] + r.timings_ms.get("inference", 0.0)
                                 + r.timings_ms.get("cloud", 0.0))
    return {"agreement": float(agree.mean()), "agreement_easy": float(agree[~hard].mean()),
            "agreement_hard": float(agree[hard].mean()), "f1": f1(counts)[0], "agree": agree,
            "escalated": sum(r.escalation_reason is not None for r in results) / len(results),
            "degraded": sum(r.degraded for r in results), "latency": latency}


def split_half(signal_values: np.ndarray, device_agrees: np.ndarray, target: float) -> dict:
    """The threshold chosen on the even-numbered images (best agreement escalating at most ``target``; the signal
    is hard when high), measured on the odd-numbered ones."""
    even, odd = np.arange(len(signal_values)) % 2 == 0, np.arange(len(signal_values)) % 2 == 1
    best = None
    for t in np.unique(np.concatenate([signal_values, [1.0]])):
        esc = signal_values[even] > t
        agreement = np.where(esc, True, device_agrees[even]).mean()
        if esc.mean() <= target and (best is None or (agreement, -esc.mean()) > best[1:]):
            best = (float(t), agreement, -esc.mean())
    esc = signal_values[odd] > best[0]
    return {"threshold": best[0], "agreement": float(np.where(esc, True, device_agrees[odd]).mean()),
            "escalated": float(esc.mean()), "images": int(odd.sum())}


def main() -> None:
    global WORK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cloud-venv", type=Path, default=Path(os.environ.get("EDGESDK_CLOUD_VENV", REPO / ".venv-cloud")),
                    help="venv with edgesdk serve (make setup-cloud)")
    ap.add_argument("--workdir", type=Path, default=WORK, help="where the bundles and images are (default build/demo)")
    ap.add_argument("--artifact", default="litert-int8", help="the device's artifact (default litert-int8, what an "
                    "edge device runs; onnxruntime-int8 and openvino-int8 work too)")
    ap.add_argument("--target-escalation", type=float, default=0.3, help="escalate at most this share (default 0.3)")
    ap.add_argument("--json", action="store_true", help="also print a JSON summary as the last line")
    args = ap.parse_args()
    WORK = args.workdir.resolve()
    if not (args.cloud_venv / "bin" / "edgesdk").is_file():
        sys.exit(f"no cloud venv at {args.cloud_venv}: run `make setup-cloud` first")

    import edgesdk
    from edgesdk.tasks import task_of
    from edgesdk_converters.escalation import calibrate_escalation

    cli = str(Path(sys.executable).parent / "edgesdk")
    WORK.mkdir(parents=True, exist_ok=True)
    device_bundle, cloud_bundle = ensure_bundles(cli)
    data = ensure_images()
    labels = json.loads((data / "val.json").read_text())["images"]
    images = sorted((data / "val").glob("*.png"))
    truth = [labels[p.name] for p in images]
    hard = np.array([t["hard"] for t in truth])

    with Server(args.cloud_venv, cloud_bundle) as server:
        print(f"\ncloud: {cloud_bundle.name} served at {server.url}; device: {device_bundle.name} ({args.artifact})\n")
        entry = calibrate_escalation(device_bundle, data / "val", cloud=server.url, artifact=args.artifact,
                                     target_escalation=args.target_escalation, progress=False,
                                     say=lambda text: print(text, flush=True))
        print(f"\n{'escalated':>10} {'agreement with cloud':>21}   (the curve, from calibrate-escalation)")
        for p in entry["curve"]:
            if p["escalation_rate"] <= 0.5:
                print(f"{p['escalation_rate']:>10.1%} {p['accuracy']:>21.2%}")
        results = {mode: predict_all(edgesdk, device_bundle, server.url, images, mode, args.artifact)
                   for mode in ("device-only", "cloud-only", "prefer-device")}

    task = task_of(edgesdk.Bundle.open(device_bundle).manifest)  # the task the agreement is judged by
    runs = {mode: summarize(r, results["cloud-only"], truth, hard, task) for mode, r in results.items()}
    print(f"\n{len(images)} validation images ({int(hard.sum())} hard); escalates when {entry['signal']} > "
          f"{entry['threshold']:.4f}")
    print(f"{'mode':<14} {'escalated':>9} {'agrees w/ cloud':>15} {'easy':>7} {'hard':>7} {'F1 vs truth':>11}  "
          "latency by source (preprocess + inference / cloud call)")
    for mode, r in runs.items():
        lat = "; ".join(f"{src}: {percentiles(ms)}" for src, ms in r["latency"].items() if ms)
        print(f"{mode:<14} {r['escalated']:>9.1%} {r['agreement']:>15.2%} {r['agreement_easy']:>7.1%} "
              f"{r['agreement_hard']:>7.1%} {r['f1']:>11.3f}  {lat}")
    hybrid = runs["prefer-device"]
    reasons = sorted({str(r.escalation_reason) for r in results["prefer-device"] if r.escalation_reason})
    print(f"\nhybrid escalated {hybrid['escalated']:.1%} (goal: at most {args.target_escalation:.0%}; reasons: "
          f"{', '.join(reasons) or 'none'}) and agrees with the cloud on {hybrid['agreement']:.2%} of the images "
          f"(device-only {runs['device-only']['agreement']:.2%}); degraded answers: {hybrid['degraded']}")

    # Chosen and measured on the same images above; here: chosen on the even ones, measured on the odd ones.
    sig = np.array([r.signals[entry["signal"]] or 0.0 for r in results["prefer-device"]])
    check = split_half(sig, runs["device-only"]["agree"], args.target_escalation)
    print(f"split-half check: threshold {check['threshold']:.4f} chosen on the even images; on the {check['images']} "
          f"odd ones hybrid agrees {check['agreement']:.2%} escalating {check['escalated']:.1%}")
    if args.json:
        summary = {mode: {k: v for k, v in r.items() if k not in ("agree", "latency")} for mode, r in runs.items()}
        summary.update(threshold=entry["threshold"], signal=entry["signal"], curve=entry["curve"], split_half=check,
                       agreement_with=entry.get("agreement_with"))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
