"""onnx: float ONNX (torch.onnx.export or the source), INT8 QDQ via ``onnxruntime.quantization.quantize_static``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from . import Built, kept_text, ranges_text

# The quantize_static settings of the INT8 artifact. ``reduce_range`` (7-bit weights) keeps ONNX Runtime's U8S8
# kernels exact on every CPU: x86 without VNNI (AVX2, AVX-512F) multiplies through VPMADDUBSW, which adds two
# uint8 x int8 products into a saturating int16 (255 * 127 * 2 > 32767); with weights in [-63, 63] the pair sum
# fits. VNNI/AMX (int32 accumulation) and ARM (dot products) never saturate; there the cost is one bit of weight
# precision, which per-channel scales absorb. Measured in benchmarks/int8_isa.py (see METHOD and the README).
OPTIONS = {"per_channel": True, "reduce_range": True, "activation_type": "QUInt8", "weight_type": "QInt8"}


def method(options: dict) -> str:
    weights = "7-bit (reduce_range)" if options["reduce_range"] else "8-bit"
    act = "uint8" if options["activation_type"] == "QUInt8" else "int8"
    wt = "int8" if options["weight_type"] == "QInt8" else "uint8"
    kind = f"{act[0].upper()}8{wt[0].upper()}8".replace("I", "S")  # U8S8, U8U8, S8S8
    return (f"onnxruntime quantize_static QDQ, {'per-channel' if options['per_channel'] else 'per-tensor'} {weights} "
            f"{wt} weights, {act} activations ({kind}), MinMax calibration"
            + ("; 7-bit weights keep the U8S8 kernels of x86 CPUs without VNNI from saturating"
               if options["reduce_range"] else ""))


METHOD = method(OPTIONS)
PERCENTILE = 99.99
CALIBRATIONS = ("minmax", "percentile")
CALIBRATION_TEXT = {"minmax": "MinMax calibration", "percentile": f"Percentile {PERCENTILE} calibration"}


def build(source, samples: list[list[np.ndarray]], out_dir: Path, progress=lambda it: it,
          keep_float: tuple[str, ...] = (), float_model: Path | None = None,
          calibration_cache: Path | None = None, calibration: str = "minmax", layer_ranges: tuple[str, ...] = (),
          layer_calibration: str = "percentile", layer_calibration_cache: Path | None = None) -> list[Built]:
    """``keep_float``: node names of the float model (as the INT8 model keeps them) left unquantized
    (``nodes_to_exclude``: no Q/DQ pair on their inputs and outputs); ``float_model``: the float ONNX built before
    (recovery re-quantizes it without converting again); ``calibration_cache``: a JSON file of tensor ranges that
    quantize_static writes on the first call and reads on the next ones (recovery's trials calibrate once);
    ``calibration``: ``minmax`` (the default) or ``percentile`` (each activation's range at its 99.99th percentile of
    |value|, which recovery tries: on the PP-OCRv4 recognizer it reads 99 lines of 100 where MinMax reads 68);
    ``layer_ranges``: nodes (named as in ``keep_float``) whose input activations take their ranges from
    ``layer_calibration`` instead (``TensorQuantOverrides``: recovery's per-layer range choice), read from
    ``layer_calibration_cache`` (a cache as ``calibration_cache``; calibrated here when it does not exist yet)."""
    for choice in (calibration, layer_calibration):
        if choice not in CALIBRATIONS:
            raise ConversionError(f"onnx target: calibration must be one of {', '.join(CALIBRATIONS)}, got "
                                  f"{choice!r}")
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32 = Path(float_model) if float_model is not None else source.float_onnx(out_dir / "model_fp32.onnx")
    names = [s.name for s in _onnx_inputs(fp32)]
    if sorted(names) == sorted(s.name for s in source.inputs):
        names = [s.name for s in source.inputs]  # samples are in the source's input order; feed them by name

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
    divisions = _divisions_as_products(prepared, out_dir / "_prepared.onnx")
    if divisions:
        prepared = out_dir / "_prepared.onnx"
    int8 = out_dir / "model_int8.onnx"
    extra = {"CalibPercentile": PERCENTILE} if calibration == "percentile" else {}
    options = dict(OPTIONS)  # read at call time: a test may build the saturating variant on purpose
    try:
        if layer_ranges:
            read = layer_inputs(prepared, layer_ranges)  # an unknown name is refused before any calibration
            other = _ranges(source, samples, fp32, layer_calibration, layer_calibration_cache)
            extra["TensorQuantOverrides"] = _overrides(read, layer_ranges, other)
        quantize_static(
            str(prepared), str(int8), Reader(), quant_format=QuantFormat.QDQ, per_channel=options["per_channel"],
            reduce_range=options["reduce_range"], activation_type=getattr(QuantType, options["activation_type"]),
            weight_type=getattr(QuantType, options["weight_type"]),
            calibrate_method=CalibrationMethod.Percentile if calibration == "percentile" else CalibrationMethod.MinMax,
            extra_options=extra or None,
            nodes_to_exclude=list(keep_float) or None,
            **({"calibration_cache_path": str(calibration_cache)} if calibration_cache is not None else {}),
        )
    except ConversionError:  # a layer_ranges name no node has: said as it is
        raise
    except Exception as exc:
        raise ConversionError(f"onnxruntime quantize_static failed on {source.name}: {exc}") from exc
    finally:
        if prepared != fp32:
            prepared.unlink(missing_ok=True)
    return [
        Built("onnxruntime-fp32", "onnxruntime", "fp32", [fp32], "float reference"),
        Built("onnxruntime-int8", "onnxruntime", "int8", [int8],
              method(options).replace("MinMax calibration", CALIBRATION_TEXT[calibration])
              + (f"; {divisions} divisions by a constant made products by its reciprocal (ONNX Runtime has no "
                 "integer Div: each ran in float between a DequantizeLinear and a QuantizeLinear)" if divisions else "")
              + _upgrade_text(source)
              + kept_text(keep_float, "nodes_to_exclude")
              + ranges_text(layer_ranges, CALIBRATION_TEXT[layer_calibration].replace(" calibration", ""))),
    ]


def _divisions_as_products(model_path: Path, out: Path) -> int:
    """Write ``model_path`` to ``out`` with each ``Div`` by a constant float (an initializer or a Constant node)
    turned into a ``Mul`` by its reciprocal, keeping the node's name; return how many (nothing written for 0).

    ONNX Runtime has no integer Div, so in a QDQ model each Div runs in float between a DequantizeLinear and a
    QuantizeLinear, where a Mul is a QLinearMul: Paddle writes HardSwish as ``x * clip(x + 3, 0, 6) / 6``, 33 Divs
    by 6 on the PP-OCRv4 recognizer (66 conversions per inference). ``x * (1/6)`` differs from ``x / 6`` by at
    most one float32 rounding."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    constants.update({n.output[0]: next((a.t for a in n.attribute if a.name == "value"), None)
                      for n in graph.node if n.op_type == "Constant" and n.output})
    turned = 0
    for n in graph.node:
        if n.op_type != "Div" or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        tensor = constants.get(n.input[1])
        if tensor is None:
            continue
        value = numpy_helper.to_array(tensor)
        if value.dtype not in (np.float32, np.float64) or value.size > 4096 or not np.all(np.isfinite(value)) \
                or np.any(value == 0):
            continue
        reciprocal = numpy_helper.from_array((1.0 / value).astype(value.dtype), f"{n.input[1]}_reciprocal_{turned}")
        graph.initializer.append(reciprocal)
        n.op_type = "Mul"
        n.input[1] = reciprocal.name
        turned += 1
    if turned:
        onnx.save(model, str(out))
    return turned


