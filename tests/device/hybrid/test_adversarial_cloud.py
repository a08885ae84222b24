"""A malicious V2 server on loopback against the device's cloud client and hybrid mode.

The server (a real HTTP server on raw sockets, in a thread) answers the model check truthfully and every infer as
the test tells it: garbage, wrong shapes, NaN/Inf/null scores, an extra first output, INT64 or BOOL outputs, huge
answers (a Content-Length that lies, a body that never ends), headers or a body trickled a byte at a time, and
error bodies that echo the bearer token with terminal escapes. In every case a hybrid model answers from the device
(``degraded``, with the cloud's reason) within its deadline plus a generous slack (a behaviour bound, not a
benchmark), and a bare :class:`CloudClient` raises the typed :class:`CloudError`. The never-ending body also runs
in a child process under an address-space limit, so a client that read it whole fails the test, not the machine.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
import time

import pytest

import edgesdk
from edgesdk import Bundle, EscalationPolicy
from edgesdk.errors import CloudError, CloudRejected, CloudTimeout, InputError
from edgesdk.hybrid.client import CircuitBreaker, CloudClient, RetryBudget
from support import self_signed_cert

TOKEN = "s3cret-TOKEN-123"
DEADLINE_S = 1.0
SLACK_S = 1.5  # generous: the bound is "about the deadline", never "as long as the server likes"
STREAM_CAP = 400 * 2 ** 20  # the most a never-ending body sends before the server gives up on its own


class MaliciousServer:
    """HTTP/1.1 on 127.0.0.1: ``GET /v2`` and ``GET /v2/models/NAME`` answered truthfully from the manifest,
    ``POST .../infer`` by ``self.infer(conn, request)`` (it writes what it likes and returns whether the connection
    stays open). ``request`` has ``headers`` (lower-case names), ``body`` and ``json``."""

    def __init__(self, manifest: dict, tls=None):
        self.manifest = manifest
        self.infer = good
        self.tls = tls  # an ssl.SSLContext: HTTPS
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            reader = conn.makefile("rb")
            try:
                while not self.stop.is_set():
                    line = reader.readline(4096)
                    if not line:
                        return
                    method, path, _ = line.decode("latin-1").split(" ", 2)
                    headers = {}
                    while (h := reader.readline(4096)) not in (b"\r\n", b"\n", b""):
                        k, _, v = h.decode("latin-1").partition(":")
                        headers[k.strip().lower()] = v.strip()
                    body = reader.read(int(headers.get("content-length") or 0))
                    request = {"headers": headers, "body": body,
                               "json": json.loads(body) if method == "POST" else None}
                    if path.endswith("/infer"):
                        keep = self.infer(conn, request)
                    elif path == "/v2":
                        keep = reply(conn, 200, {"name": "malicious", "extensions": []})
                    elif path == f"/v2/models/{self.manifest['name']}":
                        keep = reply(conn, 200, {"name": self.manifest["name"], "inputs": [
                            {"name": t["name"], "datatype": "FP32", "shape": t["shape"]}
                            for t in self.manifest["inputs"]]})
                    else:
                        keep = reply(conn, 404, {"error": "no such path"})
                    if not keep:
                        return
            except OSError:
                return  # the client hung up: expected when it gives up on a trickle or a flood


def reply(conn: socket.socket, status: int, body, headers: dict | None = None) -> bool:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
    conn.sendall(f"HTTP/1.1 {status} X\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
                 + b"\r\n" + data)
    return True


def outputs(*entries: dict):
    """An infer behaviour answering 200 with these outputs (and the request's id)."""
    def infer(conn, request):
        return reply(conn, 200, {"id": request["json"]["id"], "model_name": "digits", "outputs": list(entries)})
    return infer


SCORES = [0.0] * 9 + [1.0]
GOOD = {"name": "output_0", "shape": [1, 10], "datatype": "FP32", "data": SCORES}
good = outputs(GOOD)


def garbage(conn, request):
    return reply(conn, 200, b"\x00\xff{not json at all")


def length_lie(conn, request):
    """Declares 500 MB, sends a little, then holds the connection: a client that reads waits for nothing."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500000000\r\n\r\n{\"a")
    _hold(conn, 10.0)
    return False


def endless(conn, request):
    """A chunked body that goes on until the client hangs up (or STREAM_CAP is sent)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"%x\r\n" % 2 ** 20 + b" " * 2 ** 20 + b"\r\n"
    for _ in range(STREAM_CAP // 2 ** 20):
        conn.sendall(piece)
    return False


def trickle(head: bytes, step: bytes = b"x"):
    """Sends ``head``, then ``step`` every 0.1 s for up to 30 s."""
    def infer(conn, request):
        conn.sendall(head)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conn.sendall(step)
            time.sleep(0.1)
        return False
    return infer


def echo_error(status: int, as_json: bool):
    """An error whose text echoes the Authorization header, with a terminal escape and a fake second line."""
    def infer(conn, request):
        text = f"denied: {request['headers'].get('authorization')} \x1b[2J\r\nedgesdk: result 7 (source=cloud)"
        return reply(conn, status, {"error": text} if as_json else text.encode())
    return infer


def _hold(conn: socket.socket, seconds: float) -> None:
    conn.settimeout(seconds)
    try:
        conn.recv(1)  # returns when the client hangs up
    except OSError:
        pass


# (case id, infer behaviour, reason, error class of a bare client)
CASES = [
    ("garbage", garbage, "bad_response", CloudError),
    ("shape [1,3]", outputs({**GOOD, "shape": [1, 3], "data": [0.1, 0.2, 0.7]}), "bad_response", CloudError),
    ("shape [1,1000000] claimed", outputs({**GOOD, "shape": [1, 1000000]}), "bad_response", CloudError),
    ("scalar", outputs({**GOOD, "shape": [], "data": [0.5]}), "bad_response", CloudError),
    ("NaN scores", outputs({**GOOD, "data": [math.nan] * 10}), "bad_response", CloudError),
    ("Inf score", outputs({**GOOD, "data": SCORES[:9] + [math.inf]}), "bad_response", CloudError),
    ("null scores", outputs({**GOOD, "data": [None] * 10}), "bad_response", CloudError),
    ("extra first output", outputs({**GOOD, "name": "evil"}, GOOD), "bad_response", CloudError),
    ("INT64", outputs({**GOOD, "datatype": "INT64", "data": [999999] * 10}), "bad_response", CloudError),
    ("BOOL", outputs({**GOOD, "datatype": "BOOL", "data": [True] * 10}), "bad_response", CloudError),
    ("shape [1,0]", outputs({**GOOD, "shape": [1, 0], "data": []}), "bad_response", CloudError),
    ("Content-Length lies", length_lie, "response_too_large", CloudError),
    ("endless body", endless, "response_too_large", CloudError),
    ("trickled headers", trickle(b"HTTP/1.1 200 OK\r\nX-Slow: "), "timeout", CloudTimeout),
    ("trickled body", trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"), "timeout", CloudTimeout),
    ("401 echoing the token", echo_error(401, True), "rejected", CloudRejected),
    ("500 echoing the token", echo_error(500, False), "server_error", CloudError),
]


@pytest.fixture(scope="module")
def server(digits_bundle):
    srv = MaliciousServer(Bundle.open(digits_bundle.bundle).manifest)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def x(digits_bundle):
    return Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]


def client(server: MaliciousServer, **options) -> CloudClient:
    # A breaker and a retry budget that never trip here: each case must fail for its own reason.
    options = {"token": TOKEN, "deadline_s": DEADLINE_S, "timeout_s": DEADLINE_S, "max_attempts": 1,
               "breaker": CircuitBreaker(min_calls=50, window=50), "retry_budget": RetryBudget(1.0, 100), **options}
    return CloudClient(server.url, server.manifest["name"], **options)


@pytest.fixture(scope="module")
def hybrid(digits_bundle, server):
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=client(server),
                      escalation=EscalationPolicy(threshold=1.0)) as model:  # every input escalates
        yield model


def test_an_honest_answer_is_the_clouds(hybrid, server, x):
    server.infer = good
    result = hybrid.predict(x)
    assert result.source == "cloud" and not result.degraded and int(result.outputs[0].argmax()) == 9


@pytest.mark.parametrize("behaviour, reason", [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_answer_degrades_to_the_device_within_the_deadline(hybrid, server, x, behaviour, reason):
    server.infer = behaviour
    t0 = time.monotonic()
    result = hybrid.predict(x)
    took = time.monotonic() - t0
    assert (result.source, result.degraded, result.cloud_error) == ("device", True, reason)
    assert result.escalation_reason == "low_confidence"
    assert took < DEADLINE_S + SLACK_S, f"predict took {took:.2f} s against a {DEADLINE_S} s deadline"


@pytest.mark.parametrize("behaviour, reason, error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bare_client_raises_the_typed_error(server, digits_bundle, x, behaviour, reason, error):
    server.infer = behaviour
    c = client(server, expected_outputs=server.manifest["outputs"], max_attempts=3)
    t0 = time.monotonic()
    with pytest.raises(error) as caught:
        c.infer([x], [server.manifest["inputs"][0]["name"]])
    took = time.monotonic() - t0
    assert caught.value.reason == reason and took < DEADLINE_S + SLACK_S, (caught.value, took)
    text = str(caught.value)
    assert TOKEN not in text and TOKEN not in caught.value.detail and text.isprintable(), text


def test_the_mismatch_is_named(server, x):
    server.infer = outputs({**GOOD, "name": "evil"}, {**GOOD, "shape": [1, 3], "datatype": "INT64"})
    c = client(server, expected_outputs=server.manifest["outputs"])
    with pytest.raises(CloudError, match=r"outputs \['evil', 'output_0'\], expected \['output_0'\]; output "
                                         r"'output_0' is 'INT64', expected FP32; output 'output_0' has shape "
                                         r"\[1, 3\], expected \[1, 10\]"):
        c.infer([x], ["x"])
    server.infer = outputs({**GOOD, "data": [math.nan] + SCORES[1:]})
    with pytest.raises(CloudError, match=r"output 'output_0' holds 1 non-finite values"):
        c.infer([x], ["x"])


def test_the_response_cap_comes_from_the_outputs_and_can_be_raised(server, x):
    """A valid answer padded to 100 kB is over the cap the [1, 10] output sets (10 x 32 bytes + 64 kB), and
    passes with max_response_bytes raised."""
    def padded(conn, request):
        body = json.dumps({"id": request["json"]["id"], "outputs": [GOOD]}).encode() + b" " * 100_000
        return reply(conn, 200, body)

    server.infer = padded
    with pytest.raises(CloudError, match=r"declares 100\d+ bytes; the cap is 65856") as caught:
        client(server, expected_outputs=server.manifest["outputs"]).infer([x], ["x"])
    assert caught.value.reason == "response_too_large"
    raised = client(server, expected_outputs=server.manifest["outputs"], max_response_bytes=200_000)
    assert raised.infer([x], ["x"])[0].shape == (1, 10)


@pytest.mark.parametrize("options, message", [
    ({"max_response_bytes": 0}, "max_response_bytes must be an integer >= 1, got 0"),
    ({"max_response_bytes": 1.5}, "max_response_bytes must be an integer >= 1, got 1.5"),
    ({"expected_outputs": [{"name": "o", "shape": [1, "10"], "dtype": "float32"}]}, "'shape' must be a list"),
    ({"expected_outputs": [{"name": "o", "shape": [1], "dtype": "complex64"}]}, "has no Open Inference Protocol"),
    ({"expected_outputs": [{"shape": [1], "dtype": "float32"}]}, "needs a non-empty 'name'"),
])
def test_client_limits_misuse(options, message):
    with pytest.raises(InputError, match=message):
        CloudClient("http://127.0.0.1:9", "digits", **options)


def test_an_echoed_token_is_never_shown_in_cloud_only_mode(hybrid, server, x):
    server.infer = echo_error(401, True)
    with pytest.raises(CloudRejected) as caught:
        hybrid.predict(x, mode="cloud-only")
    text = str(caught.value)
    assert TOKEN not in text and "\x1b" not in text and "\n" not in text and "\r" not in text
    assert "denied: Bearer [redacted]" in text and len(caught.value.detail) < 600


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_edgesdk_run_in_cloud_only_mode_never_prints_an_echoed_token(server, digits_bundle, digits_images,
                                                                     json_output):
    """The finding as a user met it: ``edgesdk run --mode cloud-only`` printed the server's error, token included."""
    import os
    from pathlib import Path

    server.infer = echo_error(401, True)
    image = sorted((digits_images / "val" / "3").iterdir())[0]
    command = [str(Path(sys.executable).parent / "edgesdk"), "run", str(digits_bundle.bundle), str(image), "--mode",
               "cloud-only", "--cloud", server.url, "--token-env", "EDGESDK_TEST_TOKEN", "--require", "onnxruntime"]
    proc = subprocess.run(command + (["--json"] if json_output else []), capture_output=True, text=True,
                          timeout=120, env={**os.environ, "EDGESDK_TEST_TOKEN": TOKEN})
    printed = proc.stdout + proc.stderr
    assert "rejected" in printed and "Traceback" not in printed, printed[-2000:]
    assert TOKEN not in printed and "\x1b" not in printed
    assert not any(line.startswith("edgesdk: result 7") for line in printed.splitlines())  # no fake line drawn
    assert "[redacted]" in printed


def test_over_tls_the_deadline_holds_too(digits_bundle, tmp_path, x):
    """The TLS path has its own reads and writes (handshake, records): a trickled body and a server that accepts
    the connection but never answers the handshake both end at the deadline."""
    import ssl

    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    manifest = Bundle.open(digits_bundle.bundle).manifest
    srv = MaliciousServer(manifest, tls=context)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never speaks TLS
    try:
        c = client(srv, cafile=str(cert), expected_outputs=manifest["outputs"], max_attempts=3)
        assert c.infer([x], ["x"])[0].shape == (1, 10)  # an honest answer over TLS
        srv.infer = trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for target in (c, CloudClient(f"https://127.0.0.1:{silent.getsockname()[1]}", "digits", cafile=str(cert),
                                      deadline_s=DEADLINE_S, timeout_s=DEADLINE_S, binary=False)):
            t0 = time.monotonic()
            with pytest.raises(CloudTimeout):
                target.infer([x], ["x"])
            assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
    finally:
        srv.close()
        silent.close()


def test_prefer_cloud_degrades_too(hybrid, server, x):
    server.infer = outputs({**GOOD, "data": [math.nan] * 10})
    result = hybrid.predict(x, mode="prefer-cloud")
    assert (result.source, result.degraded, result.cloud_error) == ("device", True, "bad_response")


CHILD = r"""
import json, resource, sys
import numpy as np
from edgesdk.hybrid.client import CloudClient
from edgesdk.errors import CloudError

def vm_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1])

limit = (vm_kb() + 256 * 1024) * 1024  # 256 MB of address space above what is mapped now
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
client = CloudClient(sys.argv[1], "digits", binary=False, max_attempts=1, deadline_s=20.0, timeout_s=20.0)
try:
    client.infer([np.zeros((1, 1, 8, 8), np.float32)], ["x"])
    reason = None
except CloudError as exc:
    reason = exc.reason
except MemoryError:
    reason = "MemoryError"
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"reason": reason, "grown_mb": grown / 1024}))
"""


def test_an_endless_body_is_cut_at_the_default_cap_in_bounded_memory(server):
    """No expected outputs: the default cap (16 MiB) holds against a 400 MiB body, in a child whose address space
    is limited, so a client reading it whole fails here instead of swapping the machine."""
    server.infer = endless
    run = subprocess.run([sys.executable, "-c", CHILD, server.url], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["reason"] == "response_too_large" and report["grown_mb"] < 100, report


@pytest.mark.parametrize("inputs", [
    [{"name": ["x"], "datatype": "FP32", "shape": [1, 1, 8, 8]}],                # an unhashable name
    [{"name": 1, "datatype": "FP32", "shape": [1]}, {"name": "b", "datatype": "FP32", "shape": [1]}],  # mixed
    "not a list",
    [{"name": "x", "datatype": {"a": 1}, "shape": ["1", None]}],                 # junk types, a string dim
])
def test_garbage_model_metadata_is_a_typed_cloud_error(inputs):
    """The model check reads the server's metadata: whatever JSON it holds, the answer is a CloudError."""
    from edgesdk.hybrid.transport import MockTransport, Response

    def handler(request):
        return Response(200, {}, json.dumps({"name": "digits", "inputs": inputs, "outputs": []}).encode())

    client = CloudClient("http://127.0.0.1:9", "digits", transport=MockTransport(handler))
    spec = [{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}]
    with pytest.raises(CloudError) as caught:
        client.check_inputs(spec)
    assert caught.value.reason in ("bad_response", "model_mismatch"), caught.value


# -- issue 29, low: a detection answer out of any sane range is the cloud's failure --------------------------------

@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    from task_models import detector_bundle

    return detector_bundle(tmp_path_factory.mktemp("detector"))


def predictions(values) -> callable:
    """An infer behaviour answering the detector's one output with ``values`` [1, 6, 16]."""
    import numpy as np

    return outputs({"name": "predictions", "shape": [1, 6, 16], "datatype": "FP32",
                    "data": np.asarray(values, np.float32).reshape(-1).tolist()})


@pytest.mark.parametrize("made_by", ["load", "app"])
def test_cloud_boxes_out_of_any_sane_range_are_the_clouds_failure(detector, made_by):
    """A cloud answer with boxes at 1e30 px became zero-area boxes at the image's corner that replaced the device's
    good ones. Now the client decodes the answer's candidates as the device would before anything uses it: a box
    over the score threshold that is no number or lies past 16 input sizes is a ``bad_response``, and the device
    answers. The same with the client load makes from a URL and one the app made."""
    import numpy as np

    from edgesdk.tasks.answers import AnswerCheck

    manifest = Bundle.open(detector).manifest
    srv = MaliciousServer(manifest)
    image = np.full((40, 40, 3), 128, np.uint8)
    try:
        with edgesdk.load(detector, artifact="onnxruntime-fp32") as device:
            honest = device.predict(image).outputs[0]
        far = honest.copy()
        far[0, :4] = 1e30  # every box's centre and size: 1e30 of the input (16 px) away
        cloud = srv.url if made_by == "load" else client(srv)
        always = EscalationPolicy(signal="min_kept_score", threshold=1.0)  # every answer escalates
        with edgesdk.load(detector, artifact="onnxruntime-fp32", mode="prefer-device", cloud=cloud,
                          escalation=always) as model:
            srv.infer = predictions(honest)
            result = model.predict(image)
            assert (result.source, len(result.detections)) == ("cloud", 16)
            srv.infer = predictions(far)
            result = model.predict(image)
            assert (result.source, result.degraded, result.cloud_error) == ("device", True, "bad_response")
            assert len(result.detections) == 16
            assert all(0 <= v <= 40 for d in result.detections for v in d.box)
            assert all(d.box[2] > d.box[0] and d.box[3] > d.box[1] for d in result.detections)
        if made_by == "app":
            assert cloud.answer_check is None  # the model passes its check with each call: the app's client is its own
        bare = client(srv, expected_outputs=manifest["outputs"], answer_check=AnswerCheck.of(manifest))
        with pytest.raises(CloudError, match=r"bad_response: the infer response is unusable: 16 of the 16 candidate "
                                             r"boxes over the score threshold are not numbers or lie farther than 16 "
                                             r"input sizes \(16x16\) from the input"):
            bare.infer([np.zeros((1, 3, 16, 16), np.float32)], ["x"])
        srv.infer = predictions(honest)
        assert bare.infer([np.zeros((1, 3, 16, 16), np.float32)], ["x"])[0].shape == (1, 6, 16)
    finally:
        srv.close()


# -- issue 29, interop: model metadata that says less is unknown, not a mismatch -----------------------------------

X_SPEC = [{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}]


def _metadata_client(metadata: dict) -> CloudClient:
    from edgesdk.hybrid.transport import MockTransport, Response

    return CloudClient("http://127.0.0.1:9", "digits",
                       transport=MockTransport(lambda request: Response(200, {}, json.dumps(metadata).encode())))


@pytest.mark.parametrize("metadata", [
    {"name": "digits"},                                                               # no inputs key at all
    {"name": "digits", "inputs": None, "outputs": None},
    {"name": "digits", "inputs": [], "outputs": []},                                  # MLServer, a KServe model
    {"name": "digits", "inputs": [{"name": "x"}]},                                    # no datatype, no shape
    {"name": "digits", "inputs": [{"name": "x", "datatype": "", "shape": None}]},
    {"name": "digits", "inputs": [{"name": "x", "datatype": "fp32", "shape": [-1, 1, 8, 8]}]},   # author's case
    {"name": "digits", "inputs": [{"name": "x", "datatype": "TYPE_FP32", "shape": [1, 1, -1, -1]}]},  # Triton's
], ids=["absent", "null", "empty", "bare", "blank", "lower-case", "type-prefix"])
def test_metadata_that_says_nothing_is_unknown_not_a_mismatch(metadata):
    """The issue's finding: the client refused such servers (bad_response / model_mismatch) before sending
    anything, though the answers are checked against the bundle anyway."""
    assert _metadata_client(metadata).check_inputs(X_SPEC)["name"] == "digits"


@pytest.mark.parametrize("inputs, problem", [
    ([{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8]}], r"no input 'x' \(the server has \['image'\]\)"),
    ([{"name": "x", "datatype": "FP64"}], r"input 'x' is FP64 there, FP32 here"),
    ([{"name": "x", "datatype": "bytes", "shape": [-1]}], r"input 'x' is bytes there, FP32 here; input 'x' has shape "
                                                          r"\[-1\] there"),
    ([{"name": "x", "shape": [1, 3, 8, 8]}], r"input 'x' has shape \[1, 3, 8, 8\] there, \[1, 1, 8, 8\] here"),
], ids=["other name", "other datatype", "bytes", "other shape"])
def test_listed_metadata_that_contradicts_the_bundle_is_still_a_mismatch(inputs, problem):
    with pytest.raises(CloudError, match=problem) as caught:
        _metadata_client({"name": "digits", "inputs": inputs}).check_inputs(X_SPEC)
    assert caught.value.reason == "model_mismatch"
