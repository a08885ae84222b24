"""Isolated probe: open an artifact in a child process before this process touches it.

A hostile or damaged model file can crash an engine's native code (a segfault or an abort), which no
``try`` catches: the application dies with it. ``load(..., isolate=True)`` therefore first opens each
artifact, and runs it on every golden input the numerics check will run here
(:func:`edgesdk.numerics.golden_feeds`), in a fresh interpreter (``sys.executable -I -c ...``). Only
when that child finishes does the load open the artifact in this process.

What the child's end means (:func:`probe`):

- it finished and ran: nothing is raised, the caller opens the artifact here;
- it raised an edgesdk error (``BackendUnavailable`` with its reason, ``BundleError``): the same
  error is raised here, saying it came from the probe, and the file is never opened here;
- it was killed by a signal (SIGSEGV, SIGABRT...), exited with another status, wrote no verdict
  or ran out of ``timeout``: ``BackendUnavailable("isolated_probe_failed")`` naming the artifact,
  the signal or status and the last lines of the child's stderr. :func:`edgesdk.load` skips that
  candidate, and raises :class:`~edgesdk.errors.BundleError` when no other candidate serves.

The verdict is a file the child creates (exclusively, once) in a temporary directory of this process,
not a line on stdout: an engine or a model that prints cannot forge it. The child runs in isolated mode
(``-I``: no current directory or script directory on its path, no ``PYTHON*`` variables, so a planted
``json.py`` in the working directory is not imported), and its environment lacks the variables whose
names look like secrets (:data:`SECRET_WORDS`): the probe needs none.

The child imports what a device imports (edgesdk, numpy, the one engine), never torch or the
converters; it sees this process's ``sys.path`` (passed explicitly), so a backend added with
:func:`edgesdk.engines.register_backend` is imported there by its module name (one defined in
``__main__`` cannot be, and fails the probe). It writes no core dump. With ``cache_dir`` the child
fills the engine's compile cache as a load here would, so the load that follows it may be a cache hit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .bundle import Bundle, safe_member
from .engines import ENGINE_NAMES, engine_class
from .errors import BackendUnavailable, BundleError

PROBE_TIMEOUT_S = 300.0  # an NPU or GPU compile of a large model can take minutes
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")  # env names with these are not passed to the child
_TAIL_LINES = 12  # lines of the child's stderr quoted in the error

# argv[1] is JSON: the model, engine, options, golden file and input count, the verdict file, the parent's
# sys.path and, for a registered backend, where to import it from. faulthandler prints the Python stack of a crash on
# stderr (the native crash itself still ends the child by its signal).
_CHILD = r"""
import faulthandler, json, sys
faulthandler.enable()
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (ImportError, ValueError, OSError):
    pass
args = json.loads(sys.argv[1])
sys.path[:0] = [p for p in args["sys_path"] if p not in sys.path]
import importlib
import numpy as np
from edgesdk.engines import open_engine, register_backend
from edgesdk.errors import BackendUnavailable, EdgeSDKError
from edgesdk.numerics import golden_feeds

def verdict(obj):
    # "x": created once; if anything else made the file first, this raises and the child's status says so
    with open(args["verdict"], "x", encoding="utf-8") as f:
        json.dump(obj, f)

try:
    if args["plugin"] is not None:
        backend = importlib.import_module(args["plugin"]["module"])
        for part in args["plugin"]["qualname"].split("."):
            backend = getattr(backend, part)
        register_backend(args["engine"], backend)
    runs = []
    if args["golden"] is not None:
        with np.load(args["golden"], allow_pickle=False) as golden:
            runs = golden_feeds({k: golden[k] for k in golden.files}, args["inputs"])
    engine = open_engine(args["engine"], args["model"], **args["options"])
    try:
        for i, feeds in enumerate(runs):
            try:
                engine.run(feeds)
            except EdgeSDKError:
                raise
            except Exception as exc:  # as the numerics check reports it in the parent
                raise BackendUnavailable("run_failed", f"failed on golden input {i}: {exc}") from exc
    finally:
        engine.close()
