"""A fault-injecting HTTP proxy on loopback, in front of a real V2 server: the network a device really has.

At ``fault_rate`` (seeded), a request gets one of ``faults``: ``delay`` (held ``delay_s`` before it is forwarded,
so a client with a shorter timeout gives up), ``reset`` (the connection is aborted with a TCP RST, no response),
``429`` or ``503`` (an error response with a JSON body, as an overloaded server sends). ``outage = True`` resets
every request until it is set back. Everything else is forwarded unchanged (HTTP/1.1, keep-alive). Used by the
tests and by benchmarks/hybrid_faults.py.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("delay", "reset", "429", "503")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length"}


class FaultProxy:
    def __init__(self, upstream: str, fault_rate: float = 0.3, faults: tuple[str, ...] = FAULTS,
                 delay_s: float = 0.5, seed: int = 0):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host.replace("http://", ""), int(port))
        self.fault_rate, self.faults, self.delay_s = fault_rate, tuple(faults), delay_s
        self.outage = False
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two sends: with Nagle's algorithm the second waits for the client's
            # delayed ACK (~40 ms a response), which would be the proxy's latency, not the network's.
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._draw()
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault in ("429", "503"):
                    data = json.dumps({"error": f"injected {fault}"}).encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if fault == "delay":
                    time.sleep(proxy.delay_s)
                conn = proxy._upstream()
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException):
                    conn.close()
                    proxy._local.conn = None
                    self.send_error(502, "upstream failed")
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up first (e.g. after a delay): expected

            do_GET = do_POST = _handle

        self._local = threading.local()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _draw(self) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self.outage:
                fault = "reset"
            elif self._rng.random() < self.fault_rate:
                fault = self._rng.choice(self.faults)
            else:
                fault = None
            self.counts[fault or "forwarded"] += 1
            return fault

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        return conn

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
