"""How the cloud client reaches a V2 server: the injectable transport protocol, its default (HTTP/1.1 with
keep-alive, standard library only, TLS with the system's trust store), a mock for tests without sockets (httpx's
``MockTransport`` idea) and the URL check (TLS, or plain http to a loopback address only)."""

from __future__ import annotations

import http.client
import ipaddress
import ssl
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol
from urllib.parse import urlsplit


from ..errors import InputError


LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


class Transport(Protocol):
    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float) -> Response: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Request:
    """One request as the client sent it (what a :class:`MockTransport` handler receives)."""
    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None
    timeout_s: float


class MockTransport:
    """A transport that answers from a function, for testing hybrid logic without sockets::

        def handler(request: Request) -> Response:
            return Response(200, {}, json.dumps({"model_name": "m", "outputs": [...]}).encode())

        client = CloudClient("http://127.0.0.1:9", "m", transport=MockTransport(handler))

    The handler returns a :class:`Response` or raises what a network raises (``TimeoutError``, ``ConnectionError``,
    ``OSError``); the client treats both exactly as it treats the HTTP transport's. Every request is kept in
    :attr:`requests`, in order. Thread-safe as far as the handler is."""

    def __init__(self, handler: Callable[[Request], Response]):
        if not callable(handler):
            raise InputError(f"MockTransport needs a function Request -> Response, got {type(handler).__name__}")
        self._handler = handler
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float) -> Response:
        request = Request(method, url, dict(headers), body, timeout_s)
        with self._lock:
            self.requests.append(request)
        response = self._handler(request)
        if not isinstance(response, Response):
            raise TypeError(f"the MockTransport handler returned {type(response).__name__}, not a Response")
        return response

    def close(self) -> None:
        pass


class HttpTransport:
    """HTTP/1.1 with keep-alive: one connection per thread and endpoint, reopened after any failure. TLS uses
    the system's trust store (or ``cafile``) and checks the host name."""

    def __init__(self, cafile: str | None = None):
        self._ssl = ssl.create_default_context(cafile=cafile)
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float) -> Response:
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(key)
        if conn is None:
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s, context=self._ssl)
            else:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
            conns[key] = conn
            with self._lock:
                self._all.append(conn)
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, path, body=body, headers=dict(headers))
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            conns.pop(key, None)
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)
            if isinstance(exc, http.client.HTTPException):
                raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
            raise
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


def check_url(url: str, allow_insecure_http: bool = False) -> str:
    """The endpoint URL, normalized; :class:`InputError` for a URL this client refuses (see the module docstring)."""
    if not isinstance(url, str):
        raise InputError(f"cloud url must be a string, got {type(url).__name__}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"cloud url must be http(s)://host[:port], got {url!r}")
    if parts.username or parts.password:
        raise InputError("cloud url must not carry credentials: pass token= or token_env=")
    if parts.scheme == "http" and not allow_insecure_http and not _is_loopback(parts.hostname):
        raise InputError(f"cloud url {url!r} is plain http to a non-loopback host: use https, or "
                         "allow_insecure_http=True if the network is trusted")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
