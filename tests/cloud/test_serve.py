"""``edgesdk serve``: a bundle in KServe's ModelServer, driven over loopback like a device would (Open Inference
Protocol V2 REST, standard library only), and by tritonclient, a V2 client from elsewhere (it runs in the cloud
venv). The server runs in the cloud venv: see ``cloud_server.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import psutil
import pytest

from cloud_server import CloudServer, call, cloud_venv, free_port
from edgesdk import Bundle
from edgesdk.hybrid.served_artifact import serving_artifact
from edgesdk.errors import BundleError
from support import fail_validation

DEFAULT_ARTIFACT = "onnxruntime-fp32"  # the cloud venv has onnxruntime only; every fp32 ties on accuracy


@pytest.fixture(scope="module")
def server(digits_bundle, tmp_path_factory):
    with CloudServer(digits_bundle.bundle, log_dir=tmp_path_factory.mktemp("serve")) as running:
        yield running
    assert running.returncode == 0, running.output()[-4000:]  # SIGTERM is a clean stop


@pytest.fixture(scope="module")
def golden_x(digits_bundle) -> np.ndarray:
    return Bundle.open(digits_bundle.bundle).golden()["input_0"]


def local_run(bundle_path, artifact: str, x: np.ndarray) -> np.ndarray:
    """The artifact run here, row by row (artifacts take batch 1)."""
    with Bundle.open(bundle_path).artifact(artifact).open() as engine:
        return np.concatenate([engine.run([x[i:i + 1]])[0] for i in range(len(x))])


def tensor(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> dict:
    return {"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}


def listening(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_health_and_server_metadata(server):
    assert call(f"{server.url}/v2/health/live") == (200, {"live": True})
    assert call(f"{server.url}/v2/health/ready")[0] == 200
    status, meta = call(f"{server.url}/v2")
    assert status == 200 and meta["name"] == "kserve" and isinstance(meta["extensions"], list)
    assert call(f"{server.url}/v2/models/digits/ready") == (200, {"name": "digits", "ready": True})


def test_model_metadata_lists_the_bundle_tensors_with_a_variable_batch(server):
    status, meta = call(f"{server.url}/v2/models/digits")
    assert status == 200
    assert meta["name"] == "digits"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert meta["outputs"] == [{"name": "output_0", "datatype": "FP32", "shape": [-1, 10]}]


def test_serves_the_most_accurate_installed_float_artifact_by_default(server):
    assert f"artifact {DEFAULT_ARTIFACT} on onnxruntime" in server.output()


def test_infer_json_matches_the_artifact_run_locally_and_echoes_the_id(server, digits_bundle, golden_x):
    x = golden_x[:1]
    status, answer = server.infer({"id": "golden-0", "inputs": [tensor(x)]})
    assert status == 200, answer
    assert answer["id"] == "golden-0" and answer["model_name"] == "digits"
    [out] = answer["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("output_0", "FP32", [1, 10])
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, local_run(digits_bundle.bundle, DEFAULT_ARTIFACT, x), rtol=0, atol=1e-5)


def test_a_batch_runs_row_by_row_and_is_stacked(server, digits_bundle, golden_x):
    x = golden_x[:3]
    status, answer = server.infer({"inputs": [tensor(x)]})
    assert status == 200, answer
    assert answer["id"]  # kserve answers without an id when none was sent; the server makes one
    [out] = answer["outputs"]
    assert out["shape"] == [3, 10]
    got = np.asarray(out["data"], dtype=np.float32).reshape(3, 10)
    np.testing.assert_allclose(got, local_run(digits_bundle.bundle, DEFAULT_ARTIFACT, x), rtol=0, atol=1e-5)


def test_requested_outputs_are_honoured(server, golden_x):
    status, answer = server.infer({"inputs": [tensor(golden_x[:1])], "outputs": [{"name": "output_0"}]})
    assert status == 200 and [o["name"] for o in answer["outputs"]] == ["output_0"]


MISUSES = {
    "wrong shape": (lambda x: [tensor(x.reshape(1, 8, 8))], "input 'x' must have shape [-1, 1, 8, 8]"),
    "zero batch": (lambda x: [{**tensor(x), "shape": [0, 1, 8, 8], "data": []}], "got [0, 1, 8, 8]"),
    "wrong datatype": (lambda x: [tensor(x.astype(np.int32), datatype="INT32")], "input 'x' must be FP32; got INT32"),
    "wrong input name": (lambda x: [tensor(x, name="y")], "model 'digits' has no input named 'y' (inputs: x)"),
    "missing input": (lambda x: [], "the request lacks input(s) x"),
    "input twice": (lambda x: [tensor(x), tensor(x)], "input 'x' is given twice"),
    "too little data": (lambda x: [{**tensor(x), "data": [0.5, 0.5]}], "its data does not fill shape [1, 1, 8, 8]"),
    "data not numbers": (lambda x: [{**tensor(x), "data": ["a"] * 64}], "its data does not fill shape"),
}


@pytest.mark.parametrize("misuse", MISUSES, ids=list(MISUSES))
def test_a_bad_request_is_a_400_naming_the_problem_and_the_server_keeps_serving(server, golden_x, misuse):
    inputs, message = MISUSES[misuse]
    status, answer = server.infer({"inputs": inputs(golden_x[:1])})
    assert status == 400, answer
    assert set(answer) == {"error"} and message in answer["error"], answer
    assert server.infer({"inputs": [tensor(golden_x[:1])]})[0] == 200


def test_an_unknown_output_is_a_400(server, golden_x):
    status, answer = server.infer({"inputs": [tensor(golden_x[:1])], "outputs": [{"name": "logits"}]})
    assert status == 400
    assert answer == {"error": "model 'digits' has no output named 'logits' (outputs: output_0)"}


def test_an_unknown_model_is_a_404(server, golden_x):
    status, answer = server.infer({"inputs": [tensor(golden_x[:1])]}, model="cats")
    assert status == 404 and "cats" in answer["error"]
    assert call(f"{server.url}/v2/models/cats")[0] == 404
    assert server.infer({"inputs": [tensor(golden_x[:1])]})[0] == 200


def test_the_v1_route_is_refused_with_the_v2_route(server):
    status, answer = call(f"{server.url}/v1/models/digits:predict", {"instances": [[0.0] * 64]})
    assert status == 400 and "POST /v2/models/digits/infer" in answer["error"]


def test_binds_to_loopback_by_default(server):
    assert listening(server.port) == {"127.0.0.1"}


def test_host_and_artifact_options(digits_bundle, golden_x, tmp_path):
    # Another loopback address shows --host is used as given, without opening the machine to the network.
    with CloudServer(digits_bundle.bundle, "--artifact", "onnxruntime-int8", host="127.0.0.2",
                     log_dir=tmp_path) as other:
        assert listening(other.port) == {"127.0.0.2"}
        assert "artifact onnxruntime-int8 on onnxruntime" in other.output()
        status, answer = other.infer({"inputs": [tensor(golden_x[:2])]})
        assert status == 200, answer
        got = np.asarray(answer["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
        np.testing.assert_allclose(got, local_run(digits_bundle.bundle, "onnxruntime-int8", golden_x[:2]),
                                   rtol=0, atol=1e-5)


def serve_cli(*args: str, venv=None) -> subprocess.CompletedProcess:
    exe = str((venv or cloud_venv()) / "bin" / "edgesdk")
    return subprocess.run([exe, "serve", *args], capture_output=True, text=True, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_missing_bundle_is_a_one_line_error(tmp_path):
    proc = serve_cli(str(tmp_path / "nope.bundle"), "--port", str(free_port()))
    assert proc.returncode == 2
    missing = tmp_path / "nope.bundle"
    assert one_line_error(proc) == f"error: BundleError: bundle not found: {missing} is not a directory"


def test_an_unknown_artifact_is_a_one_line_error_naming_the_known_ones(digits_bundle):
    proc = serve_cli(str(digits_bundle.bundle), "--artifact", "tpu-int4", "--port", str(free_port()))
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "has no artifact 'tpu-int4'" in line and "onnxruntime-fp32" in line and "litert-int8" in line


def test_a_device_install_says_how_to_get_kserve(digits_bundle):
    import importlib.util

    assert importlib.util.find_spec("kserve") is None, "kserve must not be in the device/workstation venv"
    proc = subprocess.run([sys.executable, "-m", "edgesdk", "serve", str(digits_bundle.bundle)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "pip install 'edgesdk-cloud[serve]'" in proc.stderr and "reason: kserve_missing" in proc.stderr


def test_the_default_artifact_is_the_most_accurate_float_one(digits_bundle, bundle_copy):
    assert serving_artifact(Bundle.open(digits_bundle.bundle)).id == DEFAULT_ARTIFACT  # a tie: the golden reference
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["validation"]["openvino-fp32"]["accuracy"] = 0.999
    manifest["validation"]["openvino-int8"]["accuracy"] = 1.0  # int8 is never the default
    path.write_text(json.dumps(manifest))
    assert serving_artifact(Bundle.open(bundle_copy)).id == "openvino-fp32"


def test_the_default_artifact_is_never_one_that_failed_its_gate(bundle_copy):
    fail_validation(bundle_copy, DEFAULT_ARTIFACT)
    chosen = serving_artifact(Bundle.open(bundle_copy), installed_only=False)
    assert chosen.id != DEFAULT_ARTIFACT and chosen.precision == "fp32"
    fail_validation(bundle_copy, "litert-fp32", "openvino-fp32")
    with pytest.raises(BundleError, match=r"every float artifact failed its validation gate \(litert-fp32: golden "
                                          r"agreement drop 1\.48 points > max 0\.5 at quantize time; .*\); "
                                          r"re-quantize the bundle, or name one with --artifact and --allow-failed"):
        serving_artifact(Bundle.open(bundle_copy), installed_only=False)


def test_a_failed_artifact_is_a_one_line_error_naming_allow_failed(bundle_copy):
    fail_validation(bundle_copy, "onnxruntime-int8")
    proc = serve_cli(str(bundle_copy), "--artifact", "onnxruntime-int8", "--port", str(free_port()))
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert line.startswith("error: BundleError: artifact 'onnxruntime-int8' of bundle 'digits' failed its validation "
                           "gate (accuracy drop 1.48 points > max 0.5 at quantize time)") and "--allow-failed" in line


def test_allow_failed_serves_a_failed_artifact_with_a_warning(bundle_copy, golden_x, tmp_path):
    fail_validation(bundle_copy, "onnxruntime-int8")
    with CloudServer(bundle_copy, "--artifact", "onnxruntime-int8", "--allow-failed", log_dir=tmp_path) as other:
        assert "artifact onnxruntime-int8 on onnxruntime" in other.output()
        assert "warning: serving artifact 'onnxruntime-int8' of bundle 'digits', which failed its validation gate" \
            in other.output()
        status, answer = other.infer({"inputs": [tensor(golden_x[:1])]})
        assert status == 200, answer


TRITON_CLIENT = r"""
import json, sys
import numpy as np
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

