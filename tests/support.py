"""Shared helpers of the test suite: paths, a tiny model, and checks that an artifact is really integer."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "samples" / "digits"
DIGITS_PT2 = DIGITS / "digits.pt2"
DIGITS_ONNX = DIGITS / "digits.onnx"
DIGITS_TOML = DIGITS / "preprocess.toml"
DIGITS_INPUT = "image"  # the input name digits.onnx was exported with (samples/digits/train.py)
SMALL_PER_CLASS = 8  # images per digit in the small_digits fixture

ARTIFACT_IDS = {
    "tflite": ("litert-fp32", "litert-int8"),
    "openvino": ("openvino-fp32", "openvino-int8"),
    "onnx": ("onnxruntime-fp32", "onnxruntime-int8"),
}


def quantize(*args, **kwargs):
    """``edgesdk_converters.quantize.quantize`` without progress bars (imported lazily: torch is heavy)."""
    from edgesdk_converters.quantize import quantize as run

    kwargs.setdefault("progress", False)
    return run(*args, **kwargs)


def rehash(bundle_dir: Path) -> None:
    """Make a bundle's manifest checksums match its files again (what a careless or hostile edit would do)."""
    import json

    from edgesdk.file_digest import sha256_file

    path = bundle_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    for f in [f for a in manifest["artifacts"] for f in a["files"]] + manifest["golden"]["files"]:
        f["sha256"] = sha256_file(bundle_dir / f["path"])
        f["bytes"] = (bundle_dir / f["path"]).stat().st_size
    path.write_text(json.dumps(manifest, indent=2))


def fail_validation(bundle_dir: Path, *artifact_ids: str, drop: float = 1.48, max_drop: float = 0.5) -> None:
    """Record in a bundle's manifest that ``artifact_ids`` failed their validation gate (``drop`` points against
    ``max_drop``), as ``edgesdk quantize --max-drop`` writes it. The manifest is not checksummed: no rehash needed."""
    import json

    path = bundle_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    for aid in artifact_ids:
        entry = manifest["validation"][aid]
        entry.update({"passed": False, entry["gate"]: drop, "max_drop_points": max_drop})
    path.write_text(json.dumps(manifest, indent=2))


def digits_pixels_to_input(pixels: np.ndarray) -> np.ndarray:
    """The digits preprocessing written out with numpy: (pixel / 255 - 0.5) / 0.5 -> N x 1 x 8 x 8."""
    x = (pixels.astype(np.float32) / 255.0 - 0.5) / 0.5
    return x[:, None, :, :].astype(np.float32)


@functools.cache
def tiny_cnn_class():
    """A small CNN on 1x3x16x16 -> 5 logits (conv, strided conv, linear), defined lazily so torch loads only here."""
    import torch
    from torch import nn

    class TinyCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.fc = nn.Linear(16 * 8 * 8, 5)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.conv2(x))
            return self.fc(x.flatten(1))

    return TinyCNN


def tiny_cnn():
    import torch

    torch.manual_seed(0)
    return tiny_cnn_class()().eval()


# -- "really integer" checks -------------------------------------------------------------------------------

_TFLITE_WEIGHTED_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}


