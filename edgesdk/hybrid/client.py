"""A client for the Open Inference Protocol (KServe V2) over REST: the cloud half of hybrid mode, on the device.

Any V2 server can be the endpoint (KServe's ModelServer, ``edgesdk serve``, Triton, OpenVINO Model Server). What
the device needs from a remote service it cannot control:

- a deadline per call (``deadline_s``) and a timeout per attempt (``timeout_s``, never past the deadline), each a
  wall-clock bound on everything a request does: connect, TLS handshake, send, response headers and body;
- answers checked before anything uses them: with ``expected_outputs`` (the bundle's manifest ``outputs``) an
  answer whose output names, count, shapes, datatypes or values (NaN, Inf, null) differ is a ``bad_response``; so
  is one that the bundle's task cannot use (``answer_check``, :class:`~edgesdk.tasks.answers.AnswerCheck`: a
  detector's boxes that are no number or lie past 16 input sizes);
  a response over ``max_response_bytes`` (derived from the expected outputs by default) is refused as
  ``response_too_large``, before its body is read when it says its length;
- retries only where they can help (connection failures, timeouts, 429, 502, 503, 504; inference is idempotent),
  at most ``max_attempts``, after a capped exponential backoff with full jitter (a random pause between 0 and
  ``min(backoff_cap_s, backoff_base_s * 2**n)``), honouring ``Retry-After`` when it fits the deadline;
- a retry budget (:class:`RetryBudget`): retries stay under a share of the calls, so a struggling endpoint is not
  stormed by every device at once;
- a circuit breaker (:class:`CircuitBreaker`): after a run of failures calls fail at once (the device answers) until
  a cool-down passes and a probe succeeds;
- a bearer token from the environment or a callback, never stored in the bundle, never logged; TLS with
  certificate verification, and plain ``http`` only to a loopback address unless ``allow_insecure_http``;
- the binary tensor extension when the server lists ``binary_tensor_data``, JSON tensors otherwise.

Nothing here logs a request or response body, or a token; text a server sends that an error keeps (a rejection's
message) is cut short, single-line and has the token redacted. Every failure of a call is a
:class:`~edgesdk.errors.CloudError` (a malformed answer too): the caller (hybrid mode) answers from the device
instead. The deadline bounds the attempts and the pauses between them; only the host name's resolution is the
system's (use an address, or a resolver with its own timeout, where that matters).

The pieces live beside this module: :mod:`.transport` (the injectable transport and the URL check),
:mod:`.resilience` (retry budget, circuit breaker) and :mod:`.v2_codec` (request and response bodies, and the check of
an answer against the expected outputs); their public names are importable from here too. The transport is
injectable (``transport=``): anything with ``request(method, url, headers, body, timeout_s, max_bytes) -> Response``
that raises ``OSError`` (``TimeoutError`` for a timeout) when no response came and
:class:`~edgesdk.hybrid.transport.ResponseTooLarge` for one over ``max_bytes``. The default, :class:`HttpTransport`,
keeps one connection per thread and endpoint (``http.client``, standard library only).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import ssl
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np

from ..choices import CloudReason
from ..errors import CloudError, CloudRejected, CloudTimeout, CloudUnavailable, InputError
from ..lifecycle import Closeable
from .resilience import CircuitBreaker, RetryBudget
from .transport import HttpTransport, Response, ResponseTooLarge, Transport, _is_loopback, check_url
from .v2_codec import (_V2_NAME, DATATYPES, MAX_DETAIL_CHARS, METADATA_MAX_BYTES, ExpectedOutput, _decode, _encode,
                       _error_message, _retry_after, _safe, clean, response_cap)
from .v2_codec import expected_outputs as parse_expected_outputs

log = logging.getLogger("edgesdk.hybrid")

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
# Failures that say the endpoint is unwell (they open the circuit); a rejected request or a missing token do not.
SERVER_FAILURES = frozenset({CloudReason.TIMEOUT, CloudReason.UNREACHABLE, CloudReason.OVERLOADED,
                             CloudReason.SERVER_ERROR, CloudReason.BAD_RESPONSE, CloudReason.RETRY_BUDGET,
                             CloudReason.TLS, CloudReason.TRANSPORT_ERROR, CloudReason.RESPONSE_TOO_LARGE})
BINARY_RECHECK_S = 60.0  # after a failed GET /v2, JSON is used this long before asking again


class CloudClient(Closeable):
    """Calls one model on one V2 endpoint. ``url`` is the server root (``https://host:port``); ``model`` the
    model name (the bundle's name, usually). Thread-safe.

    ``token`` (a string, or a callable returning one, called per request) or ``token_env`` (the name of an
    environment variable, read per request) gives a bearer token. ``expected_outputs`` (the manifest's
    ``outputs``: ``[{name, shape, dtype}]``) is what every answer of :meth:`infer` must be (see the module
    docstring); ``max_response_bytes`` replaces the cap derived from it (raise it for a model whose answers are
    bigger; it also caps metadata answers, at least ``METADATA_MAX_BYTES``). ``answer_check`` (called with the
    outputs in the expected order and their names, returning a list of problems; ``AnswerCheck.of(manifest)``)
    refuses answers that match the outputs but that the bundle's task cannot use; ``edgesdk.load`` gives a client
    that has none the bundle's. :meth:`infer` raises a
    :class:`~edgesdk.errors.CloudError` subclass on any failure; ``stats()`` counts calls, attempts, retries and
    failures by reason.
    """

    def __init__(self, url: str, model: str, *, version: str | None = None,
                 token: str | Callable[[], str] | None = None, token_env: str | None = None,
                 timeout_s: float = 1.0, deadline_s: float = 2.0, max_attempts: int = 3,
                 backoff_base_s: float = 0.1, backoff_cap_s: float = 2.0, retry_budget: RetryBudget | None = None,
                 breaker: CircuitBreaker | None = None, allow_insecure_http: bool = False, cafile: str | None = None,
                 binary: bool | None = None, transport: Transport | None = None,
                 expected_outputs: Sequence[Mapping[str, Any]] | None = None, max_response_bytes: int | None = None,
                 answer_check: Callable[[list[np.ndarray], list[str]], list[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        self.url = check_url(url, allow_insecure_http)
        if not isinstance(model, str) or not model or "/" in model:
            raise InputError(f"cloud model name must be a non-empty string without '/', got {model!r}")
        for name, value in (("timeout_s", timeout_s), ("deadline_s", deadline_s)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise InputError(f"cloud client: {name} must be > 0 seconds, got {value!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InputError(f"cloud client: max_attempts must be an integer >= 1, got {max_attempts!r}")
        if max_response_bytes is not None and (type(max_response_bytes) is not int or max_response_bytes < 1):
            raise InputError(f"cloud client: max_response_bytes must be an integer >= 1, got {max_response_bytes!r}")
        self.expected_outputs = parse_expected_outputs(expected_outputs)
        self.max_response_bytes = max_response_bytes
        if answer_check is not None and not callable(answer_check):
            raise InputError(f"cloud client: answer_check must be callable, got {type(answer_check).__name__}")
        self.answer_check = answer_check
        if token is not None and token_env is not None:
            raise InputError("cloud client: pass token or token_env, not both")
        if (token is not None or token_env is not None) and self.url.startswith("http://") and \
                not _is_loopback(urlsplit(self.url).hostname or ""):
            log.warning("the cloud token for %s will travel in clear text (plain http, allow_insecure_http=True)",
                        self.url)
        self.model, self.version = model, version
        self.timeout_s, self.deadline_s, self.max_attempts = float(timeout_s), float(deadline_s), max_attempts
        self.backoff_base_s, self.backoff_cap_s = float(backoff_base_s), float(backoff_cap_s)
        self.retry_budget = retry_budget if retry_budget is not None else RetryBudget()
        self.breaker = breaker if breaker is not None else CircuitBreaker(clock=clock)
        self._token, self._token_env = token, token_env
        self._binary = binary
        self._binary_failed_at: float | None = None
        self._transport = transport if transport is not None else HttpTransport(cafile)
        self.clock = self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._sent = threading.local()  # the token this thread last sent: redacted from what a server says
        self._stats = {"calls": 0, "attempts": 0, "retries": 0, "ok": 0, "failures": {}}
        base = f"{self.url}/v2/models/{model}" + (f"/versions/{version}" if version else "")
        self._model_url = base

    def __repr__(self) -> str:  # never shows the token
        return f"CloudClient({self.url!r}, model={self.model!r})"

    # -- protocol calls ---------------------------------------------------------------------------------------
    def live(self) -> bool:
        return self._get_json("/v2/health/live", retry=False).get("live") is True

    def ready(self) -> bool:
        """Model readiness (``GET /v2/models/{m}/ready``): False on any failure, never raises."""
        try:
            self._call("GET", self._model_url + "/ready", None, {}, retry=False)
            return True
        except CloudError:
            return False

    def server_metadata(self) -> dict:
        return self._get_json("/v2")

    def model_metadata(self, deadline_s: float | None = None) -> dict:
        return self._get_json(self._model_url[len(self.url):], deadline_s=deadline_s)

    def check_inputs(self, inputs: Sequence[Mapping[str, Any]], deadline_s: float | None = None) -> dict:
        """Compare the model's metadata with the inputs the device will send (the bundle's manifest ``inputs``:
        ``name``, ``shape``, ``dtype``); raises :class:`CloudError` (reason ``model_mismatch``) naming every
        difference. Returns the metadata.

        What the metadata does not say is unknown, not a mismatch: V2 servers differ in what they list (MLServer and
        a KServe custom model list no inputs unless told; some list no datatype or no shape), and every answer is
        checked against the bundle anyway. So no ``inputs`` (absent, null or empty) passes, an input without a
        datatype or a shape passes on that point, and a datatype is compared whatever its case and with Triton's
        ``TYPE_`` prefix allowed. What is listed and contradicts the bundle is a mismatch: inputs listed without
        this one, another datatype, another rank or size (-1 is any size). Metadata that is not V2 (inputs not a
        list, an input without a string name) is a ``bad_response``."""
        meta = self.model_metadata(deadline_s)
        listed = meta.get("inputs") if isinstance(meta, dict) else None
        if listed is None or listed == []:
            log.debug("model %r at %s lists no inputs: they are checked by its answers", self.model, self.url)
            return meta
        if not isinstance(listed, list) or not all(isinstance(i, dict) and isinstance(i.get("name"), str)
                                                   for i in listed):
            raise CloudError(CloudReason.BAD_RESPONSE,
                             f"model {self.model!r} at {self.url}: its metadata's inputs are not a list of inputs "
                             "with string names")
        served = {i["name"]: i for i in listed}
        problems = []
        for spec in inputs:
            name, shape = spec["name"], list(spec["shape"])
            datatype = _V2_NAME.get(np.dtype(spec.get("dtype", "float32")))
            got = served.get(name)
            if got is None:
                problems.append(f"no input {name!r} (the server has {sorted(n for n in served if n)})")
                continue
            theirs = got.get("datatype")
            if theirs not in (None, "") and _datatype(theirs) != datatype:
                problems.append(f"input {name!r} is {_safe_text(theirs)} there, {datatype} here")
            their = got.get("shape")
            if their is None:
                continue
            their = their if isinstance(their, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in their) else ["?"]
            if len(their) != len(shape) or any(t not in (-1, s) for t, s in zip(their, shape)):
                problems.append(f"input {name!r} has shape {their} there, {shape} here")
        if problems:  # the server's names and types are its text: cleaned like its error messages
            raise CloudError(CloudReason.MODEL_MISMATCH, self._clean(
                f"model {self.model!r} at {self.url} does not take what this bundle sends: {'; '.join(problems)}"))
        return meta

    def infer(self, arrays: Sequence[np.ndarray], names: Sequence[str], *, deadline_s: float | None = None,
              request_id: str | None = None,
              expected_outputs: Sequence[Mapping[str, Any]] | None = None,
              answer_check: Callable[[list[np.ndarray], list[str]], list[str]] | None = None) -> list[np.ndarray]:
        """One inference within ``deadline_s`` (default ``self.deadline_s``) all told: the outputs in the order
        the server lists them, or checked against ``expected_outputs`` (default ``self.expected_outputs``) and
        in its order, then by ``answer_check`` (default ``self.answer_check``). Raises a :class:`CloudError`."""
        if len(arrays) != len(names):
            raise InputError(f"cloud infer: {len(arrays)} arrays for {len(names)} input names")
        expected = self.expected_outputs if expected_outputs is None else parse_expected_outputs(expected_outputs)
        batch = int(np.shape(arrays[0])[0]) if len(arrays) and np.ndim(arrays[0]) else None
        cap = self.max_response_bytes or response_cap(expected, batch)
        end = self.clock() + (deadline_s if deadline_s is not None else self.deadline_s)
        rid = request_id or uuid.uuid4().hex
        binary = self._binary if self._binary is not None else self._server_has_binary(end - self.clock())
        body, headers = _encode(arrays, names, rid, binary)
        check = (answer_check or self.answer_check) if expected is not None else None

        def read(resp: Response) -> list[np.ndarray]:
            outputs = _decode(resp, rid, expected, batch)
            problems = check(outputs, [spec.name for spec in expected]) if check is not None else None
            if problems:
                raise CloudError(CloudReason.BAD_RESPONSE, f"the infer response is unusable: {'; '.join(problems)}",
                                 resp.status)
            return outputs

        return self._call("POST", self._model_url + "/infer", body, headers, deadline_s=end - self.clock(),
                          max_bytes=cap, read=read)

    def stats(self) -> dict:
        with self._lock:
            stats = {**self._stats, "failures": dict(self._stats["failures"])}
        stats.update(breaker=self.breaker.state, breaker_opened=self.breaker.opened,
                     breaker_recovered=self.breaker.recovered, retries_refused=self.retry_budget.refused)
        return stats

    def close(self) -> None:
        self._transport.close()

    # -- the resilient call -----------------------------------------------------------------------------------
    def _server_has_binary(self, deadline_s: float) -> bool:
        """Whether the server lists the binary tensor extension; asked once. When asking fails, JSON is used
        and the question waits ``BINARY_RECHECK_S`` (a failing endpoint is not asked twice per inference)."""
        if self._binary is not None:
            return self._binary
        if self._binary_failed_at is not None and self.clock() - self._binary_failed_at < BINARY_RECHECK_S:
            return False
        if deadline_s <= 0:
            return False
        try:
            extensions = self._get_json("/v2", retry=False, deadline_s=deadline_s).get("extensions") or []
        except CloudError:
            self._binary_failed_at = self.clock()
            return False  # JSON works everywhere
        self._binary = "binary_tensor_data" in extensions
        return self._binary

    def _get_json(self, path: str, retry: bool = True, deadline_s: float | None = None) -> dict:
        def read(resp: Response) -> dict:
            data = json.loads(resp.body)
            if not isinstance(data, dict):
                raise ValueError(f"GET {path} answered with {type(data).__name__}, not a JSON object")
            return data

        return self._call("GET", self.url + path, None, {}, retry=retry, deadline_s=deadline_s, read=read)

    def _headers(self, extra: Mapping[str, str]) -> dict:
        headers = {"Accept": "application/json", **extra}
        if self._token_env is not None:
            token = os.environ.get(self._token_env)
            if not token:
                raise CloudError(CloudReason.NO_TOKEN, f"the environment variable {self._token_env} that should hold "
                                                       "the cloud token is not set")
        elif callable(self._token):
            try:
                token = self._token()
            except Exception as exc:  # the app's callback: its message may hold anything, so it is not quoted
                raise CloudError(CloudReason.NO_TOKEN, f"the token callback raised {type(exc).__name__}") from None
        else:
            token = self._token
        if token:
            if not isinstance(token, str) or any(c in token for c in "\r\n") or not token.isascii():
                raise CloudError(CloudReason.NO_TOKEN,
                                 "the cloud token must be a single line of ASCII text (it is not shown)")
            headers["Authorization"] = f"Bearer {token.strip()}"
            self._sent.token = token.strip()
        return headers

    def _clean(self, text: str) -> str:
        """Our message around a server's words, made safe to keep (:func:`~.v2_codec.clean`, this thread's token)."""
        return clean(text, (getattr(self._sent, "token", None),), MAX_DETAIL_CHARS)

    def _call(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], *, retry: bool = True,
              deadline_s: float | None = None, max_bytes: int | None = None,
              read: Callable[[Response], Any] = lambda resp: resp) -> Any:
        """One call (with its retries) through the circuit breaker, which counts calls, not attempts: a fault
        that a retry rescued says nothing bad about the endpoint. ``read`` turns the response into the answer
        inside the breaker's accounting (a malformed answer is the endpoint's failure). Every failure is a
        :class:`CloudError`, whatever raised it."""
        with self._lock:
            self._stats["calls"] += 1
        ticket = self.breaker.allow()
        if ticket is None:
            raise self._fail(CloudUnavailable(CloudReason.CIRCUIT_OPEN, f"the circuit to {self.url} is open after "
                                                                        "repeated failures; calls fail at once until a "
                                                                        "probe succeeds"))
        ok = False
        if max_bytes is None:
            max_bytes = max(METADATA_MAX_BYTES, self.max_response_bytes or 0)
        try:
            try:
                resp = self._attempts(method, url, body, headers, retry, deadline_s, max_bytes)
            except CloudError:
                raise
            except Exception as exc:  # the transport failed in a way no OSError covers: still a CloudError
                detail = f"{method} {urlsplit(url).path}: {type(exc).__name__}: {_safe(exc)}"
                raise self._fail(CloudError(CloudReason.TRANSPORT_ERROR, detail, None, 1)) from None
            try:
                answer = read(resp)
            except CloudError as exc:
                exc.attempts = max(exc.attempts, 1)
                raise self._fail(exc)
            except Exception as exc:  # a malformed answer or anything unforeseen: never past the caller's fallback
                raise self._fail(CloudError(CloudReason.BAD_RESPONSE, f"{method} {urlsplit(url).path}: "
                                                                      f"{type(exc).__name__}: {_safe(exc)}",
                                            resp.status, 1)) from None
            ok = True
            with self._lock:
                self._stats["ok"] += 1
            return answer
        except CloudError as exc:
            # Nothing sent (no token, no time left): the call says nothing about the endpoint either way.
            ok = None if exc.attempts == 0 else exc.reason not in SERVER_FAILURES
            raise
        finally:
            self.breaker.record(ticket, ok)  # always settled, so a probe can never be left hanging

    def _attempts(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], retry: bool,
                  deadline_s: float | None, max_bytes: int) -> Response:
        start = self._clock()
        deadline = start + (deadline_s if deadline_s is not None else self.deadline_s)
        path = urlsplit(url).path
        self.retry_budget.deposit()
        attempts, status, last = 0, None, "unreachable"  # what the last attempt did, for messages
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise self._fail(CloudTimeout(CloudReason.TIMEOUT, f"{method} {path}: no answer within the deadline "
                                              f"({deadline - start:.3f} s, {attempts} attempts; last: {last})",
                                              status, attempts))
            attempts += 1
            with self._lock:
                self._stats["attempts"] += 1
            t0 = self._clock()
            retry_after = None
            try:
                resp = self._transport.request(method, url, self._headers(headers), body,
                                               min(self.timeout_s, remaining), max_bytes)
            except (TimeoutError, socket.timeout):
                last, status = CloudReason.TIMEOUT, None
            except ResponseTooLarge as exc:  # the same server would send it again: not retried
                raise self._fail(CloudError(CloudReason.RESPONSE_TOO_LARGE, f"{method} {path}: {exc} (raise it with "
                                            "max_response_bytes=)", None, attempts)) from None
            except ssl.SSLCertVerificationError as exc:  # it will not verify on a retry either
                raise self._fail(CloudUnavailable(CloudReason.TLS, f"{method} {path}: the TLS connection to "
                                                                   f"{self.url} failed ({type(exc).__name__}: {exc}); "
                                                                   "pass cafile= for a private CA",
                                                  None, attempts)) from exc
            except OSError as exc:
                last, status = f"unreachable ({type(exc).__name__})", None
            else:
                status = resp.status
                log.debug("%s %s -> %d in %.1f ms (attempt %d)", method, path, status, (self._clock() - t0) * 1e3,
                          attempts)
                if 200 <= status < 300:
                    return resp
                message = _error_message(resp, (getattr(self._sent, "token", None),))
                if status not in RETRYABLE_STATUS:
                    # The request is at fault (4xx) or the server failed it for good (500): not retried. A
                    # 4xx says nothing about the server's health.
                    cls = CloudRejected if 400 <= status < 500 else CloudError
                    reason = CloudReason.REJECTED if 400 <= status < 500 else CloudReason.SERVER_ERROR
                    raise self._fail(cls(reason, f"{method} {path} answered {status}: {message}", status,
                                         attempts))
                last = f"{status} {message}"
                retry_after = _retry_after(resp)
            log.debug("%s %s failed (attempt %d): %s", method, path, attempts, last)
            if not retry or attempts >= self.max_attempts:
                break
            pause = self._rng.uniform(0.0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** (attempts - 1)))
            if retry_after is not None:
                if self._clock() + retry_after >= deadline:
                    raise self._fail(CloudUnavailable(CloudReason.OVERLOADED,
                                                      f"{method} {path}: the server asks to retry after "
                                                      f"{retry_after:g} s, past the deadline ({last})", status,
                                                      attempts))
                pause = max(pause, retry_after)
            if self._clock() + pause >= deadline:
                cls, reason = (CloudTimeout, CloudReason.TIMEOUT) if last == CloudReason.TIMEOUT else \
                    (CloudUnavailable,
                     CloudReason.OVERLOADED if status in RETRYABLE_STATUS else CloudReason.UNREACHABLE)
                raise self._fail(cls(reason, f"{method} {path}: the deadline leaves no time for another attempt "
                                             f"({attempts} made; last: {last})", status, attempts))
            if not self.retry_budget.withdraw():
                raise self._fail(CloudUnavailable(CloudReason.RETRY_BUDGET, f"{method} {path} failed ({last}) and the "
                                                                            "retry budget is spent: the endpoint is "
                                                                            "failing too often to retry",
                                                  status, attempts))
            with self._lock:
                self._stats["retries"] += 1
            self._sleep(pause)
        reason = CloudReason.TIMEOUT if last == CloudReason.TIMEOUT else \
            CloudReason.OVERLOADED if status in RETRYABLE_STATUS else CloudReason.UNREACHABLE
        cls = CloudTimeout if reason == CloudReason.TIMEOUT else CloudUnavailable
        raise self._fail(cls(reason, f"{method} {path} failed after {attempts} attempt"
                                     f"{'' if attempts == 1 else 's'}: {last}", status, attempts))

    def _fail(self, exc: CloudError) -> CloudError:
        exc.detail = self._clean(exc.detail)  # whatever of a server's text it quotes
        exc.args = (f"{exc.reason}: {exc.detail}",)
        with self._lock:
            self._stats["failures"][exc.reason] = self._stats["failures"].get(exc.reason, 0) + 1
        return exc


def _datatype(value: Any) -> Any:
    """A datatype as the server's metadata spells it, made comparable: upper case, without the ``TYPE_`` prefix of
    Triton's model configuration (``fp32``, ``FP32`` and ``TYPE_FP32`` are one type); anything but a string as it
    is (it then matches nothing)."""
    if not isinstance(value, str):
        return value
    value = value.strip().upper()
    return value[len("TYPE_"):] if value.startswith("TYPE_") else value


def _safe_text(value: Any) -> str:
    """A value from the server's metadata as short text (whatever JSON type it is)."""
    return (value if isinstance(value, str) else repr(value))[:80]


__all__ = ["check_url", "CloudClient", "CircuitBreaker", "RetryBudget", "HttpTransport", "Response", "Transport",
           "ResponseTooLarge", "ExpectedOutput", "DATATYPES"]
