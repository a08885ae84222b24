"""The door of ``edgesdk serve``: an ASGI layer in front of KServe's app that answers before KServe reads anything.

- The model-repository API (``/v2/repository/...``: load, unload) is off (404) unless a ``repository_token`` was
  given; then it needs ``Authorization: Bearer <token>`` (401 otherwise, compared in constant time).
- A request body is read here, whole, before KServe sees it: over ``max_body_bytes`` is a 413 (from its
  Content-Length before a byte is read, or as soon as the count passes the cap), slower than ``body_timeout_s`` a 408.
  Bodies held at once total at most ``max_pending x max_body_bytes`` and at most ``max_pending`` requests are in
  KServe at once; past either, a 503 with ``Retry-After``. A slow sender holds only the bytes it sent, so a few of
  them do not lock others out. KServe then reads the body from memory.
- A JSON body (or a binary request's JSON header) with more commas than a full request has values is a 413 before
  KServe parses it: the body cap alone would let ``0,0,0,...`` carry 16 times the values a request may hold.
- No error body repeats a credential the request carried (``Authorization``, ``Cookie``, API-key headers) or the
  repository token: an error body holding one is replaced by a plain one.

It is plain ASGI (no kserve, starlette or fastapi import), so it does not depend on how KServe builds its app.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from http import HTTPStatus
from typing import Any, Awaitable, Callable

from .limits import VALUE_SLACK, ServeLimits

Message = dict[str, Any]
ASGIApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

REPOSITORY_PREFIX = "/v2/repository"
CREDENTIAL_HEADERS = (b"authorization", b"proxy-authorization", b"cookie", b"x-api-key", b"x-auth-token")
SECRET_MIN_CHARS = 4  # shorter values are words that any message may hold
ERROR_BODY_MAX = 1 << 20  # error bodies are short; a longer one is not relayed, whatever it holds


class RequestGate:
    """Wraps KServe's ASGI ``app`` with the checks of the module docstring."""

    def __init__(self, app: ASGIApp, limits: ServeLimits, repository_token: str | None = None):
        self.app = app
        self.limits = limits
        self.repository_token = repository_token
        self.pending = 0  # requests handed to KServe and not answered yet
        self.buffered = 0  # bytes of bodies held, being read or in KServe
        self.budget = limits.max_pending * limits.max_body_bytes

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key.lower(), value)
        send = _Redacting(send, self._secrets(headers))
        path = scope.get("path", "")
        if path == REPOSITORY_PREFIX or path.startswith(REPOSITORY_PREFIX + "/"):
            refusal = self._repository_refusal(headers)
            if refusal is not None:
                await _answer(send, *refusal)
                return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS") and b"content-length" not in headers \
                and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)
            return
        body = await self._read_body(headers, receive, send)
        if body is None:
            return
        try:
            if self._too_many_values(body, headers):
                await _answer(send, 413, f"the request holds more than {self.limits.max_values} values, all that "
                                         f"max_batch ({self.limits.max_batch}) requests of this model hold",
                              {"connection": "close"})
                return
            if self.pending >= self.limits.max_pending:
                await _busy(send, f"{self.limits.max_pending} requests are running or waiting (max_pending)")
                return
            self.pending += 1
            try:
                await self.app(scope, _replay(body, receive), send)
            finally:
                self.pending -= 1
        finally:
            self.buffered -= len(body)

    def _repository_refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str, dict] | None:
        if self.repository_token is None:
            return 404, ("the model repository API (load, unload) is off in edgesdk serve; it is turned on by "
                         "giving serve a repository token"), {}
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                                 self.repository_token.encode("utf-8")):
            return 401, "the model repository API needs the server's repository token as a bearer token", \
                {"www-authenticate": "Bearer"}
        return None

    async def _read_body(self, headers: dict[bytes, bytes], receive, send) -> bytes | None:
        """The whole body, counted in ``buffered``; or None once an error was answered (or the client left)."""
        cap = self.limits.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _answer(send, 400, "Content-Length must be a number of bytes", {"connection": "close"})
                return None
            if int(declared) > cap:
                await _answer(send, 413, _too_large(int(declared), cap), {"connection": "close"})
                return None
        deadline = time.monotonic() + self.limits.body_timeout_s
        chunks, size, done = [], 0, False
        try:
            while True:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    await _answer(send, 408, f"the request body did not arrive within "
                                             f"{self.limits.body_timeout_s:g} s (body_timeout_s)",
                                  {"connection": "close"})
                    return None
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                if size + len(chunk) > cap:
                    await _answer(send, 413, _too_large(size + len(chunk), cap, at_least=True),
                                  {"connection": "close"})
                    return None
                if self.buffered + len(chunk) > self.budget:
                    await _busy(send, f"request bodies of {self.budget} bytes are held already "
                                      f"(max_pending x max_body_bytes)", close=True)
                    return None
                self.buffered += len(chunk)
                size += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    done = True
                    return b"".join(chunks)
        finally:
            if not done:
                self.buffered -= size

    def _too_many_values(self, body: bytes, headers: dict[bytes, bytes]) -> bool:
        if not self.limits.max_values:
            return False
        declared = headers.get(b"inference-header-content-length", b"")
        end = min(int(declared), len(body)) if declared.isdigit() else len(body)  # binary tensors are not JSON
        return body.count(b",", 0, end) > self.limits.max_values + VALUE_SLACK

    def _secrets(self, headers: dict[bytes, bytes]) -> list[bytes]:
        found = [] if self.repository_token is None else [self.repository_token.encode("utf-8")]
        for name in CREDENTIAL_HEADERS:
            value = headers.get(name)
            if value:
                found.append(value)
                found += value.replace(b";", b" ").replace(b"=", b" ").split()[1:]  # "Bearer X", "a=X; b=Y"
        return [s for s in found if len(s) >= SECRET_MIN_CHARS]


class _Redacting:
    """``send``, holding back an error response until its body is known to repeat none of ``secrets``."""

    def __init__(self, send, secrets: list[bytes]):
        self.send, self.secrets = send, secrets
        self.start: Message | None = None
        self.body = bytearray()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status", 200) >= 400 and self.secrets:
            self.start = message
            return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if message.get("more_body", False) and len(self.body) <= ERROR_BODY_MAX:
            return
        status, body = self.start["status"], bytes(self.body)
        headers = [(k, v) for k, v in self.start.get("headers", ()) if k.lower() != b"content-length"]
        if len(body) > ERROR_BODY_MAX or any(s in body for s in self.secrets):
            body = _error_json(f"{status} {_phrase(status)}: the error text is withheld because it repeated a "
                               f"credential of the request")
            headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            headers.append((b"content-type", b"application/json"))
        self.start, self.body = None, bytearray()
        await self.send({"type": "http.response.start", "status": status,
                         "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


def _replay(body: bytes, receive):
    """A ``receive`` that hands the app the body read already, then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send, status: int, text: str, headers: dict[str, str] | None = None) -> None:
    body = _error_json(text)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _busy(send, why: str, close: bool = False) -> None:
    await _answer(send, 503, f"the server is busy: {why}; retry shortly",
                  {"retry-after": "1", **({"connection": "close"} if close else {})})


def _error_json(text: str) -> bytes:
    return json.dumps({"error": text}).encode()


def _too_large(size: int, cap: int, at_least: bool = False) -> str:
    return (f"the request body is {'over ' if at_least else ''}{size} bytes; edgesdk serve takes at most {cap} "
            f"(max_body_bytes: the model's input size x max_batch, in JSON)")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
