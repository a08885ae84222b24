"""The Open Inference Protocol (KServe V2) body: tensors to an infer request (JSON, or the binary tensor extension)
and an infer response back to arrays, every malformed answer a ``bad_response`` :class:`~edgesdk.errors.CloudError`;
and what a server's error says, kept short."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from ..choices import CloudReason
from ..errors import CloudError, InputError
from .transport import Response


DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
_V2_NAME = {np.dtype(t): name for name, t in DATATYPES.items()}
MAX_ERROR_CHARS = 300  # of a server's error message kept in an exception


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


def _decode(resp: Response, rid: str) -> list[np.ndarray]:
    body = resp.body
    length = resp.headers.get("inference-header-content-length")
    try:
        split = int(length) if length is not None else len(body)
        if not 0 <= split <= len(body):
            raise ValueError(f"Inference-Header-Content-Length {split} outside the body ({len(body)} bytes)")
        answer = json.loads(body[:split])
        outputs, rest, offset = [], body[split:], 0
        for out in answer["outputs"]:
            dtype = np.dtype(DATATYPES[out["datatype"]]).newbyteorder("<")
            shape = [int(d) for d in out["shape"]]
            size = (out.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                if offset + int(size) > len(rest):
                    raise ValueError(f"output {out.get('name')!r} needs {size} bytes past the JSON; "
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
    if answer.get("id") not in (None, rid):
        raise CloudError(CloudReason.BAD_RESPONSE,
                         f"the infer response answers request {answer.get('id')!r}, not {rid!r}", resp.status)
    if not outputs:
        raise CloudError(CloudReason.BAD_RESPONSE, "the infer response has no outputs", resp.status)
    return outputs


def _safe(exc: BaseException) -> str:
    """An exception's message for our own error text, cut short (it may quote a server's body)."""
    return str(exc)[:MAX_ERROR_CHARS]


def _error_message(resp: Response) -> str:
    try:
        data = json.loads(resp.body)
        message = data.get("error") if isinstance(data, dict) else None
    except ValueError:
        message = None
    if not isinstance(message, str):
        message = resp.body[:MAX_ERROR_CHARS].decode("utf-8", "replace").strip() or "(no body)"
    return message[:MAX_ERROR_CHARS]


def _retry_after(resp: Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: ignored, the backoff applies
