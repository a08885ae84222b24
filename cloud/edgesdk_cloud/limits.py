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

A leading dimension of 1 or -1 on every tensor is the batch. Any other -1 (a dynamic dimension) leaves ``V``
unknown, so nothing above can be derived from the manifest: ``max_body_bytes`` (and ``max_batch``, for a batched
model) must then be given, and are refused (:class:`InputError` naming the tensor) when they are not. ``max_values``
is then what the body cap can hold, one value per 2 bytes (``0,``). An output with a dynamic dimension leaves its
answer uncounted in the memory arithmetic, which says so.
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
HEADER_TIMEOUT_S = 10.0  # a request line and headers, from the connection (or the request's first byte) to their end
MIN_JSON_BYTES_PER_VALUE = 2  # "0,": the fewest bytes a value takes in JSON
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
    uncounted_outputs: tuple[str, ...] = ()  # outputs with a dynamic dimension: their answer is not in the cost

    @classmethod
    def for_manifest(cls, manifest: dict[str, Any], max_batch: int | None = None, max_body_bytes: int | None = None,
                     body_timeout_s: float = BODY_TIMEOUT_S, max_pending: int = MAX_PENDING) -> "ServeLimits":
        """The defaults for the bundle's inputs, or the values given (checked: :class:`InputError`)."""
        batched = has_batch(manifest)
        values = _values(manifest["inputs"], batched)
        outputs = {t["name"]: _item_values(t, batched) for t in manifest["outputs"]}
        dynamic = dynamic_inputs(manifest)
        if dynamic:
            needed = [("max_body_bytes", "--max-body-bytes", max_body_bytes)]
            needed += [("max_batch", "--max-batch", max_batch)] if batched else []
            missing = [f"{name} ({flag})" for name, flag, value in needed if value is None]
            if missing:
                where = " after the batch" if batched else ""
                raise InputError(f"model {manifest['name']!r}: input(s) {', '.join(map(repr, dynamic))} have a dynamic "
                                 f"dimension (-1){where}, so the size of a request cannot be derived from the "
                                 f"manifest; give {' and '.join(missing)}")
        if max_batch is None:
            by_budget = BODY_BUDGET_BYTES // max(1, values * JSON_BYTES_PER_VALUE)
            max_batch = max(1, min(MAX_BATCH, by_budget)) if batched else 1
        _check_int("max_batch", max_batch, 1, BATCH_CEILING if batched else 1,
                   "" if batched else f" (model {manifest['name']!r} has no batch dimension)")
        derived = ""
        if max_body_bytes is None:
            max_body_bytes = max_batch * values * JSON_BYTES_PER_VALUE + HEADER_BYTES
            derived = (f" (derived from the model's inputs: {max_batch} x {values} input values x "
                       f"{JSON_BYTES_PER_VALUE} + {HEADER_BYTES})")
        _check_int("max_body_bytes", max_body_bytes, 1024, 1 << 40, derived)
        if isinstance(body_timeout_s, bool) or not isinstance(body_timeout_s, (int, float)) \
                or not 0 < body_timeout_s <= 3600:
            raise InputError(f"body_timeout_s must be a number of seconds in (0, 3600]; got {body_timeout_s!r}")
        _check_int("max_pending", max_pending, 1, 256)
        max_values = max_body_bytes // MIN_JSON_BYTES_PER_VALUE if dynamic else max_batch * values
        return cls(max_batch, max_body_bytes, float(body_timeout_s), max_pending,
                   max(MAX_CONNECTIONS, 4 * max_pending), sum(n or 0 for n in outputs.values()), max_values,
                   tuple(name for name, n in outputs.items() if n is None))

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
                     f"rounded up to 128 MiB steps = {mib} MiB"
                     + (f"; not counted: the answer of output(s) {', '.join(self.uncounted_outputs)}, which have a "
                        f"dynamic dimension" if self.uncounted_outputs else ""))


def has_batch(manifest: dict[str, Any]) -> bool:
    """Whether every tensor leads with a batch dimension (1, as artifacts are compiled, or -1): then a request may
    carry a batch of N >= 1 on that axis."""
    return all(list(t["shape"][:1]) in ([1], [-1]) for t in manifest["inputs"] + manifest["outputs"])


def dynamic_inputs(manifest: dict[str, Any]) -> list[str]:
    """The inputs with a dynamic dimension (-1) other than the batch: their size is not in the manifest."""
    return [t["name"] for t in manifest["inputs"] if _item_values(t, has_batch(manifest)) is None]


def _values(tensors: list[dict[str, Any]], batched: bool) -> int:
    return sum(n or 0 for n in (_item_values(t, batched) for t in tensors))


def _item_values(tensor: dict[str, Any], batched: bool) -> int | None:
    """Values per batch item; None when a dimension after the batch is dynamic (-1)."""
    dims = [int(d) for d in (tensor["shape"][1:] if batched else tensor["shape"])]
    return None if any(d < 0 for d in dims) else math.prod(dims)


def _check_int(name: str, value: Any, low: int, high: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{name} must be an integer from {low} to {high}{why}; got {value!r}")


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"
