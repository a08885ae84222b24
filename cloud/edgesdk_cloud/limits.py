"""What one ``edgesdk serve`` request may cost, derived from the bundle's inputs, and the memory that implies.

``serve`` checks these before it reads or parses a request (:mod:`edgesdk_cloud.gate`), and ``export`` writes the
same numbers into the KServe and Triton manifests, so a deployment's memory limit covers what the server accepts.

The arithmetic, for a model whose inputs hold ``V`` values per batch item (all inputs together):

- ``max_batch``: ``MAX_BATCH`` (64), lowered so that one request's JSON stays near ``BODY_BUDGET_BYTES`` (64 MiB)
  for big inputs; 1 when the model has no batch dimension;
- ``max_body_bytes``: ``max_batch x V x JSON_BYTES_PER_VALUE`` (32: the longest float32 in JSON, ``-1.2345678e-05``
  with its separator, rounded up) ``+ HEADER_BYTES`` (64 KiB for names, ids and parameters). A binary request
  (4 bytes a float32 value) fits in it with room to spare;
- ``max_values``: ``max_batch x V``; a JSON body with more commas than that (plus ``VALUE_SLACK`` for shapes and
  parameters) is refused before it is parsed, as short values (``0,``) would otherwise put 16 values in the space
  the body cap allows one;
- a request in the server holds its body twice (read here, then by KServe) and its parse: ``PARSE_BYTES_PER_VALUE``
  (128: a Python float and its list slot, pydantic's copy, KServe's lists, the numpy row; 108 measured for a batch
  of 4096 digits) per value, plus its answer (``32 x`` its values, twice: the list and the JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgesdk.errors import InputError

MAX_BATCH = 64
BATCH_CEILING = 4096  # beyond this a client should split its request: each row is one engine run anyway
BODY_BUDGET_BYTES = 64 << 20
JSON_BYTES_PER_VALUE = 32
HEADER_BYTES = 64 << 10
VALUE_SLACK = 1024
PARSE_BYTES_PER_VALUE = 128
MAX_PENDING = 4  # requests holding a body at once; engines run one at a time, so more would only queue
BODY_TIMEOUT_S = 30.0  # a whole body, from its headers to its last byte: a slow sender is cut off
MAX_CONNECTIONS = 64  # uvicorn's limit_concurrency: open connections, idle or not, before it answers 503
SERVER_BASE_MIB = 512  # edgesdk serve on onnxruntime with a small model: ~180 MB resident, measured, with headroom
MIB = 1 << 20


@dataclass(frozen=True)
class ServeLimits:
    """Caps on one request to ``edgesdk serve``; see the module docstring for how the defaults are derived."""

    max_batch: int
    max_body_bytes: int
    body_timeout_s: float = BODY_TIMEOUT_S
    max_pending: int = MAX_PENDING
    max_connections: int = MAX_CONNECTIONS
    output_values: int = 0  # output values per batch item, for the answer's share of a request's cost
    max_values: int = 0  # input values of a full request; 0: not checked

    @classmethod
    def for_manifest(cls, manifest: dict[str, Any], max_batch: int | None = None, max_body_bytes: int | None = None,
                     body_timeout_s: float = BODY_TIMEOUT_S, max_pending: int = MAX_PENDING) -> "ServeLimits":
        """The defaults for the bundle's inputs, or the values given (checked: :class:`InputError`)."""
        batched = all(list(t["shape"][:1]) == [1] for t in manifest["inputs"] + manifest["outputs"])
        values = sum(_item_values(t, batched) for t in manifest["inputs"])
        out_values = sum(_item_values(t, batched) for t in manifest["outputs"])
        if max_batch is None:
            by_budget = BODY_BUDGET_BYTES // max(1, values * JSON_BYTES_PER_VALUE)
            max_batch = max(1, min(MAX_BATCH, by_budget)) if batched else 1
        _check_int("max_batch", max_batch, 1, BATCH_CEILING if batched else 1,
                   "" if batched else f" (model {manifest['name']!r} has no batch dimension)")
        if max_body_bytes is None:
            max_body_bytes = max_batch * values * JSON_BYTES_PER_VALUE + HEADER_BYTES
        _check_int("max_body_bytes", max_body_bytes, 1024, 1 << 40)
        if isinstance(body_timeout_s, bool) or not isinstance(body_timeout_s, (int, float)) \
                or not 0 < body_timeout_s <= 3600:
            raise InputError(f"body_timeout_s must be a number of seconds in (0, 3600]; got {body_timeout_s!r}")
        _check_int("max_pending", max_pending, 1, 256)
        return cls(max_batch, max_body_bytes, float(body_timeout_s), max_pending,
                   max(MAX_CONNECTIONS, 4 * max_pending), out_values, max_batch * values)

    @property
    def request_cost_bytes(self) -> int:
        """What one request at the caps holds in the server at its peak."""
        answer = 2 * JSON_BYTES_PER_VALUE * self.max_batch * self.output_values
        return 2 * self.max_body_bytes + PARSE_BYTES_PER_VALUE * (self.max_values + VALUE_SLACK) + answer

    def memory_mib(self, model_bytes: int) -> tuple[int, str]:
        """A memory request for the server (MiB, in steps of 128) and the arithmetic, as one line of text."""
        model = 3 * model_bytes  # an engine holds the model two to three times while loading
        requests = self.max_pending * self.request_cost_bytes
        mib = SERVER_BASE_MIB + 128 * math.ceil((model + requests) / (128 * MIB))
        return mib, (f"{SERVER_BASE_MIB} MiB server + 3 x {_mib(model_bytes)} model + {self.max_pending} requests "
                     f"in flight x {_mib(self.request_cost_bytes)} (2 x the body cap of {self.max_body_bytes} "
                     f"bytes + {PARSE_BYTES_PER_VALUE} bytes x {self.max_values} values parsed + the answer), "
                     f"rounded up to 128 MiB steps = {mib} MiB")


def _item_values(tensor: dict[str, Any], batched: bool) -> int:
    return math.prod(int(d) for d in (tensor["shape"][1:] if batched else tensor["shape"]))


def _check_int(name: str, value: Any, low: int, high: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{name} must be an integer from {low} to {high}{why}; got {value!r}")


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"
