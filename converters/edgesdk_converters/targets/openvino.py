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
    folded = fold_weights(model)
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
              + kept_text(keep_float, "nncf.IgnoredScope")
              + (f"; {folded} weights folded to constants before quantizing" if folded else "")),
    ]


# layers whose input 1 is a weight NNCF quantizes when it is a Constant
WEIGHTED = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData", "MatMul")


def fold_weights(model) -> int:
    """Replace each weight computed from constants alone (a float16 Constant, its decompression Convert, then the
    Reshape/Unsqueeze/Transpose OpenVINO's TFLite frontend puts on a depthwise kernel) by the float32 Constant it
    computes; return how many. NNCF quantizes a weight only when it sees a Constant (through a Convert at most):
    on BlazeFace its 16 depthwise convolutions kept float weights and ran in bf16 on AMX, between int8 layers. The
    values are the same (every float16 is a float32); the float reference is saved before and keeps its form."""
    import openvino as ov
    from openvino import opset13 as ops

    def constant_only(output, seen: set) -> bool:
        node = output.get_node()
        if node.get_type_name() == "Constant":
            return True
        if node.get_type_name() == "Parameter" or id(node) in seen:
            return False
        seen.add(id(node))
        return all(constant_only(i.get_source_output(), seen) for i in node.inputs())

    targets = []
    for op in model.get_ordered_ops():
        if op.get_type_name() in WEIGHTED and op.get_input_size() > 1:
            weight = op.input(1).get_source_output()
            if weight.get_node().get_type_name() != "Constant" and constant_only(weight, set()) \
                    and weight.get_element_type() == ov.Type.f32:
                targets.append((op, weight))
    if not targets:
        return 0
    computed = ov.Model([w for _, w in targets], [], "weights")
    compiled = ov.Core().compile_model(computed, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    values = compiled.create_infer_request().infer({})
    for (op, _), value in zip(targets, values.values()):
        op.input(1).replace_source_output(ops.constant(np.asarray(value, np.float32)).output(0))
    model.validate_nodes_and_infer_types()
    return len(targets)
