"""The SHA-256 of a file, read in chunks: how a bundle lists its files (and checks them at open), how the engines key
their compile caches, and what the trust archive names an extracted bundle by. Below the bundle, the engines and
trust alike, so that none of them imports another for it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The hex SHA-256 of the file at ``path``, read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
