"""Our client and hybrid mode against two V2 servers that are not ``edgesdk serve`` (issue 29, interop): KServe's
ModelServer with a custom ``kserve.Model`` as its docs write one, and Seldon's MLServer with a custom runtime
(:mod:`v2_peers`), each a real server on loopback serving the digits bundle's float artifact.

Servers differ in what their model metadata lists: both list no inputs and no outputs for a model whose author (or
model-settings) gives none, and a KServe model's datatypes are spelled as its author writes them. Missing metadata is
unknown, not a mismatch: the client proceeds and still checks every answer against the bundle; metadata that
contradicts the bundle is a ``model_mismatch`` before anything is sent.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk import Bundle, EscalationPolicy
from edgesdk.errors import CloudError
from edgesdk.hybrid.client import CloudClient

from v2_peers import PeerServer

ALWAYS = EscalationPolicy(threshold=1.0)  # every input is "hard": the cloud answers all


@pytest.fixture(scope="module", params=["kserve", "mlserver"])
def peer(request, digits_bundle, tmp_path_factory):
    with PeerServer(request.param, digits_bundle.bundle, tmp_path_factory.mktemp(f"peer-{request.param}")) as srv:
        yield srv


@pytest.fixture(scope="module")
def manifest(digits_bundle) -> dict:
    return Bundle.open(digits_bundle.bundle).manifest


@pytest.fixture(scope="module")
def x(digits_bundle) -> np.ndarray:
    return Bundle.open(digits_bundle.bundle).golden()["input_0"][:1]


def local_fp32(bundle_path, x: np.ndarray) -> np.ndarray:
    with Bundle.open(bundle_path).artifact("onnxruntime-fp32").open() as engine:
        return engine.run([x])[0]


def test_metadata_listing_no_inputs_is_unknown_and_the_answer_is_checked(peer, digits_bundle, manifest, x):
    """The issue's case: such a server was refused (the model check read "no inputs" as a bad answer) before
    anything was sent."""
    with CloudClient(peer.url, "digits", expected_outputs=manifest["outputs"]) as client:
        meta = client.check_inputs(manifest["inputs"])
        assert meta["name"] == "digits" and not meta.get("inputs")
        out = client.infer([x], ["x"])
    np.testing.assert_allclose(out[0], local_fp32(digits_bundle.bundle, x), atol=1e-5)
    with edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=peer.url,
                      escalation=ALWAYS) as model:
        result = model.predict(x)
    assert (result.source, result.degraded, result.cloud_error) == ("cloud", False, None)
    assert result.top[0].index == int(np.argmax(local_fp32(digits_bundle.bundle, x)))


def test_with_no_metadata_a_wrong_answer_is_still_refused(peer, digits_bundle, manifest, x):
    with CloudClient(peer.url, "digits-wrong", expected_outputs=manifest["outputs"]) as client:
        client.check_inputs(manifest["inputs"])  # nothing listed: nothing to contradict
        with pytest.raises(CloudError, match=r"output 'output_0' has shape \[1, 9\], expected \[1, 10\]") as caught:
            client.infer([x], ["x"])
    assert caught.value.reason == "bad_response"
    with CloudClient(peer.url, "digits-wrong") as client, \
            edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=client,
                         escalation=ALWAYS) as model:
        result = model.predict(x)
    assert (result.source, result.degraded, result.cloud_error) == ("device", True, "bad_response")


def test_listed_inputs_in_the_servers_own_spelling_are_checked_and_pass(peer, manifest, x):
    """KServe's model lists ``fp32`` (its author's spelling) and MLServer ``FP32``, both with a variable batch."""
    with CloudClient(peer.url, "digits-listed", expected_outputs=manifest["outputs"]) as client:
        meta = client.check_inputs(manifest["inputs"])
        assert [(i["name"], i["datatype"].upper(), i["shape"]) for i in meta["inputs"]] == [("x", "FP32",
                                                                                              [-1, 1, 8, 8])]
        assert client.infer([x], ["x"])[0].shape == (1, 10)


def test_metadata_that_contradicts_the_bundle_is_a_model_mismatch_before_anything_is_sent(peer, digits_bundle,
                                                                                           manifest, x):
    with CloudClient(peer.url, "digits-contradicting") as client:
        with pytest.raises(CloudError, match=r"model_mismatch: model 'digits-contradicting' at .* does not take what "
                                             r"this bundle sends: input 'x' has shape \[-1, 3, 8, 8\] there, "
                                             r"\[1, 1, 8, 8\] here"):
            client.check_inputs(manifest["inputs"])
    with CloudClient(peer.url, "digits-contradicting") as client, \
            edgesdk.load(digits_bundle.bundle, require="onnxruntime", mode="prefer-device", cloud=client,
                         escalation=ALWAYS) as model:
        result = model.predict(x)
        assert (result.source, result.degraded, result.cloud_error) == ("device", True, "model_mismatch")
        assert client.stats()["calls"] == 1  # the model check alone: no inference was sent
