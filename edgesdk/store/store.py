""":class:`BundleStore`: the versions of a bundle on a device, one of them active, the previous ones kept to roll
back to. The layout on disk and the crash-safety argument are in :mod:`edgesdk.store`; an install's steps in
:mod:`.install`; the probation watch in :mod:`.probation`."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ..choices import InstallStep, StoreReason, VersionState
from ..errors import BackendUnavailable, BundleError, InputError, StoreError
from . import changes, disk, install as installing, rollout
from .disk import BUNDLE, VERSIONS, Pointer
from .options import StoreOptions
from .probation import ProbationWatch, check_watchable
from .recovery import recover
from .versions import ID_PATTERN, StoreVersion, describe

log = logging.getLogger("edgesdk.store")
MAX_HOOKS = 64
_DEVICE_ID_CHARS = 128


class BundleStore:
    """The versions of a bundle on this device under ``root``: :meth:`install` a new one (checked here first), one
    :meth:`active` at a time, ``keep`` previous ones to :meth:`rollback` to, and automatic rollback during a new
    version's probation (:class:`~edgesdk.store.options.Probation`).

    Opening a store (this constructor) makes ``root`` a store when it is a new or empty folder, and recovers it from
    whatever an interrupted process left (:mod:`edgesdk.store.recovery`); a folder of something else is refused
    (``not_a_store``). ``options`` (a :class:`~edgesdk.store.options.StoreOptions`) with keyword shortcuts for its
    fields: ``BundleStore(root, keep=3)``. ``device_id`` decides staged rollouts (:mod:`edgesdk.store.rollout`); None
    takes the one made at random for this store and kept in it.

    The state lives on disk, not in this object: every method reads the pointer again, so several processes (the app,
    ``edgesdk store`` on the command line) may hold the same store, each change made under a lock. Thread-safe.
    """

    def __init__(self, root: str | Path, options: StoreOptions | None = None, *, device_id: str | None = None,
                 **overrides: Any):
        if options is not None and not isinstance(options, StoreOptions):
            raise InputError(f"options must be a StoreOptions or None, got {type(options).__name__}")
        try:
            opts = replace(options or StoreOptions(), **overrides)
        except TypeError as exc:
            raise InputError(f"BundleStore() got an unknown option: {exc}") from exc
        if device_id is not None and (not isinstance(device_id, str) or not 1 <= len(device_id) <= _DEVICE_ID_CHARS
                                      or not device_id.isprintable()):
            raise InputError(f"device_id must be one line of 1 to {_DEVICE_ID_CHARS} printable characters, got "
                             f"{device_id!r}")
        self.root = Path(root).absolute()
        self.options = opts
        disk.open_root(self.root)
        self._lock = disk.store_lock(self.root)
        self._local = threading.local()  # this thread's lock depth and the changes it made under the lock
        self._hooks: list[Callable[[dict[str, Any]], Any]] = []
        with self._locked():
            recover(self.root)
            self.device_id = device_id if device_id is not None else disk.device_id(self.root)

    # -- what it holds ----------------------------------------------------------------------------------------------
    def versions(self) -> list[StoreVersion]:
        """Every version the store holds or remembers: the active one, the previous ones newest first, then the staged
        and rejected ones, newest first."""
        pointer = self._settled()
        probation = self._probation_of(pointer)
        out = []
        if pointer.active:
            out.append(self._describe(pointer.active, VersionState.ACTIVE, probation=probation))
        out += [self._describe(v, VersionState.PREVIOUS) for v in pointer.previous]
        for version, state in reversed(pointer.states.items()):
            out.append(self._describe(version, VersionState(state["state"]), state.get("reason"),
                                      kept=bool(state.get("folder"))))
        return out

    def version(self, version: str) -> StoreVersion:
        """The version named ``version`` (its id, or the start of one that no other shares)."""
        pointer = self._pointer()
        found = self._resolve(version, pointer, kept_only=False)
        return next(v for v in self.versions() if v.id == found)

    def active(self) -> StoreVersion | None:
        """The version that serves, None when there is none."""
        found = [v for v in self.versions() if v.state is VersionState.ACTIVE]
        return found[0] if found else None

    def active_path(self) -> Path:
        """The bundle folder of the active version (what ``edgesdk.load`` opens); ``no_active_version`` when there is
        none. A :class:`~edgesdk.ModelPool` given this store loads it from here."""
        pointer = self._pointer()
        if pointer.active is None:
            raise StoreError(StoreReason.NO_ACTIVE_VERSION, f"store {self.root} has no active version "
                                                            f"({self.state_text(pointer)}): install one first")
        return self.root / VERSIONS / pointer.active / BUNDLE

    def history(self) -> list[dict[str, Any]]:
        """What happened to the store, oldest first: ``{"time", "event", "version", "reason", ...}`` per event
        (installed, activated, staged, rejected, refused, rolled_back, confirmed, pruned, recovered)."""
        return disk.read_history(self.root)

    # -- changes ----------------------------------------------------------------------------------------------------
    def install(self, source: str | Path, *, trust: Any = None, rollout_percent: float | None = None,
                progress: Callable[[str, dict[str, Any]], None] | None = None,
                allow_rejected: bool = False) -> StoreVersion:
        """Install the bundle ``source`` (a bundle folder, an ``.edgebundle`` file, or an http(s) URL of one) and
        activate it when this device is in its rollout; returns the version, ``active`` or ``staged``.

        Nothing is activated before the bundle has been brought into the store, every file checked against the
        manifest's sha256, its signature verified (``trust``: a :class:`~edgesdk.Trust` or a public key path, checked
        besides the store's own ``StoreOptions.trust``), and loaded on this machine with its golden inputs run and
        compared (the self-check). A version that fails its self-check is recorded as rejected (reason
        ``self_check_failed``) and :class:`StoreError` is raised; a tampered or unsigned bundle raises
        :class:`~edgesdk.errors.BundleError`; either way the active version stays. A version rejected before is
        refused (``rejected_before``) unless ``allow_rejected``. ``rollout_percent`` (0 to 100; None: the manifest's
        ``rollout_percent``, else every device) stages the version without activating it on the devices outside it.

        ``progress(step, detail)`` is called before each step (:class:`~edgesdk.choices.InstallStep`; ``download``
        per chunk with ``bytes``/``total``, ``copy`` per file, ``prune`` per version); an exception it raises stops the
        install, which leaves the store as a kill at that point would. Blocks while it downloads and checks; the
        store's lock is held only for the last steps (publish, rollout, activate, prune).
        """
        return installing.install(self, source, trust, rollout_percent, progress, allow_rejected)

    def activate(self, version: str, *, allow_rejected: bool = False) -> StoreVersion:
        """Make the kept version ``version`` (an id, or the start of one) active now, the active one the newest
        previous; it goes on probation as a new install does. It was self-checked when it was installed and is not
        checked again. A rejected one is refused (``rejected_before``) unless ``allow_rejected``."""
        if not isinstance(allow_rejected, bool):
            raise InputError(f"allow_rejected must be True or False, got {allow_rejected!r}")
        with self._locked():
            pointer = self._pointer()
            found = self._resolve(version, pointer, kept_only=True)
            if found != pointer.active:
                state = pointer.states.get(found) or {}
                if state.get("state") == VersionState.REJECTED and not allow_rejected:
                    raise StoreError(StoreReason.REJECTED_BEFORE,
                                     f"version {found} was rejected ({state.get('reason')}); it is activated again "
                                     "only with allow_rejected=True (CLI --allow-rejected) "
                                     f"({self.state_text(pointer)})")
                old = changes.activate(pointer, found, self.options.probation)
                self._commit(pointer)
                disk.append_history(self.root, "activated", found, "activate()", previous=old)
                self._changed("activated", found, old, "activate()")
                self._prune(pointer)
        return self.version(found)

    def rollback(self) -> StoreVersion:
        """Go back to the newest previous version; the active one is rejected (reason ``manual``), so that nothing
        activates it again unasked. ``no_previous_version`` when there is none. Returns the version now active."""
        with self._locked():
            pointer = self._pointer()
            self._roll_back(pointer, f"{StoreReason.MANUAL}: rolled back by rollback()")
            active = pointer.active
        return self.version(active)

    def on_change(self, hook: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        """Call ``hook({"event", "version", "previous", "reason"})`` after this store object changed the active version
        (``activated``, ``rolled_back``: by an install, activate, rollback or a probation alert), once the store's
        lock is released, in the thread that made the change (for a probation alert: the one whose prediction raised
        it). A hook that raises is logged. The place to call :meth:`~edgesdk.ModelPool.reload` or load again."""
        if not callable(hook):
            raise InputError(f"on_change takes a callable, got {type(hook).__name__}")
        with self._locked():
            if len(self._hooks) >= MAX_HOOKS:
                raise InputError(f"a store takes at most {MAX_HOOKS} on_change hooks")
            self._hooks.append(hook)
        return hook

    def remove_hook(self, hook: Callable) -> None:
        with self._locked():
            if hook in self._hooks:
                self._hooks.remove(hook)

    # -- serving ----------------------------------------------------------------------------------------------------
    def load(self, options: Any = None, **overrides: Any):
        """``edgesdk.load`` of the active version (same options and shortcuts). While that version is on probation
        the model is watched (:meth:`watch`), and a load of it that fails (``BackendUnavailable``, ``BundleError``)
        rolls the store back (reason ``load_failed``) and loads the version rolled back to.

        The model keeps serving the version it was loaded with, whatever the store does later: a rollback (by
        probation or by hand) or an install changes the pointer, never closes a model under the app. Load again (or
        let a :class:`~edgesdk.ModelPool` serve the store and call its :meth:`~edgesdk.ModelPool.reload`) when
        :meth:`on_change` says the active version changed."""
        from ..runtime.loading import load
        from ..runtime.options import merge_options

        opts = merge_options(options, dict(overrides))
        for attempt in range(2):  # at most one automatic rollback per call
            pointer = self._settled()
            if pointer.active is None:
                raise StoreError(StoreReason.NO_ACTIVE_VERSION, f"store {self.root} has no active version to load "
                                                                f"({self.state_text(pointer)})")
            version, probation = pointer.active, self._probation_of(pointer)
            if probation is not None:  # refused before a load that could not be judged
                check_watchable(opts.monitor or None, self.options.probation, version)
            try:
                model = load(self.root / VERSIONS / version / BUNDLE, opts)
            except (BackendUnavailable, BundleError) as exc:
                if probation is None or attempt:
                    raise
                with self._locked():
                    pointer = self._pointer()
                    if pointer.active != version or not self._complete_previous(pointer):
                        raise
                    self._roll_back(pointer, f"{StoreReason.LOAD_FAILED}: {type(exc).__name__}: {exc}")
                continue
            try:
                self.watch(model)
            except BaseException:
                model.close()
                raise
            return model
        raise StoreError(StoreReason.LOAD_FAILED, f"store {self.root}: the active version changed twice during one "
                                                  f"load ({self.state_text()})")  # pragma: no cover - unreachable

    def watch(self, model: Any) -> bool:
        """Watch ``model`` through its monitor when it serves the active version and that version is on probation
        (True then): an alert on a probation signal rolls the store back, enough predictions confirm the version.
        :meth:`load` does it; a :class:`~edgesdk.ModelPool` serving this store does it for the models it loads."""
        pointer = self._settled()
        since = self._probation_of(pointer)
        device = getattr(model, "device", model)  # a hybrid model is watched through its device model
        if since is None or device is None or getattr(device, "bundle", None) is None:
            return False
        if Path(device.bundle.root).resolve() != (self.root / VERSIONS / pointer.active / BUNDLE).resolve():
            return False
        check_watchable(getattr(device.monitor, "options", None), self.options.probation, pointer.active)
        ProbationWatch(device, pointer.active, self.options.probation, since["since_unix"], self._probation_failed,
                       self._probation_passed)
        return True

    # -- for the install and probation modules ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's lock (re-entrant); the on_change hooks of what changed under it run once it is released."""
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            local.events, local.trash = [], []
        local.depth = depth + 1
        try:
            with self._lock.held():
                yield
        finally:
            local.depth = depth
            if depth == 0:  # what was written is told, even when what followed it raised
                trash, local.trash = local.trash, []
                for folder in trash:  # pruned folders, moved into trash/ under the lock, deleted outside it
                    shutil.rmtree(folder, ignore_errors=True)
                events, local.events = local.events, []
                for event in events:
                    for hook in list(self._hooks):
                        try:
                            hook(dict(event))
                        except Exception:  # an app's hook never breaks the store
                            log.exception("store %s: an on_change hook raised", self.root)

    def state_text(self, pointer: Pointer | None = None) -> str:
        """The store's state as messages name it: ``active: digits@3f2a...; previous: ...``."""
        pointer = pointer or self._pointer()
        return f"active: {pointer.active or 'none'}; previous: {', '.join(pointer.previous) or 'none'}"

    def _pointer(self) -> Pointer:
        try:
            found = disk.read_pointer(self.root)
            if found is not None or not any((self.root / VERSIONS).iterdir()):
                return found or Pointer()
        except ValueError:  # damaged since the store was opened: recovery reads its copy, or rebuilds it
            pass
        with self._locked():  # damaged, or missing while versions are kept: never taken as "nothing installed"
            return recover(self.root)

    def _commit(self, pointer: Pointer, before_replace: Callable[[], None] | None = None) -> None:
        disk.write_pointer(self.root, pointer, before_replace)

    def _changed(self, event: str, version: str | None, previous: str | None, reason: str) -> None:
        self._local.events.append({"event": event, "version": version, "previous": previous, "reason": reason})

    def _discard(self, folder: Path) -> None:
        disk.discard(folder, self.root / disk.TRASH)

    def _prune(self, pointer: Pointer, report: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        """Forget what is past ``keep`` in the pointer (written first), then delete those folders."""
        dropped = changes.prune(pointer, self.options.keep)
        if not dropped:
            return
        self._commit(pointer)
        for version in dropped:
            if report is not None:
                report(InstallStep.PRUNE, {"version": version})
            moved = disk.discard(self.root / VERSIONS / version, self.root / disk.TRASH, delete=False)
            if moved is not None:  # deleted once the lock is released (a probation alert prunes on a prediction's
                self._local.trash.append(moved)  # thread: it must not wait for a large folder to be deleted)
            disk.append_history(self.root, "pruned", version, f"past keep={self.options.keep}")

    def _reject(self, version: str, reason: str) -> None:
        """Record ``version`` (not kept: it failed before it was published) as rejected with ``reason``."""
        with self._locked():
            pointer = self._pointer()
            if version != pointer.active and version not in pointer.previous:
                kept = bool((pointer.states.get(version) or {}).get("folder"))
                pointer.remember(version, VersionState.REJECTED, reason, folder=kept)
                self._commit(pointer)
            disk.append_history(self.root, "rejected", version, reason)

    def _complete_previous(self, pointer: Pointer) -> list[str]:
        """The previous versions whose folders are complete: the ones a rollback may make active."""
        return [v for v in pointer.previous if disk.read_record(self.root / VERSIONS / v) is not None]

    def _roll_back(self, pointer: Pointer, reason: str) -> None:
        """Under the lock: back from the active version to the newest complete previous one, rejected with ``reason``
        (``no_previous_version`` when there is none: nothing is written then)."""
        complete = self._complete_previous(pointer)
        if not complete:
            broken = [v for v in pointer.previous if v not in complete]
            raise StoreError(StoreReason.NO_PREVIOUS_VERSION,
                             f"store {self.root} has no previous version to roll back to ({self.state_text(pointer)}"
                             f"{'; incomplete: ' + ', '.join(broken) if broken else ''})")
        pointer.previous = complete  # an incomplete one cannot serve; recovery would forget it too
        old, new = changes.roll_back(pointer, reason)
        self._commit(pointer)
        disk.append_history(self.root, "rolled_back", old, reason, to=new)
        self._changed("rolled_back", new, old, reason)
        self._prune(pointer)

    def _probation_failed(self, version: str, reason: str) -> None:
        with self._locked():
            pointer = self._pointer()
            if pointer.active != version or self._probation_of(pointer) is None:
                return  # rolled back or confirmed meanwhile (another model of it, another process)
            if not self._complete_previous(pointer):
                disk.append_history(self.root, "probation_alert", version, f"{reason}; no previous version to roll "
                                    "back to: it stays active")
                return
            self._roll_back(pointer, f"{StoreReason.PROBATION_ALERT}: {reason}")

    def _probation_passed(self, version: str, predictions: int) -> None:
        with self._locked():
            pointer = self._pointer()
            if pointer.active != version or pointer.probation is None:
                return
            pointer.probation = None
            self._commit(pointer)
            disk.append_history(self.root, "confirmed", version, f"probation passed after {predictions} predictions "
                                "of a model here (or its time)", predictions=predictions)

    def _probation_of(self, pointer: Pointer) -> dict[str, Any] | None:
        """The active version's probation (``since``, ``since_unix``, ``until``, ``predictions``), None when it is
        not on one (or the store's options turn probation off)."""
        probation = self.options.probation
        entry = pointer.probation
        if probation is None or entry is None or entry.get("version") != pointer.active:
            return None
        until = float(entry.get("since_unix") or 0) + probation.seconds
        return {"since": entry.get("since"), "since_unix": float(entry.get("since_unix") or 0),
                "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until)), "predictions": probation.predictions}

    def _settled(self) -> Pointer:
        """The pointer, the active version confirmed first when its probation's time is over."""
        pointer = self._pointer()
        probation = self._probation_of(pointer)
        if probation is not None and time.time() >= probation["since_unix"] + self.options.probation.seconds:
            self._probation_passed(pointer.active, 0)
            pointer = self._pointer()
        return pointer

    def _resolve(self, version: Any, pointer: Pointer, kept_only: bool) -> str:
        """The id ``version`` names (an id, or the start of exactly one), among the kept versions (and the remembered
        ones unless ``kept_only``)."""
        if not isinstance(version, str) or not version:
            raise InputError(f"a version is named by its id (as `edgesdk store list` shows it), got {version!r}")
        kept = sorted(p.name for p in (self.root / VERSIONS).iterdir() if disk.read_record(p) is not None)
        known = kept + ([] if kept_only else [v for v in pointer.states if v not in kept])
        matches = [v for v in known if v == version] or [v for v in known if v.startswith(version)]
        if len(matches) == 1 and (ID_PATTERN.fullmatch(matches[0])):
            return matches[0]
        forgotten = [v for v in pointer.states if v.startswith(version) and v not in kept]
        why = (f"version {forgotten[0]} is no longer kept ({pointer.states[forgotten[0]].get('reason')}): install it "
               "again") if kept_only and forgotten else \
            f"{version!r} names {len(matches)} versions ({', '.join(matches)})" if matches else \
            f"it has no version {version!r} (versions: {', '.join(known) or 'none'})"
        raise StoreError(StoreReason.UNKNOWN_VERSION, f"store {self.root}: {why} ({self.state_text(pointer)})")

    def _describe(self, version: str, state: VersionState, reason: str | None = None, kept: bool = True,
                  probation: dict[str, Any] | None = None) -> StoreVersion:
        folder = self.root / VERSIONS / version
        record = disk.read_record(folder) if kept else None
        percent = (record or {}).get("rollout_percent")
        place = rollout.bucket(self.device_id, version) if percent is not None else None
        return describe(version, state, record, folder / BUNDLE if record else None, reason, place, probation)

    def __repr__(self) -> str:
        return f"<edgesdk.BundleStore {str(self.root)!r} ({self.state_text()})>"


__all__ = ["BundleStore"]
