"""The version identity every monitor figure carries: which bundle (name, version, fingerprint), where it runs
(artifact, engine and its version, device, precision), the CPU class and the edgesdk version. One function for the
device's :class:`~edgesdk.Model` and the cloud side's ``edgesdk serve``, so their figures are about the same things.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from ..version import __version__


def fingerprint(bundle: Any) -> str:
    """The first 16 hex digits of the sha256 of the bundle's files' sha256s (sorted): one value per bundle content."""
    digests = "".join(sorted(f["sha256"] for f in bundle.file_entries()))
    return hashlib.sha256(digests.encode()).hexdigest()[:16]


def version_identity(bundle: Any, bundle_fingerprint: str, artifact: str, engine: str, device: str | None,
                     precision: str | None) -> dict[str, Any]:
    """The identity as plain data (``Monitor.snapshot()["identity"]``; the OpenTelemetry attributes' source)."""
    return {"bundle": bundle.name, "version": bundle.manifest.get("version"), "fingerprint": bundle_fingerprint,
            "artifact": artifact, "engine": engine, "engine_version": engine_version(engine), "device": device,
            "precision": precision, "cpu_class": cpu_class(), "edgesdk": __version__}


@functools.lru_cache(maxsize=8)
def engine_version(engine: str) -> str | None:
    from ..engines import engine_version as read  # package metadata: read once per engine

    return read(engine)


@functools.lru_cache(maxsize=1)
def cpu_class() -> str:
    from ..cpu import cpu_class as read

    return read()["isa_class"]
