"""``edgesdk serve`` attacked over loopback: the repository API, oversized and malformed requests, NaN inputs,
credentials in error bodies, and a bounded flood (bodies, batches, slow senders). The servers are started through
:func:`edgesdk_cloud.server.serve` (the options the command line lacks); every socket has a timeout, every body sent
is small or only declared, so a regression fails a test instead of hanging or exhausting the machine."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest

from cloud_server import CloudServer, call
from edgesdk.errors import InputError
from edgesdk_cloud.limits import HEADER_TIMEOUT_S, MAX_CONNECTIONS, ServeLimits

TOKEN = "repo-token-0123456789abcdef"
CLIENT_TOKEN = "client-bearer-7f3a9c2e51"
X = [0.25] * 64


def tensor(batch: int = 1, data=None, **fields) -> dict:
    return {"name": "x", "shape": [batch, 1, 8, 8], "datatype": "FP32", "data": X * batch if data is None else data,
            **fields}


@pytest.fixture(scope="module")
def plain(digits_bundle, tmp_path_factory):
    """serve with its defaults."""
    with CloudServer(digits_bundle.bundle, log_dir=tmp_path_factory.mktemp("plain"), options={}) as running:
        yield running


@pytest.fixture(scope="module")
def guarded(digits_bundle, tmp_path_factory):
    """serve with the repository API on behind a token, a short body deadline and a small batch cap, started from
    the command line (the token comes from an environment variable, never from argv)."""
    os.environ["EDGESDK_TEST_REPOSITORY_TOKEN"] = TOKEN  # the server process inherits it
    try:
        with CloudServer(digits_bundle.bundle, "--repository-token-env", "EDGESDK_TEST_REPOSITORY_TOKEN",
                         "--body-timeout", "2", "--max-batch", "8",
                         log_dir=tmp_path_factory.mktemp("guarded")) as running:
            yield running
    finally:
        os.environ.pop("EDGESDK_TEST_REPOSITORY_TOKEN", None)


def raw(server: CloudServer, head: str, body: bytes = b"", timeout_s: float = 10) -> tuple[int, dict, float]:
    """Send ``head`` (request line and headers) and ``body`` on a raw socket; the status, the JSON answer, and the
    seconds it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + body)
        return (*_response(s), time.monotonic() - start)


def _response(s: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += s.recv(65536)
    return int(head.split()[1]), json.loads(rest[:length])


def post_head(server: CloudServer, length: int | None, path: str = "/v2/models/digits/infer", extra: str = "") -> str:
    size = f"Content-Length: {length}\n" if length is not None else "Transfer-Encoding: chunked\n"
    return f"POST {path} HTTP/1.1\nHost: 127.0.0.1:{server.port}\nContent-Type: application/json\n{size}{extra}\n"


# -- finding 5 (high): the model-repository API ---------------------------------------------------------------

@pytest.mark.parametrize("route", ["/v2/repository/models/digits/unload", "/v2/repository/models/digits/load",
                                   "/v2/repository/index"])
def test_the_repository_api_is_off_by_default(plain, route):
    status, answer = call(f"{plain.url}{route}", {}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 404 and "repository API (load, unload) is off" in answer["error"], answer
    assert call(f"{plain.url}/v2/health/ready") == (200, {"ready": True})
    assert plain.infer({"inputs": [tensor()]})[0] == 200


def test_with_a_token_unload_needs_it_and_readiness_follows_the_model(guarded):
    unload, load = (f"{guarded.url}/v2/repository/models/digits/{verb}" for verb in ("unload", "load"))
    for headers in ({}, {"Authorization": "Bearer wrong-token-xxxxxxxxxx"}, {"Authorization": TOKEN}):
        status, answer = call(unload, {}, headers=headers)
        assert status == 401 and "wrong-token" not in json.dumps(answer), answer
    assert guarded.infer({"inputs": [tensor()]})[0] == 200
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert call(unload, {}, headers=bearer) == (200, {"name": "digits", "unload": True})
    try:
        assert call(f"{guarded.url}/v2/health/ready")[0] == 503  # was 200 with no model at all
        assert guarded.infer({"inputs": [tensor()]})[0] in (404, 503)
    finally:
        assert call(load, {}, headers=bearer) == (200, {"name": "digits", "load": True})
    assert call(f"{guarded.url}/v2/health/ready") == (200, {"ready": True})
    assert guarded.infer({"inputs": [tensor()]})[0] == 200


def test_a_short_repository_token_is_refused():
    from edgesdk_cloud.server import serve

    with pytest.raises(InputError, match="repository_token must be at least 16 printable characters"):
        serve("unused.bundle", repository_token="short")


# -- medium: request size, batch size, malformed requests, NaN --------------------------------------------------

def test_a_declared_200_mb_body_is_a_413_before_it_is_sent(plain):
    status, answer, seconds = raw(plain, post_head(plain, 200_000_000))
    assert status == 413 and "edgesdk serve takes at most 196608" in answer["error"], answer
    assert seconds < 5


def test_a_chunked_body_past_the_cap_is_a_413_as_soon_as_it_passes(plain):
    chunk = b"0" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8))  # 512 KiB, never terminated
    status, answer, _ = raw(plain, post_head(plain, None), body)
    assert status == 413 and "is over" in answer["error"], answer


