"""The store's files on disk and the few ways they change: every write that matters is made durable (the data
fsynced, then renamed over its target, then the folder fsynced), so a reader, or a process started after a kill or a
power cut, sees the old state or the new one, never half of one. The layout is drawn in :mod:`edgesdk.store`.

Nothing here decides anything: :mod:`.recovery` and :mod:`.store` read and write through these functions.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import math
import os
import re
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..choices import StoreReason
from ..errors import StoreError

log = logging.getLogger("edgesdk.store")

FORMAT = 1
MARKER = "STORE"  # {"format": 1}: this folder is a store (recovery deletes only inside one)
POINTER = "ACTIVE"  # the pointer: which version serves, the ones kept, probation, recorded states
POINTER_COPY = "ACTIVE.copy"  # the same pointer, written just before ACTIVE is replaced: read when ACTIVE cannot be
DEVICE_ID = "device-id"
HISTORY = "history.jsonl"
LOCK = "LOCK"
VERSIONS, STAGING, DOWNLOADS, TRASH = "versions", "staging", "downloads", "trash"
RECORD = "version.json"  # written last into a version folder: a version is complete only with it
BUNDLE = "bundle"  # versions/<id>/bundle: the bundle folder itself
MAX_STATES = 64  # staged and rejected versions remembered in the pointer (the oldest forgotten first)
MAX_HISTORY_BYTES = 1 << 20  # history.jsonl is cut to its newer half past this
MAX_POINTER_BYTES = 256 << 10  # a pointer or a version record past this is damaged (a real one is a few KiB)
MAX_NESTING = 16  # a pointer, record or history line nested deeper than this is damaged (a real one: 3 levels)
MAX_HISTORY_LINE = 64 << 10  # a longer history line is skipped
ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,48}@[0-9a-f]{12}")  # a version id: also a folder name in versions/
STATES = ("staged", "rejected")  # the states a pointer records besides active and previous
_TMP = ".tmp"

try:  # advisory locks between processes; a platform without fcntl (Windows) serializes threads only
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# -- durable writes --------------------------------------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """Make the names in ``path`` (a rename, a new file) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - a platform that cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on a folder
        pass
    finally:
        os.close(fd)


def write_durable(path: Path, text: str, before_replace: Callable[[], None] | None = None) -> None:
    """Replace ``path`` with ``text``: written to a temporary file beside it, fsynced, renamed over it, the folder
    fsynced. ``before_replace`` runs between the fsync and the rename (the install's progress, which is also where
    the crash tests kill it). A leftover temporary file is removed by the next :func:`remove_temporaries`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{_TMP}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (and ``root``), deepest first: a bundle written by another
    module (the archive extraction) is durable before the rename that publishes it."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def read_bounded(path: Path, what: str, limit: int = MAX_POINTER_BYTES) -> str | None:
    """The text of the small JSON file ``path`` (a pointer, a record): None when it does not exist; ValueError when it
    is damaged (too large, not UTF-8); :class:`StoreError` when it cannot be read now (EIO, EACCES ...), which is not
    damage, and must not make recovery rebuild or delete anything."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise StoreError(StoreReason.NOT_A_STORE, f"cannot read {what} {path} ({errno.errorcode.get(exc.errno, '?')}: "
                                                  f"{exc.strerror or exc}); the store is left as it is") from exc
    if len(data) > limit:
        raise ValueError(f"{path.name} is over {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not UTF-8 text") from exc


def parse_json(text: str, name: str) -> Any:
    """``json.loads`` of a file's text, with its nesting checked first (ValueError past :data:`MAX_NESTING`, never a
    RecursionError)."""
    depth, quoted, escaped = 0, False, False
    for char in text if text.count("[") + text.count("{") > MAX_NESTING else "":  # fewer brackets: never deeper
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise ValueError(f"{name} is nested deeper than {MAX_NESTING} levels")
        elif char in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except RecursionError as exc:  # pragma: no cover - the scan above refuses it first
        raise ValueError(f"{name} is nested too deep") from exc


def remove_temporaries(folder: Path) -> list[str]:
    """Delete the temporary files :func:`write_durable` left in ``folder`` when a process died mid-write."""
    gone = []
    for path in folder.glob(f".*{_TMP}"):
        path.unlink(missing_ok=True)
        gone.append(path.name)
    return gone


def discard(path: Path, trash: Path, delete: bool = True) -> Path | None:
    """Remove the folder ``path``: first renamed into ``trash`` (one step: it is no longer where it was), then deleted
    (a kill in between leaves it in the trash, which the next open empties). ``delete=False`` leaves the deletion to
    the caller (after it released the store's lock: a large folder takes time to delete) and returns where it is."""
    if not path.exists():
        return None
    trash.mkdir(exist_ok=True)
    target = trash / f"{path.name}.{secrets.token_hex(4)}"
    os.rename(path, target)
    fsync_dir(path.parent)
    if not delete:
        return target
    shutil.rmtree(target, ignore_errors=True)
    return None


