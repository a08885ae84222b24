"""``edgesdk serve``: a bundle's model inside KServe's ModelServer, over the Open Inference Protocol V2 REST.

The server is KServe's own (``kserve.ModelServer`` hosting a :class:`BundleModel`, a ``kserve.Model``), so a device
talks to the same server here as in a KServe deployment. ``kserve`` is imported only by :func:`serve` and on first
use of ``BundleModel``: importing this module loads nothing the device lacks.

The served model, named after the bundle's manifest ``name``:

- its metadata lists the manifest's inputs and outputs with V2 datatypes; where every tensor has a leading dimension
  of 1, that dimension is the batch and shows as -1;
- a request gives exactly the manifest's inputs, each with its datatype and shape (any batch size N >= 1 where the
  batch shows as -1); anything else is refused with 400 ``{"error": ...}`` naming what was expected and what came;
- artifacts are compiled for batch 1, so a batch of N runs N times and the outputs are stacked;
- requests run one at a time on the engine (engines are not thread-safe), off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgesdk.bundle.reader import Artifact, Bundle
from edgesdk.hybrid.client import DATATYPES
from edgesdk.hybrid.served_artifact import serving_artifact
from edgesdk.errors import BackendUnavailable, BundleError, InputError

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
        # Artifacts are compiled for batch 1: a leading 1 on every tensor is a batch the server can vary.
        self.batched = all(t.shape[:1] == (1,) for t in self.inputs + self.outputs)

    def shape(self, tensor: V2Tensor) -> list[int]:
        """The shape as V2 metadata shows it: -1 for the batch."""
        return [-1, *tensor.shape[1:]] if self.batched else list(tensor.shape)

    def metadata(self, tensors: Sequence[V2Tensor]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": self.shape(t)} for t in tensors]

    def feeds(self, given: Sequence[Any]) -> tuple[list[np.ndarray], int]:
        """The request's arrays in manifest input order, and the batch size.

        ``given`` are V2 request inputs (``name``, ``datatype``, ``shape``, ``as_numpy()``). Raises
        :class:`InputError` naming the expected and the received name, datatype or shape.
        """
        by_name: dict[str, Any] = {}
        for inp in given:
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
                batch = " (-1: a batch of 1 or more)" if self.batched else ""
                raise InputError(f"input {spec.name!r} must have shape {self.shape(spec)}{batch}; got {shape}")
            try:
                feeds.append(inp.as_numpy())
            except ValueError as exc:  # too few/many values for the shape, or values that are not numbers
                raise InputError(f"input {spec.name!r}: its data does not fill shape {shape} as {spec.datatype}: "
                                 f"{exc}") from exc
            batches.add(shape[0] if self.batched else 1)
        if len(batches) > 1:
            raise InputError(f"the inputs of one request share a batch size; got {sorted(batches)}")
        return feeds, batches.pop()

    def check_outputs(self, requested: Sequence[Any] | None) -> None:
        names = [t.name for t in self.outputs]
        for out in requested or ():
            if out.name not in names:
                raise InputError(f"model {self.model!r} has no output named {out.name!r} (outputs: {', '.join(names)})")

    def _fits(self, spec: V2Tensor, shape: list[int]) -> bool:
        if len(shape) != len(spec.shape):
            return False
        if self.batched:
            return shape[0] >= 1 and tuple(shape[1:]) == spec.shape[1:]
        return tuple(shape) == spec.shape


def _v2_tensor(entry: dict[str, Any], model: str) -> V2Tensor:
    datatype = V2_DATATYPES.get(str(entry["dtype"]))
    if datatype is None:
        raise BundleError(f"bundle {model!r}: tensor {entry['name']!r} has dtype {entry['dtype']!r}, which V2 cannot "
                          f"carry (known: {', '.join(V2_DATATYPES)})")
    return V2Tensor(entry["name"], tuple(int(d) for d in entry["shape"]), str(entry["dtype"]), datatype)


def serve(bundle_path: str | Path, artifact: str | None = None, host: str = "127.0.0.1", port: int = 8080,
          allow_failed: bool = False) -> None:
    """Serve the bundle's model at ``http://host:port/v2/models/<name>`` until SIGINT or SIGTERM (blocks).

    ``artifact`` is an artifact id (default: :func:`~edgesdk.hybrid.served_artifact.serving_artifact`). Raises
    :class:`BundleError` for a bad bundle or an unknown artifact id, :class:`BackendUnavailable` when kserve or the
    artifact's engine is missing, and :class:`InputError` for a port outside 1-65535. REST only (no gRPC), one
    worker process. An ``artifact`` that failed its validation gate at quantize time is refused
    (:class:`BundleError`) unless ``allow_failed``, and then served with a
    :class:`~edgesdk.errors.FailedArtifactWarning`.
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InputError(f"port must be an integer from 1 to 65535, got {port!r}")
    _require_kserve()  # before the bundle is read: the fix for a device install comes first
    bundle = Bundle.open(bundle_path)
    chosen = bundle.servable_artifact(artifact, allow_failed) if artifact is not None else serving_artifact(bundle)
    bundle.warn_if_failed(chosen.id)
    model = _bundle_model_class()(bundle, chosen)
    model.load()
    server = _model_server_class()(host, http_port=port, workers=1, enable_grpc=False, enable_docs_url=False)
    shown = f"[{host}]" if ":" in host else host
    print(f"edgesdk: serving {bundle.name!r} (artifact {chosen.id} on {chosen.engine}) at "
          f"http://{shown}:{port}/v2/models/{bundle.name}", file=sys.stderr, flush=True)
    try:
        server.start([model])
    finally:
        model.stop()


