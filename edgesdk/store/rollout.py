"""Staged rollout: whether this device takes a version that is meant for ``rollout_percent`` of the fleet.

The decision is a stable hash, made on the device with nothing asked of a server: the sha256 of the device id and the
version id gives a bucket in [0, 100) (two decimals), and the device takes the version when its bucket is under the
percent. The same device and version always land in the same bucket, so raising a version's percent (a manifest
re-released with only ``rollout_percent`` changed keeps its version id) only adds devices; and each version draws
its devices anew, so the same devices are not always the first. ``rollout_percent`` comes from the install call, else
from the bundle's manifest (``rollout_percent``: a number from 0 to 100), else every device takes the version.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from ..errors import InputError

BUCKETS = 10_000  # buckets of 0.01 percent


def bucket(device_id: str, version_id: str) -> float:
    """This device's place in [0, 100) for ``version_id``."""
    digest = hashlib.sha256(f"{device_id}\n{version_id}".encode("utf-8")).digest()
    return (int.from_bytes(digest[:8], "big") % BUCKETS) / (BUCKETS / 100)


def check_percent(percent: Any, what: str = "rollout_percent") -> float | None:
    """``percent`` as a float in [0, 100], or None; anything else is an :class:`InputError`."""
    if percent is None:
        return None
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not math.isfinite(percent) \
            or not 0 <= percent <= 100:
        raise InputError(f"{what} must be a number from 0 to 100 (or None: every device), got {percent!r}")
    return float(percent)


def decide(device_id: str, version_id: str, percent: float | None) -> dict[str, Any]:
    """``{"percent", "bucket", "selected"}`` for this device and version (percent None: every device)."""
    place = bucket(device_id, version_id)
    return {"percent": percent, "bucket": place, "selected": percent is None or place < percent}


__all__ = ["bucket", "decide", "check_percent"]
