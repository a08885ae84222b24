"""Bundle updates in the field: :class:`BundleStore` installs new versions of a bundle next to the one that serves,
checks each on this machine before activating it, keeps the previous ones, and rolls back by itself when a new
version fails its self-check, fails to load, or makes its monitor alert during a probation window. This package owns
the store's folder and everything in it; it loads bundles only through :func:`edgesdk.load`, reads monitors only
through their hooks, and imports nothing from the workstation or cloud sides.

On disk (``root``)::

    STORE                      marks the folder as a store (recovery deletes leftovers only inside one)
    ACTIVE                     the pointer (JSON): active version, previous ones newest first, probation, the
                               staged and rejected versions with their reasons; replaced whole, never edited
    ACTIVE.copy                the same pointer, written just before each replace of ACTIVE: read when ACTIVE is
                               damaged or missing
    LOCK                       the lock every change of state is made under (flock; across processes)
    device-id                  this device's random id for staged rollouts, made once
    history.jsonl              every event with its reason (installed, activated, staged, rejected, rolled_back, ...)
    versions/<name>@<hash>/    a complete version: bundle/ (the bundle folder) and version.json, written last;
                               nothing else (a downloaded archive and its extraction record are deleted first)
    staging/install-*/         an install at work (locked by its process while it lives)
    downloads/<key>.part       a download that stopped, kept for the next install of its URL to resume
    trash/                     folders being deleted

Crash safety, step by step (a process may be killed at any instant of an install; the tests kill one with SIGKILL
at every progress call of an install, download, copy and prune included):

1. Staging, downloading, extracting or copying, verifying and the self-check write only inside the install's own
   staging folder (and its download part). The pointer is untouched: the previous version is active and whole. A
   store opened later deletes staging folders no live process holds.
2. The staged files are fsynced, then ``version.json`` is written last (fsynced, renamed into place): a version folder
   without it is incomplete, and is never named by a pointer.
3. Under the lock, the folder is renamed into ``versions/`` in one step. Killed here, the new folder exists but no
   pointer names it; opening the store removes it (the previous version is still the active one).
4. Activation writes the new pointer to a temporary file, fsyncs it, renames it over ``ACTIVE`` (atomic) and fsyncs
   the folder. Killed before the rename, the old pointer (previous version active) is what a reader sees; after it,
   the new one. Nothing is ever half-written where a reader looks.
5. Pruning writes the pointer without the versions to drop first, then moves each folder into ``trash/`` (under
   the lock) and deletes it (after the lock is released); killed in between, the trash or an unnamed folder is
   removed at the next open. A prune never drops the active version or a previous one kept, and a rollback goes
   only to a complete folder, checked before the pointer changes.
6. Opening a store (:mod:`.recovery`) also checks that the pointer's active version is complete, and else makes the
   newest complete previous version active, logging why: the device is never left without a loadable version while
   it has one. A damaged or missing ``ACTIVE`` is read from ``ACTIVE.copy``; with both damaged the pointer is
   rebuilt from the history, where only a version last activated or confirmed may serve (a staged or rejected one
   is kept, never activated). A pointer that cannot be read now (EIO, EACCES) is an error, and nothing is changed.

Rollback and probation are pointer changes made the same way (one rename under the lock), so a kill during them
leaves either the state before or the state after.
"""

from __future__ import annotations

from .options import Probation, StoreOptions
from .store import BundleStore
from .versions import StoreVersion

__all__ = ["BundleStore", "StoreOptions", "Probation", "StoreVersion"]