def test_a_batch_over_the_cap_is_a_400_naming_max_batch(plain, guarded):
    assert plain.infer({"inputs": [tensor(64)]})[0] == 200  # the default cap, 64, fits in the default body cap
    status, answer = plain.infer({"inputs": [tensor(65)]})
    assert status == 400 and "has a batch of 65; this server takes at most 64" in answer["error"], answer
    status, answer = guarded.infer({"inputs": [tensor(9)]})
    assert status == 400 and "at most 8 per request (max_batch)" in answer["error"], answer
    body = json.dumps({"inputs": [tensor(20_000, data=[0] * 64 * 20_000)]}).encode()
    status, answer, _ = raw(plain, post_head(plain, len(body)))  # refused on its Content-Length: nothing sent
    assert status == 413 and f"the request body is {len(body)} bytes" in answer["error"], answer


def test_more_values_than_a_full_request_holds_is_a_413_before_parsing(plain):
    body = json.dumps({"inputs": [tensor(data=[0] * 20_000)]}).encode()  # 60 KB, under the byte cap
    status, answer, _ = raw(plain, post_head(plain, len(body)), body)
    assert status == 413 and "holds more than 4096 values" in answer["error"], answer


def binary(header: dict, payload: bytes, length: str | None = None) -> tuple[str, bytes]:
    head = json.dumps(header).encode()
    return length or str(len(head)), head + payload


BINARY_MISUSES = {
    "short tensor": ({"inputs": [{**tensor(data=None), "data": None, "parameters": {"binary_data_size": 12}}]},
                     b"\0" * 12, None, "cannot reshape array of size 3"),
    "header length not a number": ({"inputs": []}, b"", "abc", "Inference-Header-Content-Length must be"),
    "header length past the body": ({"inputs": []}, b"", "999", "at most the body's"),
    "no inputs": ({}, b"", None, "lacks the field 'inputs'"),
    "header not an object": ([1], b"", None, "does not match the V2 binary tensor format"),
    "NaN in binary": ({"inputs": [{**tensor(data=None), "data": None, "parameters": {"binary_data_size": 256}}]},
                      struct.pack("<64f", *([float("nan")] + X[1:])), None, "holds NaN or infinite values"),
}


@pytest.mark.parametrize("misuse", BINARY_MISUSES, ids=list(BINARY_MISUSES))
def test_a_malformed_binary_request_is_a_400_naming_the_problem(plain, misuse):
    header, payload, length, message = BINARY_MISUSES[misuse]
    if isinstance(header, dict) and header.get("inputs"):
        header["inputs"][0].pop("data")
    length, body = binary(header, payload, length)
    head = post_head(plain, len(body), extra=f"Inference-Header-Content-Length: {length}\n")
    status, answer, _ = raw(plain, head.replace("application/json", "application/octet-stream"), body)
    assert status == 400 and message in answer["error"], answer


JSON_MISUSES = {
    "data is an object": ({"inputs": [tensor(data={"a": 1})]}, "inputs.0.data: Input should be a valid list"),
    "inputs is an object": ({"inputs": {"a": 1}}, "inputs: Input should be a valid list"),
    "data holds objects": ({"inputs": [tensor(data=[{"a": 1}] * 64)]}, "its data does not fill shape"),
    "NaN": ({"inputs": [tensor(data=[float("nan")] * 64)]}, "holds NaN or infinite values (the first at flat index 0)"),
    "Infinity": ({"inputs": [tensor(data=X[:5] + [float("inf")] + X[6:])]}, "the first at flat index 5"),
}


