"""ModelPool: several bundles under one memory budget (a detector, a classifier and an OCR model), each from a bundle
folder or from a :class:`~edgesdk.BundleStore` (its active version, reloaded onto a new one with
:meth:`ModelPool.reload`)."""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from ..budgets import memory
from ..choices import BudgetReason
from ..errors import BudgetExceeded, InputError
from ..lifecycle import Closeable
from .loading import load_device
from .model import Model
from .options import RuntimeOptions, merge_options

EVICTED_KEPT = 256  # ``ModelPool.evicted`` keeps the most recent evictions only (a long-running pool cycles forever)


@dataclass
class _Entry:
    model: Model | None  # None while it loads: one thread loads it, the others asking for it wait for that load
    last_used: float
    leases: int = 0  # calls holding the model now: it is not evicted until they return
    error: Exception | None = None  # why its load failed (or the pool closed meanwhile): raised to those who waited
    retired: bool = False  # replaced by reload() while leased: closed when its last lease ends


class ModelPool(Closeable):
    """Loads models on demand under ``memory_mb``; when another must load, the least recently used
    model that nobody holds is unloaded first. Thread-safe.

    A model is *leased* for the length of :meth:`predict`, or of a ``with pool.lease(path) as model:`` block: a
    leased model is never evicted, nor closed by :meth:`unload`. When a load needs room and every loaded model is
    leased, it waits (up to ``wait_s`` seconds) for a lease to end, then raises :class:`BudgetExceeded` ``memory``
    naming them. A model that needs more than ``memory_mb`` leaves beside the process's memory at the pool's creation
    (so it cannot fit even in an empty pool) raises at once, evicting nothing. :meth:`get` hands out a model
    *without* a lease: the pool may close it later to make room, and its ``predict`` then raises
    ``InputError("... was closed")``; hold models with :meth:`lease` (or call :meth:`predict`) instead.

    Loads run outside the pool's lock, so calls on loaded models (and leases given back) never wait for one; they
    run one at a time (threads asking for the bundle being loaded share that load and its error, those asking for
    another wait for it), because a model's cost is measured as the RSS its load adds, which a second load at the
    same time would blur, and so two loads cannot both take the same room.

    The pool accounts memory as the process RSS when it was created plus each loaded model's
    measured cost (RSS after freeing a model does not shrink reliably, so live RSS would lie).

    A :class:`~edgesdk.BundleStore` may stand where a path goes (``pool.predict(store, x)``, ``get``, ``lease``,
    ``unload``): the pool serves the store's active version under the store's own key, lets the store watch a version
    on probation (:meth:`~edgesdk.BundleStore.watch`), and :meth:`reload` moves it onto the version active now.
    """

    def __init__(self, memory_mb: float, options: RuntimeOptions | None = None, *, wait_s: float = 30.0,
                 **overrides: Any):
        if not _positive_number(memory_mb):
            raise InputError(f"memory_mb must be positive, got {memory_mb!r}")
        if isinstance(wait_s, bool) or not (_positive_number(wait_s) or wait_s == 0):
            raise InputError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
        if options is not None and not isinstance(options, RuntimeOptions):
            raise InputError(f"options must be a RuntimeOptions or None, got {type(options).__name__}")
        self.memory_mb = float(memory_mb)
        self.wait_s = float(wait_s)
        opts = merge_options(options, dict(overrides))
        self._options = replace(opts, budgets=replace(opts.budgets, memory_mb=self.memory_mb))
        self._baseline_mb = memory.rss_mb()
        self._entries: dict[Path, _Entry] = {}  # loaded models, and the one loading (model None)
        self._sources: dict[Path, Any] = {}  # a store's key -> the store (its root: the pool's key for it)
        self._retired: list[_Entry] = []  # replaced by reload() while leased; closed when their leases end
        self._closed = False
        self._loading: Path | None = None  # the bundle loading now, outside the lock
        self._lock = threading.RLock()  # held only briefly: never across a load, a close or a call on a model
        self._changed = threading.Condition(self._lock)  # notified when a lease ends, a load ends, models go
        self.evicted: list[str] = []  # bundle paths unloaded to make room, oldest first (the last EVICTED_KEPT)

    def in_use_mb(self) -> float:
        with self._lock:
            entries = [*self._entries.values(), *self._retired]
            return self._baseline_mb + sum(e.model.cost_mb for e in entries if e.model is not None)

    def get(self, path: str | Path) -> Model:
        """The loaded model for ``path``, loading it (and evicting idle ones) when needed. Not leased: see the
        class docstring."""
        return self._acquire(self._key(path), lease=False).model

    @contextmanager
    def lease(self, path: str | Path) -> Iterator[Model]:
        """``with pool.lease(path) as model:`` the model for ``path``, which the pool does not evict until the
        block ends."""
        entry = self._acquire(self._key(path), lease=True)
        try:
            yield entry.model
        finally:
            retired = None
            with self._lock:
                entry.leases -= 1
                entry.last_used = time.monotonic()
                if entry.retired and not entry.leases and entry in self._retired:  # (close() closed it otherwise)
                    retired = entry.model
                    self._retired.remove(entry)
                self._changed.notify_all()
            if retired is not None:  # reload() replaced it while this lease held it
                retired.close()

    def predict(self, path: str | Path, x: Any):
        with self.lease(path) as model:
            return model.predict(x)

    def _acquire(self, key: Path, lease: bool) -> _Entry:
        """The loaded entry for ``key`` (its lease taken when asked, before any eviction can see it), loaded by this
        thread when nobody else is loading."""
        with self._lock:
            while True:
                entry = self._entries.get(key)
                if entry is not None and entry.model is not None:
                    entry.last_used = time.monotonic()
                    entry.leases += lease
                    return entry
                if entry is not None:  # loading in another thread: its outcome is ours
                    while entry.model is None and self._entries.get(key) is entry:
                        self._changed.wait()
                    if entry.model is None and entry.error is not None:
                        raise entry.error
                    continue  # loaded (or its loader was interrupted: load it here)
                if self._loading is None:
                    break
                self._changed.wait()  # another bundle is loading
            placeholder = self._entries[key] = _Entry(None, time.monotonic())
            self._loading = key
        try:
            model = self._load(key)
        except BaseException as exc:
            with self._lock:
                if isinstance(exc, Exception) and placeholder.error is None:
                    placeholder.error = exc
                if self._entries.get(key) is placeholder:
                    del self._entries[key]
                self._loading = None
                self._changed.notify_all()
            raise
        with self._lock:
            self._loading = None
            self._changed.notify_all()
            if self._entries.get(key) is placeholder:
                placeholder.model, placeholder.last_used = model, time.monotonic()
                placeholder.leases += lease
                return placeholder
        model.close()  # the pool was closed while it loaded
        raise placeholder.error or InputError(f"the pool was closed while {key.name} loaded")

    def _load(self, key: Path) -> Model:
        """Load ``key`` (the lock not held; this thread is the one loading), unloading idle models while it does not
        fit: after each one the load is tried again, since it may then choose another artifact. A store's key loads
        its active version, which the store then watches when it is on probation."""
        deadline = time.monotonic() + self.wait_s
        source = self._sources.get(key)
        while True:
            try:
                if source is None:
                    return load_device(key, self._options, self.in_use_mb)
                model = load_device(source.active_path(), self._options, self.in_use_mb)
                try:
                    source.watch(model)
                except BaseException:
                    model.close()
                    raise
                return model
            except BudgetExceeded as exc:
                if exc.reason != BudgetReason.MEMORY:
                    raise
                room = self.memory_mb - self._baseline_mb
                if exc.needed is not None and exc.needed > room:
                    raise BudgetExceeded(
                        BudgetReason.MEMORY, f"{exc.detail}; it cannot fit in this pool even with no other model "
                        f"loaded (memory_mb {self.memory_mb:g} MB, the process used {self._baseline_mb:.0f} MB when "
                        f"the pool was made, so {max(room, 0.0):.1f} MB are the pool's)",
                        needed=exc.needed, available=round(max(room, 0.0), 2)) from exc
                evicted = self._take_idle(exc, deadline)
            if evicted is not None:
                evicted.close()

    def _take_idle(self, exc: BudgetExceeded, deadline: float) -> Model | None:
        """Take the least recently used model nobody holds out of the pool (the caller closes it), waiting until
        ``deadline`` for one; None when the pool emptied meanwhile (try the load again)."""
        with self._lock:
            if not self._loaded():
                raise exc  # nothing loaded to make room with (another limit, e.g. a cgroup's, is lower)
            while True:
                loaded = self._loaded()
                if not loaded:
                    return None  # emptied meanwhile (unload, close)
                idle = [k for k, e in loaded.items() if e.leases == 0 and not e.model.busy]  # busy: a get() caller's
                if idle:
                    oldest = min(idle, key=lambda k: loaded[k].last_used)
                    self.evicted.append(str(oldest))
                    del self.evicted[:-EVICTED_KEPT]
                    return self._entries.pop(oldest).model
                left = deadline - time.monotonic()
                if left <= 0:
                    held = ", ".join(f"{k.name} ({e.leases} lease{'s' * (e.leases != 1)})" for k, e in loaded.items())
                    raise BudgetExceeded(
                        BudgetReason.MEMORY, f"{exc.detail}; every loaded model is in use ({held}) and none "
                        f"was returned within {self.wait_s:g} s (ModelPool wait_s)",
                        needed=exc.needed, available=exc.available) from exc
                self._changed.wait(min(left, 0.1))  # a lease ends (notified), a get() caller's call (polled)

    def _loaded(self) -> dict[Path, _Entry]:
        return {k: e for k, e in self._entries.items() if e.model is not None}

    def reload(self, source: Any = None) -> list[str]:
        """Move every model this pool serves from a store onto the store's active version, when it serves another
        (after an install, activate or rollback: :meth:`~edgesdk.BundleStore.on_change` says when); ``source``: only
        that store's. Returns the bundle folders now served in their place.

        Calls on the old model are not dropped: a call running on it finishes, and a lease holding it
        (:meth:`lease`, :meth:`predict`) keeps it until the lease ends, when it is closed; calls made after the
        swap get the new model. The new model loads first (the one load at a time, within the budget, evicting idle
        models if it must; the old one may be among them) while calls go on with the old; a load that fails raises,
        and the old model stays. A model handed out by :meth:`get` is closed at the swap, once its running call
        returns (hold models with :meth:`lease`)."""
        wanted = None if source is None else self._key(source)
        with self._lock:
            keys = [k for k, e in self._entries.items() if k in self._sources and e.model is not None
                    and (wanted is None or k == wanted)]
        swapped = []
        for key in keys:
            target = self._sources[key].active_path().resolve()
            with self._lock:
                entry = self._entries.get(key)
                current = None if entry is None or entry.model is None else Path(entry.model.bundle.root).resolve()
            if current is not None and current != target and self._swap(key):
                swapped.append(str(target))
        return swapped

    def _swap(self, key: Path) -> bool:
        """Load the store's active version for ``key`` and put it in the place of the model there (see
        :meth:`reload`); False when the entry went meanwhile (the next call loads the active version itself)."""
        with self._lock:
            while self._loading is not None:
                self._changed.wait()
            entry = self._entries.get(key)
            if self._closed or entry is None or entry.model is None:
                return False
            self._loading = key  # calls go on with the old model: its entry stays until the swap
        try:
            model = self._load(key)
        finally:
            with self._lock:
                self._loading = None
                self._changed.notify_all()
        with self._lock:
            if self._closed:
                old, close_now = None, model
            else:
                old = self._entries.get(key)
                self._entries[key] = _Entry(model, time.monotonic())
                close_now = None
                if old is not None and old.model is not None:
                    if old.leases:
                        old.retired = True
                        self._retired.append(old)
                    else:
                        close_now = old.model
            self._changed.notify_all()
        if close_now is not None:
            close_now.close()  # waits for a call running on it (the model's own lock), then closes
        return not self._closed

    def unload(self, path: str | Path) -> None:
        """Unload ``path`` (nothing when it is not loaded; when it is loading, once that load ends). The leases on it
        must end first: it waits up to ``wait_s`` for them, then raises :class:`InputError` naming them and leaves
        the model loaded, never closing it under its holder. A model handed out by :meth:`get` is not leased."""
        key = self._key(path)
        deadline = time.monotonic() + self.wait_s
        with self._lock:
            while True:
                entry = self._entries.get(key)
                if entry is None:
                    return
                if entry.model is None:
                    self._changed.wait()  # loading: the load ends (loaded or failed)
                    continue
                if not entry.leases:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InputError(
                        f"cannot unload {key.name}: {entry.leases} lease{'s' * (entry.leases != 1)} still "
                        f"hold{'s' * (entry.leases == 1)} it after {self.wait_s:g} s (ModelPool wait_s); it stays "
                        f"loaded")
                self._changed.wait(left)
            del self._entries[key]
            self._changed.notify_all()
        entry.model.close()

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return [str(k) for k in self._loaded()]

    def monitors(self) -> dict[str, dict[str, Any]]:
        """Each loaded model's ``monitor.snapshot()`` (plain data), by bundle path; a model loaded with
        ``monitor=False`` is left out. An evicted model's monitor goes with it (its sink, if any, got its last
        snapshot when it was closed)."""
        with self._lock:
            models = {str(k): e.model for k, e in self._entries.items() if e.model is not None}
        return {path: model.monitor.snapshot() for path, model in models.items() if model.monitor is not None}

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"memory_mb": self.memory_mb, "in_use_mb": round(self.in_use_mb(), 1), "loaded": self.loaded,
                    "loading": None if self._loading is None else str(self._loading),
                    "leased": {str(k): e.leases for k, e in self._entries.items() if e.leases},
                    "evicted": list(self.evicted)}

    def close(self) -> None:
        """Close every model, leased or not (a call still running on one finishes; the next raises). A load under
        way ends with ``InputError`` for the threads that asked for it, and its model is closed."""
        with self._lock:
            self._closed = True
            entries = list(self._entries.items()) + [(Path("retired"), e) for e in self._retired]
            self._entries.clear()
            self._retired.clear()
            for key, entry in entries:
                if entry.model is None:
                    entry.error = InputError(f"the pool was closed while {key.name} loaded")
            self._changed.notify_all()
        for _, entry in entries:
            if entry.model is not None:
                entry.model.close()

    def _key(self, path: Any) -> Path:
        """The pool's key for a bundle path, or for a store (its root; the store is remembered for the loads)."""
        if callable(getattr(path, "active_path", None)) and isinstance(getattr(path, "root", None), Path):
            key = path.root.resolve()
            with self._lock:
                self._sources[key] = path
            return key
        return _key(path)


def _key(path: str | Path) -> Path:
    if not isinstance(path, (str, Path)):
        raise InputError(f"a pool bundle path must be a str or a Path (or a BundleStore), got {type(path).__name__}")
    return Path(path).resolve()


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
