"""What opening a store does first, under its lock: bring the folder back to a state the pointer describes, whatever
moment a previous process was killed at.

In order: the temporary files of an interrupted durable write and the trash are deleted; so is every staging folder no
live process holds (an install killed before it published); the pointer is read, and when it names an active version
that is missing or incomplete (no ``version.json``), the newest complete one it keeps serves instead (reason
``recovery``, logged); a damaged pointer (or a missing one while complete versions exist) is read from its copy
``ACTIVE.copy``, and when that is damaged too, rebuilt from the history (:func:`_rebuilt`: only a version the history
last shows activated or confirmed serves again; a staged, rejected or unknown one is kept, never activated); kept
versions whose folders are gone are forgotten; and every version folder the pointer does not name (published by an
install killed before its activation, or half deleted by a prune) goes. Each change is written to the history with
its reason. A pointer that cannot be read now (EIO, EACCES: not damage) is a :class:`~edgesdk.errors.StoreError`,
and nothing is changed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..choices import StoreReason, VersionState
from .disk import (DOWNLOADS, POINTER, POINTER_COPY, STAGING, TRASH, VERSIONS, Pointer, append_history, discard,
                   held_by_another, read_history, read_pointer, read_record, remove_temporaries, write_pointer)


def recover(root: Path) -> Pointer:
    """Make the store consistent (the caller holds its lock) and return its pointer."""
    left = remove_temporaries(root) + remove_temporaries(root / DOWNLOADS)
    trash = root / TRASH
    for path in trash.iterdir():
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for path in (root / STAGING).iterdir():
        if not held_by_another(path):  # a live install holds its folder; a killed one held it no longer
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            left.append(f"{STAGING}/{path.name}")
    if left:
        append_history(root, "recovered", None, "cleaned up after an interrupted install", removed=sorted(left))
    complete = {p.name: record for p in (root / VERSIONS).iterdir() if (record := read_record(p)) is not None}
    try:
        found, changed = read_pointer(root), False
        if found is None and (complete or (root / POINTER_COPY).exists()):
            raise ValueError(f"{POINTER} is missing while the store keeps versions")
        pointer = found or Pointer()
    except ValueError as exc:
        pointer, changed = _rebuilt(root, complete, exc), True
    if pointer.active is not None and pointer.active not in complete:
        lost = pointer.active
        kept = [v for v in pointer.previous if v in complete]
        pointer.active, pointer.previous, pointer.probation = (kept[0], kept[1:], None) if kept else (None, [], None)
        changed = True
        append_history(root, "recovered", pointer.active,
                       f"{StoreReason.RECOVERY}: the pointer named {lost}, which is missing or incomplete; "
                       f"{pointer.active or 'nothing'} serves now", lost=lost)
    if any(v not in complete for v in pointer.previous):
        pointer.previous = [v for v in pointer.previous if v in complete]
        changed = True
    for version, state in pointer.states.items():
        if state.get("folder") and version not in complete:
            state["folder"] = False
            changed = True
    if pointer.probation is not None and pointer.probation.get("version") != pointer.active:
        pointer.probation = None
        changed = True
    if changed:
        write_pointer(root, pointer)
    named = set(pointer.referenced())
    for path in sorted((root / VERSIONS).iterdir()):
        if path.name not in named or path.name not in complete:
            discard(path, trash)
            append_history(root, "recovered", path.name, "removed: an install or a prune was interrupted before "
                           "the pointer named it" if path.name in complete else "removed: incomplete")
    return pointer


def _rebuilt(root: Path, complete: dict[str, dict[str, Any]], exc: Exception) -> Pointer:
    """The pointer when ``ACTIVE`` is damaged or missing: its copy when that reads, else one rebuilt from the history.

    The history says what the pointer said (each change is logged as it is committed): replayed, every version ends
    either serving-capable (last ``activated``, ``confirmed``, rolled back *to*, or made active by a recovery) or not
    (last ``rolled_back`` from, ``rejected``, ``staged``). The complete versions of the first kind are active and
    previous, the most recently activated first; the others are kept with their state (one the history does not
    mention is kept as rejected), so that nothing staged outside this device's rollout, or rejected, serves unasked."""
    try:
        copy = read_pointer(root, POINTER_COPY)
    except ValueError as damaged:
        copy, exc = None, ValueError(f"{exc}; {damaged}")
    if copy is not None:
        append_history(root, "recovered", copy.active, f"{StoreReason.RECOVERY}: the pointer could not be read ({exc});"
                       f" its copy {POINTER_COPY} serves")
        return copy
    activated: dict[str, int] = {}  # version -> when it last became active
    other: dict[str, tuple[str, str | None]] = {}  # version -> (state, reason) of a version that must not serve
    for i, event in enumerate(read_history(root)):
        kind, version, reason = event.get("event"), event.get("version"), event.get("reason")
        if not isinstance(version, str):
            continue
        if kind == "activated" or (kind == "recovered" and event.get("lost")):
            activated[version] = i
            other.pop(version, None)
        elif kind in ("rolled_back", "rejected", "staged"):
            activated.pop(version, None)
            other[version] = (VersionState.STAGED if kind == "staged" else VersionState.REJECTED,
                              reason if isinstance(reason, str) else None)
            to = event.get("to") if kind == "rolled_back" else None
            if isinstance(to, str):
                activated[to] = i
                other.pop(to, None)
    serving = sorted((v for v in complete if v in activated), key=lambda v: activated[v], reverse=True)
    pointer = Pointer(serving[0] if serving else None, serving[1:])
    for version in sorted((v for v in complete if v not in activated),
                          key=lambda v: complete[v].get("installed_unix") or 0):
        state, reason = other.get(version) or (VersionState.REJECTED, f"{StoreReason.RECOVERY}: its state was lost "
                                               "with the pointer; activate it with allow_rejected=True")
        pointer.remember(version, state, reason, folder=True)
    append_history(root, "recovered", pointer.active, f"{StoreReason.RECOVERY}: the pointer could not be read ({exc});"
                   " rebuilt from the history: the version last activated serves, "
                   f"{len(pointer.states)} staged or rejected version(s) kept, not activated")
    return pointer


__all__ = ["recover"]