@pytest.mark.parametrize("misuse", JSON_MISUSES, ids=list(JSON_MISUSES))
def test_a_malformed_json_request_is_a_400_with_a_message_not_500_or_null(plain, misuse):
    body, message = JSON_MISUSES[misuse]
    status, answer = plain.infer(body)  # json.dumps writes NaN and Infinity, as Python clients do
    assert status == 400 and message in answer["error"] and "input" not in answer, answer


def test_invalid_json_is_a_400(plain):
    status, answer, _ = raw(plain, post_head(plain, 5), b"{nope")
    assert status == 400 and answer["error"].startswith("the request body is not valid JSON"), answer


# -- low: error bodies never repeat a credential -----------------------------------------------------------------

def test_no_error_body_repeats_the_bearer_token(plain):
    auth = {"Authorization": f"Bearer {CLIENT_TOKEN}", "Cookie": f"session={CLIENT_TOKEN}x"}
    echoed = {"inputs": [{**tensor(), "name": CLIENT_TOKEN}]}  # a client that mixed up its fields
    status, answer = plain.infer(echoed, headers=auth)
    assert status == 400 and CLIENT_TOKEN not in json.dumps(answer), answer
    assert "withheld because it repeated a credential" in answer["error"]
    for path, body in ((f"/v2/models/{CLIENT_TOKEN}/infer", {"inputs": [tensor()]}),
                       ("/v2/models/digits/infer", {"inputs": [tensor(data=[float("nan")] * 64)]}),
                       ("/v2/repository/models/digits/unload", {})):
        status, answer = call(f"{plain.url}{path}", body, headers=auth)
        assert status >= 400 and CLIENT_TOKEN not in json.dumps(answer), answer
    assert plain.infer(echoed)[1]["error"].startswith(f"model 'digits' has no input named '{CLIENT_TOKEN}'")


# -- the flood -----------------------------------------------------------------------------------------------------

def slow_sender(server: CloudServer) -> int:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(post_head(server, 4096).replace("\n", "\r\n").encode())
        try:
            for _ in range(40):  # 1 byte every 0.1 s: 4 s, past the server's 2 s deadline
                s.sendall(b" ")
                time.sleep(0.1)
        except OSError:  # the server answered and closed
            pass
        return _response(s)[0]


def test_a_flood_leaves_the_server_alive_bounded_and_answering(guarded):
    process = psutil.Process(guarded.proc.pid)
    assert guarded.infer({"inputs": [tensor(8)]})[0] == 200
    before = process.memory_info().rss
    full = json.dumps({"inputs": [tensor(8, data=[-1.2345678e-05] * 64 * 8)]}).encode()
    jobs = ([lambda: raw(guarded, post_head(guarded, 200_000_000))[0]] * 16
            + [lambda: guarded.infer({"inputs": [tensor(500)]})[0]] * 16
            + [lambda: raw(guarded, post_head(guarded, len(full)), full)[0]] * 24
            + [lambda: slow_sender(guarded)] * 6)
    start = time.monotonic()
    with ThreadPoolExecutor(24) as pool:
        statuses = [f.result(timeout=60) for f in [pool.submit(job) for job in jobs]]
    assert time.monotonic() - start < 30
    assert statuses.count(408) == 6, statuses  # every slow sender cut off
    assert set(statuses) <= {200, 400, 408, 413, 503}, statuses
    assert statuses.count(200) >= 1 and statuses.count(413) >= 16, statuses
    grown = process.memory_info().rss - before
    print(f"flood: {statuses.count(200)} x 200, {statuses.count(503)} x 503; RSS {before / 2**20:.0f} MiB "
          f"+ {grown / 2**20:.1f} MiB, {time.monotonic() - start:.1f} s")
    assert grown < 150 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"
    start = time.monotonic()
    status, answer = guarded.infer({"inputs": [tensor()]})
    assert status == 200 and time.monotonic() - start < 5, answer
    assert np.isfinite(answer["outputs"][0]["data"]).all()


# -- slow headers: uvicorn counts a connection toward limit_concurrency before the gate sees its request ----------

