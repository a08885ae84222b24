"""The changes of a store's state, each made on a :class:`~edgesdk.store.disk.Pointer` in memory and then written in
one rename by the caller (who holds the store's lock): activate a version, roll back from the active one, and plan
what a prune deletes (the pointer forgets the folders first; the folders go after it is written, so the pointer never
names a folder that is gone)."""

from __future__ import annotations

import time

from ..choices import VersionState
from .disk import Pointer, now
from .options import Probation


def activate(pointer: Pointer, version: str, probation: Probation | None) -> str | None:
    """Make ``version`` active, the active one the newest previous, and start its probation (None: none). Returns
    the version that was active."""
    old = pointer.active
    pointer.previous = ([old] if old and old != version else []) + [v for v in pointer.previous
                                                                     if v not in (version, old)]
    pointer.states.pop(version, None)
    pointer.active = version
    pointer.probation = None if probation is None else {"version": version, "since": now(),
                                                        "since_unix": time.time()}
    return old


def roll_back(pointer: Pointer, reason: str) -> tuple[str, str]:
    """Make the newest previous version active (the caller checked there is one), rejecting the active one with
    ``reason``; the version rolled back to is not put on probation again. Returns (from, to)."""
    old, new = pointer.active, pointer.previous[0]
    pointer.active, pointer.previous, pointer.probation = new, pointer.previous[1:], None
    pointer.remember(old, VersionState.REJECTED, reason, folder=True)
    return old, new


def prune(pointer: Pointer, keep: int) -> list[str]:
    """Keep ``keep`` previous versions, and the folders of the ``keep`` newest staged and rejected versions each;
    return the versions whose folders go. A rejected version is still remembered without its folder, so that it is
    not installed again unasked; a staged one is forgotten. The active version and the previous ones kept are never
    dropped, whatever else a pointer records of them."""
    dropped = pointer.previous[keep:]
    pointer.previous = pointer.previous[:keep]
    serving = ([pointer.active] if pointer.active else []) + pointer.previous
    for version in dropped:  # a record left of a dropped previous version must not name its folder any more
        _forget_folder(pointer, version)
    for state in (VersionState.STAGED, VersionState.REJECTED):
        kept = [v for v, s in pointer.states.items() if s.get("state") == state and s.get("folder")
                and v not in serving and v not in dropped]
        for version in kept[:-keep] if keep else kept:
            dropped.append(version)
            _forget_folder(pointer, version)
    return dropped


def _forget_folder(pointer: Pointer, version: str) -> None:
    state = pointer.states.get(version)
    if state is None:
        return
    if state.get("state") == VersionState.STAGED:
        del pointer.states[version]
    else:
        state["folder"] = False


__all__ = ["activate", "roll_back", "prune"]
