"""onnx: float ONNX (torch.onnx.export or the source), INT8 QDQ via ``onnxruntime.quantization.quantize_static``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Built

METHOD = "onnxruntime quantize_static QDQ, per-channel int8 weights, uint8 activations (U8S8), MinMax calibration"


def build(source, samples: list[list[np.ndarray]], out_dir: Path, progress=lambda it: it) -> list[Built]:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32 = source.float_onnx(out_dir / "model_fp32.onnx")
    names = [s.name for s in _onnx_inputs(fp32)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(progress(samples))

        def get_next(self):
            sample = next(self._it, None)
            return None if sample is None else dict(zip(names, sample))

    prepared = out_dir / "_prepared.onnx"
    try:
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    except Exception as exc:  # pre-processing only helps; quantize the raw graph when it fails
        logging.getLogger(__name__).info("quant_pre_process skipped for %s: %s", source.name, exc)
        prepared.unlink(missing_ok=True)
        prepared = fp32
    int8 = out_dir / "model_int8.onnx"
    try:
        quantize_static(
            str(prepared), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
        )
    except Exception as exc:
        raise ConversionError(f"onnxruntime quantize_static failed on {source.name}: {exc}") from exc
    finally:
        if prepared != fp32:
            prepared.unlink(missing_ok=True)
    return [
        Built("onnxruntime-fp32", "onnxruntime", "fp32", [fp32], "float reference"),
        Built("onnxruntime-int8", "onnxruntime", "int8", [int8], METHOD),
    ]


def _onnx_inputs(path: Path):
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]
