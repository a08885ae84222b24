"""``edgesdk serve``: a bundle's model inside KServe's ModelServer, over the Open Inference Protocol V2 REST.

The server is KServe's own (``kserve.ModelServer`` hosting a :class:`BundleModel`, a ``kserve.Model``), so a device
talks to the same server here as in a KServe deployment. ``kserve`` is imported only by :func:`serve` and on first
use of ``BundleModel``: importing this module loads nothing the device lacks.

The served model, named after the bundle's manifest ``name``:

- its metadata lists the manifest's inputs and outputs with V2 datatypes; where every tensor has a leading dimension
  of 1 (or -1), that dimension is the batch and shows as -1;
- a request gives exactly the manifest's inputs, each with its datatype and shape (any batch size N >= 1 where the
  batch shows as -1, any size >= 1 where a later dimension is -1, dynamic); anything else is refused with 400
  ``{"error": ...}`` naming what was expected and what came;
- artifacts are compiled for batch 1, so a batch of N runs N times and the outputs are stacked;
- requests run one at a time on the engine (engines are not thread-safe), off the event loop;
- a request is bounded before it is read (:class:`~edgesdk_cloud.limits.ServeLimits`: body bytes, batch size, body
  time, requests held at once); NaN or infinite inputs are refused with 400;
- the model-repository API (load, unload) is off unless ``repository_token`` is given (:mod:`edgesdk_cloud.gate`);
  the server is ready only while the model's engine is open (:mod:`edgesdk_cloud.modelserver`).
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgesdk.bundle.reader import Artifact, Bundle
from edgesdk.hybrid.client import DATATYPES
from edgesdk.hybrid.served_artifact import serving_artifact
from edgesdk.errors import BundleError, InputError

from .limits import BODY_TIMEOUT_S, MAX_PENDING, ServeLimits, has_batch
from .modelserver import import_kserve, model_server_class, require_kserve

# numpy dtype name -> V2 datatype, from the client's table (one table for both sides of the wire)
V2_DATATYPES = {np.dtype(t).name: name for name, t in DATATYPES.items()}


@dataclass(frozen=True)
class V2Tensor:
    """One manifest input or output: numpy ``dtype`` and its V2 ``datatype``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    datatype: str


