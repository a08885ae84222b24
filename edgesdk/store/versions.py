"""What a store says about a version: its id (from its manifest), the record written into its folder when it is
installed, and :class:`StoreVersion`, the value :meth:`~edgesdk.BundleStore.versions` hands out."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..choices import VersionState
from .disk import ID_PATTERN, now

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def version_id(manifest: dict[str, Any]) -> str:
    """``<name>@<12 hex digits>``: the bundle's name made safe for a folder name, and the start of the sha256 of its
    manifest without ``rollout_percent`` (the manifest holds every file's sha256, so the id names the files; a manifest
    re-released with only its rollout percent changed is the same version)."""
    body = {k: v for k, v in manifest.items() if k != "rollout_percent"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
    name = _UNSAFE.sub("_", str(manifest.get("name") or "")).strip("._-")[:48] or "bundle"
    return f"{name}@{digest[:12]}"


def new_record(version: str, manifest: dict[str, Any], source: str, percent: float | None, signed: bool,
               check: dict[str, Any]) -> dict[str, Any]:
    """The record of a version, written last into its folder (``version.json``)."""
    return {"id": version, "name": manifest.get("name"), "bundle_version": manifest.get("version"), "source": source,
            "installed": now(), "installed_unix": time.time(), "rollout_percent": percent, "signed": signed,
            "self_check": check}


@dataclass(frozen=True)
class StoreVersion:
    """One version of a store, as it is now.

    ``state``: a :class:`~edgesdk.choices.VersionState` (``active``, ``previous``, ``staged``, ``rejected``);
    ``reason``: why it is staged or rejected (starting with a :class:`~edgesdk.choices.StoreReason` code), None
    otherwise. ``path``: its bundle folder (None when the store no longer keeps it: a rejected version remembered so
    that it is not installed again). ``probation``: ``{"since", "until", "predictions"}`` while the active version is
    on probation. ``rollout_percent`` and ``bucket``: the staged rollout it was installed with and this device's place.
    """

    id: str
    state: VersionState
    reason: str | None
    name: str | None
    bundle_version: str | None
    installed: str | None
    path: Path | None
    rollout_percent: float | None = None
    bucket: float | None = None
    signed: bool = False
    probation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": str(self.state), "reason": self.reason, "name": self.name,
                "bundle_version": self.bundle_version, "installed": self.installed,
                "path": None if self.path is None else str(self.path), "rollout_percent": self.rollout_percent,
                "bucket": self.bucket, "signed": self.signed, "probation": self.probation}


def describe(version: str, state: VersionState, record: dict[str, Any] | None, path: Path | None,
             reason: str | None = None, bucket: float | None = None,
             probation: dict[str, Any] | None = None) -> StoreVersion:
    record = record or {}
    return StoreVersion(version, state, reason, record.get("name"), record.get("bundle_version"),
                        record.get("installed"), path, record.get("rollout_percent"), bucket,
                        bool(record.get("signed")), probation)


__all__ = ["StoreVersion", "version_id", "new_record", "describe", "ID_PATTERN"]
