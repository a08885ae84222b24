"""Isolated probe: open an artifact in a child process before this process touches it.

A hostile or damaged model file can crash an engine's native code (a segfault or an abort), which no
``try`` catches: the application dies with it. ``load(..., isolate=True)`` therefore first opens each
artifact, and runs it on every golden input the numerics check will run here
(:func:`edgesdk.runtime.numerics.golden_feeds`), in a fresh interpreter (``sys.executable -I -c ...``). Only
when that child finishes does the load open the artifact in this process.

What the child's end means (:func:`probe`):

- it finished and ran: nothing is raised, the caller opens the artifact here;
- it raised an edgesdk error (``BackendUnavailable`` with its reason, ``BundleError``): the same
  error is raised here, saying it came from the probe, and the file is never opened here;
- it was killed by a signal (SIGSEGV, SIGABRT...), exited with another status, wrote no verdict
  or ran out of ``timeout``: ``BackendUnavailable("isolated_probe_failed")`` naming the artifact,
  the signal or status and the last lines of the child's stderr. :func:`edgesdk.load` skips that
  candidate, and raises :class:`~edgesdk.errors.BundleError` when no other candidate serves.

The child is started by :func:`edgesdk.child_process.run_child`: isolated mode (``-I``), no variables whose names
look like secrets, and a verdict that is a file the child creates once, never a line on stdout (an engine or a model
that prints cannot forge it).

The child imports what a device imports (edgesdk, numpy, the one engine), never torch or the
converters; it sees this process's ``sys.path`` (passed explicitly), so a backend added with
:func:`edgesdk.engines.register_backend` is imported there by its module name (one defined in
``__main__`` cannot be, and fails the probe). It writes no core dump. With ``cache_dir`` the child
fills the engine's compile cache as a load here would, so the load that follows it may be a cache hit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from ..bundle.reader import Bundle, safe_member
from ..child_process import SECRET_WORDS, run_child, tail
from ..engines import ENGINE_NAMES, engine_class
from ..choices import BackendReason
from ..errors import BackendUnavailable, BundleError

PROBE_TIMEOUT_S = 300.0  # an NPU or GPU compile of a large model can take minutes
__all__ = ["probe", "PROBE_TIMEOUT_S", "SECRET_WORDS"]

# ARGS: the model, engine, options, golden file and input count and, for a registered backend, where to import it
# from. faulthandler prints the Python stack of a crash on stderr (the native crash itself still ends the child by
# its signal).
_CHILD = r"""
import faulthandler
faulthandler.enable()
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (ImportError, ValueError, OSError):
    pass
args = ARGS
import importlib
from pathlib import Path
from edgesdk.bundle.reader import read_golden
from edgesdk.engines import open_engine, register_backend
from edgesdk.choices import BackendReason
from edgesdk.errors import BackendUnavailable, EdgeSDKError
from edgesdk.runtime.numerics import golden_feeds

verdict = answer

try:
    if args["plugin"] is not None:
        backend = importlib.import_module(args["plugin"]["module"])
        for part in args["plugin"]["qualname"].split("."):
            backend = getattr(backend, part)
        register_backend(args["engine"], backend)
    runs = []
    if args["golden"] is not None:
        # the members the manifest names, checked from their headers first, as the parent reads them
        golden = read_golden(Path(args["golden"]), args["tensor_inputs"], args["tensor_outputs"])
        runs = golden_feeds(golden, len(args["tensor_inputs"]))
    engine = open_engine(args["engine"], args["model"], **args["options"])
    try:
        for i, feeds in enumerate(runs):
            try:
                engine.run(feeds)
            except EdgeSDKError:
                raise
            except Exception as exc:  # as the numerics check reports it in the parent
                raise BackendUnavailable(BackendReason.RUN_FAILED, f"failed on golden input {i}: {exc}") from exc
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
        "tensor_inputs": bundle.manifest["inputs"], "tensor_outputs": bundle.manifest["outputs"],
        "plugin": _plugin(engine, where),
    }
    try:
        run = run_child(_CHILD, args, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BackendUnavailable(BackendReason.ISOLATED_PROBE_FAILED,
                                 f"the isolated probe of {where} did not finish in "
                                 f"{timeout:g} s (killed); stderr: {tail(exc.stderr)}") from exc
    except OSError as exc:
        raise BackendUnavailable(BackendReason.ISOLATED_PROBE_FAILED, f"the isolated probe of {where} could not start "
                                                                      f"{sys.executable}: {exc}") from exc
    verdict = run.answer
    if run.returncode != 0 or not isinstance(verdict, dict):
        ended = run.how_it_ended().replace("without an answer", "without a verdict")
        raise BackendUnavailable(BackendReason.ISOLATED_PROBE_FAILED,
                                 f"the isolated probe of {where} ({art.model_path.name}) "
                                 f"{ended}; stderr: {run.stderr_tail()}")
    if "error" in verdict:
        detail = f"{where} (isolated probe): {verdict.get('detail') or ''}"
        if verdict["error"] == "BackendUnavailable":
            raise BackendUnavailable(BackendReason.lookup(verdict.get("reason") or "")
                                     or BackendReason.ISOLATED_PROBE_FAILED, detail)
        if verdict["error"] == "BundleError":
            raise BundleError(detail)
        raise BackendUnavailable(BackendReason.ISOLATED_PROBE_FAILED, f"{detail} ({verdict['error']})")
    return run.elapsed_ms


def _plugin(engine: str, where: str) -> dict[str, str] | None:
    """Where the child imports a registered (non built-in) backend from."""
    if engine in ENGINE_NAMES:
        return None
    backend = engine_class(engine)
    if backend.__module__ == "__main__" or "<locals>" in backend.__qualname__:
        raise BackendUnavailable(BackendReason.ISOLATED_PROBE_FAILED,
                                 f"the isolated probe of {where} cannot import backend "
                                 f"{backend.__qualname__} (defined in {backend.__module__}; "
                                 "register a class from an importable module)")
    return {"module": backend.__module__, "qualname": backend.__qualname__}
