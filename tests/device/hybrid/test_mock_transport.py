"""The mock transport shipped with the cloud client (httpx's MockTransport idea): what an app's own tests use to drive
hybrid logic without sockets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import CloudUnavailable, InputError
from edgesdk.hybrid.client import CloudClient
from edgesdk.hybrid.transport import MockTransport, Request, Response

X = [np.zeros((1, 1, 8, 8), np.float32)]


def test_the_shipped_mock_transport_answers_from_a_function_and_records_requests():
    """What an app's own tests would write: no sockets, the handler sees each request the client sends."""
    def handler(request: Request) -> Response:
        sent = json.loads(request.body)
        return Response(200, {}, json.dumps({"model_name": "digits", "id": sent["id"], "outputs": [
            {"name": "output_0", "shape": [1, 2], "datatype": "FP32", "data": [0.25, 0.75]}]}).encode())

    mock = MockTransport(handler)
    outs = CloudClient("http://127.0.0.1:9", "digits", transport=mock, binary=False).infer(X, ["x"], request_id="q")
    np.testing.assert_allclose(outs[0], [[0.25, 0.75]])
    assert [(r.method, r.url) for r in mock.requests] == [("POST", "http://127.0.0.1:9/v2/models/digits/infer")]
    with pytest.raises(InputError, match="MockTransport needs a function"):
        MockTransport("not a function")


def test_a_mock_transport_handler_that_raises_is_a_network_failure():
    def handler(request: Request) -> Response:
        raise ConnectionRefusedError("nobody listens")

    c = CloudClient("http://127.0.0.1:9", "digits", transport=MockTransport(handler), binary=False,
                    deadline_s=0.5, backoff_base_s=0.0)
    with pytest.raises(CloudUnavailable):
        c.infer(X, ["x"])