def _ranges(source, samples, fp32: Path, calibration: str, cache: Path | None):
    """Every activation's range under ``calibration`` (``TensorsData``), from ``cache`` or calibrated now (and kept
    in ``cache`` when one is named)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    with tempfile.TemporaryDirectory(prefix="edgesdk-ort-ranges-") as scratch:
        path = Path(cache) if cache is not None else Path(scratch) / "ranges.json"
        if not path.is_file():
            build(source, samples, Path(scratch), float_model=fp32, calibration_cache=path, calibration=calibration)
        return load_tensors_data(path)


def layer_inputs(model_path: Path, nodes: tuple[str, ...]) -> list[str]:
    """The activations the named nodes read: the tensors whose ranges ``layer_ranges`` replaces (weights and biases
    keep theirs; a node's output is its consumers' input, and the model's outputs keep their own ranges). An
    activation written by an op ONNX Runtime gives its input's parameters (a pool, reshape, transpose, slice...:
    :func:`_same_as_input`) brings that op's input along, up the chain: its own override would be ignored. A name no
    node of the main graph has is refused (the nodes of an If or Loop body are not read): the artifact would silently
    differ from what was asked."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    constants = {i.name for i in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output if out}
    same = _same_as_input()
    wanted, found, tensors = set(nodes), set(), []
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        found.add(node.name)
        for tensor in node.input:
            while tensor and tensor not in constants and tensor not in tensors:
                tensors.append(tensor)
                up = producer.get(tensor)
                if up is None or up.op_type not in same or not up.input:
                    break
                tensor = up.input[0]
    missing = sorted(wanted - found)
    if missing:
        raise ConversionError(f"onnx target: layer_ranges names no node: {', '.join(missing[:5])}"
                              + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    return tensors


def range_overrides(model_path: Path, nodes: tuple[str, ...], ranges) -> dict:
    """``TensorQuantOverrides`` giving every activation the named nodes read (:func:`layer_inputs`) its range from
    ``ranges`` (``TensorsData``). None of them calibrated is refused: the artifact would be the default one."""
    return _overrides(layer_inputs(model_path, nodes), nodes, ranges)


def _overrides(tensors: list[str], nodes: tuple[str, ...], ranges) -> dict:
    overrides = {t: [{"rmin": ranges.data[t].range_value[0], "rmax": ranges.data[t].range_value[1]}]
                 for t in tensors if t in ranges.data}
    if not overrides:
        raise ConversionError(f"onnx target: layer_ranges: no activation {', '.join(nodes)} read was calibrated")
    return overrides


def _same_as_input() -> frozenset[str]:
    """The op types whose output ONNX Runtime's QDQ quantizer may give its (first) input's parameters: those
    quantized by ``QDQDirect8BitOp`` and its subclasses (reshape, transpose, pools, resize, slice...), and Pad, Split
    and Gather (``quantize_output_same_as_input``). Conservative: some share only in some cases (Pad in its reflect,
    edge and wrap modes or with a zero constant; the others when their input is quantized), and there the walk also
    gives the op's input the other range."""
    from onnxruntime.quantization.operators.direct_q8 import QDQDirect8BitOp
    from onnxruntime.quantization.registry import QDQRegistry

    shared = {op for op, quantizer in QDQRegistry.items() if issubclass(quantizer, QDQDirect8BitOp)}
    return frozenset(shared | {"Pad", "Split", "Gather", "GatherElements"})


def _upgrade_text(source) -> str:
    """What the artifact's method says of an opset upgrade the source went through for this target."""
    upgrade = getattr(source, "provenance", {}).get("opset_upgrade")
    if not upgrade or "onnx" not in upgrade["targets"]:
        return ""
    return f"; the opset {source.provenance['opset']} source upgraded to opset {upgrade['to']} with {upgrade['tool']}"


def _onnx_inputs(path: Path):
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]
