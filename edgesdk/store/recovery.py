"""What opening a store does first, under its lock: bring the folder back to a state the pointer describes, whatever
moment a previous process was killed at.

In order: the temporary files of an interrupted durable write and the trash are deleted; so is every staging folder no
live process holds (an install killed before it published); the pointer is read, and when it names an active version
that is missing or incomplete (no ``version.json``), the newest complete one it keeps serves instead (reason
``recovery``, logged); an unreadable pointer is rebuilt from the complete versions, newest active; kept versions whose
folders are gone are forgotten; and every version folder the pointer does not name (published by an install killed
before its activation, or half deleted by a prune) goes. Each change is written to the history with its reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..choices import StoreReason
from .disk import (DOWNLOADS, STAGING, TRASH, VERSIONS, Pointer, append_history, discard, held_by_another,
                   read_pointer, read_record, remove_temporaries, write_pointer)


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
        pointer, changed = read_pointer(root) or Pointer(), False
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
    """A pointer made from the complete versions (newest active) when ``ACTIVE`` cannot be read."""
    newest = sorted(complete, key=lambda v: complete[v].get("installed_unix") or 0, reverse=True)
    pointer = Pointer(newest[0] if newest else None, newest[1:])
    append_history(root, "recovered", pointer.active, f"{StoreReason.RECOVERY}: the pointer could not be read ({exc});"
                   f" rebuilt from the complete versions, the newest active")
    return pointer


__all__ = ["recover"]
