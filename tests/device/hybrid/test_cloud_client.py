"""The V2 cloud client's own logic: retries, backoff, budget, breaker, deadline, token, URL rules and the wire format.

These drive the client through a scripted transport (the injectable-transport idea of httpx's MockTransport) on a
fake clock, so every timing decision is exact; the same client against a real server on loopback, through a
fault-injecting proxy, is in test_cloud_interop.py.
"""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

# _decode/_encode: the V2 wire format alone
from edgesdk.hybrid.client import CircuitBreaker, CloudClient, Response, RetryBudget, _decode, _encode
from edgesdk.hybrid.transport import MockTransport, Request
from edgesdk.errors import CloudError, CloudRejected, CloudTimeout, CloudUnavailable, InputError
from support import FakeClock, self_signed_cert


Clock = FakeClock


def ok_body(rid: str | None = None) -> bytes:
    out = {"model_name": "digits", "outputs": [{"name": "output_0", "shape": [1, 3], "datatype": "FP32",
                                                "data": [0.1, 0.7, 0.2]}]}
    if rid is not None:
        out["id"] = rid
    return json.dumps(out).encode()


class Script(MockTransport):
    """The shipped mock transport, answering from a list: a status code, an exception instance, or a Response;
    ``requests`` records each request (a Request). ``cost_s`` is how much fake time each attempt takes."""

    def __init__(self, clock: Clock, *steps, cost_s: float = 0.01):
        super().__init__(self._answer)
        self.clock, self.steps, self.cost_s = clock, list(steps), cost_s

    def _answer(self, request: Request) -> Response:
        self.clock.t += self.cost_s
        step = self.steps.pop(0) if self.steps else 200
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Response):
            return step
        if step == 200:
            rid = json.loads(request.body)["id"] if request.body else None
            return Response(200, {}, ok_body(rid) if request.method == "POST" else b'{"live": true}')
        return Response(step, {}, json.dumps({"error": f"status {step} from the script"}).encode())


def client(clock, transport, **options) -> CloudClient:
    options = {"binary": False, "rng": random.Random(0), "deadline_s": 5.0, "timeout_s": 1.0, **options}
    return CloudClient("http://127.0.0.1:9", "digits", transport=transport, clock=clock, sleep=clock.sleep, **options)


X = [np.zeros((1, 1, 8, 8), np.float32)]


