"""A V2 server made the way KServe's docs show a custom model: ``kserve.Model`` subclasses in KServe's own ModelServer,
with no edgesdk code. Run by :mod:`v2_peers` in the cloud venv (kserve, onnxruntime):
``python v2_peer_kserve.py BUNDLE PORT``. Bound to 127.0.0.1 only, no gRPC.

It serves the bundle's float ONNX artifact under the model names of :data:`v2_peers.MODELS`: their metadata lists
what each says (KServe's default for a custom model lists no inputs and no outputs), and each answers as it says.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ARGV, sys.argv = sys.argv, sys.argv[:1]  # kserve.model_server parses the command line when it is imported
import kserve  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse  # noqa: E402
sys.argv = ARGV

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from v2_peers import MODELS, answer  # noqa: E402


class Peer(kserve.Model):
    def __init__(self, name: str, session: ort.InferenceSession, manifest: dict, listed: dict):
        super().__init__(name)
        self.session, self.manifest, self.listed = session, manifest, listed
        self.ready = True

    def get_input_types(self) -> list[dict]:
        return self.listed.get("inputs", [])

    def get_output_types(self) -> list[dict]:
        return self.listed.get("outputs", [])

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32)
        out = answer(self.listed["answer"], self.session.run(None, {self.session.get_inputs()[0].name: x})[0])
        output = InferOutput(name=self.manifest["outputs"][0]["name"], shape=list(out.shape), datatype="FP32")
        output.set_data_from_numpy(out.astype(np.float32), binary_data=False)
        return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=[output])


class LoopbackModelServer(kserve.ModelServer):
    """KServe's ModelServer builds its REST server with host 0.0.0.0 inside start(); bound to loopback here."""

    async def _serve(self) -> None:
        rest = getattr(self, "_rest_server", None)
        if rest is None or getattr(rest, "config", None) is None:  # never serve on every interface instead
            raise RuntimeError("this kserve does not build its REST server as the test expects: not serving")
        rest.config.host = "127.0.0.1"
        await super()._serve()


def main() -> None:
    bundle, port = Path(sys.argv[1]), int(sys.argv[2])
    manifest = json.loads((bundle / "manifest.json").read_text())
    onnx = next(a for a in manifest["artifacts"] if a["id"] == "onnxruntime-fp32")["files"][0]["path"]
    session = ort.InferenceSession(str(bundle / onnx), providers=["CPUExecutionProvider"])
    models = [Peer(name, session, manifest, listed(manifest, spec)) for name, spec in MODELS.items()]
    LoopbackModelServer(http_port=port, workers=1, enable_grpc=False).start(models)


def listed(manifest: dict, spec: dict) -> dict:
    """What a model lists, in KServe's spelling of the datatype (a custom model's author writes it: lower case)."""
    metadata = spec["metadata"](manifest)
    for tensor in metadata.get("inputs", []) + metadata.get("outputs", []):
        tensor["datatype"] = tensor["datatype"].lower()
    return {**metadata, "answer": spec["answer"]}


if __name__ == "__main__":
    main()
