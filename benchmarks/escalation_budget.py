"""Budgeted escalation (issue 28) on the digits sample: a fixed threshold against ``EscalationPolicy(target_rate=...)``
on a stream whose hardness shifts half-way, with the hybrid answers' accuracy beside the escalation rates.

    python benchmarks/escalation_budget.py [--inputs 20000] [--noise 0.3] [--target 0.1] [--step 0.1]

The stream: the demo's held-out digits (``build/demo/digits-images/val``, built by ``edgesdk demo`` when missing)
drawn with replacement, Gaussian noise of ``--noise`` times the pixel range on the second half. The device: the
digits bundle's ONNX Runtime INT8 artifact. The cloud: the sample's larger float model
(``samples/digits/digits_cloud.onnx``, the one ``make demo-hybrid`` serves), run by ONNX Runtime behind the cloud
client's mock transport (the hybrid logic end to end without sockets; what is measured is rates and accuracy, not
time). The fixed threshold is the one that escalates ``--target`` of the first 2,000 (clean) inputs, as
``calibrate-escalation`` would choose it for that rate; the budget starts from the same threshold.

Printed per policy: the escalated share and the accuracy of the answers in each half, and the escalated share of
every 1,000-input window (step 100) after 500 inputs of adaptation to the start and to the shift (min - max), with
the windows that straddle the shift apart. Rates and accuracies do not depend on the CPU (printed anyway).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bundles import ROOT, digits_bundle  # noqa: E402

CLOUD_ONNX = ROOT / "samples" / "digits" / "digits_cloud.onnx"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=20_000)
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--target", type=float, default=0.1)
    parser.add_argument("--step", type=float, default=0.1)
    args = parser.parse_args()

    import onnxruntime as ort
    from PIL import Image

    import edgesdk
    from edgesdk import EscalationPolicy, HybridOptions
    from edgesdk.cpu import cpu_class
    from edgesdk.hybrid.client import CloudClient
    from edgesdk.hybrid.model import signals
    from edgesdk.hybrid.transport import MockTransport, Response

    cpu = cpu_class()
    print(f"CPU: {cpu['isa_class']}: {cpu['model']} ({cpu['cpus']} cpus)")
    bundle = digits_bundle()
    files = sorted((bundle.parent / "digits-images" / "val").glob("*/*.png"))
    images = np.stack([np.asarray(Image.open(f).convert("L"), dtype=np.float64) for f in files])
    truth = np.array([int(f.parent.name) for f in files])
    n, half = args.inputs, args.inputs // 2
    rng = np.random.default_rng(28)
    pick = rng.integers(0, len(files), n)
    xs = images[pick]
    xs[half:] += rng.normal(0.0, args.noise * 255, xs[half:].shape)
    xs = np.clip(xs, 0, 255).astype(np.uint8)
    labels = truth[pick]

    session = ort.InferenceSession(str(CLOUD_ONNX), providers=["CPUExecutionProvider"])

    def handler(request):
        sent = json.loads(request.body)
        x = np.asarray(sent["inputs"][0]["data"], np.float32).reshape(sent["inputs"][0]["shape"])
        y = session.run(None, {session.get_inputs()[0].name: x})[0]
        return Response(200, {}, json.dumps({"model_name": "digits", "id": sent["id"], "outputs": [
            {"name": "output_0", "shape": list(y.shape), "datatype": "FP32", "data": y.ravel().tolist()}]}).encode())

    def cloud():
        return CloudClient("http://127.0.0.1:9", "digits", transport=MockTransport(handler), binary=False)

    with edgesdk.load(bundle, artifact="onnxruntime-int8", monitor=False) as device:
        top = np.array([signals(device.io.probabilities(device.predict(x).outputs))["max_prob"] for x in xs[:2000]])
        device_right = np.array([int(np.argmax(device.predict(x).outputs[0])) == y for x, y in zip(xs, labels)])
    fixed = float(np.quantile(top, args.target))
    print(f"{n} inputs, noise {args.noise:g} of the pixel range from input {half}; fixed max_prob threshold "
          f"{fixed:.6f} (escalates {args.target:g} of the first 2,000)\n")
    print("| policy | 1st half: escalated | 1st half: accuracy | 2nd half: escalated | 2nd half: accuracy | "
          "windows after adaptation | windows across the shift |")
    print("|---|---|---|---|---|---|---|")
    print(f"| device only | 0 | {device_right[:half].mean():.4f} | 0 | {device_right[half:].mean():.4f} | - | - |")
    for name, policy in (("fixed threshold", EscalationPolicy(signal="max_prob", threshold=fixed)),
                         (f"target_rate={args.target:g}", EscalationPolicy(signal="max_prob", threshold=fixed,
                                                                           target_rate=args.target,
                                                                           step=args.step))):
        with edgesdk.load(bundle, artifact="onnxruntime-int8", monitor=False, hybrid=HybridOptions(
                mode="prefer-device", cloud=cloud(), policy=policy, check_model=False)) as model:
            escalated, right = np.zeros(n, bool), np.zeros(n, bool)
            for i, (x, y) in enumerate(zip(xs, labels)):
                r = model.predict(x)
                escalated[i], right[i] = r.source == "cloud", int(np.argmax(r.outputs[0])) == y
        starts = range(500, n - 999, 100)
        settled = [escalated[s:s + 1000].mean() for s in starts if not half - 1000 < s < half + 500]
        across = [escalated[s:s + 1000].mean() for s in starts if half - 1000 < s < half + 500]
        print(f"| {name} | {escalated[:half].mean():.3f} | {right[:half].mean():.4f} | {escalated[half:].mean():.3f} "
              f"| {right[half:].mean():.4f} | {min(settled):.3f} - {max(settled):.3f} | "
              f"{min(across):.3f} - {max(across):.3f} |")


if __name__ == "__main__":
    main()
