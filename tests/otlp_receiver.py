"""What an OpenTelemetry Collector's OTLP/HTTP receiver does with metrics, on loopback: decodes each export (protobuf,
gzip or not) and keeps, per metric name, the attribute sets of its data points. For the tests that export over
OTLP (the monitoring sample, ``edgesdk serve --otel``): nothing leaves the machine."""

from __future__ import annotations

import gzip
import re
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from edgesdk.monitor import otel
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)


def documented() -> dict[str, dict]:
    """The table of :mod:`edgesdk.monitor.otel`'s docstring: name -> kind, unit, attributes (beside the identity)."""
    rows = {}
    for line in otel.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            name, kind, unit, attributes, _ = cells
            rows[name.strip("`")] = {"kind": kind, "unit": unit, "attributes": set(re.findall(r"`([^`]+)`",
                                                                                             attributes))}
    return rows


class OtlpReceiver(ThreadingHTTPServer):
    """Started on a free loopback port (``url``); a context manager that serves on a thread until left."""

    def __init__(self):
        self.paths: set[str] = set()
        self.points: dict[str, list[dict[str, str]]] = defaultdict(list)  # metric name -> each point's attributes
        self.resources: list[dict[str, str]] = []
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _OtlpHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    @property
    def names(self) -> set[str]:
        with self._lock:
            return set(self.points)

    def __enter__(self) -> "OtlpReceiver":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def take(self, request: ExportMetricsServiceRequest, path: str) -> None:
        with self._lock:
            self.paths.add(path)
            for rm in request.resource_metrics:
                self.resources.append({kv.key: _value(kv.value) for kv in rm.resource.attributes})
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        self.points[m.name] += [{kv.key: _value(kv.value) for kv in p.attributes}
                                                for p in data.data_points] or [{}]


def _value(v) -> str:
    return str(getattr(v, v.WhichOneof("value")))


class _OtlpHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.take(ExportMetricsServiceRequest.FromString(body), self.path)
        answer = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass
