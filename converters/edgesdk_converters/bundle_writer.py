"""Writing a bundle: the manifest entry of each file (path, sha256, size) and the manifest itself. The workstation
owns every bundle writer; the device only reads (:mod:`edgesdk.bundle.reader`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgesdk.bundle.reader import MANIFEST
from edgesdk.file_digest import sha256_file


def file_entry(root: Path, path: Path) -> dict[str, Any]:
    """The manifest entry of a file already placed inside the bundle ``root``."""
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path