# -- the pointer -----------------------------------------------------------------------------------------------------
@dataclass
class Pointer:
    """The content of ``ACTIVE``: the state of the store, replaced whole in one rename.

    ``active``: the version that serves (None: nothing installed yet, or nothing left). ``previous``: the versions
    kept to roll back to, newest first. ``probation``: ``{"version", "since", "since_unix"}`` while the active
    version is on probation, else None. ``states``: ``{id: {"state": "staged"|"rejected", "reason", "time"}}`` for the
    versions that are neither active nor previous, ``folder`` saying whether it is kept (a rejected one may have
    none: it failed before it was kept, or was pruned, and is remembered so that it is not installed again).
    """

    active: str | None = None
    previous: list[str] = field(default_factory=list)
    probation: dict[str, Any] | None = None
    states: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "active": self.active, "previous": self.previous,
                           "probation": self.probation, "states": self.states, "updated": now()}, indent=1)

    @classmethod
    def from_json(cls, text: str, name: str = POINTER) -> "Pointer":
        """Raises ValueError when ``text`` is not a pointer, naming what is wrong (every field is checked here, so
        that nothing reading a pointer meets a field of another type)."""
        data = parse_json(text, name)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{name} is not a format-{FORMAT} pointer")
        active, previous = data.get("active"), data.get("previous")
        probation, states = data.get("probation"), data.get("states")
        if not (active is None or _is_id(active)) or not isinstance(previous, list) \
                or not all(_is_id(v) for v in previous) or len(set(previous)) != len(previous) or active in previous:
            raise ValueError(f"{name}: its active and previous versions are not distinct version ids")
        if probation is not None and not (isinstance(probation, dict) and _is_id(probation.get("version"))
                                          and _is_number(probation.get("since_unix"))
                                          and isinstance(probation.get("since"), (str, type(None)))):
            raise ValueError(f"{name}: its probation is not {{version, since, since_unix (a number)}}")
        if not isinstance(states, dict) or len(states) > MAX_STATES or not all(
                _is_id(v) and isinstance(s, dict) and s.get("state") in STATES
                and isinstance(s.get("reason"), (str, type(None))) and isinstance(s.get("folder", False), bool)
                for v, s in states.items()):
            raise ValueError(f"{name}: its states are not {{version id: {{state (staged or rejected), reason, "
                             "folder}}")
        return cls(active, list(previous), probation, dict(states))

    def remember(self, version: str, state: str, reason: str | None, folder: bool) -> None:
        """Record ``version`` as staged or rejected (``folder``: whether its folder is kept), forgetting the oldest
        past :data:`MAX_STATES`."""
        self.states.pop(version, None)
        self.states[version] = {"state": str(state), "reason": reason, "time": now(), "folder": folder}
        while len(self.states) > MAX_STATES:
            self.states.pop(next(iter(self.states)))

    def referenced(self) -> list[str]:
        """Every version this pointer keeps a folder for: active, previous, and the staged and rejected ones kept."""
        ids = ([self.active] if self.active else []) + self.previous
        return ids + [v for v, s in self.states.items() if s.get("folder") and v not in ids]


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_pointer(root: Path, name: str = POINTER) -> Pointer | None:
    """The pointer (``name``: ``ACTIVE``, or its copy), None when there is no such file; ValueError when it is
    damaged; :class:`StoreError` when it cannot be read now (see :func:`read_bounded`)."""
    text = read_bounded(root / name, "the store's pointer")
    return None if text is None else Pointer.from_json(text, name)


def write_pointer(root: Path, pointer: Pointer, before_replace: Callable[[], None] | None = None) -> None:
    """Replace the pointer: its copy first, then ``ACTIVE`` (each durably), so that when ``ACTIVE`` is found
    damaged its copy holds the last state written (or, after a kill between the two, the one about to be)."""
    text = pointer.to_json()
    write_durable(root / POINTER_COPY, text)
    write_durable(root / POINTER, text, before_replace)


# -- versions --------------------------------------------------------------------------------------------------------
def version_dir(root: Path, version: str) -> Path:
    return root / VERSIONS / version


def read_record(folder: Path) -> dict[str, Any] | None:
    """A version folder's record, None when the folder is not a complete version (no record, or a damaged one);
    :class:`StoreError` when it cannot be read now (EIO ...: the version may be whole, and is not deleted)."""
    try:
        text = read_bounded(folder / RECORD, "the version record")
        record = None if text is None else parse_json(text, f"{folder.name}/{RECORD}")
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("id") != folder.name or not (folder / BUNDLE).is_dir() \
            or not all(record.get(k) is None or _is_number(record.get(k)) for k in ("installed_unix",
                                                                                   "rollout_percent")):
        return None
    return record


