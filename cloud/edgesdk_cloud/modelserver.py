"""KServe's ModelServer as ``edgesdk serve`` runs it, locked down.

:func:`model_server_class` makes (on first use: it imports kserve) a ``kserve.ModelServer`` that

- listens on the host asked for, not on every interface;
- puts :class:`~edgesdk_cloud.gate.RequestGate` in front of KServe's app (repository API, body caps, slow senders,
  credentials in error bodies) and tells uvicorn to keep at most ``max_connections`` connections;
- is ready (``/v2/health/ready``) only while its model is registered and its engine open: KServe's own readiness
  is true whatever its models do;
- answers a client's malformed request with 400 ``{"error": ...}``: KServe answers a binary request it cannot
  decode with 500, and FastAPI a JSON body that is not a V2 request with 422 repeating the whole body;
- unloads a model (repository API, when on) by closing its engine and keeps it, so a load opens it again.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from importlib import metadata
from typing import Any

from edgesdk.errors import BackendUnavailable

from .gate import RequestGate
from .limits import ServeLimits

BINARY_HEADER_LENGTH = "inference-header-content-length"


def require_kserve() -> None:
    if importlib.util.find_spec("kserve") is None:
        raise BackendUnavailable("kserve_missing", "edgesdk serve runs on the cloud side and needs KServe's "
                                                   "ModelServer (pip install 'edgesdk-cloud[serve]')")


def import_kserve():
    """Import kserve. ``kserve.model_server`` parses ``sys.argv`` when imported (argparse ``parse_known_args``):
    it is shown an empty command line, so ``edgesdk serve``'s own options never reach it, and every setting is
    passed explicitly instead."""
    require_kserve()
    argv = sys.argv
    sys.argv = argv[:1]
    try:
        import kserve
    finally:
        sys.argv = argv
    return kserve


@functools.cache
def model_server_class() -> type:
    kserve = import_kserve()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve.errors import InvalidInput
    from kserve.model_repository import ModelRepository
    from kserve.model_server import app as kserve_app
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.rest.server import RESTServer

    class BundleDataPlane(DataPlane):
        """KServe's data plane with a readiness that looks at the models, and decode errors as 400."""

        async def ready(self) -> bool:
            models = self.model_registry.get_models()
            return bool(models) and all([await self.model_registry.is_model_ready(name) for name in models])

        def decode(self, body, headers, *args, **kwargs):
            if isinstance(body, bytes) and headers and BINARY_HEADER_LENGTH in headers:
                length = headers[BINARY_HEADER_LENGTH]
                if not length.isdigit() or int(length) > len(body):
                    raise InvalidInput(f"Inference-Header-Content-Length must be the byte count of the request's "
                                       f"JSON header, at most the body's {len(body)} bytes; got {length!r}")
            try:
                return super().decode(body, headers, *args, **kwargs)
            except KeyError as exc:
                raise InvalidInput(f"the request's JSON header lacks the field {exc}") from exc
            except (TypeError, ValueError, IndexError, AttributeError) as exc:  # kserve's decoding trusts the header
                raise InvalidInput(f"the request does not match the V2 binary tensor format: {exc}") from exc

    class BundleRepository(ModelRepository):
        """KServe's registry, where an unloaded model is kept (engine closed) so that ``load`` can reopen it."""

        def __init__(self) -> None:
            super().__init__()
            self.unloaded: dict[str, Any] = {}

        def unload(self, name: str) -> None:
            model = self.get_model(name)
            super().unload(name)
            self.unloaded[name] = model

        def load(self, name: str) -> bool:
            model = self.unloaded.pop(name, None)
            if model is None:
                return False
            model.load()
            self.update(model)
            return True

    class HostModelServer(kserve.ModelServer):
        """KServe's ModelServer with the changes of the module docstring.

        kserve (0.21) builds its RESTServer inside ``start()``, with ``host="0.0.0.0"`` and the app as an import
        string written into the uvicorn config (kserve/protocol/rest/server.py), and serves it in the same call.
        ``_serve()`` runs after that server is built and before uvicorn binds, so the host and the gate are set
        there. Should kserve stop building the server that way, serving is refused rather than left open on every
        interface or without the gate.
        """

        def __init__(self, host: str, limits: ServeLimits, repository_token: str | None = None, **options: Any):
            super().__init__(registered_models=BundleRepository(), **options)
            self.host = host
            self.limits = limits
            self.repository_token = repository_token
            self.dataplane = BundleDataPlane(model_registry=self.registered_models)

        async def _serve(self) -> None:
            rest = getattr(self, "_rest_server", None)
            if not isinstance(rest, RESTServer) or rest.config.app != "kserve.model_server:app":
                raise BackendUnavailable("kserve_unsupported", f"kserve {metadata.version('kserve')} does not build "
                                         f"its REST server as edgesdk expects, so it cannot be bound to {self.host} "
                                         f"behind edgesdk's request checks")
            kserve_app.add_exception_handler(RequestValidationError, _not_a_v2_request)
            rest.config.host = self.host
            rest.config.app = RequestGate(kserve_app, self.limits, self.repository_token)
            rest.config.limit_concurrency = self.limits.max_connections
            await super()._serve()

    async def _not_a_v2_request(request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_message(exc.errors())}, status_code=400)

    HostModelServer.__qualname__ = "HostModelServer"
    return HostModelServer


def validation_message(errors: list[dict[str, Any]]) -> str:
    """FastAPI's validation errors as one line, without the input it repeats (a request's whole body)."""
    found = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ())]
        if loc[:2] == ["body", "bytes"]:  # the other member of kserve's Union[InferenceRequest, bytes]
            continue
        if error.get("type") == "json_invalid":
            at = f" at character {loc[1]}" if len(loc) > 1 else ""
            return f"the request body is not valid JSON: {(error.get('ctx') or {}).get('error', 'invalid')}{at}"
        where = ".".join(p for p in loc[1:] if p != "InferenceRequest") or "body"
        found.append(f"{where}: {error.get('msg', 'invalid')}")
    shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    return f"the request is not a V2 inference request: {shown or 'invalid body'}"
