"""ModelPool: several bundles under one memory budget (a detector, a classifier and an OCR model)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import memory
from ..choices import BudgetReason
from ..errors import BudgetExceeded, InputError
from ..lifecycle import Closeable
from ..runtime.loading import load_device
from ..runtime.model import Model
from ..runtime.options import RuntimeOptions, merge_options


class ModelPool(Closeable):
    """Loads models on demand under ``memory_mb``; when another must load, the least recently used
    idle model is unloaded first. Thread-safe.

    The pool accounts memory as the process RSS when it was created plus each loaded model's
    measured cost (RSS after freeing a model does not shrink reliably, so live RSS would lie).
    """

    def __init__(self, memory_mb: float, options: RuntimeOptions | None = None, **overrides: Any):
        if memory_mb <= 0:
            raise InputError(f"memory_mb must be positive, got {memory_mb}")
        self.memory_mb = float(memory_mb)
        opts = merge_options(options, dict(overrides))
        self._options = replace(opts, budgets=replace(opts.budgets, memory_mb=self.memory_mb))
        self._baseline_mb = memory.rss_mb()
        self._models: dict[Path, Model] = {}
        self._last_used: dict[Path, float] = {}
        self._lock = threading.RLock()
        self.evicted: list[str] = []  # bundle paths unloaded to make room, oldest first

    def in_use_mb(self) -> float:
        return self._baseline_mb + sum(m.cost_mb for m in self._models.values())

    def get(self, path: str | Path) -> Model:
        """The loaded model for ``path``, loading it (and evicting idle ones) when needed."""
        key = Path(path).resolve()
        with self._lock:
            if key in self._models:
                self._last_used[key] = time.monotonic()
                return self._models[key]
            while True:
                try:
                    model = load_device(key, self._options, self.in_use_mb)
                    break
                except BudgetExceeded as exc:
                    if exc.reason != BudgetReason.MEMORY or not self._evict_one():
                        raise
            self._models[key] = model
            self._last_used[key] = time.monotonic()
            return model

    def predict(self, path: str | Path, x: Any):
        model = self.get(path)
        with self._lock:
            self._last_used[Path(path).resolve()] = time.monotonic()
        return model.predict(x)

    def _evict_one(self) -> bool:
        idle = [k for k in self._models if not self._models[k].busy]  # not mid-inference
        if not idle:
            return False
        oldest = min(idle, key=self._last_used.get)
        self._models.pop(oldest).close()
        self._last_used.pop(oldest)
        self.evicted.append(str(oldest))
        return True

    def unload(self, path: str | Path) -> None:
        key = Path(path).resolve()
        with self._lock:
            model = self._models.pop(key, None)
            self._last_used.pop(key, None)
        if model is not None:
            model.close()

    @property
    def loaded(self) -> list[str]:
        return [str(k) for k in self._models]

    def state(self) -> dict[str, Any]:
        return {"memory_mb": self.memory_mb, "in_use_mb": round(self.in_use_mb(), 1), "loaded": self.loaded,
                "evicted": list(self.evicted)}

    def close(self) -> None:
        with self._lock:
            for model in self._models.values():
                model.close()
            self._models.clear()
            self._last_used.clear()