# -- history ---------------------------------------------------------------------------------------------------------
def append_history(root: Path, event: str, version: str | None, reason: str | None = None, **detail: Any) -> None:
    """One line of ``history.jsonl`` (and of the ``edgesdk.store`` log): what happened, to which version, why.
    Never raises: the history explains, the pointer decides."""
    entry = {"time": now(), "event": event, "version": version, "reason": reason, **detail}
    (log.warning if event in ("rolled_back", "rejected", "recovered") else log.info)(
        "store %s: %s %s%s", root, event, version, f" ({reason})" if reason else "")
    path = root / HISTORY
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if path.stat().st_size > MAX_HISTORY_BYTES:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            write_durable(path, "\n".join(lines[len(lines) // 2:]) + "\n")
    except OSError as exc:
        log.warning("store %s: cannot write its history (%s)", root, exc)


def read_history(root: Path) -> list[dict[str, Any]]:
    """The history's events, oldest first (a line cut short by a kill is skipped)."""
    try:
        lines = (root / HISTORY).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreError(StoreReason.NOT_A_STORE, f"cannot read the store's history {root / HISTORY} "
                                                  f"({exc.strerror or exc})") from exc
    events = []
    for line in lines:
        try:
            entry = parse_json(line, HISTORY) if len(line) <= MAX_HISTORY_LINE else None
        except ValueError:
            continue
        if isinstance(entry, dict):
            events.append(entry)
    return events


# -- locks -----------------------------------------------------------------------------------------------------------
class StoreLock:
    """The store's lock: held for each change of state (never across a download or a self-check), so that two
    processes, or two threads, read-modify-write the pointer one at a time. Re-entrant in one thread."""

    def __init__(self, root: Path):
        self._path = root / LOCK
        self._threads = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._threads:
            if self._depth == 0 and fcntl is not None:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    os.close(self._fd)  # closing releases the flock
                    self._fd = None


_LOCKS: dict[Path, StoreLock] = {}
_LOCKS_GUARD = threading.Lock()


def store_lock(root: Path) -> StoreLock:
    """The one lock of the store at ``root`` in this process, shared by every :class:`~edgesdk.BundleStore` object on
    it: a thread holding it through one object (an install's progress callback) may use another without deadlock."""
    key = root.resolve()
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, StoreLock(key))


def lock_folder(path: Path) -> int | None:
    """Hold an exclusive lock on the folder ``path`` while it is worked in (the fd; close it to let go): recovery
    deletes only staging folders nobody holds. None where there are no such locks."""
    if fcntl is None:  # pragma: no cover
        return None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def held_by_another(path: Path) -> bool:
    """Whether a live process holds ``path``'s lock (a kill releases it: the folder is then a leftover)."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


# -- the store's identity --------------------------------------------------------------------------------------------
def open_root(root: Path) -> None:
    """Make ``root`` a store (a missing or empty folder), or check that it is one. Refuses anything else: recovery
    deletes leftovers inside a store, which must never be a folder of something else."""
    if root.exists() and not root.is_dir():
        raise StoreError(StoreReason.NOT_A_STORE, f"{root} is a file, not a store folder")
    marker = root / MARKER
    if root.is_dir() and not marker.is_file():
        if any(root.iterdir()):
            raise StoreError(StoreReason.NOT_A_STORE, f"{root} is a folder of something else (it has files and no "
                                                      f"{MARKER} file): give an empty or new folder for a store")
    root.mkdir(parents=True, exist_ok=True)
    if not marker.is_file():
        write_durable(marker, json.dumps({"format": FORMAT, "created": now()}))
    for name in (VERSIONS, STAGING, DOWNLOADS, TRASH):
        (root / name).mkdir(exist_ok=True)


def device_id(root: Path) -> str:
    """This device's id for staged rollouts: made at random once and kept in the store (``device-id``)."""
    path = root / DEVICE_ID
    try:
        found = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    made = secrets.token_hex(16)
    tmp = path.with_name(f".{DEVICE_ID}.{os.getpid()}.{threading.get_ident()}{_TMP}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(made + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)  # creates it whole, or fails when another process made it first: its id is the device's
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(root)
    return made


__all__ = ["Pointer", "StoreLock", "store_lock", "read_pointer", "write_pointer", "read_record", "append_history",
           "read_history", "read_bounded", "parse_json",
           "write_durable", "sync_tree", "discard", "open_root", "device_id", "lock_folder", "held_by_another"]
