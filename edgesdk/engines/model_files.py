"""What a model file points at, read without its engine: ONNX external data, and whether a file is an OpenVINO IR.

An ONNX model may keep tensors in other files ("external data"): the tensor names a file by a relative
``location`` and ONNX Runtime (or OpenVINO) opens it next to the model. A hostile model could name
../../etc/passwd, an absolute path, or a file the manifest does not list (CVE-2022-25882, CVE-2024-27318).
The locations are read from the protobuf wire format (the onnx package is not a device dependency),
following the messages that can hold a TensorProto; everything else (raw tensor bytes) is skipped unread. The engines
check a model's locations before they open it; a bundle checks that they are files it lists
(:meth:`edgesdk.Bundle.verify`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import BundleError

_TENSOR, _SPARSE, _GRAPH, _NODE, _ATTRIBUTE, _FUNCTION, _TRAINING = range(7)
_FIELDS = {  # message kind -> {field number: kind of the embedded message}
    "model": {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
}
_EXTERNAL_DATA_FIELD = 13  # TensorProto.external_data: repeated StringStringEntryProto (key = 1, value = 2)
_MAX_NESTING = 100  # messages inside messages (protobuf's own default limit); deeper is refused, not followed


def external_data_locations(path: Path) -> list[str]:
    """Every external-data ``location`` the ONNX file at ``path`` names (empty for a self-contained model).

    Raises :class:`BundleError` when the file cannot be read or is not well-formed protobuf (ONNX Runtime
    could not load it either).
    """
    import mmap

    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) == 0:
                return []
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                found, malformed = _scan(view)
    except OSError as exc:
        raise BundleError(f"{path} cannot be read: {exc}") from exc
    if malformed:
        raise BundleError(f"{path} is not a well-formed ONNX file: {malformed}")
    return [os.fsdecode(loc) for loc in found]  # as the OS will read the path: bytes that are not UTF-8 kept


def is_openvino_ir(path: Path) -> bool:
    """Whether the file starts like XML (an OpenVINO IR), after an optional byte-order mark and whitespace."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return True  # unreadable: the engine's own load says why
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"<")


def location_problem(model: Path, location: str) -> str | None:
    """Why ``location`` (relative to the folder of ``model``) is not a safe external data file, or None."""
    pure = Path(location)
    if (not location or "\x00" in location or "\\" in location or ":" in location or location.startswith("/")
            or pure.is_absolute()):
        return "is not a relative path inside the model's folder (absolute, a drive, or a backslash)"
    if ".." in location.split("/"):
        return "escapes the model's folder with '..'"
    folder = model.parent.resolve()
    if not (folder / location).resolve().is_relative_to(folder):
        return "resolves outside the model's folder (a link?)"
    return None


class _Malformed(Exception):
    pass


def _scan(view) -> tuple[list[bytes], str | None]:
    """The locations in a mapped file, or why it is malformed. Nothing escapes here holding a slice of the map
    (the map cannot close while one lives)."""
    found: list[bytes] = []
    data = memoryview(view)
    try:
        _walk(data, "model", found, 0)
    except _Malformed as exc:
        return [], str(exc)
    finally:
        data.release()
    return found, None


def _walk(data: memoryview, kind: Any, found: list[bytes], depth: int) -> None:
    """Collect the external-data locations of the message ``data`` of ``kind`` (see ``_FIELDS``)."""
    if depth > _MAX_NESTING:
        raise _Malformed(f"messages nested more than {_MAX_NESTING} deep")
    fields = _FIELDS.get(kind, {})
    for number, wire, start, end in _fields(data):
        if wire != 2:
            continue
        if kind == _TENSOR:
            if number == _EXTERNAL_DATA_FIELD:
                entry_data = data[start:end]
                entry = {n: bytes(entry_data[s:e]) for n, w, s, e in _fields(entry_data) if w == 2}
                if entry.get(1) == b"location":  # protobuf: the last key/value of an entry wins
                    found.append(entry.get(2, b""))
        elif number in fields:
            _walk(data[start:end], fields[number], found, depth + 1)


def _fields(data: memoryview):
    """(field number, wire type, start, end) of each field of one message; for wire type 2, the payload."""
    pos, size = 0, len(data)
    while pos < size:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed(f"field number 0 at byte {pos}")
        if wire == 0:
            _, pos = _varint(data, pos)
            yield number, wire, pos, pos
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            yield number, wire, pos, pos
        elif wire == 2:
            length, start = _varint(data, pos)
            pos = start + length
            if pos > size:
                raise _Malformed(f"field {number} runs past the end of its message")
            yield number, wire, start, pos
        elif wire == 3:  # a group (proto2, long deprecated): skipped whole, like an unknown field
            depth = 1
            while depth:
                if pos >= size:
                    raise _Malformed("a group is not closed")
                inner, pos = _varint(data, pos)
                if inner & 7 == 3:
                    depth += 1
                elif inner & 7 == 4:
                    depth -= 1
                elif inner & 7 == 0:
                    _, pos = _varint(data, pos)
                elif inner & 7 in (1, 5):
                    pos += 8 if inner & 7 == 1 else 4
                elif inner & 7 == 2:
                    length, pos = _varint(data, pos)
                    pos += length
                else:
                    raise _Malformed(f"unknown wire type {inner & 7}")
        else:
            raise _Malformed(f"unknown wire type {wire} at byte {pos}")
    if pos != size:
        raise _Malformed("the last field runs past the end of its message")


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise _Malformed("a number is cut short")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Malformed(f"a number is longer than 10 bytes at byte {pos}")
