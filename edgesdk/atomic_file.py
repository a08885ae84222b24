"""Replacing a small file, or a whole output folder, in one step: a reader sees the old or the new, never half.

The text goes to a temporary file in the same folder (named for this process and thread, so concurrent writers do
not share one) and is renamed over the target, which is atomic on POSIX and Windows. Used for the cache files
(autotune and speed decisions, memory costs, failed probes) and the manifest rewrites of calibrate-escalation.
A folder (a bundle that ``edgesdk quantize`` wrote, an ``edgesdk export``) is built beside its target and moved into
place (:func:`publish_dir`), after :func:`check_replaceable` made sure nothing but an old one of its kind is lost.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .errors import ConversionError


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


def check_replaceable(out: Path, force: bool, marker: str, kind: str, force_hint: str) -> None:
    """Refuse an output folder that would destroy anything but a previous ``kind`` (one holding ``marker``):
    a file, or a non-empty folder without ``force``, or a folder that is not a ``kind`` even with it."""
    if out.exists() and not out.is_dir():
        raise ConversionError(f"output {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ConversionError(f"output {out} exists and is not empty ({force_hint})")
        if not (out / marker).is_file():
            raise ConversionError(f"output {out} is not {kind} (no {marker}); refusing to replace it")


def publish_dir(work: Path, out: Path) -> None:
    """Move a finished directory ``work`` (made with mkdtemp beside ``out``) into place as ``out``: an empty ``out``
    (maybe the current folder) is filled, not replaced; an old ``out`` is removed only once the new one is there.
    Files get the usual permissions (mkdtemp made the folder 0700; docker COPY keeps modes)."""
    import os
    import shutil

    mask = os.umask(0)
    os.umask(mask)
    for path in [work, *work.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
    if out.is_dir() and not any(out.iterdir()):
        for child in work.iterdir():
            child.rename(out / child.name)
        work.rmdir()
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    work.rename(out)
    shutil.rmtree(old, ignore_errors=True)
