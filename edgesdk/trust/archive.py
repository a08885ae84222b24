"""Single-file bundles: ``.edgebundle`` archives, and the safe way back to a bundle directory.

An ``.edgebundle`` is a gzip-compressed tar of a verified bundle: regular files and directories only,
``manifest.json`` first and the rest in sorted order, with zeroed owners and times, so the same bundle
packs to the same members. :func:`open_archive` extracts one into the cache
(``<cache dir>/bundles/<sha256 of the archive>``) and returns that directory; a second open of the
same archive is a cache hit and extracts nothing. It reads gzip-compressed and plain tars.

Extraction trusts nothing in the archive. Absolute paths, ``..``, links, devices, fifos and sparse
files are refused; so are archives past the :class:`ArchiveLimits` (file count, member size, total
size, and bytes unpacked per archive byte, which catches decompression bombs early). Each member also
passes :func:`tarfile.data_filter`. Files are written by this module, counted as they are written, into
a temporary directory inside the cache dir, which is renamed into place only once the bundle inside
verifies (:meth:`~edgesdk.bundle.Bundle.open`); on any failure it is deleted. Nothing is written outside
the cache dir. Every refusal is a :class:`~edgesdk.errors.BundleError` naming the member and the reason.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..autotune import cache_dir
from ..bundle import MANIFEST, Bundle, sha256_file
from ..errors import BundleError

SUFFIX = ".edgebundle"
_CHUNK = 1 << 20
_RATIO_FLOOR = 16 << 20  # bytes any archive may unpack to, whatever its ratio (small, very compressible bundles)


@dataclass(frozen=True)
class ArchiveLimits:
    """What :func:`open_archive` accepts. Sizes are bytes of unpacked data."""

    max_files: int = 10_000
    max_member_bytes: int = 4 << 30
    max_total_bytes: int = 8 << 30
    max_ratio: int = 200  # unpacked bytes per archive byte, past the first 16 MiB


def default_cache_dir() -> Path:
    """Where extracted archives go: ``bundles`` in edgesdk's cache dir (``$EDGESDK_CACHE_DIR``, else the user cache)."""
    return cache_dir() / "bundles"


