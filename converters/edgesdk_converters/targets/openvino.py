"""openvino: float IR via ``ov.convert_model``, INT8 IR via ``nncf.quantize``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Built

METHOD = "nncf.quantize (preset performance: symmetric int8, fast bias correction)"


def build(source, samples: list[list[np.ndarray]], out_dir: Path) -> list[Built]:
    import nncf
    import openvino as ov

    model = source.openvino_model()
    fp32 = out_dir / "model_fp32.xml"
    ov.save_model(model, str(fp32), compress_to_fp16=False)  # the float reference stays fp32
    dataset = nncf.Dataset(samples, lambda sample: sample)
    try:
        quantized = nncf.quantize(model, dataset, subset_size=len(samples), preset=nncf.QuantizationPreset.PERFORMANCE)
    except Exception as exc:
        raise ConversionError(f"nncf.quantize failed on {source.name}: {exc}") from exc
    int8 = out_dir / "model_int8.xml"
    ov.save_model(quantized, str(int8), compress_to_fp16=False)
    return [
        Built("openvino-fp32", "openvino", "fp32", [fp32, fp32.with_suffix(".bin")], "float reference"),
        Built("openvino-int8", "openvino", "int8", [int8, int8.with_suffix(".bin")], METHOD),
    ]
