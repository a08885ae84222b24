"""openvino: float IR via ``ov.convert_model``, INT8 IR via ``nncf.quantize``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Built, kept_text

CALIBRATIONS = ("minmax", "mean_minmax")
METHOD = ("nncf.quantize (preset performance: symmetric int8, min/max activation ranges, fast bias correction, "
          "first-layer overflow fix)")


def build(source, samples: list[list[np.ndarray]], out_dir: Path, progress=lambda it: it,
          keep_float: tuple[str, ...] = (), float_model: Path | None = None, calibration: str = "minmax"
          ) -> list[Built]:
    """``keep_float``: friendly names of ops left in float (``nncf.IgnoredScope``); ``float_model``: the float IR
    built before (recovery re-quantizes it without converting again); ``calibration``: ``minmax`` (the default) or
    ``mean_minmax`` (NNCF's own default: the mean of each sample's min and max, which recovery tries)."""
    if calibration not in CALIBRATIONS:
        raise ConversionError(f"openvino target: calibration must be one of {', '.join(CALIBRATIONS)}, got "
                              f"{calibration!r}")
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    if float_model is not None:
        fp32 = Path(float_model)
        model = ov.Core().read_model(str(fp32))
    else:
        model = source.openvino_model()
        fp32 = out_dir / "model_fp32.xml"
        ov.save_model(model, str(fp32), compress_to_fp16=False)  # the float reference stays fp32
    dataset = nncf.Dataset(progress(samples), lambda sample: sample)
    try:
        # Min/max activation ranges, as the other two targets use: NNCF's default estimator
        # clipped the digits CNN's logits (max error 4.3 vs 0.24). The overflow fix stays on the first layer
        # for CPUs without VNNI: run as AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, benchmarks/int8_isa.py) the digits logits
        # move by up to 2.4 but no answer changes (98.52% on both); ENABLE (every layer) is exact on every ISA
        # but doubles the error against float on VNNI/AMX CPUs, so it is not worth it here.
        advanced = AdvancedQuantizationParameters(
            activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX) \
            if calibration == "minmax" else AdvancedQuantizationParameters()
        ignored = nncf.IgnoredScope(names=list(keep_float), validate=False) if keep_float else None
        quantized = nncf.quantize(model, dataset, subset_size=len(samples), preset=nncf.QuantizationPreset.PERFORMANCE,
                                  advanced_parameters=advanced, **({"ignored_scope": ignored} if ignored else {}))
    except Exception as exc:
        raise ConversionError(f"nncf.quantize failed on {source.name}: {exc}") from exc
    int8 = out_dir / "model_int8.xml"
    ov.save_model(quantized, str(int8), compress_to_fp16=False)
    return [
        # On AMX CPUs OpenVINO runs "fp32" as bf16 unless told f32: the float reference must say so.
        Built("openvino-fp32", "openvino", "fp32", [fp32, fp32.with_suffix(".bin")], "float reference",
              runtime={"precision_hint": "f32"}),
        Built("openvino-int8", "openvino", "int8", [int8, int8.with_suffix(".bin")],
              (METHOD if calibration == "minmax" else METHOD.replace("min/max activation ranges",
                                                                      "mean min/max activation ranges"))
              + kept_text(keep_float, "nncf.IgnoredScope")),
    ]