def pack_bundle(bundle_dir: str | Path, out_path: str | Path) -> Path:
    """Write the bundle at ``bundle_dir`` (verified first) as one ``.edgebundle`` file at ``out_path``.

    Every file of the directory goes in, ``signature.sig`` included, so a signed bundle stays signed.
    The archive is written beside ``out_path`` and renamed into place, so a reader never sees half of it.
    """
    root = Path(bundle_dir)
    Bundle.open(root)
    out = Path(out_path)
    if out.resolve().is_relative_to(root.resolve()):
        raise BundleError(f"the archive {out} cannot be written inside the bundle it packs ({root})")
    members = _bundle_members(root)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, path in members:
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if path.is_dir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.size, info.mode = path.stat().st_size, 0o644
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
        tmp.chmod(0o644 & ~_umask())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def open_archive(path: str | Path, cache_dir: str | Path | None = None, limits: ArchiveLimits = ArchiveLimits()) -> Path:
    """Extract the ``.edgebundle`` at ``path`` into the cache (once) and return the bundle directory.

    The directory is named by the archive's sha256; if it is already there the archive is not extracted
    again (the caller's :meth:`Bundle.open <edgesdk.bundle.Bundle.open>` verifies the files as always).
    Safe to call from several processes at once: each extracts privately and the first rename wins.
    """
    src = Path(path)
    if not src.is_file():
        raise BundleError(f"bundle archive not found: {src} is not a file")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fingerprint = sha256_file(src)
    target = cache / fingerprint
    if (target / MANIFEST).is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache, prefix=f".{fingerprint[:16]}.", suffix=".extracting"))
    try:
        _extract(src, work, limits)
        if not (work / MANIFEST).is_file():
            raise BundleError(f"archive {src} holds no {MANIFEST}: it is not a bundle archive, or it was cut short")
        try:
            Bundle.open(work)
        except BundleError as exc:  # name the archive, not the temporary folder
            raise BundleError(f"archive {src} does not hold a valid bundle: {str(exc).replace(str(work), src.name)}"
                              ) from exc
        work.chmod(0o777 & ~_umask())  # mkdtemp made it 0700; the extracted bundle reads like any other folder
        _publish(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


# -- packing ---------------------------------------------------------------------
def _bundle_members(root: Path) -> list[tuple[str, Path]]:
    """Every directory and file under ``root`` as (tar name, path): manifest first, then sorted by path parts."""
    members = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise BundleError(f"cannot pack {root}: {rel!r} is not a regular file or directory (symlink? device?)")
        members.append((rel, path))
    members.sort(key=lambda m: (m[0] != MANIFEST, PurePosixPath(m[0]).parts))
    return members


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- extraction ------------------------------------------------------------------
def _extract(src: Path, dest: Path, limits: ArchiveLimits) -> None:
    """Write the members of ``src`` under ``dest``, refusing anything unsafe before it is written."""
    allowed = min(limits.max_total_bytes, max(limits.max_ratio * src.stat().st_size, _RATIO_FLOOR))
    written, count, seen = 0, 0, set()
    try:
        with open(src, "rb") as raw, _decompressed(raw) as data, tarfile.open(fileobj=data, mode="r|") as tar:
            for member in tar:  # a stream: members are read (and checked) one at a time
                count += 1
                if count > limits.max_files:
                    raise BundleError(f"archive {src} has more than {limits.max_files} members (refused at "
                                      f"{member.name!r}); a bundle holds a few files")
                rel = _member_path(src, member, dest)
                if rel is None:
                    continue
                if rel in seen:
                    raise BundleError(f"archive {src}: member {member.name!r} appears twice")
                seen.add(rel)
                if member.size > limits.max_member_bytes:
                    raise BundleError(f"archive {src}: member {member.name!r} is {member.size} bytes, over the "
                                      f"limit of {limits.max_member_bytes}")
                if written + member.size > allowed:
                    raise BundleError(_over_total(src, member.name, written + member.size, allowed, limits))
                full = dest.joinpath(*rel.parts)
                if member.isdir():
                    _write(src, member.name, lambda: full.mkdir(parents=True, exist_ok=True))
                else:
                    written += _write_file(tar, member, src, full, allowed - written)
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as exc:
        # Reading failed (writes are translated in _write): bad magic, bad checksum, bad gzip, cut short.
        raise BundleError(f"archive {src} is corrupt or truncated: {type(exc).__name__}: {exc}") from exc
    if count == 0:
        raise BundleError(f"archive {src} is empty")


def _decompressed(raw):
    """The tar stream inside ``raw``: gunzipped (concatenated gzip members too) when it starts with gzip's magic."""
    magic = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else contextlib.nullcontext(raw)


def _member_path(src: Path, member: tarfile.TarInfo, dest: Path) -> PurePosixPath | None:
    """The member's path inside the bundle, or None for the root itself (``./``); refuses what is unsafe."""
    name = member.name
    kind = _unsupported_kind(member)
    if kind:
        raise BundleError(f"archive {src}: member {name!r} is {kind}; a bundle archive holds regular files and "
                          "directories only")
    if not name or "\x00" in name or "\\" in name:
        raise BundleError(f"archive {src}: member {name!r} has an unusable name")
    pure = PurePosixPath(name)
    if pure.is_absolute():
        raise BundleError(f"archive {src}: member {name!r} has an absolute path")
    if ".." in pure.parts:
        raise BundleError(f"archive {src}: member {name!r} escapes the bundle with '..'")
    if member.size < 0:
        raise BundleError(f"archive {src}: member {name!r} claims a negative size")
    if not pure.parts:
        if member.isdir():
            return None
        raise BundleError(f"archive {src}: member {name!r} has an unusable name")
    data_filter = getattr(tarfile, "data_filter", None)  # Python >= 3.12, and 3.10.12 / 3.11.4 backports
    if data_filter is not None:
        try:
            data_filter(member, os.fspath(dest))
        except tarfile.FilterError as exc:
            raise BundleError(f"archive {src}: member {name!r} is refused by tarfile's data filter: {exc}") from exc
    return pure


def _unsupported_kind(member: tarfile.TarInfo) -> str | None:
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device node"
    if member.isfifo():
        return "a fifo"
    if member.issparse():
        return "a sparse file"
    if not (member.isreg() or member.isdir()):
        return f"of unsupported type {member.type!r}"
    return None


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, src: Path, full: Path, budget: int) -> int:
    """Copy one regular member to ``full`` (a new file), counting the bytes as they are written."""
    source = tar.extractfile(member)
    _write(src, member.name, lambda: full.parent.mkdir(parents=True, exist_ok=True))
    fd = _write(src, member.name, lambda: os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    done = 0
    with os.fdopen(fd, "wb") as out:
        while block := source.read(_CHUNK):
            done += len(block)
            if done > member.size or done > budget:
                raise BundleError(f"archive {src}: member {member.name!r} unpacks to more than it declares or "
                                  "than the archive may hold")
            _write(src, member.name, lambda: out.write(block))
    if done != member.size:
        raise BundleError(f"archive {src} is truncated: member {member.name!r} has {done} of {member.size} bytes")
    return done


def _write(src: Path, name: str, action):
    """Run one filesystem write; an OSError becomes a BundleError naming the member (e.g. 'a' is a file, 'a/b')."""
    try:
        return action()
    except OSError as exc:
        raise BundleError(f"archive {src}: cannot extract member {name!r}: {exc}") from exc


def _over_total(src: Path, name: str, total: int, allowed: int, limits: ArchiveLimits) -> str:
    if allowed < limits.max_total_bytes:
        return (f"archive {src}: member {name!r} brings the unpacked size to {total} bytes, over {limits.max_ratio}x "
                f"the {src.stat().st_size}-byte archive (a decompression bomb?)")
    return f"archive {src}: member {name!r} brings the unpacked size to {total} bytes, over the limit of {allowed}"


def _publish(work: Path, target: Path) -> None:
    """Rename the verified extraction into place; if another process got there first, keep theirs."""
    try:
        work.rename(target)
        return
    except OSError:
        if (target / MANIFEST).is_file():
            shutil.rmtree(work, ignore_errors=True)
            return
    shutil.rmtree(target, ignore_errors=True)  # a leftover that is no bundle (not ours: we rename only verified ones)
    work.rename(target)
