"""Reading the TOML files edgesdk takes (preprocessing specs, platform profiles, task configs) with typed errors,
bounded as every settings file is (:mod:`.settings_file`: a regular file, its size and its nesting capped)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .errors import InputError
from .settings_file import MAX_SETTINGS_DEPTH, check_depth, read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse ``path``; a missing, unreadable, oversized, too deeply nested or malformed file is an InputError naming
    ``what`` and the file."""
    path = Path(path)
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except RecursionError:  # arrays or inline tables nested past the parser's stack
        raise InputError(f"{what} file {path} nests deeper than {MAX_SETTINGS_DEPTH} levels") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} file {path} is not valid TOML: {exc}") from exc
    check_depth(data, path, what)
    return data
