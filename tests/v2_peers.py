"""Two V2 (Open Inference Protocol) servers besides ``edgesdk serve``, for the interop tests, each serving the digits
bundle's float ONNX artifact on 127.0.0.1 only:

- ``kserve``: KServe's ModelServer with a custom ``kserve.Model`` written as KServe's docs show (its metadata lists
  what the model's author returns: nothing by default; datatypes as the author spells them, here lower case), in the
  cloud venv (``make setup-cloud``). Program: ``v2_peer_kserve.py``.
- ``mlserver``: Seldon's MLServer with a custom runtime (``v2_peer_mlserver.py``), in its own venv
  (``$EDGESDK_MLSERVER_VENV``, by default ``<repo>/.venv-mlserver``, made by ``make setup-mlserver``: MLServer pins
  what the other venvs cannot share). Its tests skip, saying so, when that venv is not there.

Both serve the same model names (:data:`MODELS`), which differ in what their metadata lists and in how they answer.
This module is also imported by the two server programs, in their own venvs: it imports only numpy at the top.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
READY_TIMEOUT_S = 120  # MLServer imports and loads four models in a few seconds; a shared 2-core machine is slower


def _tensors(specs: list[dict], shape=lambda s: [-1, *s[1:]]) -> list[dict]:
    return [{"name": t["name"], "datatype": "FP32", "shape": shape(list(t["shape"]))} for t in specs]


# model name -> what its metadata lists (from the bundle's manifest) and how it answers
MODELS: dict[str, dict[str, Any]] = {
    # lists no inputs and no outputs (MLServer without them in model-settings; a KServe custom model by default)
    "digits": {"metadata": lambda m: {}, "answer": "honest"},
    # lists the inputs and outputs, the batch dimension variable (-1)
    "digits-listed": {"metadata": lambda m: {"inputs": _tensors(m["inputs"]), "outputs": _tensors(m["outputs"])},
                      "answer": "honest"},
    # lists an input of three channels where the bundle sends one
    "digits-contradicting": {"metadata": lambda m: {"inputs": _tensors(m["inputs"], lambda s: [-1, 3, *s[2:]])},
                             "answer": "honest"},
    # lists nothing, and answers nine scores where the bundle has ten
    "digits-wrong": {"metadata": lambda m: {}, "answer": "nine-scores"},
}


def answer(kind: str, scores: np.ndarray) -> np.ndarray:
    """What a model of :data:`MODELS` answers, from the artifact's true output."""
    return scores[:, :-1] if kind == "nine-scores" else scores


class PeerServer:
    """One of the two peers (``kind`` kserve or mlserver) serving ``bundle`` on a free loopback port; a context
    manager. Entering waits for ``/v2/health/ready`` (failing with the server's log when it does not come); leaving
    sends SIGTERM and waits for the exit."""

    def __init__(self, kind: str, bundle: Path, workdir: Path):
        from cloud_server import free_port

        self.kind, self.bundle, self.workdir = kind, Path(bundle), Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.workdir / f"{kind}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def _command(self) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        if self.kind == "kserve":
            from cloud_server import cloud_venv

            return [str(cloud_venv() / "bin" / "python"), str(TESTS / "v2_peer_kserve.py"), str(self.bundle),
                    str(self.port)], env
        venv = mlserver_venv()
        return [str(venv / "bin" / "mlserver"), "start", str(self._mlserver_repository())], env

    def _mlserver_repository(self) -> Path:
        """The settings MLServer reads: the server's (loopback, no metrics server, models in this process) and one
        folder per model with its model-settings.json."""
        from cloud_server import free_port

        root = self.workdir / f"mlserver-{self.port}"
        root.mkdir(parents=True)
        manifest = json.loads((self.bundle / "manifest.json").read_text())
        (root / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1", "http_port": self.port, "grpc_port": free_port(), "metrics_endpoint": None,
            "parallel_workers": 0, "debug": False, "load_models_at_startup": True,
            "environments_dir": str(root / "envs"), "metrics_dir": str(root / "metrics")}))
        for name, spec in MODELS.items():
            (root / name).mkdir()
            (root / name / "model-settings.json").write_text(json.dumps({
                "name": name, "implementation": "v2_peer_mlserver.OnnxPeer", **spec["metadata"](manifest),
                "parameters": {"extra": {"bundle": str(self.bundle), "answer": spec["answer"]}}}))
        return root

    def __enter__(self) -> "PeerServer":
        from cloud_server import call, wait_ready

        command, env = self._command()
        with open(self.log, "wb") as log:  # a file, not a pipe: a chatty server never blocks on a full pipe
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env)
        wait_ready(self.proc, lambda: call(f"{self.url}/v2/health/ready", timeout_s=2)[0] == 200 and all(
            call(f"{self.url}/v2/models/{name}/ready", timeout_s=2)[0] == 200 for name in MODELS),
            f"the {self.kind} peer", self.output, self.__exit__, READY_TIMEOUT_S)
        return self

    def __exit__(self, *exc) -> None:
        from cloud_server import terminate

        if self.proc is None or self.proc.poll() is not None:
            return
        terminate(self.proc)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def mlserver_venv() -> Path:
    """The MLServer venv, or a skip saying how to make it."""
    import pytest

    venv = Path(os.environ.get("EDGESDK_MLSERVER_VENV") or REPO / ".venv-mlserver")
    if not (venv / "bin" / "mlserver").is_file():
        pytest.skip(f"the MLServer venv {venv} is not set up: run `make setup-mlserver` (or set "
                    "EDGESDK_MLSERVER_VENV to a venv with mlserver and onnxruntime)")
    return venv


if __name__ == "__main__":
    sys.exit("v2_peers is a helper of the test suite, not a program")
