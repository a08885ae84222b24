"""Seldon MLServer's custom-runtime side of the interop tests: an ``mlserver.MLModel`` running the bundle's float ONNX
artifact with ONNX Runtime. MLServer imports it by the ``implementation`` of each model's ``model-settings.json``,
which :mod:`v2_peers` writes (with this file's folder on ``PYTHONPATH``) and serves with ``mlserver start`` from
the MLServer venv. What a model's metadata lists is its model-settings' ``inputs`` and ``outputs`` (none: MLServer
lists none); how it answers is ``parameters.extra.answer``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

sys.path.insert(0, str(Path(__file__).parent))
from v2_peers import answer  # noqa: E402


class OnnxPeer(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        bundle = Path(extra["bundle"])
        self.manifest = json.loads((bundle / "manifest.json").read_text())
        onnx = next(a for a in self.manifest["artifacts"] if a["id"] == "onnxruntime-fp32")["files"][0]["path"]
        self.session = ort.InferenceSession(str(bundle / onnx), providers=["CPUExecutionProvider"])
        self.answer = extra["answer"]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        out = answer(self.answer, self.session.run(None, {self.session.get_inputs()[0].name: x})[0])
        output = NumpyCodec.encode_output(self.manifest["outputs"][0]["name"], out.astype(np.float32))
        return InferenceResponse(id=payload.id, model_name=self.name, outputs=[output])
