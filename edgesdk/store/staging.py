"""Bringing an install's source into a private staging folder of the store, where it is checked before anything
else sees it: a bundle folder is copied file by file (regular files only, each fsynced), an ``.edgebundle`` archive is
extracted with the bounds of :func:`~edgesdk.trust.open_archive`, a URL is downloaded (:mod:`.download`) and then
extracted. The staging folder is locked while the install works in it, so that a store opened meanwhile by another
process (whose recovery deletes the staging folders of killed installs) leaves it alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..choices import InstallStep, StoreReason
from ..errors import BundleError, StoreError
from ..trust import open_archive
from .disk import BUNDLE, STAGING, fsync_dir, lock_folder
from .download import download, is_url, shown
from .options import StoreOptions

_CHUNK = 1 << 20
Report = Callable[[str, dict[str, Any]], None]


class Staging:
    """A new folder in ``<store>/staging``, locked until :meth:`close` deletes it (a published version has been
    renamed out of it by then)."""

    def __init__(self, root: Path):
        self.path = Path(tempfile.mkdtemp(dir=root / STAGING, prefix="install-"))
        self._fd = lock_folder(self.path)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def describe(source: Any) -> str:
    """The source as records and messages show it (a URL without its query or user)."""
    return shown(source) if isinstance(source, str) and is_url(source) else str(source)


def check_source(source: Any) -> None:
    """Refuse a source that is none of the three kinds before anything is staged."""
    if isinstance(source, str) and is_url(source):
        from .download import check_url

        check_url(source)
        return
    if not isinstance(source, (str, os.PathLike)):
        raise StoreError(StoreReason.BAD_SOURCE, f"an install source is a bundle folder, an .edgebundle file or an "
                                                 f"http(s) URL, got {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise StoreError(StoreReason.BAD_SOURCE, f"{path} does not exist (an install source is a bundle folder, an "
                                                 ".edgebundle file or an http(s) URL)")
    if not (path.is_dir() or path.is_file()):
        raise StoreError(StoreReason.BAD_SOURCE, f"{path} is neither a folder nor a regular file")


def fetch(source: Any, root: Path, staging: Path, options: StoreOptions, report: Report) -> Path:
    """The bundle folder of ``source`` inside ``staging`` (not verified yet: the caller opens it)."""
    out = staging / BUNDLE
    if isinstance(source, str) and is_url(source):
        archive = download(source, root, staging / "download.edgebundle", options, report)
        _extract(archive, staging, out, options, report)
        archive.unlink()  # a version folder holds its bundle and its record, not the archive it came in
    elif Path(source).is_dir():
        _copy(Path(source), out, options, report)
    else:
        size = Path(source).stat().st_size
        if size > options.max_bytes:
            raise StoreError(StoreReason.TOO_LARGE, f"{source} is {size} bytes, over the store's limit of "
                                                    f"{options.max_bytes} (StoreOptions.max_bytes)")
        _extract(Path(source), staging, out, options, report)
    return out


def _extract(archive: Path, staging: Path, out: Path, options: StoreOptions, report: Report) -> None:
    report(InstallStep.EXTRACT, {"archive": archive.name})
    cache = staging / "extract"
    extracted = open_archive(archive, cache_dir=cache, limits=options.archive_limits)
    os.rename(extracted, out)
    out.chmod(0o755)
    shutil.rmtree(cache)  # the extraction's record: the staging folder is published whole


def _copy(src: Path, out: Path, options: StoreOptions, report: Report) -> None:
    """Copy every file of the bundle folder ``src`` (refusing links and special files, and more files or bytes than
    the store takes), fsyncing each, telling ``copy`` after each file."""
    files, total = [], 0
    for folder, dirs, names in os.walk(src):
        for name in sorted(dirs) + sorted(names):
            path = Path(folder) / name
            mode = path.lstat().st_mode
            rel = path.relative_to(src).as_posix()
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise BundleError(f"bundle {src}: {rel!r} is not a regular file or folder (a link? a device?); a "
                                  "store copies regular files only")
            files.append(rel)
            total += path.stat().st_size
            if len(files) > options.archive_limits.max_files:
                raise StoreError(StoreReason.TOO_LARGE, f"bundle {src} has more than "
                                                        f"{options.archive_limits.max_files} files")
    if total > options.max_bytes:
        raise StoreError(StoreReason.TOO_LARGE, f"bundle {src} holds {total} bytes, over the store's limit of "
                                                f"{options.max_bytes} (StoreOptions.max_bytes)")
    out.mkdir()
    done = 0
    for i, rel in enumerate(sorted(files), 1):
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        done += _copy_file(src / rel, target, options.max_bytes - done)
        report(InstallStep.COPY, {"file": rel, "files": i, "of": len(files), "bytes": done})
    for folder, dirs, _ in os.walk(out, topdown=False):
        fsync_dir(Path(folder))


def _copy_file(src: Path, dest: Path, budget: int) -> int:
    """Copy one file (a new one: never through a link planted meanwhile), fsynced; its size. The walk saw a regular
    file; what is there now is checked again on the open file: O_NOFOLLOW refuses a link planted meanwhile,
    O_NONBLOCK keeps a FIFO from blocking the open, and fstat refuses anything but a regular file."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        fd_in = os.open(src, os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise BundleError(f"{src} cannot be opened as a regular file ({exc.strerror or exc}); a store copies regular "
                          "files only") from exc
    copied = 0
    with os.fdopen(fd_in, "rb") as fin:
        if not stat.S_ISREG(os.fstat(fd_in).st_mode):
            raise BundleError(f"{src} is no longer a regular file; a store copies regular files only")
        os.set_blocking(fd_in, True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o644)
        with os.fdopen(fd, "wb") as fout:
            while block := fin.read(_CHUNK):
                copied += len(block)
                if copied > budget:  # the file grew since it was measured
                    raise StoreError(StoreReason.TOO_LARGE, f"{src} grew past the store's limit while it was copied")
                fout.write(block)
            fout.flush()
            os.fsync(fout.fileno())
    return copied


__all__ = ["Staging", "fetch", "check_source", "describe"]
