"""Where edgesdk keeps what it learned on this machine: the user cache dir (``$EDGESDK_CACHE_DIR``, else
``$XDG_CACHE_HOME/edgesdk``, else ``~/.cache/edgesdk``) and its JSON files of decisions keyed by string (autotune's
and the speed checks' timings, failed device probes). The memory cost book and the trust archive keep their files in
the same folder. Below the runtime, the budgets and trust, which all read it; it imports nothing of edgesdk but
:mod:`edgesdk.atomic_file`.

Thread- and process-safety: :func:`store` reads, merges and replaces a file under a thread lock and an advisory file
lock (where the OS has one); a reader never sees half a file. A cache that cannot be read or written is no error: the
caller measures again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from .atomic_file import write_json_atomic


def cache_dir() -> Path:
    if os.environ.get("EDGESDK_CACHE_DIR"):
        return Path(os.environ["EDGESDK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgesdk"


def lookup(key: str, name: str) -> Any:
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


def store(key: str, decision: Any, name: str) -> None:
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
