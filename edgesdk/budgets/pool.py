"""ModelPool: several bundles under one memory budget (a detector, a classifier and an OCR model)."""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from . import memory
from ..choices import BudgetReason
from ..errors import BudgetExceeded, InputError
from ..lifecycle import Closeable
from ..runtime.loading import load_device
from ..runtime.model import Model
from ..runtime.options import RuntimeOptions, merge_options

EVICTED_KEPT = 256  # ``ModelPool.evicted`` keeps the most recent evictions only (a long-running pool cycles forever)


@dataclass
class _Entry:
    model: Model
    last_used: float
    leases: int = 0  # calls holding the model now: it is not evicted until they return


class ModelPool(Closeable):
    """Loads models on demand under ``memory_mb``; when another must load, the least recently used
    model that nobody holds is unloaded first. Thread-safe.

    A model is *leased* for the length of :meth:`predict`, or of a ``with pool.lease(path) as model:`` block: a
    leased model is never evicted. When a load needs room and every loaded model is leased, it waits (up to
    ``wait_s`` seconds) for a lease to end, then raises :class:`BudgetExceeded` ``memory`` naming them. A model
    that cannot fit even in an empty pool raises at once. :meth:`get` hands out a model *without* a lease: the
    pool may close it later to make room, and its ``predict`` then raises ``InputError("... was closed")``; hold
    models with :meth:`lease` (or call :meth:`predict`) instead.

    The pool accounts memory as the process RSS when it was created plus each loaded model's
    measured cost (RSS after freeing a model does not shrink reliably, so live RSS would lie).
    """

    def __init__(self, memory_mb: float, options: RuntimeOptions | None = None, *, wait_s: float = 30.0,
                 **overrides: Any):
        if not _positive_number(memory_mb):
            raise InputError(f"memory_mb must be positive, got {memory_mb!r}")
        if not _positive_number(wait_s) and wait_s != 0:
            raise InputError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
        if options is not None and not isinstance(options, RuntimeOptions):
            raise InputError(f"options must be a RuntimeOptions or None, got {type(options).__name__}")
        self.memory_mb = float(memory_mb)
        self.wait_s = float(wait_s)
        opts = merge_options(options, dict(overrides))
        self._options = replace(opts, budgets=replace(opts.budgets, memory_mb=self.memory_mb))
        self._baseline_mb = memory.rss_mb()
        self._entries: dict[Path, _Entry] = {}
        self._lock = threading.RLock()
        self._released = threading.Condition(self._lock)  # notified whenever a lease ends
        self.evicted: list[str] = []  # bundle paths unloaded to make room, oldest first (the last EVICTED_KEPT)

    def in_use_mb(self) -> float:
        return self._baseline_mb + sum(e.model.cost_mb for e in self._entries.values())

    def get(self, path: str | Path) -> Model:
        """The loaded model for ``path``, loading it (and evicting idle ones) when needed. Not leased: see the
        class docstring."""
        with self._lock:
            return self._entry(_key(path)).model

    @contextmanager
    def lease(self, path: str | Path) -> Iterator[Model]:
        """``with pool.lease(path) as model:`` the model for ``path``, which the pool does not evict until the
        block ends."""
        key = _key(path)
        with self._lock:
            entry = self._entry(key)
            entry.leases += 1
        try:
            yield entry.model
        finally:
            with self._lock:
                entry.leases -= 1
                entry.last_used = time.monotonic()
                self._released.notify_all()

    def predict(self, path: str | Path, x: Any):
        with self.lease(path) as model:
            return model.predict(x)

    def _entry(self, key: Path) -> _Entry:
        """The entry for ``key``, loaded when needed (under the lock)."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.last_used = time.monotonic()
            return entry
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                model = load_device(key, self._options, self.in_use_mb)
                break
            except BudgetExceeded as exc:
                if exc.reason != BudgetReason.MEMORY or not self._entries:
                    raise  # nothing loaded to make room with: it cannot fit
                while not self._evict_one():
                    if not self._entries:
                        break  # emptied meanwhile (unload, close): try the load again
                    left = deadline - time.monotonic()
                    if left <= 0:
                        held = ", ".join(f"{k.name} ({e.leases} lease{'s' * (e.leases != 1)})"
                                         for k, e in self._entries.items())
                        raise BudgetExceeded(
                            BudgetReason.MEMORY, f"{exc.detail}; every loaded model is in use ({held}) and none "
                            f"was returned within {self.wait_s:g} s (ModelPool wait_s)",
                            needed=exc.needed, available=exc.available) from exc
                    self._released.wait(min(left, 0.1))  # a lease ends (notified), a get() caller's call (polled)
                    entry = self._entries.get(key)
                    if entry is not None:  # another thread loaded it while this one waited
                        entry.last_used = time.monotonic()
                        return entry
        entry = self._entries[key] = _Entry(model, time.monotonic())
        return entry

    def _evict_one(self) -> bool:
        idle = [k for k, e in self._entries.items() if e.leases == 0 and not e.model.busy]  # busy: a get() caller's
        if not idle:
            return False
        oldest = min(idle, key=lambda k: self._entries[k].last_used)
        self._entries.pop(oldest).model.close()
        self.evicted.append(str(oldest))
        del self.evicted[:-EVICTED_KEPT]
        return True

    def unload(self, path: str | Path) -> None:
        """Unload ``path``, first waiting (up to ``wait_s``) for the calls that hold it to return."""
        key = _key(path)
        with self._lock:
            deadline = time.monotonic() + self.wait_s
            while key in self._entries and self._entries[key].leases and time.monotonic() < deadline:
                self._released.wait(deadline - time.monotonic())
            entry = self._entries.pop(key, None)
        if entry is not None:
            entry.model.close()

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return [str(k) for k in self._entries]

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"memory_mb": self.memory_mb, "in_use_mb": round(self.in_use_mb(), 1), "loaded": self.loaded,
                    "leased": {str(k): e.leases for k, e in self._entries.items() if e.leases},
                    "evicted": list(self.evicted)}

    def close(self) -> None:
        """Close every model, leased or not (a call still running on one finishes; the next raises)."""
        with self._lock:
            for entry in self._entries.values():
                entry.model.close()
            self._entries.clear()
            self._released.notify_all()


def _key(path: str | Path) -> Path:
    if not isinstance(path, (str, Path)):
        raise InputError(f"a pool bundle path must be a str or a Path, got {type(path).__name__}")
    return Path(path).resolve()


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