def test_a_good_call_returns_the_outputs_and_sends_json():
    clock = Clock()
    script = Script(clock, 200)
    outs = client(clock, script).infer(X, ["x"], request_id="r1")
    assert len(outs) == 1 and outs[0].dtype == np.float32 and outs[0].shape == (1, 3)
    sent = json.loads(script.requests[0].body)
    assert sent["id"] == "r1" and sent["inputs"][0] == {"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                                         "data": [0.0] * 64}
    assert script.requests[0].url == "http://127.0.0.1:9/v2/models/digits/infer"


def test_retryable_failures_are_retried_with_capped_full_jitter_backoff():
    clock = Clock()
    script = Script(clock, ConnectionResetError("reset"), 503, 429, 200)
    c = client(clock, script, max_attempts=4, backoff_base_s=0.1, backoff_cap_s=0.25)
    assert c.infer(X, ["x"])[0].shape == (1, 3)
    assert len(script.requests) == 4
    caps = [0.1, 0.2, 0.25]  # base * 2**n, capped
    assert len(clock.sleeps) == 3 and all(0 <= s <= cap for s, cap in zip(clock.sleeps, caps))
    assert c.stats()["retries"] == 3 and c.stats()["ok"] == 1


def test_jitter_is_full_jitter():
    """Over many draws the pauses spread over [0, cap], not around the cap (the point of full jitter)."""
    clock = Clock()
    pauses = []
    for seed in range(200):
        script = Script(clock, 503, 200)
        client(clock, script, rng=random.Random(seed), backoff_base_s=0.1).infer(X, ["x"])
    pauses = clock.sleeps
    assert min(pauses) < 0.01 and max(pauses) > 0.09 and 0.04 < sum(pauses) / len(pauses) < 0.06


@pytest.mark.parametrize("status", [400, 404, 422])
def test_a_rejection_is_not_retried_and_carries_the_server_message(status):
    clock = Clock()
    script = Script(clock, status)
    with pytest.raises(CloudRejected, match=f"answered {status}: status {status} from the script") as caught:
        client(clock, script).infer(X, ["x"])
    assert caught.value.status == status and caught.value.reason == "rejected" and caught.value.attempts == 1
    assert len(script.requests) == 1 and clock.sleeps == []


def test_a_500_is_a_server_error_not_retried():
    clock = Clock()
    script = Script(clock, 500)
    with pytest.raises(CloudError, match="answered 500") as caught:
        client(clock, script).infer(X, ["x"])
    assert caught.value.reason == "server_error" and len(script.requests) == 1


def test_attempts_are_capped_and_the_last_failure_is_named():
    clock = Clock()
    script = Script(clock, 503, 503, 503, 200)
    with pytest.raises(CloudUnavailable, match=r"failed after 3 attempts: 503 status 503") as caught:
        client(clock, script, max_attempts=3).infer(X, ["x"])
    assert caught.value.reason == "overloaded" and caught.value.attempts == 3 and caught.value.status == 503


def test_the_deadline_bounds_the_whole_call_and_each_attempt():
    clock = Clock()
    script = Script(clock, TimeoutError("slow"), TimeoutError("slow"), 200, cost_s=0.4)
    c = client(clock, script, deadline_s=0.5, timeout_s=0.3, max_attempts=5, backoff_base_s=0.05)
    with pytest.raises(CloudTimeout) as caught:
        c.infer(X, ["x"])
    assert caught.value.reason == "timeout"
    assert script.requests[0].timeout_s == pytest.approx(0.3)  # min(timeout_s, remaining)
    assert all(r.timeout_s <= 0.5 for r in script.requests)
    assert clock.t <= 0.5 + 0.4 + 1e-9  # at most one attempt's cost past the deadline (the fake transport overruns)


def test_retry_after_is_honoured_within_the_cap():
    clock = Clock()
    script = Script(clock, Response(503, {"retry-after": "0.2"}, b'{"error": "busy"}'), 200)
    client(clock, script, backoff_base_s=0.01).infer(X, ["x"])
    assert clock.sleeps == [pytest.approx(0.2)]


def test_the_retry_budget_limits_retries_to_a_share_of_calls():
    clock = Clock()
    budget = RetryBudget(ratio=0.1, reserve=2)
    script = Script(clock, *([503] * 1000))
    c = client(clock, script, retry_budget=budget, max_attempts=3, breaker=CircuitBreaker(min_calls=20, window=20,
                                                                                         failure_rate=1.0,
                                                                                         cooldown_s=0))
    reasons = []
    for _ in range(50):
        with pytest.raises(CloudError) as caught:
            c.infer(X, ["x"])
        reasons.append(caught.value.reason)
    stats = c.stats()
    assert stats["retries"] <= 0.1 * stats["calls"] + 2
    assert "retry_budget" in reasons and stats["retries_refused"] > 0


def test_the_breaker_opens_fails_fast_and_recovers_after_a_probe():
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=0.5, window=10, min_calls=4, cooldown_s=5.0, clock=clock)
    script = Script(clock, *([ConnectionRefusedError("down")] * 4))
    c = client(clock, script, breaker=breaker, max_attempts=1)
    for _ in range(4):
        with pytest.raises(CloudUnavailable, match="unreachable"):
            c.infer(X, ["x"])
    assert breaker.state == "open" and breaker.opened == 1
    sent = len(script.requests)
    with pytest.raises(CloudUnavailable, match="circuit .* is open") as caught:
        c.infer(X, ["x"])
    assert caught.value.reason == "circuit_open" and len(script.requests) == sent  # failed at once, nothing sent
    clock.t += 5.0  # cool-down passed: one probe goes through and succeeds
    assert c.infer(X, ["x"])[0].shape == (1, 3)
    assert breaker.state == "closed" and breaker.recovered == 1


