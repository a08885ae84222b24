"""``edgesdk serve``'s monitoring: the device's :class:`edgesdk.monitor.Monitor` on the served artifact, so the cloud
side reports the same figures as a device (drift against the bundle's reference, error rate, latencies, the version
identity) to a JSON-lines file (``--monitor FILE``) and through the same OpenTelemetry instruments
(``--otel``: :func:`edgesdk.monitor.otel.publish` on a meter provider that exports over OTLP/HTTP).

The OTLP exporter is configured the OpenTelemetry way, by the environment: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``; default ``http://localhost:4318``), ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_METRIC_EXPORT_INTERVAL`` (ms, default 60000), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` (default
here ``edgesdk-serve``). The SDK and the exporter come with the ``otel`` extra (``pip install
'edgesdk-cloud[otel]'``); without them ``--otel`` is refused before the server starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError
from edgesdk.monitor import Monitor, MonitorOptions
from edgesdk.monitor.identity import fingerprint, version_identity

EXTRA = "edgesdk-cloud[otel]"
SERVICE_NAME = "edgesdk-serve"


class Telemetry:
    """The served model's monitor (None when neither a file nor OpenTelemetry is asked for) and its exporters."""

    def __init__(self, monitor: Monitor | None, provider: Any = None, publication: Any = None,
                 where: tuple[str, ...] = ()):
        self.monitor = monitor
        self._provider = provider
        self._publication = publication
        self._where = where

    @classmethod
    def start(cls, bundle: Any, artifact: Any, monitor_file: str | Path | None, otel: bool,
              device: str = "CPU") -> "Telemetry":
        """The monitor of ``artifact`` of ``bundle`` (opened on ``device``: serve opens it on the engine's default,
        the CPU), writing to ``monitor_file`` and published over OTLP when ``otel``. Raises :class:`InputError` when
        ``otel`` is asked for without the OpenTelemetry SDK."""
        if monitor_file is None and not otel:
            return cls(None)
        meter_provider = _otlp_provider() if otel else None  # a missing extra fails before anything is made
        digest = fingerprint(bundle)
        monitor = Monitor.for_bundle(
            bundle, lambda: version_identity(bundle, digest, artifact.id, artifact.engine, device, artifact.precision),
            MonitorOptions(sink=None if monitor_file is None else Path(monitor_file)))
        where = ((f"JSON lines to {monitor_file}",) if monitor_file is not None else ()) + \
            (("OpenTelemetry over OTLP/HTTP to " + _endpoint(),) if otel else ())
        if meter_provider is None:
            return cls(monitor, where=where)
        from edgesdk.monitor.otel import publish

        return cls(monitor, meter_provider, publish(monitor, meter_provider), where)

    def describe(self) -> str:
        return ", ".join(self._where)

    def close(self) -> None:
        """Stop publishing, export what is left, write the monitor's last snapshot."""
        if self._publication is not None:
            self._publication.close()
        if self._provider is not None:
            self._provider.shutdown()  # a last collection and export
        if self.monitor is not None:
            self.monitor.close()


def _otlp_provider() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError as exc:
        raise InputError(f"--otel needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({exc.name} is missing): "
                         f"pip install '{EXTRA}'") from exc
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    return MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
                         resource=Resource.create(attributes))


def _endpoint() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or \
        (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318").rstrip("/") + "/v1/metrics"