def tflite_integer_report(path: Path) -> dict:
    """Dtypes of a .tflite model: its I/O, every weighted op's input/weights/output, and any float tensors."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    tensors = {d["index"]: d for d in interp.get_tensor_details()}
    weighted = []
    # _get_ops_details is the only way ai_edge_litert exposes op -> tensor wiring.
    for op in interp._get_ops_details():
        if op["op_name"] in _TFLITE_WEIGHTED_OPS:
            act, weights = (tensors[i] for i in op["inputs"][:2])
            out = tensors[op["outputs"][0]]
            weighted.append((op["op_name"], act["dtype"], weights["dtype"], out["dtype"]))
    io = {d["index"] for d in interp.get_input_details() + interp.get_output_details()}
    return {
        "inputs": [d["dtype"] for d in interp.get_input_details()],
        "outputs": [d["dtype"] for d in interp.get_output_details()],
        "weighted_ops": weighted,
        "ops": [op["op_name"] for op in interp._get_ops_details()],
        # float tensors other than the model's own input/output tensors
        "float_tensors": [d["name"] for i, d in tensors.items()
                          if d["dtype"] in (np.float32, np.float16) and i not in io],
    }


def assert_tflite_int8(path: Path, io: str = "float") -> None:
    """Every weight and every activation inside is int8; the I/O tensors are float around
    in-graph QUANTIZE/DEQUANTIZE ops (io="float", the default) or int8 themselves (io="int8")."""
    rep = tflite_integer_report(path)
    io_dtype = np.float32 if io == "float" else np.int8
    assert rep["inputs"] and all(d == io_dtype for d in rep["inputs"]), rep["inputs"]
    assert rep["outputs"] and all(d == io_dtype for d in rep["outputs"]), rep["outputs"]
    if io == "float":
        assert rep["ops"].count("QUANTIZE") == len(rep["inputs"]), rep["ops"]
        assert rep["ops"].count("DEQUANTIZE") == len(rep["outputs"]), rep["ops"]
    assert rep["weighted_ops"], "no conv / fully-connected op found"
    for op, act, weights, out in rep["weighted_ops"]:
        assert (act, weights, out) == (np.int8, np.int8, np.int8), f"{op}: {act}, {weights}, {out}"
    assert rep["float_tensors"] == []


def openvino_integer_report(path: Path) -> dict:
    import openvino as ov

    model = ov.Core().read_model(str(path))
    ops = list(model.get_ops())
    types = [op.get_type_name() for op in ops]
    return {
        "fake_quantize": types.count("FakeQuantize"),
        "int8_constants": sum(1 for op in ops if op.get_type_name() == "Constant"
                              and op.get_output_element_type(0).get_type_name() == "i8"),
        "weighted_ops": sum(types.count(t) for t in ("Convolution", "GroupConvolution", "MatMul")),
    }


def assert_openvino_int8(path: Path) -> None:
    rep = openvino_integer_report(path)
    assert rep["weighted_ops"] > 0, rep
    # one activation FakeQuantize and one int8 weight constant per conv / matmul
    assert rep["fake_quantize"] >= rep["weighted_ops"], rep
    assert rep["int8_constants"] >= rep["weighted_ops"], rep


def onnx_integer_report(path: Path) -> dict:
    import onnx

    graph = onnx.load(str(path)).graph
    inits = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    weights = {}
    for node in graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul"):
            dq = producers.get(node.input[1])
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
                weights[node.name] = onnx.helper.tensor_dtype_to_np_dtype(inits[dq.input[0]].data_type)
            else:
                weights[node.name] = None  # float weight fed directly
    ops = [n.op_type for n in graph.node]
    # the zero point's type is the quantized activation type (int8, or uint8 for ORT's x86 U8S8 kernels)
    activations = {onnx.helper.tensor_dtype_to_np_dtype(inits[n.input[2]].data_type)
                   for n in graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits}
    return {"quantize": ops.count("QuantizeLinear"), "dequantize": ops.count("DequantizeLinear"), "weights": weights,
            "activations": activations}


def assert_onnx_int8(path: Path) -> None:
    rep = onnx_integer_report(path)
    assert rep["quantize"] > 0 and rep["dequantize"] > 0, rep
    assert rep["weights"], "no Conv / Gemm / MatMul node"
    assert all(dtype == np.int8 for dtype in rep["weights"].values()), rep["weights"]
    assert rep["activations"] and rep["activations"] <= {np.dtype(np.int8), np.dtype(np.uint8)}, rep["activations"]


INT8_CHECKS = {"litert": assert_tflite_int8, "openvino": assert_openvino_int8, "onnxruntime": assert_onnx_int8}


def ov_default_precision() -> str:
    """The inference precision OpenVINO's CPU plugin uses when not told (``bf16`` on AVX512-BF16/AMX CPUs)."""
    import openvino as ov

    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()


class FakeClock:
    """Seconds that move only when a test (or the code's injected sleep) moves them; ``sleeps`` records each
    sleep asked for."""

    def __init__(self, t: float = 0.0):
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def file_entry(root: Path, path: Path) -> dict:
    """A manifest file entry, written here and not taken from the workstation's bundle writer: the device tests run
    where the converters are not installed (.venv-device)."""
    from edgesdk.file_digest import sha256_file

    return {"path": path.resolve().relative_to(root.resolve()).as_posix(), "sha256": sha256_file(path),
            "bytes": path.stat().st_size}


def write_manifest(root: Path, manifest: dict) -> Path:
    import json

    path = root / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, valid one day, made with the openssl command (a TLS server on loopback
    for the client tests). Fails the test, saying why, where openssl is missing."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make a test certificate", pytrace=False)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key