url, model, x_path = sys.argv[1:4]
x = np.load(x_path)
client = http.InferenceServerClient(url=url)
report = {"extensions": client.get_server_metadata()["extensions"], "ready": client.is_model_ready(model)}
for mode, binary in (("json", False), ("binary", True)):
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = http.InferRequestedOutput("output_0", binary_data=binary)
    # tritonclient sends JSON with no Content-Type; kserve then reads the body as binary (see the test)
    headers = None if binary else {"Content-Type": "application/json"}
    result = client.infer(model, [inp], outputs=[out], request_id=mode, headers=headers)
    report[mode] = {"response": result.get_response(), "output": result.as_numpy("output_0").tolist()}
inp = http.InferInput("x", list(x.shape), "FP32")
inp.set_data_from_numpy(x, binary_data=False)
try:
    client.infer(model, [inp])
    report["json_without_content_type"] = "accepted"
except InferenceServerException as exc:
    report["json_without_content_type"] = {"status": exc.status(), "message": exc.message()}
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def triton_report(server, digits_bundle, golden_x, tmp_path_factory) -> dict:
    x_path = tmp_path_factory.mktemp("triton") / "x.npy"
    np.save(x_path, golden_x[:2])
    proc = subprocess.run([str(cloud_venv() / "bin" / "python"), "-c", TRITON_CLIENT, f"127.0.0.1:{server.port}",
                           "digits", str(x_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


@pytest.mark.parametrize("mode", ["json", "binary"])
def test_tritonclient_infers_with_json_and_binary_tensors(triton_report, digits_bundle, golden_x, mode):
    expected = local_run(digits_bundle.bundle, DEFAULT_ARTIFACT, golden_x[:2])
    assert triton_report["ready"] is True
    run = triton_report[mode]
    assert run["response"]["id"] == mode
    np.testing.assert_allclose(np.asarray(run["output"], dtype=np.float32), expected, rtol=0, atol=1e-5)
    [out] = run["response"]["outputs"]
    # A binary output leaves only its size in the JSON header; the tensor follows the header as raw bytes.
    assert ("binary_data_size" in (out.get("parameters") or {})) is (mode == "binary")
    assert ("data" in out) is (mode == "json")


def test_kserve_0_21_binary_and_json_quirks_seen_by_tritonclient(triton_report):
    # kserve 0.21 decodes binary tensors (above) but does not list the binary_tensor_data extension, so a client
    # that checks extensions (as the reference says to) sends JSON to it.
    assert "binary_tensor_data" not in triton_report["extensions"]
    # JSON without a Content-Type is read as a binary request and refused: a client must send application/json.
    refused = triton_report["json_without_content_type"]
    assert refused["status"] == "400" and "inference-header-content-length" in refused["message"]



def test_dynamic_dimensions_take_any_size_of_one_or_more_and_a_leading_minus_one_is_the_batch():
    """BundleSignature alone, on V2 request inputs as KServe hands them over (name, datatype, shape, as_numpy)."""
    from types import SimpleNamespace

    from edgesdk.errors import InputError
    from edgesdk_cloud.server import BundleSignature

    signature = BundleSignature({"name": "seg", "inputs": [{"name": "x", "shape": [-1, 1, -1, -1], "dtype": "float32"}],
                                 "outputs": [{"name": "y", "shape": [-1, 2], "dtype": "float32"}]})

    def given(*shape: int) -> list:
        return [SimpleNamespace(name="x", datatype="FP32", shape=list(shape),
                                as_numpy=lambda: np.zeros(shape, np.float32))]

    assert signature.batched and signature.metadata(signature.inputs)[0]["shape"] == [-1, 1, -1, -1]
    feeds, batch = signature.feeds(given(3, 1, 5, 7), max_batch=4)
    assert batch == 3 and feeds[0].shape == (3, 1, 5, 7)
    for shape in ((1, 1, 0, 7), (1, 2, 5, 7), (0, 1, 5, 7), (1, 1, -1, 7)):
        with pytest.raises(InputError, match=r"input 'x' must have shape \[-1, 1, -1, -1\] \(-1: a batch, or a "
                                             r"dynamic dimension, of 1 or more\)"):
            signature.feeds(given(*shape))
