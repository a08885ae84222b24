"""Autotune: time the viable candidates on the golden inputs and remember the winner.

The decision is cached per (bundle fingerprint, machine, engine versions, load options) in the user cache dir
(``$EDGESDK_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgesdk``, else ``~/.cache/edgesdk``), so the next
load skips the timing; any change of the three gives a new key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..atomic_file import write_json_atomic
from ..bundle.reader import Bundle
from ..cpu import cpu_class
from ..engines import Engine, backend_names, engine_version

WARMUP = 5
RUNS = 30


def cache_dir() -> Path:
    if os.environ.get("EDGESDK_CACHE_DIR"):
        return Path(os.environ["EDGESDK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgesdk"


def machine_id() -> str:
    """The machine a decision was measured on: OS, CPU model and count, and the CPU's integer-kernel flags and ISA
    caps (:func:`edgesdk.cpu.cpu_class`). Whether INT8 beats float depends on those flags, and a VM's model name
    ("Intel(R) Xeon(R) Processor") does not tell CPU generations apart."""
    cls = cpu_class()
    flags = ",".join(f for f, on in cls["flags"].items() if on) or "none"
    caps = "".join(f"-{k}={v}" for k, v in sorted(cls["isa_caps"].items()))
    return f"{platform.system()}-{cls['arch']}-{cls['model']}-{cls['cpus']}cpu-{flags}{caps}"


def cache_key(bundle: Bundle, options: dict[str, str] | None = None) -> str:
    """Bundle fingerprint, machine, engine versions, and the load options that limit the choice."""
    fingerprint = sorted(f["sha256"] for f in bundle.file_entries())
    versions = {name: engine_version(name) for name in backend_names()}
    blob = json.dumps({"bundle": fingerprint, "machine": machine_id(), "engines": versions,
                       "options": options or {}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def lookup(key: str, name: str = "autotune.json") -> dict[str, Any] | None:
    """The decision cached under ``key`` in the cache dir's file ``name`` (None: none, or an unreadable file)."""
    path = cache_dir() / name
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None  # no cache, or an unreadable one: measure again


_STORE_LOCK = threading.Lock()


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock on ``path`` for the block (none where fcntl is missing, e.g. Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def store(key: str, decision: dict[str, Any], name: str = "autotune.json") -> None:
    """Add ``decision`` under ``key`` to the cache dir's file ``name``. Read, merge and replace happen under a lock
    (a thread lock, and an advisory file lock where the OS has one), so concurrent loads, in threads or processes,
    do not drop each other's decisions; the file is replaced atomically, so a reader never sees half of it."""
    path = cache_dir() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _STORE_LOCK, _file_lock(path.with_suffix(".lock")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            if not isinstance(data, dict):
                data = {}  # a file that is not ours: replaced
            data[key] = decision
            write_json_atomic(path, data)
    except OSError:
        pass  # a read-only home must not break loading; the next load measures again


def median_ms(engine: Engine, feeds: Sequence[np.ndarray], warmup: int = WARMUP, runs: int = RUNS) -> float:
    for _ in range(warmup):
        engine.run(feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        engine.run(feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


# -- probes ------------------------------------------------------------------------------------------------
# Some devices can only be found by loading a model on them (LiteRT GPU/NPU). A probe that failed is
# remembered per (machine, engine, engine version, device), so `auto` does not pay it on every load;
# a new engine version (a driver or delegate installed with it) probes again.

def _probe_key(engine: str, device: str) -> str:
    return f"{machine_id()}|{engine}|{engine_version(engine)}|{device}"


def failed_probe(engine: str, device: str) -> str | None:
    try:
        data = json.loads((cache_dir() / "probes.json").read_text())
    except (OSError, ValueError):
        return None
    return data.get(_probe_key(engine, device)) if isinstance(data, dict) else None


def remember_failed_probe(engine: str, device: str, detail: str) -> None:
    store(_probe_key(engine, device), detail, "probes.json")
