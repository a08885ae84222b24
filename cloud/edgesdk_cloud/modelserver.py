"""KServe's ModelServer as ``edgesdk serve`` runs it, locked down.

:func:`model_server_class` makes (on first use: it imports kserve) a ``kserve.ModelServer`` that

- listens on the host asked for, not on every interface;
- puts :class:`~edgesdk_cloud.gate.RequestGate` in front of KServe's app (repository API, body caps, slow senders,
  credentials in error bodies) and tells uvicorn to keep at most ``max_connections`` connections;
- closes, with a 408, a connection whose request line and headers are not complete within ``HEADER_TIMEOUT_S`` of
  the connection or of the request's first byte: uvicorn times out neither, and counts such a connection toward
  ``max_connections``, so 64 clients trickling their headers would otherwise make every other request a 503 for as
  long as they keep trickling (the gate sees a request only once its headers are complete);
- is ready (``/v2/health/ready``) only while its model is registered and its engine open: KServe's own readiness
  is true whatever its models do;
- answers a client's malformed request with 400 ``{"error": ...}``: KServe answers a binary request it cannot
  decode with 500, and FastAPI a JSON body that is not a V2 request with 422 repeating the whole body;
- unloads a model (repository API, when on) by closing its engine and keeps it, so a load opens it again.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import sys
from importlib import metadata
from typing import Any

from edgesdk.errors import BackendUnavailable

from .gate import RequestGate
from .limits import HEADER_TIMEOUT_S, ServeLimits

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
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

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
            if not isinstance(rest, RESTServer) or rest.config.app != "kserve.model_server:app" \
                    or rest.config.http != "auto" or rest.config.loaded:
                raise BackendUnavailable("kserve_unsupported", f"kserve {metadata.version('kserve')} does not build "
                                         f"its REST server as edgesdk expects, so it cannot be bound to {self.host} "
                                         f"behind edgesdk's request checks")
            kserve_app.add_exception_handler(RequestValidationError, _not_a_v2_request)
            rest.config.host = self.host
            rest.config.app = RequestGate(kserve_app, self.limits, self.repository_token)
            rest.config.limit_concurrency = self.limits.max_connections
            rest.config.http = header_deadline(AutoHTTPProtocol, HEADER_TIMEOUT_S)
            await super()._serve()

    async def _not_a_v2_request(request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_message(exc.errors())}, status_code=400)

    HostModelServer.__qualname__ = "HostModelServer"
    return HostModelServer


def header_deadline(protocol: type[asyncio.Protocol], timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP ``protocol`` (h11 or httptools), closing with a 408 a connection whose request line and
    headers are not complete within ``timeout_s`` of the connection, or of the first byte of a request that follows
    an answered one. Idle keep-alive connections stay under uvicorn's own ``timeout_keep_alive``; a body's time is
    the gate's ``body_timeout_s``. Both protocols start a request cycle (``self.cycle``) when headers are complete."""

    class HeaderDeadline(protocol):
        _deadline: asyncio.TimerHandle | None = None
        _cycle_before = None  # the request cycle current when the deadline was set

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._cycle_before:
                self._disarm()  # its headers are complete

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._cycle_before = self.cycle
            self._deadline = asyncio.get_running_loop().call_later(timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _headers_late(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.write(_REQUEST_TIMEOUT)
                self.transport.close()

    HeaderDeadline.__qualname__ = f"HeaderDeadline({protocol.__name__})"
    return HeaderDeadline


_TIMEOUT_BODY = json.dumps({"error": f"the request line and headers did not arrive within {HEADER_TIMEOUT_S:g} s"}
                           ).encode()
_REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY)


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