except EdgeSDKError as exc:
    verdict({"error": type(exc).__name__, "reason": getattr(exc, "reason", None),
             "detail": getattr(exc, "detail", str(exc))})
    sys.exit(0)
verdict({"ok": True})
"""


def probe(bundle: Bundle, artifact_id: str, engine: str, options: dict[str, Any], *,
          timeout: float = PROBE_TIMEOUT_S) -> float:
    """Open ``artifact_id`` of ``bundle`` on ``engine`` with ``options`` in a child process, run every golden input.

    Returns the child's wall time in ms when it finished cleanly; raises as the module docstring says.
    """
    art = bundle.artifact(artifact_id)
    where = f"{artifact_id} on {engine}:{options.get('device', 'CPU')}"
    golden = (bundle.manifest.get("golden") or {}).get("files")
    args = {
        "engine": engine, "model": str(art.model_path.resolve()),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()},
        "golden": str(safe_member(bundle.root, golden[0]["path"])) if golden else None,
        "inputs": len(bundle.manifest["inputs"]),
        # The package this edgesdk came from first: the child runs the same code as this process.
        "sys_path": [str(Path(__file__).resolve().parent.parent)] + [p for p in sys.path if isinstance(p, str) and p],
        "plugin": _plugin(engine, where),
    }
    with tempfile.TemporaryDirectory(prefix="edgesdk-probe-") as tmp:
        args["verdict"] = str(Path(tmp) / "verdict.json")
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", _CHILD, json.dumps(args)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="replace", timeout=timeout,
                                  stdin=subprocess.DEVNULL, env=_child_env())
        except subprocess.TimeoutExpired as exc:
            raise BackendUnavailable("isolated_probe_failed", f"the isolated probe of {where} did not finish in "
                                                              f"{timeout:g} s (killed); stderr: {_tail(exc.stderr)}") from exc
        except OSError as exc:
            raise BackendUnavailable("isolated_probe_failed", f"the isolated probe of {where} could not start "
                                                              f"{sys.executable}: {exc}") from exc
        elapsed_ms = (time.perf_counter() - start) * 1e3
        try:
            verdict = json.loads(Path(args["verdict"]).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            verdict = None
    if proc.returncode != 0 or not isinstance(verdict, dict):
        raise BackendUnavailable("isolated_probe_failed", f"the isolated probe of {where} ({art.model_path.name}) "
                                                          f"{_how_it_ended(proc.returncode)}; stderr: "
                                                          f"{_tail(proc.stderr)}")
    if "error" in verdict:
        detail = f"{where} (isolated probe): {verdict.get('detail') or ''}"
        if verdict["error"] == "BackendUnavailable":
            raise BackendUnavailable(verdict.get("reason") or "isolated_probe_failed", detail)
        if verdict["error"] == "BundleError":
            raise BundleError(detail)
        raise BackendUnavailable("isolated_probe_failed", f"{detail} ({verdict['error']})")
    return elapsed_ms


def _child_env() -> dict[str, str]:
    """This process's environment without the variables whose names look like secrets."""
    return {k: v for k, v in os.environ.items() if not any(w in k.upper() for w in SECRET_WORDS)}


def _plugin(engine: str, where: str) -> dict[str, str] | None:
    """Where the child imports a registered (non built-in) backend from."""
    if engine in ENGINE_NAMES:
        return None
    backend = engine_class(engine)
    if backend.__module__ == "__main__" or "<locals>" in backend.__qualname__:
        raise BackendUnavailable("isolated_probe_failed", f"the isolated probe of {where} cannot import backend "
                                                          f"{backend.__qualname__} (defined in {backend.__module__}; "
                                                          "register a class from an importable module)")
    return {"module": backend.__module__, "qualname": backend.__qualname__}


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    if returncode == 0:
        return "exited without a verdict"
    return f"exited with status {returncode}"


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-_TAIL_LINES:])[-2000:] if lines else "(empty)"
