"""The cache of extracted ``.edgebundle`` archives: ``<cache>/<sha256 of the archive>`` plus a record beside it.

An entry is served only if it is a real directory owned by this user, its record (``<sha256>.record``: the archive's
sha256 and every file's size and sha256, written when it was extracted) matches it, and the bundle in it verifies;
anything else (missing, a symlink, foreign, altered, unreadable) is discarded and extracted again. Directories are
created 0700. Every failure to write is a :class:`~edgesdk.errors.BundleError` naming the archive.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..bundle.reader import MANIFEST, Bundle
from ..file_digest import sha256_file
from ..errors import BundleError

_CHUNK = 1 << 20
_RECORD = ".record"
_MAX_RECORD_BYTES = 64 << 20


def make_private_dirs(cache: Path, src: Path) -> None:
    """Create ``cache`` and any missing parent as 0700 (``mkdir -p`` would give the parents the umask's mode)."""
    missing = [d for d in (cache, *cache.parents) if not d.exists()]
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise BundleError(f"cannot create the bundle cache dir {d} for {src}: {exc}") from exc
    if not cache.is_dir():
        raise BundleError(f"the bundle cache dir {cache} is not a directory (for {src})")


def in_cache(src: Path, cache: Path, action):
    """Run one write in the cache dir; an OSError becomes a BundleError naming the archive and the cache."""
    try:
        return action()
    except OSError as exc:
        raise BundleError(f"cannot write in the bundle cache dir {cache} for {src}: {exc}") from exc


def copy_hashing(src: Path, fd: int, copy: Path) -> str:
    """Copy every byte of ``src`` (trailing bytes after the tar end included) to the open ``copy``; its sha256."""
    digest = hashlib.sha256()
    try:
        with open(src, "rb") as raw, os.fdopen(fd, "wb") as out:
            if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
                raise BundleError(f"bundle archive {src} is not a regular file")
            while block := raw.read(_CHUNK):
                digest.update(block)
                out.write(block)
    except OSError as exc:
        raise BundleError(f"cannot copy bundle archive {src} into the cache ({copy.parent}): {exc}") from exc
    return digest.hexdigest()


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + _RECORD)


def _owned(path: Path, kind) -> bool:
    """``path`` itself (not what a symlink points to) is of ``kind`` (stat.S_ISDIR/S_ISREG) and this user's."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return kind(st.st_mode) and (not hasattr(os, "getuid") or st.st_uid == os.getuid())


def valid_entry(target: Path, fingerprint: str) -> bool:
    """Whether ``target`` is a valid entry for the archive ``fingerprint``: ours, as its record says, verified.

    Never raises: anything wrong (missing, a symlink, foreign, altered, unreadable) is False, and the caller
    extracts again."""
    record_path = _record_path(target)
    if not _owned(target, stat.S_ISDIR) or not _owned(record_path, stat.S_ISREG):
        return False
    try:
        if record_path.lstat().st_size > _MAX_RECORD_BYTES:
            return False
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("archive_sha256") != fingerprint:
            return False
        expected = record.get("files")
        if not isinstance(expected, dict) or MANIFEST not in expected:
            return False
        found = {}
        for path in target.rglob("*"):
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                found[path.relative_to(target).as_posix()] = path
            elif not stat.S_ISDIR(mode):
                return False  # a symlink or a device planted in the entry
        if found.keys() != expected.keys():
            return False
        if any(found[rel].lstat().st_size != entry.get("bytes") for rel, entry in expected.items()):
            return False
        bundle = Bundle.open(target)  # hashes every file the manifest lists
        listed = {entry.get("path") for entry in bundle.file_entries()}
        return all(sha256_file(found[rel]) == entry.get("sha256")
                   for rel, entry in expected.items() if rel == MANIFEST or rel not in listed)
    except (BundleError, OSError, ValueError, AttributeError, TypeError):
        return False


def discard(path: Path, src: Path) -> None:
    """Remove a cache entry (or record) that failed its check: a symlink or file is unlinked (never followed);
    a directory is first renamed aside, so nobody opens it half-deleted."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BundleError(f"cannot check the bundle cache entry {path} for {src}: {exc}") from exc
    try:
        if stat.S_ISDIR(st.st_mode):
            aside = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".stale"))
            try:
                path.rename(aside / "entry")
            except FileNotFoundError:  # another process discarded it first
                pass
            shutil.rmtree(aside, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise BundleError(f"the bundle cache entry {path} for {src} is not valid and cannot be removed: {exc}"
                          ) from exc


def publish(work: Path, target: Path, record: dict, src: Path) -> None:
    """Write the record, then rename the verified extraction into place; if another process published a valid
    entry first, keep theirs (it holds the same bytes); whatever else is in the way is discarded."""
    record_path = _record_path(target)
    fd, tmp_name = in_cache(src, target.parent, lambda: tempfile.mkstemp(dir=target.parent, prefix=".",
                                                                         suffix=".record"))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, sort_keys=True)
        for _ in range(3):
            try:
                os.replace(tmp_name, record_path)
                break
            except OSError:
                discard(record_path, src)  # a directory in the way
        else:
            raise BundleError(f"cannot write the bundle cache record {record_path} for {src}")
    except OSError as exc:
        raise BundleError(f"cannot write the bundle cache record {record_path} for {src}: {exc}") from exc
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    for _ in range(3):
        try:
            work.rename(target)
            return
        except OSError:
            pass
        if valid_entry(target, record["archive_sha256"]):
            shutil.rmtree(work, ignore_errors=True)
            return
        discard(target, src)
    raise BundleError(f"cannot publish the extracted bundle of {src} as {target}: something keeps replacing it")
