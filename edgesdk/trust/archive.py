"""Single-file bundles: ``.edgebundle`` archives, and the safe way back to a bundle directory.

An ``.edgebundle`` is a gzip-compressed tar of a verified bundle: regular files and directories only,
``manifest.json`` first and the rest in sorted order, with zeroed owners and times, so the same bundle
packs to the same members. :func:`open_archive` extracts one into the cache
(``<cache dir>/bundles/<sha256 of the archive>``) and returns that directory; a second open of the
same archive is a cache hit and extracts nothing. It reads gzip-compressed and plain tars.

The archive is read once: its bytes are copied into a private file in the cache dir while they are
hashed, and that copy is what is extracted, so the entry's name is the sha256 of exactly what it holds
(a file swapped under ``path`` meanwhile cannot be cached under the first file's hash). Beside each entry
``<sha256>.record`` lists the archive's sha256 and every file's sha256 and size. A cache hit is served
only if the entry is a real directory owned by this user, matches its record (names, sizes, and the
sha256 of ``manifest.json`` and of any file the manifest does not list) and passes
:meth:`~edgesdk.bundle.reader.Bundle.open`; anything else (a symlink, bit rot, a half-cleaned cache, another
bundle planted under the name) is removed and the archive extracted again. Cache folders are made 0700.
The record sits beside the entry, not in it: a file added to a signed bundle would fail its signature.

Extraction trusts nothing in the archive. Absolute paths, ``..``, links, devices, fifos and sparse
files are refused; so are archives past the :class:`ArchiveLimits` (file count, member size, total
size, and bytes unpacked per archive byte, which catches decompression bombs early), and a ``manifest.json`` over
the manifest limit of :func:`~edgesdk.bundle.schema.load_manifest`. Every byte tarfile reads is
counted too (headers and padding included), and GNU long-name and PAX headers over 64 KiB are refused before
tarfile reads them whole into memory. Each member also
passes :func:`tarfile.data_filter`. Files are written by this module, counted as they are written, into
a temporary directory inside the cache dir, which is renamed into place only once the bundle inside
verifies (:meth:`~edgesdk.bundle.reader.Bundle.open`); on any failure it is deleted. Nothing is written outside
the cache dir. Every refusal is a :class:`~edgesdk.errors.BundleError` naming the member and the reason.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..bundle.reader import MANIFEST, Bundle
from ..bundle.schema import MANIFEST_BYTES_VAR, MAX_MANIFEST_BYTES, env_limit
from ..errors import BundleError
from ..file_digest import sha256_file
from ..user_cache import cache_dir
from . import cache as store

SUFFIX = ".edgebundle"
_CHUNK = 1 << 20
_RATIO_FLOOR = 16 << 20  # bytes any archive may unpack to, whatever its ratio (small, very compressible bundles)
_MAX_META_HEADER = 64 << 10  # a GNU long name/link or PAX header: tarfile reads it whole, so it is kept small
_META_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
               tarfile.SOLARIS_XHDTYPE)
_HEADER_BYTES_PER_FILE = 4 << 10  # tar stream bytes allowed per member beyond its data (headers, padding)


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

    The directory is named by the sha256 of the bytes it was extracted from. If a valid entry for the archive
    is already there (see the module docstring) the archive is not extracted again; a damaged or substituted
    entry is replaced. Safe to call from several processes at once: each extracts privately and the first
    rename wins. Every failure is a :class:`~edgesdk.errors.BundleError`.
    """
    src = Path(path)
    if not src.is_file():
        raise BundleError(f"bundle archive not found: {src} is not a file")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        seen = sha256_file(src)
    except OSError as exc:
        raise BundleError(f"cannot read bundle archive {src}: {exc}") from exc
    if store.valid_entry(cache / seen, seen):  # the hit needs no copy: the entry was checked against this very digest
        return cache / seen
    store.make_private_dirs(cache, src)
    fd, copy_name = store.in_cache(src, cache, lambda: tempfile.mkstemp(dir=cache, prefix=".", suffix=".archive"))
    copy = Path(copy_name)
    try:
        fingerprint = store.copy_hashing(src, fd, copy)  # what is extracted below, byte for byte
        target = cache / fingerprint
        if fingerprint != seen and store.valid_entry(target, fingerprint):  # the file changed since it was hashed
            return target
        store.discard(target, src)
        work = Path(store.in_cache(src, cache, lambda: tempfile.mkdtemp(dir=cache, prefix=f".{fingerprint[:16]}.",
                                                                   suffix=".extracting")))
        try:
            files = _extract(copy, work, limits, shown=src)
            if not (work / MANIFEST).is_file():
                raise BundleError(f"archive {src} holds no {MANIFEST}: it is not a bundle archive, or it was cut short")
            try:
                Bundle.open(work)
            except BundleError as exc:  # name the archive, not the temporary folder
                raise BundleError(f"archive {src} does not hold a valid bundle: "
                                  f"{str(exc).replace(str(work), src.name)}") from exc
            work.chmod(0o777 & ~_umask())  # mkdtemp made it 0700; the extracted bundle reads like any other folder
            store.publish(work, target, {"archive_sha256": fingerprint, "files": files}, src)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    finally:
        copy.unlink(missing_ok=True)
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
def _extract(copy: Path, dest: Path, limits: ArchiveLimits, shown: Path) -> dict[str, dict]:
    """Write the members of the archive ``copy`` under ``dest``, refusing anything unsafe before it is written.

    Messages name ``shown`` (the user's path). Returns ``{path: {"sha256", "bytes"}}`` of the files written.
    """
    src, size = shown, copy.stat().st_size
    allowed = min(limits.max_total_bytes, max(limits.max_ratio * size, _RATIO_FLOOR))
    readable = allowed + _HEADER_BYTES_PER_FILE * limits.max_files + _CHUNK
    written, count, seen, files = 0, 0, set(), {}
    manifest_cap = env_limit(MANIFEST_BYTES_VAR, MAX_MANIFEST_BYTES)  # as Bundle.open will read it, refused unwritten
    try:
        with open(copy, "rb") as raw, _decompressed(raw) as data, \
                tarfile.open(fileobj=_CountedReader(data, readable), mode="r|", tarinfo=_BoundedTarInfo) as tar:
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
                if rel.as_posix() == MANIFEST and member.size > manifest_cap:
                    raise BundleError(f"archive {src}: member {member.name!r} is {member.size} bytes, over the limit "
                                      f"of {manifest_cap} for a manifest (${MANIFEST_BYTES_VAR} raises it)")
                if member.size > limits.max_member_bytes:
                    raise BundleError(f"archive {src}: member {member.name!r} is {member.size} bytes, over the "
                                      f"limit of {limits.max_member_bytes}")
                if written + member.size > allowed:
                    raise BundleError(_over_total(src, size, member.name, written + member.size, allowed, limits))
                full = dest.joinpath(*rel.parts)
                if member.isdir():
                    _write(src, member.name, lambda: full.mkdir(parents=True, exist_ok=True))
                else:
                    digest, done = _write_file(tar, member, src, full, allowed - written)
                    written += done
                    files[rel.as_posix()] = {"sha256": digest, "bytes": done}
    except _OverRead as exc:
        raise BundleError(f"archive {src}: its tar stream goes on past {exc.limit} bytes (headers included) for "
                          f"a {size}-byte archive, over the limits (a decompression bomb?)") from None
    except _MetaHeaderTooLarge as exc:
        raise BundleError(f"archive {src}: a {exc.kind} header of {exc.size} bytes is over the limit of "
                          f"{_MAX_META_HEADER} (a header bomb?)") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError, RecursionError) as exc:
        # Reading failed (writes are translated in _write): bad magic, bad checksum, bad gzip, cut short.
        raise BundleError(f"archive {src} is corrupt or truncated: {type(exc).__name__}: {exc}") from exc
    if count == 0:
        raise BundleError(f"archive {src} is empty")
    return files


