"""Each engine's own Python API on an artifact, no edgesdk in the loop: the 'bare' reference of the benchmarks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def bare_call(engine: str, path: Path, x: np.ndarray, precision_hint: str | None):
    """The engine's own API on the artifact, configured as edgesdk configures it on this machine."""
    if engine == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interp = Interpreter(model_path=str(path), num_threads=os.cpu_count())
        interp.allocate_tensors()
        inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
        if inp["dtype"] != np.float32:
            sys.exit(f"{path.name} has {np.dtype(inp['dtype']).name} input tensors; this benchmark compares float I/O "
                     "artifacts (rebuild the bundle with the default --tflite-io float)")

        def call():
            interp.set_tensor(inp["index"], x)
            interp.invoke()
            return interp.get_tensor(out["index"])
        return call
    if engine == "openvino":
        import openvino as ov

        config = {"PERFORMANCE_HINT": "LATENCY"}
        if precision_hint:
            config["INFERENCE_PRECISION_HINT"] = precision_hint
        request = ov.Core().compile_model(str(path), "CPU", config).create_infer_request()
        return lambda: request.infer([x], share_inputs=True)
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: x})