def test_a_failed_probe_opens_the_breaker_again():
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=1.0, window=2, min_calls=2, cooldown_s=1.0, clock=clock)
    script = Script(clock, 503, 503, 503)
    c = client(clock, script, breaker=breaker, max_attempts=1)
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            c.infer(X, ["x"])
    clock.t += 1.0
    with pytest.raises(CloudUnavailable, match="overloaded|503"):
        c.infer(X, ["x"])  # the probe
    assert breaker.state == "open" and breaker.opened == 2


def test_rejections_do_not_open_the_breaker():
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=0.5, window=4, min_calls=2, clock=clock)
    c = client(clock, Script(clock, 400, 400, 400, 400), breaker=breaker)
    for _ in range(4):
        with pytest.raises(CloudRejected):
            c.infer(X, ["x"])
    assert breaker.state == "closed"


def test_bearer_token_from_the_environment_is_sent_and_never_logged(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setenv("EDGESDK_TEST_TOKEN", "s3cret-token")
    script = Script(clock, 503, 200)
    c = client(clock, script, token_env="EDGESDK_TEST_TOKEN")
    with caplog.at_level(logging.DEBUG, logger="edgesdk.hybrid"):
        c.infer(X, ["x"])
    assert all(r.headers["Authorization"] == "Bearer s3cret-token" for r in script.requests)
    assert caplog.records and "s3cret" not in caplog.text and "s3cret" not in repr(c)
    assert '"data"' not in caplog.text  # no request body either
    monkeypatch.delenv("EDGESDK_TEST_TOKEN")
    with pytest.raises(CloudError, match="EDGESDK_TEST_TOKEN .* is not set"):
        c.infer(X, ["x"])


def test_a_token_callback_is_called_per_request():
    clock = Clock()
    tokens = iter(["a", "b"])
    script = Script(clock, 200, 200)
    c = client(clock, script, token=lambda: next(tokens))
    c.infer(X, ["x"])
    c.infer(X, ["x"])
    assert [r.headers["Authorization"] for r in script.requests] == ["Bearer a", "Bearer b"]


@pytest.mark.parametrize("url, message", [
    ("http://cloud.example.com:8080", "plain http to a non-loopback host"),
    ("ftp://127.0.0.1", "must be http"),
    ("https://user:pw@cloud.example.com", "must not carry credentials"),
    ("127.0.0.1:8080", "must be http"),
])
def test_bad_urls_are_refused(url, message):
    with pytest.raises(InputError, match=message):
        CloudClient(url, "digits")


def test_loopback_http_is_allowed_and_insecure_http_needs_opting_in():
    assert CloudClient("http://localhost:8080/", "digits").url == "http://localhost:8080"
    assert CloudClient("http://[::1]:8080", "digits").url == "http://[::1]:8080"
    assert CloudClient("http://10.0.0.5:8080", "digits", allow_insecure_http=True).url == "http://10.0.0.5:8080"


def test_binary_encoding_round_trips_and_names_its_header_length():
    arrays = [np.arange(6, dtype=np.float32).reshape(1, 6), np.array([[1, 2]], np.int64)]
    body, headers = _encode(arrays, ["a", "b"], "rid", binary=True)
    n = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:n])
    assert header["parameters"] == {"binary_data_output": True}
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [24, 16]
    reply = json.dumps({"id": "rid", "outputs": [
        {"name": "a", "shape": [1, 6], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
        {"name": "b", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}]}).encode()
    resp = Response(200, {"inference-header-content-length": str(len(reply))}, reply + body[n:])
    a, b = _decode(resp, "rid")
    np.testing.assert_array_equal(a, arrays[0])
    np.testing.assert_array_equal(b, arrays[1])


SHORT = b'{"outputs": [{"name": "o", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}'


@pytest.mark.parametrize("body, headers, message", [
    (b"not json", {}, "not valid V2"),
    (b'{"outputs": [{"name": "o", "shape": [2], "datatype": "FP32", "data": [1.0]}]}', {}, "not valid V2"),
    (b'{"id": "other", "outputs": []}', {}, "answers request 'other'"),
    (SHORT, {"inference-header-content-length": str(len(SHORT))}, "needs 4 bytes"),
])
def test_malformed_responses_are_bad_response_errors(body, headers, message):
    with pytest.raises(CloudError, match=message) as caught:
        _decode(Response(200, headers, body), "rid")
    assert caught.value.reason == "bad_response"


def test_fp16_needs_the_binary_extension():
    with pytest.raises(InputError, match="FP16, which cannot travel as JSON"):
        _encode([np.zeros(2, np.float16)], ["h"], "rid", binary=False)


def test_binary_is_used_when_the_server_lists_it():
    clock = Clock()
    meta = Response(200, {}, json.dumps({"name": "srv", "extensions": ["binary_tensor_data"]}).encode())
    reply = json.dumps({"outputs": [{"name": "o", "shape": [1], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    answer = Response(200, {"inference-header-content-length": str(len(reply))},
                      reply + np.float32(2.5).tobytes())
    script = Script(clock, meta, answer)
    c = CloudClient("http://127.0.0.1:9", "digits", transport=script, clock=clock, sleep=clock.sleep)
    assert c.infer(X, ["x"])[0].tolist() == [2.5]
    assert script.requests[1].headers["Content-Type"] == "application/octet-stream"


def test_check_inputs_names_every_difference():
    clock = Clock()
    meta = {"name": "digits", "inputs": [{"name": "x", "datatype": "FP16", "shape": [-1, 1, 8, 9]}],
            "outputs": []}
    c = client(clock, Script(clock, Response(200, {}, json.dumps(meta).encode())))
    with pytest.raises(CloudError, match=r"'x' is FP16 there, FP32 here; input 'x' has shape \[-1, 1, 8, 9\]") as e:
        c.check_inputs([{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}])
    assert e.value.reason == "model_mismatch"
    meta["inputs"][0].update(datatype="FP32", shape=[-1, 1, 8, 8])
    c = client(clock, Script(clock, Response(200, {}, json.dumps(meta).encode())))
    assert c.check_inputs([{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}])["name"] == "digits"


# -- TLS, on a real socket ------------------------------------------------------------------------------------

@pytest.fixture
def https_server(tmp_path):
    """A loopback HTTPS server with a fresh self-signed certificate for 127.0.0.1, answering /v2/health/live."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    cert, key = self_signed_cert(tmp_path)

    class Live(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"live": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Live)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def test_tls_certificates_are_verified(https_server):
    url, cert = https_server
    untrusted = CloudClient(url, "digits")
    with pytest.raises(CloudUnavailable, match="SSLCertVerificationError") as caught:
        untrusted.live()
    assert caught.value.reason == "tls" and caught.value.attempts == 1  # not retried
    trusted = CloudClient(url, "digits", cafile=str(cert))
    assert trusted.live()


# -- review findings: nothing but CloudError escapes, the breaker always settles ------------------------------

@pytest.mark.parametrize("body", [
    b'{"outputs": [{"name": "o", "shape": [Infinity], "datatype": "FP32", "data": [1.0]}]}',
    b'{"outputs": [{"name": "o", "shape": [1], "datatype": "INT64", "data": [1e400]}]}',
    b'{"outputs": [{"name": "o", "shape": null, "datatype": "FP32", "data": [1.0]}]}',
    b'<html>captive portal</html>',
    b'{"outputs": []}',
])
def test_a_malformed_answer_is_a_bad_response_that_counts_against_the_endpoint(body):
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=1.0, window=2, min_calls=2, cooldown_s=5.0, clock=clock)
    c = client(clock, Script(clock, Response(200, {}, body), Response(200, {}, body)), breaker=breaker)
    for _ in range(2):
        with pytest.raises(CloudError) as caught:
            c.infer(X, ["x"])
        assert caught.value.reason == "bad_response" and caught.value.attempts == 1
    assert breaker.state == "open" and c.stats()["ok"] == 0


def test_malformed_model_metadata_is_a_cloud_error():
    """(Metadata that says nothing, ``"inputs": null`` or an input without a shape, is unknown, not malformed:
    test_adversarial_cloud.test_metadata_that_says_nothing_is_unknown_not_a_mismatch.)"""
    clock = Clock()
    for meta in (b'{"inputs": "x"}', b'{"inputs": ["x"]}', b'{"inputs": [{"shape": [1, 1, 8, 8]}]}'):
        c = client(clock, Script(clock, Response(200, {}, meta)))
        with pytest.raises(CloudError):
            c.check_inputs([{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}])


@pytest.mark.parametrize("token", ["sk-live-SECRET123\n", "sk-live-SECRET123\r\nX-Evil: 1", "sk-live-SECRÉT123"])
def test_a_bad_token_is_refused_without_showing_it(token):
    clock = Clock()
    script = Script(clock, 200)
    with pytest.raises(CloudError) as caught:
        client(clock, script, token=token).infer(X, ["x"])
    assert caught.value.reason == "no_token" and "SECRET" not in str(caught.value) and "SECR" not in str(caught.value)
    assert script.requests == []  # nothing sent


def test_a_token_callback_that_raises_does_not_leak_or_hang_the_probe():
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=1.0, window=2, min_calls=2, cooldown_s=1.0, clock=clock)
    calls = {"n": 0}

    def token():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("keyring locked: password=hunter2")
        return "ok-token"

    c = client(clock, Script(clock, 503, 503, 200, 200), breaker=breaker, token=token, max_attempts=1)
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            c.infer(X, ["x"])
    assert breaker.state == "open"
    clock.t += 1.0
    with pytest.raises(CloudError, match="token callback raised RuntimeError") as caught:
        c.infer(X, ["x"])  # the probe's token callback fails: nothing is sent
    assert "hunter2" not in str(caught.value)
    assert breaker.state == "half_open"  # the probe was handed back, not lost
    assert c.infer(X, ["x"])[0].shape == (1, 3)  # the next call probes, succeeds, and closes it
    assert breaker.state == "closed"


def test_a_stale_call_does_not_decide_the_probe():
    clock = Clock()
    breaker = CircuitBreaker(failure_rate=1.0, window=2, min_calls=2, cooldown_s=1.0, clock=clock)
    stale = breaker.allow()  # let through while closed, still in flight
    for _ in range(2):
        breaker.record(breaker.allow(), False)
    assert breaker.state == "open"
    clock.t += 1.0
    probe = breaker.allow()
    assert probe is not None and probe[1] and breaker.allow() is None  # one probe at a time
    breaker.record(stale, True)  # the old call's success arrives now: ignored
    assert breaker.state == "half_open"
    breaker.record(probe, False)
    assert breaker.state == "open" and breaker.opened == 2


def test_retry_after_past_the_deadline_fails_at_once():
    clock = Clock()
    script = Script(clock, Response(503, {"retry-after": "30"}, b'{"error": "maintenance"}'), 200)
    with pytest.raises(CloudUnavailable, match="retry after 30 s, past the deadline") as caught:
        client(clock, script, deadline_s=2.0).infer(X, ["x"])
    assert caught.value.reason == "overloaded" and clock.sleeps == [] and len(script.requests) == 1


def test_an_unforeseen_transport_error_is_a_cloud_error():
    clock = Clock()
    with pytest.raises(CloudError) as caught:
        client(clock, Script(clock, ValueError("Invalid header value"))).infer(X, ["x"])
    assert caught.value.reason == "transport_error"


def test_many_threads_share_one_client():
    """8 threads x 100 calls through a transport that resets 30% of requests: every call ends in outputs or a
    CloudError, and the counters add up."""
    import threading

    rng = random.Random(3)
    lock = threading.Lock()

    class Flaky:
        def request(self, method, url, headers, body, timeout_s, max_bytes=None):
            with lock:
                fail = rng.random() < 0.3
            if fail:
                raise ConnectionResetError("reset")
            return Response(200, {}, ok_body(json.loads(body)["id"]))

        def close(self):
            pass

    c = CloudClient("http://127.0.0.1:9", "digits", transport=Flaky(), binary=False, backoff_base_s=0.0,
                    backoff_cap_s=0.0)
    outcomes = []

    def work():
        for _ in range(100):
            try:
                c.infer(X, ["x"])
                outcome = "ok"
            except CloudError as exc:
                outcome = exc.reason
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = c.stats()
    assert len(outcomes) == 800 and stats["calls"] == 800
    assert stats["ok"] == outcomes.count("ok") and stats["ok"] + sum(stats["failures"].values()) == 800
    assert stats["attempts"] == stats["calls"] - stats["failures"].get("circuit_open", 0) + stats["retries"]
