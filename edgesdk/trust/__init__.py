"""Trust for bundles: signatures (OpenSSF model signing, key mode) and single-file ``.edgebundle`` archives.

Nothing here imports ``model_signing`` until a signature is made or checked, so a device that only
opens archives, or only loads unsigned bundles, does not need it.
"""

from __future__ import annotations

from pathlib import Path

from .archive import SUFFIX, ArchiveLimits, default_cache_dir, open_archive, pack_bundle
from .signing import SIGNATURE, Trust, generate_keypair, sign_bundle, verify_bundle


def bundle_dir(path: str | Path, trust: Trust | None = None) -> Path:
    """The bundle directory to open for ``path``: a directory as it is, a file (an ``.edgebundle``) extracted
    safely into the cache. With ``trust``, its signature is checked here, before any engine reads a byte."""
    root = Path(path)
    if root.is_file():
        root = open_archive(root)
    if trust is not None:
        trust.check(root)
    return root


__all__ = [
    "Trust", "bundle_dir", "sign_bundle", "verify_bundle", "generate_keypair", "SIGNATURE",
    "pack_bundle", "open_archive", "ArchiveLimits", "default_cache_dir", "SUFFIX",
]
