"""Reading the TOML files edgesdk takes (preprocessing specs, platform profiles) with typed errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """Parse ``path``; a missing, unreadable or malformed file is an InputError naming ``what`` and the file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{what} file not found: {path}") from exc
    except OSError as exc:
        raise InputError(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} file {path} is not valid TOML: {exc}") from exc
