"""The one lifecycle of objects that hold engine, socket or thread resources: ``close()``, and a context manager.

``with edgesdk.load(path) as model: ...`` closes the model on leaving the block, whatever happened in it. Subclasses
implement :meth:`Closeable.close` (idempotent: a second call does nothing); the context-manager protocol is written
here once.
"""

from __future__ import annotations

from typing import TypeVar

_Self = TypeVar("_Self", bound="Closeable")


class Closeable:
    """Base of everything that must be closed: engines, models, pools, the cloud client, the simulated device."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError(f"{type(self).__name__} must define close()")

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
