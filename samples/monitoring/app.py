"""A device app whose model's monitor is published through OpenTelemetry, over OTLP/HTTP to a Collector.

    otelcol-contrib --config samples/monitoring/otel-collector.yaml    # in another terminal (README.md beside this)
    .venv/bin/python samples/monitoring/app.py build/demo/digits.bundle --images build/demo/digits-images/val
    curl -s http://127.0.0.1:9464/metrics | grep ^edgesdk_

It loads the bundle, publishes ``model.monitor`` (:func:`edgesdk.monitor.otel.publish`) on a meter provider that
exports every ``--interval`` seconds to ``--endpoint`` (default ``$OTEL_EXPORTER_OTLP_ENDPOINT``, else the Collector
on loopback), runs ``--predictions`` predictions over the images (or the bundle's golden inputs), and shuts the
provider down, which exports a last time. ``--scale 0.5`` darkens every input, so that ``input_drift`` rises.

Needs the extra: ``pip install 'edgesdk[otel]'`` (opentelemetry-api, -sdk, and the OTLP/HTTP exporter).
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

import numpy as np
from PIL import Image

import edgesdk
from edgesdk.monitor.otel import publish
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}


def inputs(bundle: Path, images: Path | None, scale: float) -> list:
    """The app's inputs: the images of a folder (as arrays), else the bundle's golden inputs."""
    if images is not None:
        files = sorted(p for p in images.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise SystemExit(f"no images under {images}")
        return [np.clip(np.asarray(Image.open(p)) * scale, 0, 255).astype(np.uint8) for p in files]
    golden = edgesdk.Bundle.open(bundle).golden()
    names = sorted(k for k in golden.samples if k.startswith("input_"))
    count = len(golden.samples[names[0]])
    samples = [[golden.samples[name][i] * scale for name in names] for i in range(count)]
    return [s[0] if len(s) == 1 else s for s in samples]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--images", type=Path, help="a folder of images to predict (default: the bundle's golden inputs)")
    ap.add_argument("--predictions", type=int, default=2000)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every input by this (0.5: darker images)")
    ap.add_argument("--endpoint", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    help="the Collector's OTLP/HTTP address")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between exports")
    ap.add_argument("--engine", help="onnxruntime, openvino or litert (default: edgesdk's choice)")
    args = ap.parse_args()

    exporter = OTLPMetricExporter(endpoint=args.endpoint.rstrip("/") + "/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=args.interval * 1000)
    provider = MeterProvider(resource=Resource.create({"service.name": "edgesdk-monitoring-sample"}),
                             metric_readers=[reader])
    data = inputs(args.bundle, args.images, args.scale)
    with edgesdk.load(args.bundle, engine=args.engine) as model:
        publish(model, provider)
        for x in itertools.islice(itertools.cycle(data), args.predictions):
            model.predict(x)
        provider.shutdown()  # the last export, while the model's figures are still published
        snap = model.monitor.snapshot()
    print(f"{snap['predictions']} predictions on {snap['identity']['artifact']}, exported to {args.endpoint}")
    for signal, state in snap["signals"].items():
        print(f"  {signal}: {state['level']} ({state['statistic']} {state['value']})")


if __name__ == "__main__":
    main()
