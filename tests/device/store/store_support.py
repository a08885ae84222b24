"""Helpers of the store tests: versions of the digits bundle, a bundle built to fail its self-check here, the store
options the tests install with, and a real HTTP server on loopback that serves files with Range and can misbehave
(drop the connection half-way, hide the length, never answer)."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from edgesdk import RuntimeOptions, StoreOptions
from support import rehash

# The self-check of the tests: one engine, no speed check (the others are the load's own tests).
CHECK = RuntimeOptions(engine="onnxruntime", speed_check="off", monitor=False)
FAST = StoreOptions(self_check=CHECK)
LOAD = {"engine": "onnxruntime", "speed_check": "off"}


def release(src: Path, dest: Path, version: str, **manifest_keys) -> Path:
    """A copy of the bundle ``src`` at ``dest`` whose manifest says ``version`` (and ``manifest_keys``): another
    version id for the same model files. The manifest is not checksummed (a signature would be made after)."""
    shutil.copytree(src, dest)
    path = dest / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(version=version, **manifest_keys)
    path.write_text(json.dumps(manifest, indent=2))
    return dest


def fail_self_check(bundle: Path) -> Path:
    """Make ``bundle`` fail its self-check on any machine, and nothing else: its golden reference outputs are moved far
    off (every logit + 25) and the manifest's checksums rewritten to match, so only loading it and running the golden
    inputs can tell."""
    golden = bundle / "golden.npz"
    with np.load(golden) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for name in [k for k in arrays if k.startswith("output_")]:
        arrays[name] = arrays[name] + np.asarray(25, arrays[name].dtype)
    np.savez(golden, **arrays)
    rehash(bundle)
    return bundle


def listing(root: Path) -> dict[str, list[str]]:
    """The store folder's contents, for consistency checks."""
    return {name: sorted(p.name for p in (root / name).iterdir()) for name in ("versions", "staging", "trash",
                                                                                "downloads")} | {
        "root": sorted(p.name for p in root.iterdir())}


def version_files(root: Path) -> dict[str, list[str]]:
    """Every path under each version folder of the store, outside its ``bundle/`` (a version holds its bundle and
    ``version.json``, nothing else)."""
    out = {}
    for folder in sorted((root / "versions").iterdir()):
        out[folder.name] = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                                  if p.relative_to(folder).parts[0] != "bundle")
    return out


@dataclass
class Behaviour:
    """How the server answers the next requests (set by a test)."""

    drop_after: int | None = None  # send this many body bytes, then close the connection
    drops: int = 0  # how many of the next answers drop (0: every one while drop_after is set)
    no_length: bool = False  # no Content-Length: the body ends when the connection closes
    hang: bool = False  # accept, read the request, never answer
    status: int | None = None  # answer this status (no body)
    redirect: str | None = None  # answer 302 to this location
    requests: list[dict] = field(default_factory=list)  # path, Range and If-Range of each request
    sent: int = 0  # body bytes sent in all


class FileServer:
    """``http://127.0.0.1:<port>/<name>`` serves the files given to :meth:`serve`, with ``ETag``, ``Range`` (one
    range, ``bytes=N-``) and ``If-Range``, as an HTTP/1.1 server on loopback."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.behaviour = Behaviour()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                server.answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, name: str, data: bytes) -> str:
        self.files[name] = data
        return f"{self.base}/{name}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        b = self.behaviour
        path = handler.path.split("?")[0].lstrip("/")
        b.requests.append({"path": path, "range": handler.headers.get("Range"),
                           "if_range": handler.headers.get("If-Range")})
        if b.hang:
            time.sleep(30)
            return
        if b.redirect is not None:
            handler.send_response(302)
            handler.send_header("Location", b.redirect)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = self.files.get(path)
        if b.status is not None or data is None:
            handler.send_response(b.status or 404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        start, asked = 0, handler.headers.get("Range")
        if asked and asked.startswith("bytes=") and asked.endswith("-") and handler.headers.get("If-Range") in (etag,
                                                                                                               None):
            start = int(asked[6:-1])
        if start >= len(data) and start:
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(data)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        body = data[start:]
        handler.send_response(206 if start else 200)
        handler.send_header("ETag", etag)
        handler.send_header("Accept-Ranges", "bytes")
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if b.no_length:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        else:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if b.drop_after is not None:
            part = body[:b.drop_after]
            handler.wfile.write(part)
            handler.wfile.flush()
            b.sent += len(part)
            if b.drops > 0:
                b.drops -= 1
                if b.drops == 0:
                    b.drop_after = None
            handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True
            return
        handler.wfile.write(body)
        b.sent += len(body)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
