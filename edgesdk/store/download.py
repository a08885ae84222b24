"""Downloading a bundle archive over HTTP(S) for :meth:`~edgesdk.BundleStore.install`: bounded, and resumed where
it stopped.

The bytes go to ``downloads/<key>.part`` in the store (``key``: from the URL's sha256), with ``<key>.json`` beside it
(the URL's sha256, the size the server announced, its ``ETag`` / ``Last-Modified``; a URL is never written to disk
whole, nor shown with its query or user: they may hold a token). When the connection drops, the download goes on
from the bytes it has with an HTTP ``Range`` request (``If-Range`` on the validator, so a file changed on the server
meanwhile is fetched whole again), up to ``retries`` times within ``deadline_s``; past that the install fails and
the part stays, for the next install of the same URL to resume. The deadline bounds every read (each waits at most
the time left, never ``timeout_s`` per byte of a server that drips). Only one part is kept: starting another URL's
download deletes the others. Only ``http`` and ``https`` are fetched, redirects included. The size is checked
against the cap before any byte of the body is read (``Content-Length``, or the total of ``Content-Range``) and on
every byte after (a server may announce nothing, or lie). Every refusal is a :class:`~edgesdk.errors.StoreError`:
``bad_source``, ``too_large`` or ``download_failed``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from ..choices import InstallStep, StoreReason
from ..errors import StoreError
from .disk import DOWNLOADS, held_by_another
from .options import StoreOptions

CHUNK = 256 << 10  # most bytes per read; progress is told each time the count passes a multiple of it
SCHEMES = ("http", "https")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def is_url(source: str) -> bool:
    return "://" in source


def check_url(url: str) -> None:
    """Refuse what is not an http(s) URL with a host (``file://``, ``ftp://``, a typo) before anything is fetched."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise StoreError(StoreReason.BAD_SOURCE, f"{shown(url)}: only http and https URLs are downloaded, not "
                                                 f"{parts.scheme or 'a URL without a scheme'}")
    if not parts.hostname:
        raise StoreError(StoreReason.BAD_SOURCE, f"{shown(url)} has no host")