def status_of(server: CloudServer) -> int:
    """The status of one small inference (uvicorn's own 503 is plain text, not JSON)."""
    body = json.dumps({"inputs": [tensor()]}).encode()
    request = urllib.request.Request(f"{server.url}/v2/models/digits/infer", body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_connections_trickling_their_headers_are_cut_off_and_the_server_answers_again(plain):
    """70 connections (over the 64 uvicorn keeps) send a request line and trickle headers: while they are open every
    other request is a 503, and HEADER_TIMEOUT_S after they connected they are closed with a 408, however they
    trickle. A client that reconnects as fast as it is cut off still holds the server: the README says to put serve
    behind an ingress that bounds connections per client."""
    head = b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    sockets, stop = [], threading.Event()

    def trickle() -> None:  # all but the first: that one waits quietly for its answer
        while not stop.wait(0.5):
            for s in sockets[1:]:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:  # cut off
                    pass

    thread = threading.Thread(target=trickle)
    try:
        for _ in range(MAX_CONNECTIONS + 6):
            sockets.append(socket.create_connection(("127.0.0.1", plain.port), timeout=HEADER_TIMEOUT_S + 10))
            sockets[-1].sendall(head)
        start = time.monotonic()
        thread.start()
        statuses = [status_of(plain)]
        while statuses[-1] != 200 and time.monotonic() - start < HEADER_TIMEOUT_S + 10:
            time.sleep(0.5)
            statuses.append(status_of(plain))
        waited = time.monotonic() - start
        answer = sockets[0].recv(4096)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=5)
        for s in sockets:
            s.close()
    print(f"slow headers: {len(statuses) - 1} x 503, then {statuses[-1]} after {waited:.1f} s")
    assert statuses[0] == 503, statuses  # the lockout is real while they are open
    assert statuses[-1] == 200 and waited < HEADER_TIMEOUT_S + 5, statuses
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within" in answer, answer


# -- dynamic dimensions: a request's size cannot be derived, so the caps must be given ------------------------------

def manifest(*shapes: list[int]) -> dict:
    return {"name": "seg", "inputs": [{"name": f"in{i}", "shape": s, "dtype": "float32"} for i, s in enumerate(shapes)],
            "outputs": [{"name": "out", "shape": [1, -1], "dtype": "float32"}]}


@pytest.mark.parametrize("shape, given, missing", [
    ([1, 3, -1, -1], {}, "give max_body_bytes (--max-body-bytes) and max_batch (--max-batch)"),
    ([-1, 3, -1, -1], {"max_batch": 4}, "give max_body_bytes (--max-body-bytes)"),
    ([1, 3, -1, -1], {"max_body_bytes": 1 << 20}, "give max_batch (--max-batch)"),
])
def test_a_dynamic_dimension_after_the_batch_needs_the_caps_named(shape, given, missing):
    dynamic = r"input\(s\) 'in1' have a dynamic dimension \(-1\) after the batch"
    with pytest.raises(InputError, match=dynamic) as refused:
        ServeLimits.for_manifest(manifest([1, 4], shape), **given)
    assert missing in str(refused.value) and "got -" not in str(refused.value)


def test_a_dynamic_dimension_without_a_batch_needs_only_the_body_cap():
    with pytest.raises(InputError, match=r"'in0' have a dynamic dimension \(-1\), so .* give max_body_bytes "
                                         r"\(--max-body-bytes\)$"):
        ServeLimits.for_manifest(manifest([3, -1]) | {"outputs": [{"name": "out", "shape": [5], "dtype": "float32"}]})


def test_with_the_caps_given_a_dynamic_model_is_bounded_by_its_body_cap():
    limits = ServeLimits.for_manifest(manifest([1, 3, -1, -1]), max_batch=2, max_body_bytes=1 << 20)
    assert (limits.max_batch, limits.max_body_bytes, limits.max_values) == (2, 1 << 20, (1 << 20) // 2)
    assert limits.request_cost_bytes > 2 * limits.max_body_bytes > 0
    mib, arithmetic = limits.memory_mib(1 << 20)
    assert mib > 512 and arithmetic.endswith("not counted: the answer of output(s) out, which have a dynamic dimension")


def test_a_leading_minus_one_is_the_batch_and_the_defaults_stay_positive():
    fixed = ServeLimits.for_manifest(manifest([1, 3, 8, 8]) | {"outputs": [{"name": "o", "shape": [1, 10],
                                                                         "dtype": "float32"}]})
    dynamic_batch = ServeLimits.for_manifest(manifest([-1, 3, 8, 8]) | {"outputs": [{"name": "o", "shape": [-1, 10],
                                                                                  "dtype": "float32"}]})
    assert dynamic_batch == fixed and fixed.max_values == 64 * 3 * 8 * 8 and fixed.request_cost_bytes > 0
