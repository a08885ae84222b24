"""How the cloud client reaches a V2 server: the injectable transport protocol, its default (HTTP/1.1 with
keep-alive, standard library only, TLS with the system's trust store), a mock for tests without sockets (httpx's
``MockTransport`` idea) and the URL check (TLS, or plain http to a loopback address only).

Every request a transport makes is bounded twice: in time, by ``timeout_s``, one wall-clock budget for connecting,
the TLS handshake, sending, the response headers and the body (a server that trickles bytes cannot stretch it), and
in size, by ``max_bytes``: a response declaring more is refused before its body is read, one growing past it is cut
(:class:`ResponseTooLarge`)."""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol
from urllib.parse import urlsplit


from ..errors import InputError


LOOPBACK_NAMES = ("localhost",)
READ_CHUNK = 64 * 1024  # a body is read this much at a time, each piece checked against the cap


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


class ResponseTooLarge(Exception):
    """A response longer than the request's ``max_bytes``: ``size`` is what its Content-Length declared
    (``declared``) or how much had arrived when it was cut."""

    def __init__(self, size: int, limit: int, declared: bool):
        how = "declares" if declared else "sent more than"
        super().__init__(f"the response {how} {size} bytes; the cap is {limit}")
        self.size, self.limit, self.declared = size, limit, declared


class Transport(Protocol):
    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float, max_bytes: int) -> Response: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Request:
    """One request as the client sent it (what a :class:`MockTransport` handler receives)."""
    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None
    timeout_s: float
    max_bytes: int | None = None


class MockTransport:
    """A transport that answers from a function, for testing hybrid logic without sockets::

        def handler(request: Request) -> Response:
            return Response(200, {}, json.dumps({"model_name": "m", "outputs": [...]}).encode())

        client = CloudClient("http://127.0.0.1:9", "m", transport=MockTransport(handler))

    The handler returns a :class:`Response` or raises what a network raises (``TimeoutError``, ``ConnectionError``,
    ``OSError``); the client treats both exactly as it treats the HTTP transport's, and a body over the request's
    ``max_bytes`` is refused as that transport refuses it. Every request is kept in :attr:`requests`, in order.
    Thread-safe as far as the handler is."""

    def __init__(self, handler: Callable[[Request], Response]):
        if not callable(handler):
            raise InputError(f"MockTransport needs a function Request -> Response, got {type(handler).__name__}")
        self._handler = handler
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float, max_bytes: int | None = None) -> Response:
        request = Request(method, url, dict(headers), body, timeout_s, max_bytes)
        with self._lock:
            self.requests.append(request)
        response = self._handler(request)
        if not isinstance(response, Response):
            raise TypeError(f"the MockTransport handler returned {type(response).__name__}, not a Response")
        if max_bytes is not None and len(response.body) > max_bytes:
            raise ResponseTooLarge(len(response.body), max_bytes, declared=False)
        return response

    def close(self) -> None:
        pass


class _DeadlineSocket:
    """A connected socket whose every send and receive ends by one wall-clock ``deadline`` (a ``time.monotonic()``
    value, set per request): each call gets the time left as its timeout and none starts once it is gone, so a
    peer sending or taking one byte at a time cannot stretch a request. ``http.client`` reads through it."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self.deadline = sock, deadline
        self._readers, self._closed = 0, False  # as socket.socket: closed for real once no reader holds it

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(left)

    def recv_into(self, buffer, *args) -> int:  # the arguments as given: an SSL socket's defaults differ
        self._arm()
        return self._sock.recv_into(buffer, *args)

    def recv(self, size: int, *args) -> bytes:
        self._arm()
        return self._sock.recv(size, *args)

    def sendall(self, data) -> None:
        # One send per turn, each with the time left (an SSL socket's sendall would give every send a fresh timeout).
        view = memoryview(data).cast("B")
        while view:
            self._arm()
            sent = self._sock.send(view[:READ_CHUNK])
            view = view[sent:]

    def makefile(self, mode: str = "rb", *args, **kwargs):
        if mode != "rb":
            raise ValueError(f"a deadline socket is read as 'rb' only, not {mode!r}")
        self._readers += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))

    def _decref_socketios(self) -> None:  # SocketIO.close calls it
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        # http.client closes the connection while a response that will close it is still being read.
        self._closed = True
        if self._readers <= 0:
            self._sock.close()

    def settimeout(self, timeout) -> None:  # the deadline decides, not a per-read timeout
        pass

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection whose connect, TLS handshake and every read and write end by ``deadline``."""

    def __init__(self, host: str, port: int | None, tls: ssl.SSLContext | None):
        super().__init__(host, port if port is not None else (443 if tls is not None else 80))
        self._tls = tls
        self.deadline = 0.0

    def start(self, deadline: float) -> None:
        """Bound the next request (and a reconnect it needs) by ``deadline``."""
        self.deadline = deadline
        if isinstance(self.sock, _DeadlineSocket):
            self.sock.deadline = deadline

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed before connecting")
        sock = _connect_within(self.host, self.port, self.deadline)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request's deadline passed before the TLS handshake")
                sock.settimeout(left)  # ssl's handshake counts this timeout over the whole handshake
                sock.do_handshake()
        except BaseException:
            sock.close()
            raise
        self.sock = _DeadlineSocket(sock, self.deadline)


def _connect_within(host: str, port: int, deadline: float) -> socket.socket:
    """A TCP connection to the first of ``host``'s addresses that answers, all of them within ``deadline`` together
    (``socket.create_connection`` gives each address the whole timeout again). The name lookup itself is the
    system resolver's and is not bounded here: an IP address in the URL avoids it."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    if time.monotonic() >= deadline:
        raise TimeoutError(f"no address of {host} answered within the request's deadline")
    raise error if error is not None else OSError(f"{host} has no address")


def _read_capped(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    if resp.length is not None and resp.length > max_bytes:
        raise ResponseTooLarge(resp.length, max_bytes, declared=True)
    data = bytearray()
    while True:
        chunk = resp.read(min(READ_CHUNK, max_bytes + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > max_bytes:
            raise ResponseTooLarge(len(data), max_bytes, declared=False)


class HttpTransport:
    """HTTP/1.1 with keep-alive: one connection per thread and endpoint, reopened after any failure. TLS uses
    the system's trust store (or ``cafile``) and checks the host name. ``timeout_s`` bounds each request as a
    whole, ``max_bytes`` its response (see the module docstring)."""

    def __init__(self, cafile: str | None = None):
        self._ssl = ssl.create_default_context(cafile=cafile)
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                timeout_s: float, max_bytes: int) -> Response:
        deadline = time.monotonic() + timeout_s
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(key)
        if conn is None:
            conn = _Connection(parts.hostname, parts.port, self._ssl if parts.scheme == "https" else None)
            conns[key] = conn
            with self._lock:
                self._all.append(conn)
        conn.start(deadline)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, path, body=body, headers=dict(headers))
            resp = conn.getresponse()
            data = _read_capped(resp, max_bytes)
        except (OSError, http.client.HTTPException, ResponseTooLarge) as exc:
            conn.close()  # a half-read response leaves the connection unusable
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