def shown(url: str) -> str:
    """The URL as messages and records show it: without a user, password or query (they may hold a token)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def download(url: str, root: Path, dest: Path, options: StoreOptions,
             progress: Callable[[str, dict[str, Any]], None]) -> Path:
    """Fetch ``url`` into the file ``dest`` (in the install's staging folder) and return it; see the module
    docstring."""
    check_url(url)
    folder = root / DOWNLOADS
    key = _digest(url)[:24]
    part, meta_path = folder / f"{key}.part", folder / f"{key}.json"
    for other in folder.iterdir():  # one part kept: another URL's is dropped (unless it is downloading now)
        if other.stem != key and not held_by_another(folder / f"{other.stem}.part"):
            other.unlink(missing_ok=True)
    deadline = time.monotonic() + options.deadline_s
    fd = _open_locked(part, url)
    try:
        meta = _meta(meta_path, url)
        if not meta:
            os.ftruncate(fd, 0)
        failures: list[str] = []
        complete, attempts = False, 0
        for attempt in range(options.retries + 1):
            attempts = attempt + 1
            if attempt:  # a short pause before resuming, never past the deadline
                time.sleep(min(0.2 * 2 ** (attempt - 1), 2.0, max(0.0, deadline - time.monotonic())))
            try:
                complete = _attempt(url, fd, meta, meta_path, options, deadline, progress)
                if complete:
                    break
                failures.append(f"attempt {attempt + 1}: the connection ended at {os.fstat(fd).st_size} bytes")
            except _Retry as exc:
                failures.append(f"attempt {attempt + 1}: {exc}")
            if time.monotonic() >= deadline:
                failures.append(f"the deadline of {options.deadline_s:g} s passed")
                break
        if not complete:
            have = os.fstat(fd).st_size
            raise StoreError(StoreReason.DOWNLOAD_FAILED,
                             f"{shown(url)}: {'; '.join(failures[-3:])}; gave up after {attempts} "
                             f"attempt(s) with {have} of {meta.get('size') or 'an unknown number of'} bytes, kept in "
                             f"{part} (the next install of this URL resumes from there)")
        os.fsync(fd)
        os.replace(part, dest)  # while the lock is held: no other install opens and writes this file meanwhile
    except StoreError as exc:
        if exc.reason is StoreReason.TOO_LARGE:
            part.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    meta_path.unlink(missing_ok=True)
    return dest


def _digest(url: str) -> str:
    """What the store keeps of a URL (never the URL itself: its query may hold a token)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()


class _Retry(Exception):
    """An attempt failed in a way another one may not (connection, timeout, 5xx)."""


def _open_locked(part: Path, url: str) -> int:
    """The part file, opened and locked; checked after the lock to be the file named ``part`` still (another install
    may have moved it away, into its staging folder, between this open and this lock: that file is not ours)."""
    for _ in range(3):
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock(fd, url)
            held, named = os.fstat(fd), os.stat(part)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise StoreError(StoreReason.DOWNLOAD_FAILED, f"{shown(url)} is being downloaded into this store by another "
                                                  "install now")


def _lock(fd: int, url: str) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise StoreError(StoreReason.DOWNLOAD_FAILED, f"{shown(url)} is being downloaded into this store by another "
                                                      "install now") from None


def _meta(path: Path, url: str) -> dict[str, Any]:
    """What the part was downloaded against (empty: start over)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) and meta.get("url_sha256") == _digest(url) else {}


def _attempt(url: str, fd: int, meta: dict[str, Any], meta_path: Path, options: StoreOptions, deadline: float,
             progress: Callable[[str, dict[str, Any]], None]) -> bool:
    """One request; True when the file is whole. Raises :class:`_Retry` for what another attempt may fix."""
    have = os.fstat(fd).st_size
    headers = {"Accept-Encoding": "identity", "User-Agent": "edgesdk-store"}
    validator = meta.get("etag") if not str(meta.get("etag") or "").startswith("W/") else None
    validator = validator or meta.get("last_modified")
    if have and validator:  # no validator: the part may be of another file; start over
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = validator
    elif have:
        os.ftruncate(fd, 0)
        have = 0
    timeout = max(0.001, min(options.timeout_s, deadline - time.monotonic()))
    try:
        response = _OPENER.open(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have and have == meta.get("size"):
            return True  # it was all there
        if exc.code == 416:
            os.ftruncate(fd, 0)
            raise _Retry("the server refused the range asked for (416): starting over") from exc
        if exc.code in (408, 429) or exc.code >= 500:
            raise _Retry(f"HTTP {exc.code} {exc.reason}") from exc
        raise StoreError(StoreReason.DOWNLOAD_FAILED, f"{shown(url)}: HTTP {exc.code} {exc.reason}") from exc
    except StoreError:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        raise _Retry(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from exc
    with response:
        total = _expected_total(response, have, fd)
        if total is not None and total > options.max_bytes:
            raise StoreError(StoreReason.TOO_LARGE, f"{shown(url)} is {total} bytes, over the store's limit of "
                                                    f"{options.max_bytes} (StoreOptions.max_bytes)")
        meta.clear()
        meta.update({"url_sha256": _digest(url), "size": total, "etag": response.headers.get("ETag"),
                     "last_modified": response.headers.get("Last-Modified")})
        meta_path.write_text(json.dumps(meta), encoding="utf-8")
        have = os.lseek(fd, 0, os.SEEK_END)
        reported = have  # progress is told at each CHUNK boundary and at the end: the same calls whatever reads bring
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Retry(f"the deadline of {options.deadline_s:g} s passed")
            _set_timeout(response, min(options.timeout_s, left))
            try:
                block = response.read1(CHUNK)  # what one receive brings: each read waits at most the time left
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise _Retry(f"{type(exc).__name__} after {have} bytes: {exc}") from exc
            if not block:
                progress(InstallStep.DOWNLOAD, {"bytes": have, "total": total})
                break
            have += len(block)
            if have > options.max_bytes:
                raise StoreError(StoreReason.TOO_LARGE, f"{shown(url)} sent more than the store's limit of "
                                                        f"{options.max_bytes} bytes (StoreOptions.max_bytes)")
            if total is not None and have > total:
                raise StoreError(StoreReason.DOWNLOAD_FAILED, f"{shown(url)} sent more than the {total} bytes it "
                                                              "announced")
            os.write(fd, block)
            if have // CHUNK > reported // CHUNK and (total is None or have < total):
                progress(InstallStep.DOWNLOAD, {"bytes": have, "total": total})
                reported = have
    return total is None or have == total


def _set_timeout(response: Any, seconds: float) -> None:
    """Bound the next receive of ``response`` (an ``http.client.HTTPResponse``) by ``seconds``."""
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(0.001, seconds))


def _expected_total(response: Any, have: int, fd: int) -> int | None:
    """The whole file's size as the server announced it (None: not announced); a 200 answer to a range request
    starts the file over."""
    if response.status == 206:
        found = _CONTENT_RANGE.fullmatch((response.headers.get("Content-Range") or "").strip())
        if found is None or int(found.group(1)) != have:
            os.ftruncate(fd, 0)
            raise _Retry(f"the server answered the range from byte {have} with "
                         f"{response.headers.get('Content-Range')!r}: starting over")
        return None if found.group(3) == "*" else int(found.group(3))
    os.ftruncate(fd, 0)
    length = response.headers.get("Content-Length")
    return int(length) if length is not None and length.strip().isdigit() else None


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to another http(s) URL."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in SCHEMES:
            raise StoreError(StoreReason.DOWNLOAD_FAILED, f"{shown(req.full_url)} redirects to a URL of scheme "
                                                          f"{scheme!r}, which is not followed (http and https only)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)

__all__ = ["download", "check_url", "is_url", "shown"]
