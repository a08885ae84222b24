"""Small files a person writes to tell edgesdk something (a preprocessing spec, a platform profile, a task config,
labels), read with bounds: only a regular file (a FIFO, a device such as /dev/zero or a directory is refused before
a byte is read: opened without blocking and checked on the open descriptor), at most :data:`MAX_SETTINGS_BYTES`
(``$EDGESDK_MAX_SETTINGS_BYTES`` raises it), and TOML or JSON nested at most :data:`MAX_SETTINGS_DEPTH` levels.
Every refusal is an :class:`~edgesdk.errors.InputError` naming what the file is for and its path."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import InputError

MAX_SETTINGS_BYTES = 4 << 20  # as a manifest's own cap: what these files hold ends up in one
MAX_SETTINGS_DEPTH = 64  # as a manifest's: a settings file nests a few levels
SETTINGS_BYTES_VAR = "EDGESDK_MAX_SETTINGS_BYTES"


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the settings file ``path`` (``what`` names it in errors: "task", "labels"...)."""
    path = Path(path)
    cap = _max_bytes()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise InputError(f"{what} file not found: {path}") from exc
    except OSError as exc:
        raise InputError(f"{what} file {path} cannot be opened: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{what} file {path} is not a regular file; only a regular file is read")
        try:
            data = file.read(cap + 1) if info.st_size <= cap else b""
        except OSError as exc:
            raise InputError(f"{what} file {path} cannot be read: {exc.strerror or exc}") from exc
    size = max(info.st_size, len(data))  # len(data): the file grew since fstat
    if size > cap:
        raise InputError(f"{what} file {path} is {size} bytes; more than {cap} is refused ({SETTINGS_BYTES_VAR} "
                         "raises it)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} file {path} is not UTF-8 text: {exc}") from exc


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value of the settings file ``path``, at most MAX_SETTINGS_DEPTH levels deep."""
    text = read_text(path, what)
    try:
        value = json.loads(text)
    except RecursionError:
        raise InputError(f"{what} file {path} nests deeper than {MAX_SETTINGS_DEPTH} levels") from None
    except ValueError as exc:  # bad JSON, or an integer past Python's digit limit
        raise InputError(f"{what} file {path} is not valid JSON: {str(exc)[:200]}") from exc
    check_depth(value, path, what)
    return value


def check_depth(value: Any, path: str | Path, what: str) -> None:
    """Refuse ``value`` (parsed from ``path``) when it nests lists and tables more than MAX_SETTINGS_DEPTH deep
    (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_SETTINGS_DEPTH:
                raise InputError(f"{what} file {path} nests deeper than {MAX_SETTINGS_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))


def _max_bytes() -> int:
    raw = os.environ.get(SETTINGS_BYTES_VAR, "").strip()
    if raw and (not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1):
        raise InputError(f"{SETTINGS_BYTES_VAR} must be a positive integer, got {raw!r}")
    return int(raw) if raw else MAX_SETTINGS_BYTES


__all__ = ["read_text", "read_json", "check_depth", "MAX_SETTINGS_BYTES", "MAX_SETTINGS_DEPTH", "SETTINGS_BYTES_VAR"]