def __getattr__(name: str):
    # BundleModel subclasses kserve.Model, so the class is made on first use.
    if name == "BundleModel":
        return _bundle_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _require_kserve() -> None:
    if importlib.util.find_spec("kserve") is None:
        raise BackendUnavailable("kserve_missing", "edgesdk serve runs on the cloud side and needs KServe's "
                                                   "ModelServer (pip install 'edgesdk[cloud]')")


def _kserve():
    """Import kserve. ``kserve.model_server`` parses ``sys.argv`` when imported (argparse ``parse_known_args``):
    it is shown an empty command line, so ``edgesdk serve``'s own options never reach it, and every setting is
    passed explicitly instead."""
    _require_kserve()
    argv = sys.argv
    sys.argv = argv[:1]
    try:
        import kserve
    finally:
        sys.argv = argv
    return kserve


@functools.cache
def _bundle_model_class() -> type:
    kserve = _kserve()
    from kserve.errors import InvalidInput, ModelNotReady
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
    from kserve.utils.utils import generate_uuid

    class BundleModel(kserve.Model):
        """One artifact of a bundle as a KServe model named after the bundle (the contract: module docstring).

        :meth:`load` opens the engine (raising edgesdk errors, e.g. :class:`BackendUnavailable`); a bad request
        raises ``kserve.errors.InvalidInput``, which the server answers with 400 ``{"error": ...}``.
        """

        def __init__(self, bundle: Bundle, artifact: Artifact):
            super().__init__(bundle.name)
            self.bundle = bundle
            self.artifact = artifact
            self.signature = BundleSignature(bundle.manifest)
            self._engine = None
            self._lock = threading.Lock()

        def load(self) -> bool:
            self._engine = self.artifact.open()
            self.ready = True
            return self.ready

        def stop(self) -> None:
            engine, self._engine = self._engine, None
            if engine is not None:
                engine.close()
            self.ready = False

        def get_input_types(self) -> list[dict[str, Any]]:
            return self.signature.metadata(self.signature.inputs)

        def get_output_types(self) -> list[dict[str, Any]]:
            return self.signature.metadata(self.signature.outputs)

        async def predict(self, payload: Any, headers: dict[str, str] | None = None,
                          response_headers: dict[str, str] | None = None) -> InferResponse:
            if not isinstance(payload, InferRequest):  # the V1 route hands over a dict
                raise InvalidInput(f"model {self.name!r} speaks the Open Inference Protocol V2 only: "
                                   f"POST /v2/models/{self.name}/infer")
            try:
                feeds, batch = self.signature.feeds(payload.inputs)
                self.signature.check_outputs(payload.request_outputs)
                arrays = await asyncio.get_running_loop().run_in_executor(None, self._run, feeds, batch)
            except InputError as exc:
                raise InvalidInput(str(exc)) from exc
            outputs = [InferOutput(spec.name, list(a.shape), spec.datatype, data=np.asarray(a, dtype=spec.dtype))
                       for spec, a in zip(self.signature.outputs, arrays)]
            return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name,
                                 infer_outputs=outputs, use_binary_outputs=payload.use_binary_outputs,
                                 requested_outputs=payload.request_outputs)

        def _run(self, feeds: list[np.ndarray], batch: int) -> list[np.ndarray]:
            with self._lock:
                engine = self._engine
                if engine is None:
                    raise ModelNotReady(self.name, "its engine is closed")
                if not self.signature.batched:
                    return engine.run(feeds)
                rows = [engine.run([f[i:i + 1] for f in feeds]) for i in range(batch)]
            return [np.concatenate([row[k] for row in rows]) for k in range(len(rows[0]))]

    BundleModel.__qualname__ = "BundleModel"
    return BundleModel


@functools.cache
def _model_server_class() -> type:
    kserve = _kserve()
    from kserve.protocol.rest.server import RESTServer

    class HostModelServer(kserve.ModelServer):
        """KServe's ModelServer, listening on ``host`` instead of every interface.

        kserve (0.21) builds its RESTServer inside ``start()``, with ``host="0.0.0.0"`` written into the uvicorn
        config (kserve/protocol/rest/server.py), and serves it in the same call. ``_serve()`` runs after that server
        is built and before uvicorn binds, so the host is set there. Should kserve stop building the server that way,
        serving is refused rather than left open on every interface.
        """

        def __init__(self, host: str, **options: Any):
            super().__init__(**options)
            self.host = host

        async def _serve(self) -> None:
            rest = getattr(self, "_rest_server", None)
            if not isinstance(rest, RESTServer):
                raise BackendUnavailable("kserve_unsupported", f"kserve {metadata.version('kserve')} does not build "
                                         f"its REST server as edgesdk expects, so it cannot be bound to {self.host}")
            rest.config.host = self.host
            await super()._serve()

    HostModelServer.__qualname__ = "HostModelServer"
    return HostModelServer