class BundleSignature:
    """The manifest's inputs and outputs as V2 tensors, and the check of a request against them."""

    def __init__(self, manifest: dict[str, Any]):
        self.model = manifest["name"]
        self.inputs = [_v2_tensor(t, self.model) for t in manifest["inputs"]]
        self.outputs = [_v2_tensor(t, self.model) for t in manifest["outputs"]]
        # Artifacts are compiled for batch 1: a leading 1 (or -1) on every tensor is a batch the server can vary.
        self.batched = has_batch(manifest)

    def shape(self, tensor: V2Tensor) -> list[int]:
        """The shape as V2 metadata shows it: -1 for the batch."""
        return [-1, *tensor.shape[1:]] if self.batched else list(tensor.shape)

    def metadata(self, tensors: Sequence[V2Tensor]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": self.shape(t)} for t in tensors]

    def feeds(self, given: Sequence[Any], max_batch: int | None = None) -> tuple[list[np.ndarray], int]:
        """The request's arrays in manifest input order, and the batch size.

        ``given`` are V2 request inputs (``name``, ``datatype``, ``shape``, ``as_numpy()``). Raises
        :class:`InputError` naming the expected and the received name, datatype or shape, a batch over
        ``max_batch`` (checked before the data is converted), or values that are NaN or infinite.
        """
        by_name: dict[str, Any] = {}
        for inp in given:
            if not isinstance(inp.name, str):
                raise InputError(f"input names are strings; got {type(inp.name).__name__}")
            if inp.name in by_name:
                raise InputError(f"input {inp.name!r} is given twice")
            by_name[inp.name] = inp
        names = [t.name for t in self.inputs]
        for name in by_name:
            if name not in names:
                raise InputError(f"model {self.model!r} has no input named {name!r} (inputs: {', '.join(names)})")
        missing = [n for n in names if n not in by_name]
        if missing:
            raise InputError(f"the request lacks input(s) {', '.join(missing)} of model {self.model!r}")
        feeds, batches = [], set()
        for spec in self.inputs:
            inp = by_name[spec.name]
            if inp.datatype != spec.datatype:
                raise InputError(f"input {spec.name!r} must be {spec.datatype}; got {inp.datatype}")
            shape = list(inp.shape)
            if not self._fits(spec, shape):
                batch = " (-1: a batch, or a dynamic dimension, of 1 or more)" if -1 in self.shape(spec) else ""
                raise InputError(f"input {spec.name!r} must have shape {self.shape(spec)}{batch}; got {shape}")
            size = shape[0] if self.batched else 1
            if max_batch is not None and size > max_batch:
                raise InputError(f"input {spec.name!r} has a batch of {size}; this server takes at most {max_batch} "
                                 f"per request (max_batch): split the request")
            try:
                array = inp.as_numpy()
            except (ValueError, TypeError, OverflowError) as exc:  # too few/many values, or values not numbers
                raise InputError(f"input {spec.name!r}: its data does not fill shape {shape} as {spec.datatype}: "
                                 f"{exc}") from exc
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                first = int(np.flatnonzero(~np.isfinite(array.ravel()))[0])
                raise InputError(f"input {spec.name!r} holds NaN or infinite values (the first at flat index "
                                 f"{first}); the model takes finite numbers")
            feeds.append(array)
            batches.add(size)
        if len(batches) > 1:
            raise InputError(f"the inputs of one request share a batch size; got {sorted(batches)}")
        return feeds, batches.pop()

    def check_outputs(self, requested: Sequence[Any] | None) -> None:
        names = [t.name for t in self.outputs]
        for out in requested or ():
            if out.name not in names:
                raise InputError(f"model {self.model!r} has no output named {out.name!r} (outputs: {', '.join(names)})")

    def _fits(self, spec: V2Tensor, shape: list[int]) -> bool:
        if len(shape) != len(spec.shape) or not all(type(d) is int for d in shape):
            return False
        skip = 1 if self.batched else 0
        if self.batched and shape[0] < 1:
            return False
        return all(d == w >= 0 or (w == -1 and d >= 1) for d, w in zip(shape[skip:], spec.shape[skip:]))


def _v2_tensor(entry: dict[str, Any], model: str) -> V2Tensor:
    datatype = V2_DATATYPES.get(str(entry["dtype"]))
    if datatype is None:
        raise BundleError(f"bundle {model!r}: tensor {entry['name']!r} has dtype {entry['dtype']!r}, which V2 cannot "
                          f"carry (known: {', '.join(V2_DATATYPES)})")
    return V2Tensor(entry["name"], tuple(int(d) for d in entry["shape"]), str(entry["dtype"]), datatype)


def serve(bundle_path: str | Path, artifact: str | None = None, host: str = "127.0.0.1", port: int = 8080,
          allow_failed: bool = False, repository_token: str | None = None, max_batch: int | None = None,
          max_body_bytes: int | None = None, body_timeout_s: float = BODY_TIMEOUT_S,
          max_pending: int = MAX_PENDING, monitor_file: str | Path | None = None, otel: bool = False) -> None:
    """Serve the bundle's model at ``http://host:port/v2/models/<name>`` until SIGINT or SIGTERM (blocks).

    ``repository_token`` turns on KServe's model-repository API (load, unload) for requests that carry it as a
    bearer token (off without it). ``max_batch``, ``max_body_bytes`` (default: derived from the bundle's inputs, see
    :mod:`edgesdk_cloud.limits`), ``body_timeout_s`` and ``max_pending`` bound each request (:class:`InputError`
    for a value out of range).

    ``artifact`` is an artifact id (default: :func:`~edgesdk.hybrid.served_artifact.serving_artifact`). Raises
    :class:`BundleError` for a bad bundle or an unknown artifact id, :class:`BackendUnavailable` when kserve or the
    artifact's engine is missing, and :class:`InputError` for a port outside 1-65535. REST only (no gRPC), one
    worker process. An ``artifact`` that failed its validation gate at quantize time is refused
    (:class:`BundleError`) unless ``allow_failed``, and then served with a
    :class:`~edgesdk.errors.FailedArtifactWarning`.

    Monitoring (:mod:`edgesdk_cloud.telemetry`): with ``monitor_file`` (a JSON-lines file, as ``edgesdk run
    --monitor``) or ``otel`` (the same OpenTelemetry instruments as a device's :func:`edgesdk.monitor.otel.publish`,
    exported over OTLP/HTTP where the standard ``OTEL_EXPORTER_OTLP_*`` variables say; the ``otel`` extra), every
    request row is observed by an :class:`edgesdk.monitor.Monitor` of the served artifact; without either, none runs.
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InputError(f"port must be an integer from 1 to 65535, got {port!r}")
    if repository_token is not None and (not isinstance(repository_token, str) or len(repository_token) < 16
                                         or not repository_token.isprintable() or " " in repository_token):
        raise InputError("repository_token must be at least 16 printable characters without spaces")
    require_kserve()  # before the bundle is read: the fix for a device install comes first
    bundle = Bundle.open(bundle_path)
    limits = ServeLimits.for_manifest(bundle.manifest, max_batch, max_body_bytes, body_timeout_s, max_pending)
    chosen = bundle.servable_artifact(artifact, allow_failed) if artifact is not None else serving_artifact(bundle)
    bundle.warn_if_failed(chosen.id)
    from .telemetry import Telemetry

    telemetry = Telemetry.start(bundle, chosen, monitor_file, otel)  # before the model: a missing extra fails first
    model = _bundle_model_class()(bundle, chosen, limits.max_batch, telemetry.monitor)
    model.load()
    server = model_server_class()(host, limits, repository_token, http_port=port, workers=1, enable_grpc=False,
                                  enable_docs_url=False)
    shown = f"[{host}]" if ":" in host else host
    print(f"edgesdk: serving {bundle.name!r} (artifact {chosen.id} on {chosen.engine}) at "
          f"http://{shown}:{port}/v2/models/{bundle.name}", file=sys.stderr, flush=True)
    print(f"edgesdk: limits: batch <= {limits.max_batch}, body <= {limits.max_body_bytes} bytes within "
          f"{limits.body_timeout_s:g} s, {limits.max_pending} requests at once; model repository API "
          f"{'on (bearer token)' if repository_token else 'off'}", file=sys.stderr, flush=True)
    if telemetry.monitor is not None:
        print(f"edgesdk: monitoring: {telemetry.describe()}", file=sys.stderr, flush=True)
    try:
        server.start([model])
    finally:
        model.stop()
        telemetry.close()


def __getattr__(name: str):
    # BundleModel subclasses kserve.Model, so the class is made on first use.
    if name == "BundleModel":
        return _bundle_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _bundle_model_class() -> type:
    kserve = import_kserve()
    from kserve.errors import InvalidInput, ModelNotReady
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
    from kserve.utils.utils import generate_uuid

    class BundleModel(kserve.Model):
        """One artifact of a bundle as a KServe model named after the bundle (the contract: module docstring).

        :meth:`load` opens the engine (raising edgesdk errors, e.g. :class:`BackendUnavailable`); a bad request
        raises ``kserve.errors.InvalidInput``, which the server answers with 400 ``{"error": ...}``.
        """

        def __init__(self, bundle: Bundle, artifact: Artifact, max_batch: int | None = None, monitor: Any = None):
            super().__init__(bundle.name)
            self.monitor = monitor  # an edgesdk.monitor.Monitor observing every row answered (None: not watched)
            self.bundle = bundle
            self.artifact = artifact
            self.max_batch = max_batch
            self.signature = BundleSignature(bundle.manifest)
            self._engine = None
            self._lock = threading.Lock()

        def load(self) -> bool:
            self._engine = self.artifact.open()
            self.ready = True
            return self.ready

        def stop(self) -> None:
            with self._lock:  # not under a running request
                engine, self._engine = self._engine, None
                self.ready = False
            if engine is not None:
                engine.close()

        async def healthy(self) -> bool:
            return self.ready and self._engine is not None

        def get_input_types(self) -> list[dict[str, Any]]:
            return self.signature.metadata(self.signature.inputs)

        def get_output_types(self) -> list[dict[str, Any]]:
            return self.signature.metadata(self.signature.outputs)

        async def predict(self, payload: Any, headers: dict[str, str] | None = None,
                          response_headers: dict[str, str] | None = None) -> InferResponse:
            if not isinstance(payload, InferRequest):  # the V1 route hands over a dict
                raise InvalidInput(f"model {self.name!r} speaks the Open Inference Protocol V2 only: "
                                   f"POST /v2/models/{self.name}/infer")
            started = time.perf_counter()
            try:
                feeds, batch = self.signature.feeds(payload.inputs, self.max_batch)
                self.signature.check_outputs(payload.request_outputs)
                arrays = await asyncio.get_running_loop().run_in_executor(None, self._run, feeds, batch, started)
            except InputError as exc:  # the request's, or the engine's check of its arrays (counted here only)
                if self.monitor is not None:
                    self.monitor.failed(type(exc).__name__)
                raise InvalidInput(str(exc)) from exc
            outputs = [InferOutput(spec.name, list(a.shape), spec.datatype, data=np.asarray(a, dtype=spec.dtype))
                       for spec, a in zip(self.signature.outputs, arrays)]
            return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name,
                                 infer_outputs=outputs, use_binary_outputs=payload.use_binary_outputs,
                                 requested_outputs=payload.request_outputs)

        def _run(self, feeds: list[np.ndarray], batch: int, started: float) -> list[np.ndarray]:
            try:
                with self._lock:
                    engine = self._engine
                    if engine is None:
                        raise ModelNotReady(self.name, "its engine is closed")
                    t1 = time.perf_counter()
                    if not self.signature.batched:
                        rows = [(feeds, engine.run(feeds))]
                    else:
                        rows = [(row, engine.run(row)) for row in ([f[i:i + 1] for f in feeds] for i in range(batch))]
                    t2 = time.perf_counter()
            except Exception as exc:
                # an InputError is counted once, by predict; a failed request counts one failure per row it held,
                # as its answered rows would count one prediction each
                if self.monitor is not None and not isinstance(exc, (ModelNotReady, InputError)):
                    reason = str(getattr(exc, "reason", None) or type(exc).__name__)
                    for _ in range(batch if self.signature.batched else 1):
                        self.monitor.failed(reason)
                raise
            if self.monitor is not None:  # each row as a device's prediction: its share of the request's times
                pre, inf = (t1 - started) * 1e3 / len(rows), (t2 - t1) * 1e3 / len(rows)
                for row_feeds, outputs in rows:
                    self.monitor.observe(row_feeds, outputs, pre, inf, None, self.artifact.id)
            if len(rows) == 1:
                return rows[0][1]
            return [np.concatenate([out[k] for _, out in rows]) for k in range(len(rows[0][1]))]

    BundleModel.__qualname__ = "BundleModel"
    return BundleModel
