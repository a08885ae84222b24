"""A real ``edgesdk serve`` for the tests: started in the cloud venv, reached over loopback with the standard library.

The cloud venv (kserve, tritonclient, onnxruntime) is ``$EDGESDK_CLOUD_VENV``, by default ``<repo>/.venv-cloud``,
made by ``make setup-cloud``. Without it the tests that need it fail with that fix; they never skip.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support import REPO

READY_TIMEOUT_S = 90  # kserve, fastapi and onnxruntime import in a few seconds; a shared 2-core machine is slower


def cloud_venv() -> Path:
    venv = Path(os.environ.get("EDGESDK_CLOUD_VENV") or REPO / ".venv-cloud")
    if not (venv / "bin" / "edgesdk").is_file() or not (venv / "bin" / "python").is_file():
        pytest.fail(f"the cloud venv {venv} is not set up (edgesdk serve and tritonclient run there): run "
                    "`make setup-cloud`, or set EDGESDK_CLOUD_VENV to a venv with "
                    "pip install -e '.[cloud,cloud-dev,onnxruntime]'", pytrace=False)
    return venv


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None, headers: dict[str, str] | None = None,
         timeout_s: float = 30) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON) and return the status and the decoded JSON answer, also for 4xx/5xx."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, json.loads(raw) if raw else None


# ``edgesdk_cloud.server.serve(bundle, port=..., **options)`` in the cloud venv: options the command line lacks.
SERVE_API = "import json, sys; from edgesdk_cloud.server import serve; " \
            "serve(sys.argv[1], port=int(sys.argv[2]), **json.loads(sys.argv[3]))"


def wait_ready(proc: subprocess.Popen, ready, what: str, output, give_up, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until ``ready()`` is true for the server ``proc`` (``what`` names it in a failure, with the tail of
    ``output()``); fail the test if it exits first, or after ``timeout_s`` (calling ``give_up()`` first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it was ready:\n{output()[-4000:]}",
                        pytrace=False)
        try:
            if ready():
                return
        except OSError:  # not listening yet
            pass
        time.sleep(0.1)
    give_up()
    pytest.fail(f"{what} was not ready after {timeout_s} s:\n{output()[-4000:]}", pytrace=False)


def terminate(proc: subprocess.Popen) -> int:
    """SIGTERM (a clean stop), SIGKILL after 30 s; the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class CloudServer:
    """``edgesdk serve BUNDLE ARGS...`` from the cloud venv, on a free port; a context manager.

    With ``options`` (keyword arguments of :func:`edgesdk_cloud.server.serve`, JSON values), the server is started
    by calling that function instead of the command, and ``args`` must be empty. Entering waits for
    ``/v2/health/ready`` (failing with the server's log when it does not come); leaving sends SIGTERM and waits for
    the exit.
    """

    def __init__(self, bundle: Path, *args: str, log_dir: Path, host: str = "127.0.0.1",
                 options: dict[str, Any] | None = None, env: dict[str, str] | None = None):
        if options is not None and args:
            raise ValueError("give command-line args or API options, not both")
        self.bundle = bundle
        self.options = None if options is None else {**options, **({"host": host} if host != "127.0.0.1" else {})}
        self.args = [*args] + (["--host", host] if host != "127.0.0.1" else [])
        self.host = host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log = log_dir / f"serve-{self.port}.log"
        self.env = env  # the server's environment (None: this process's)
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    def __enter__(self) -> "CloudServer":
        if self.options is None:
            command = [str(cloud_venv() / "bin" / "edgesdk"), "serve", str(self.bundle), "--port", str(self.port),
                       *self.args]
        else:
            command = [str(cloud_venv() / "bin" / "python"), "-c", SERVE_API, str(self.bundle), str(self.port),
                       json.dumps(self.options)]
        with open(self.log, "wb") as log:  # a file, not a pipe: a chatty server never blocks on a full pipe
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.log.parent,
                                         env=self.env)
        wait_ready(self.proc, lambda: call(f"{self.url}/v2/health/ready", timeout_s=2)[0] == 200,
                   f"`{' '.join(command)}`", self.output, self.stop)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.returncode is not None:
            return
        self.returncode = terminate(self.proc)

    def output(self) -> str:
        """What the server wrote so far (stdout and stderr, interleaved)."""
        return self.log.read_text(errors="replace")

    def infer(self, body: dict, model: str | None = None, **kw) -> tuple[int, Any]:
        return call(f"{self.url}/v2/models/{model or self.model}/infer", body, **kw)

    @property
    def model(self) -> str:
        return json.loads((self.bundle / "manifest.json").read_text())["name"]