class _OverRead(Exception):
    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


class _MetaHeaderTooLarge(Exception):
    def __init__(self, kind: str, size: int):
        super().__init__(kind, size)
        self.kind, self.size = kind, size


class _CountedReader:
    """The decompressed tar stream, counted: tarfile reads headers (GNU long names, PAX records) into memory
    without open_archive seeing them, so the limits must hold on every byte it reads, not only on members."""

    def __init__(self, inner, limit: int):
        self._inner, self._limit, self._count = inner, limit, 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._limit - self._count + 1
        block = self._inner.read(min(size, self._limit - self._count + 1))
        self._count += len(block)
        if self._count > self._limit:
            raise _OverRead(self._limit)
        return block


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses a long-name/PAX header over 64 KiB from its 512-byte header block, before its data is read."""

    @classmethod
    def frombuf(cls, buf, encoding, errors):
        info = super().frombuf(buf, encoding, errors)
        if info.type in _META_TYPES and info.size > _MAX_META_HEADER:
            kind = "GNU long-name" if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) else "PAX"
            raise _MetaHeaderTooLarge(kind, info.size)
        return info


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


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, src: Path, full: Path, budget: int) -> tuple[str, int]:
    """Copy one regular member to ``full`` (a new file), counting the bytes as they are written; (sha256, bytes)."""
    source = tar.extractfile(member)
    _write(src, member.name, lambda: full.parent.mkdir(parents=True, exist_ok=True))
    fd = _write(src, member.name, lambda: os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    done, digest = 0, hashlib.sha256()
    with os.fdopen(fd, "wb") as out:
        while block := source.read(_CHUNK):
            done += len(block)
            digest.update(block)
            if done > member.size or done > budget:
                raise BundleError(f"archive {src}: member {member.name!r} unpacks to more than it declares or "
                                  "than the archive may hold")
            _write(src, member.name, lambda: out.write(block))
    if done != member.size:
        raise BundleError(f"archive {src} is truncated: member {member.name!r} has {done} of {member.size} bytes")
    return digest.hexdigest(), done


def _write(src: Path, name: str, action):
    """Run one filesystem write; an OSError becomes a BundleError naming the member (e.g. 'a' is a file, 'a/b')."""
    try:
        return action()
    except OSError as exc:
        raise BundleError(f"archive {src}: cannot extract member {name!r}: {exc}") from exc


def _over_total(src: Path, size: int, name: str, total: int, allowed: int, limits: ArchiveLimits) -> str:
    if allowed < limits.max_total_bytes:
        return (f"archive {src}: member {name!r} brings the unpacked size to {total} bytes, over {limits.max_ratio}x "
                f"the {size}-byte archive (a decompression bomb?)")
    return f"archive {src}: member {name!r} brings the unpacked size to {total} bytes, over the limit of {allowed}"
