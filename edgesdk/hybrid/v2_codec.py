"""The Open Inference Protocol (KServe V2) body: tensors to an infer request (JSON, or the binary tensor extension)
and an infer response back to arrays, checked against what the bundle says its outputs are (:class:`ExpectedOutput`:
names, count, shapes, datatypes, finite values) before anything uses them, every malformed or mismatching answer a
``bad_response`` :class:`~edgesdk.errors.CloudError`; the byte cap on a response, derived from those outputs; and
what a server's error says, kept short, single-line and free of the bearer token."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..choices import CloudReason
from ..errors import CloudError, InputError
from .transport import Response


DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
_V2_NAME = {np.dtype(t): name for name, t in DATATYPES.items()}
MAX_ERROR_CHARS = 300  # of a server's error message kept in an exception
MAX_DETAIL_CHARS = 2000  # of a CloudError's whole detail (our words around the server's)
# The response cap: the longest JSON number (a float64's repr, 24 characters) and its separator, with room, per
# element of the expected outputs, plus the JSON around the tensors; without expected outputs (or with a dynamic
# dimension other than the batch) the default cap; model metadata and the server's description are small.
JSON_BYTES_PER_ELEMENT = 32
RESPONSE_MARGIN_BYTES = 64 * 1024
DEFAULT_MAX_RESPONSE_BYTES = 16 * 2 ** 20
METADATA_MAX_BYTES = 2 ** 20
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+")


@dataclass(frozen=True)
class ExpectedOutput:
    """One output a cloud answer must carry: its ``name``, ``shape`` (-1: any size; a leading -1: the request's
    batch) and V2 ``datatype``."""

    name: str
    shape: tuple[int, ...]
    datatype: str

    def shape_for(self, batch: int | None) -> tuple[int, ...]:
        if self.shape[:1] == (-1,) and batch is not None:
            return (batch, *self.shape[1:])
        return self.shape


def expected_outputs(specs: Iterable[Mapping[str, Any]] | None) -> tuple[ExpectedOutput, ...] | None:
    """The manifest's ``outputs`` (``[{name, shape, dtype}]``; ``dtype`` a numpy name or a V2 datatype) as
    :class:`ExpectedOutput` values; None stays None. :class:`InputError` names a spec that is not one."""
    if specs is None:
        return None
    out = []
    for i, spec in enumerate(specs):
        if isinstance(spec, ExpectedOutput):
            out.append(spec)
            continue
        name, shape, dtype = (spec.get(k) if isinstance(spec, Mapping) else None for k in ("name", "shape", "dtype"))
        if not isinstance(name, str) or not name:
            raise InputError(f"expected output {i}: needs a non-empty 'name', got {spec!r}")
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= -1 for d in shape):
            raise InputError(f"expected output {name!r}: 'shape' must be a list of integers >= -1, got {shape!r}")
        datatype = dtype if dtype in DATATYPES else _V2_NAME.get(_dtype(dtype))
        if datatype is None:
            raise InputError(f"expected output {name!r}: dtype {dtype!r} has no Open Inference Protocol datatype "
                             f"({', '.join(DATATYPES)})")
        out.append(ExpectedOutput(name, tuple(shape), datatype))
    if not out:
        raise InputError("expected outputs: the list is empty")
    if len({o.name for o in out}) != len(out):
        raise InputError(f"expected outputs: a name is listed twice ({[o.name for o in out]})")
    return tuple(out)


def response_cap(expected: Sequence[ExpectedOutput] | None, batch: int | None) -> int:
    """The most bytes an infer response may take: derived from the expected outputs (see the constants)."""
    if not expected:
        return DEFAULT_MAX_RESPONSE_BYTES
    total = 0
    for spec in expected:
        shape = spec.shape_for(batch)
        if any(d < 0 for d in shape):
            return DEFAULT_MAX_RESPONSE_BYTES
        total += math.prod(shape) * JSON_BYTES_PER_ELEMENT
    return total + RESPONSE_MARGIN_BYTES


def _dtype(value: Any) -> np.dtype | None:
    try:
        return np.dtype(value)
    except (TypeError, ValueError):
        return None


def _encode(arrays: Sequence[np.ndarray], names: Sequence[str], rid: str, binary: bool) -> tuple[bytes, dict]:
    inputs, blobs = [], []
    for name, arr in zip(names, arrays):
        arr = np.asarray(arr)
        datatype = _V2_NAME.get(arr.dtype)
        if datatype is None:
            raise InputError(f"input {name!r}: dtype {arr.dtype} has no Open Inference Protocol datatype")
        entry: dict[str, Any] = {"name": name, "shape": list(arr.shape), "datatype": datatype}
        if binary:
            raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            if datatype == "FP16":
                raise InputError(f"input {name!r} is FP16, which cannot travel as JSON; the server must offer "
                                 "the binary tensor extension")
            entry["data"] = arr.reshape(-1).tolist()
        inputs.append(entry)
    request: dict[str, Any] = {"id": rid, "inputs": inputs}
    if binary:
        request["parameters"] = {"binary_data_output": True}
    header = json.dumps(request, separators=(",", ":")).encode()
    if not binary:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(header))}


def _decode(resp: Response, rid: str, expected: Sequence[ExpectedOutput] | None = None,
            batch: int | None = None) -> list[np.ndarray]:
    """The answer's outputs: in the order the server lists them, or with ``expected``, checked against it and in
    its order."""
    body = resp.body
    length = resp.headers.get("inference-header-content-length")
    try:
        split = int(length) if length is not None else len(body)
        if not 0 <= split <= len(body):
            raise ValueError(f"Inference-Header-Content-Length {split} outside the body ({len(body)} bytes)")
        answer = json.loads(body[:split])
        listed = answer["outputs"]
        if not isinstance(listed, list):
            raise TypeError(f"'outputs' is {type(listed).__name__}, not a list")
        if expected is not None:
            _check_header(listed, expected, batch, resp.status)
        outputs, rest, offset = [], body[split:], 0
        for out in listed:
            dtype = np.dtype(DATATYPES[out["datatype"]]).newbyteorder("<")
            shape = [int(d) for d in out["shape"]]
            size = (out.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if offset + int(size) > len(rest):
                    raise ValueError(f"output {_show(out.get('name'))} needs {size} bytes past the JSON; "
                                     f"{len(rest) - offset} are left")
                arr = np.frombuffer(rest[offset:offset + int(size)], dtype=dtype).reshape(shape)
                offset += int(size)
            else:
                arr = np.asarray(out["data"], dtype=dtype).reshape(shape)
            outputs.append(arr.astype(dtype.newbyteorder("=")))
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError, IndexError) as exc:
        raise CloudError(CloudReason.BAD_RESPONSE,
                         f"the infer response is not valid V2: {type(exc).__name__}: {_safe(exc)}",
                         resp.status) from None
    if isinstance(answer, dict) and answer.get("id") not in (None, rid):
        raise CloudError(CloudReason.BAD_RESPONSE,
                         f"the infer response answers request {_show(answer.get('id'))}, not {rid!r}", resp.status)
    if not outputs:
        raise CloudError(CloudReason.BAD_RESPONSE, "the infer response has no outputs", resp.status)
    if expected is None:
        return outputs
    by_name = {out["name"]: arr for out, arr in zip(listed, outputs)}
    ordered = [by_name[spec.name] for spec in expected]
    bad = [f"output {spec.name!r} holds {int(np.count_nonzero(~np.isfinite(arr)))} non-finite values (NaN, Inf "
           "or null)" for spec, arr in zip(expected, ordered)
           if arr.dtype.kind in "fc" and not np.isfinite(arr).all()]
    if bad:
        raise CloudError(CloudReason.BAD_RESPONSE, f"the infer response is unusable: {'; '.join(bad)}", resp.status)
    return ordered


def _check_header(listed: list, expected: Sequence[ExpectedOutput], batch: int | None, status: int) -> None:
    """Every difference between the answer's outputs (as its JSON lists them) and the expected ones, as one
    ``bad_response`` naming them all; before any data is converted."""
    problems = []
    names = [out.get("name") if isinstance(out, dict) else None for out in listed]
    wanted = [spec.name for spec in expected]
    if names != wanted:
        problems.append(f"outputs {_show(names)}, expected {wanted}")
    given = {name: out for name, out in zip(names, listed) if isinstance(name, str)}
    for spec in expected:
        out = given.get(spec.name)
        if out is None:
            continue
        if out.get("datatype") != spec.datatype:
            problems.append(f"output {spec.name!r} is {_show(out.get('datatype'))}, expected {spec.datatype}")
        shape, want = out.get("shape"), spec.shape_for(batch)
        if not isinstance(shape, list) or len(shape) != len(want) or \
                any(type(d) is not int or d < 0 or w not in (-1, d) for d, w in zip(shape, want)):
            problems.append(f"output {spec.name!r} has shape {_show(shape)}, expected {list(want)}")
    if problems:
        raise CloudError(CloudReason.BAD_RESPONSE, "the infer response does not match the bundle's outputs: "
                         + "; ".join(problems), status)


def _show(value: Any, limit: int = 80) -> str:
    """A value from the server, for a message: its repr, single-line and cut short."""
    return clean(repr(value), limit=limit)


def clean(text: str, secrets: Iterable[str | None] = (), limit: int = MAX_ERROR_CHARS) -> str:
    """Server-provided text made safe to keep and print: control and other unprintable characters removed (no
    fake lines, no terminal escapes), each of ``secrets`` and anything after ``Bearer`` replaced by
    ``[redacted]``, then cut to ``limit`` characters."""
    text = "".join(c for c in str(text)[:limit * 16] if c.isprintable())
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _BEARER.sub(r"\1[redacted]", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _safe(exc: BaseException) -> str:
    """An exception's message for our own error text, cut short (it may quote a server's body)."""
    return clean(str(exc))


def _error_message(resp: Response, secrets: Iterable[str | None] = ()) -> str:
    try:
        data = json.loads(resp.body)
        message = data.get("error") if isinstance(data, dict) else None
    except ValueError:
        message = None
    if not isinstance(message, str):
        message = resp.body[:MAX_ERROR_CHARS * 16].decode("utf-8", "replace").strip() or "(no body)"
    return clean(message, secrets)


def _retry_after(resp: Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ignored, the backoff applies
