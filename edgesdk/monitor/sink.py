"""The monitor's file sink: one JSON object per line, appended (``MonitorOptions(sink=PATH)``,
``edgesdk run --monitor FILE``), read back by ``edgesdk monitor FILE``.

Each line has a ``type``: ``"snapshot"`` (``Monitor.snapshot()``: version identity, counts, latency, signals, drift)
or ``"alert"`` (a level change, with the identity). Nothing in it comes from an input: the monitor keeps summaries,
never inputs, and the identity names the bundle, artifact, engine and CPU class only. The file stays on the device;
sending it anywhere is the app's choice.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from ..errors import InputError


class JsonLinesSink:
    """Appends records to ``path`` (created with its folder), one line each, flushed per record."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"monitor sink {self.path} exists and is not a regular file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"monitor sink {self.path} cannot be written: {exc}") from exc
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(_finite(record), allow_nan=False, default=str)
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_records(path: str | Path, max_bytes: int = 256 << 20) -> list[dict[str, Any]]:
    """The records of a JSON-lines telemetry file (a file holding one JSON object, a saved snapshot, is one
    record). A last line cut short (a process killed mid-write, a full disk: no newline, not JSON) is left out; any
    other line that is not a JSON object is an :class:`InputError` naming its number."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"telemetry file {p} does not exist or is not a regular file")
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise InputError(f"telemetry file {p} is {size} bytes; at most {max_bytes} are read")
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"telemetry file {p} cannot be read: {exc}") from exc
    lines = text.splitlines()
    whole = _parse(text.strip()) if text.strip().startswith("{") and len([ln for ln in lines if ln.strip()]) > 1 \
        else None
    if isinstance(whole, dict):  # one object written over several lines (a snapshot saved pretty-printed)
        return [whole if "type" in whole else {"type": "snapshot", **whole}]
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = _parse(line)
        if record is _BAD and number == len(lines) and not text.endswith("\n"):
            break  # the last line, cut short
        if record is _BAD:
            raise InputError(f"telemetry file {p}, line {number}: not JSON (or nested too deep)")
        if not isinstance(record, dict):
            raise InputError(f"telemetry file {p}, line {number}: not a JSON object")
        records.append(record if "type" in record or len(lines) > 1 else {"type": "snapshot", **record})
    return records


_BAD = object()


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # bad JSON, an integer past the digit limit, nesting too deep
        return _BAD


__all__ = ["JsonLinesSink", "read_records"]
