"""Replacing a small file whole: a reader sees the old content or the new, never half of it.

The text goes to a temporary file in the same folder (named for this process and thread, so concurrent writers do
not share one) and is renamed over the target, which is atomic on POSIX and Windows. Used for the cache files
(autotune and speed decisions, memory costs, failed probes) and the manifest rewrites of calibrate-escalation.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one step. Raises OSError; the temporary file never stays behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any, indent: int = 1) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent))
