"""tflite: float model via litert-torch (or the source itself), full-integer INT8 via AI Edge Quantizer."""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from edgesdk.errors import ConversionError

from ..tflite_model import add_signature, prepare_for_quantizer
from . import Built, kept_text, ranges_text

# XNNPACK's int8 kernels widen to 32-bit before they add: the same artifact gives identical logits on an AVX2 CPU
# without VNNI (qemu Haswell) and on VNNI/AMX (benchmarks/int8_isa.py), so no weight-range trick is needed here.
METHOD = "ai-edge-quantizer static_wi8_ai8 (int8 weights per-channel, int8 activations, running min/max calibration)"
IO_TYPES = ("float", "int8")
CALIBRATION_TEXT = {"minmax": "running min/max", "mean_minmax": "mean of per-sample min/max"}
CALIBRATIONS = tuple(CALIBRATION_TEXT)
# Keep the model's input and output tensors float: QUANTIZE/DEQUANTIZE ops inside the graph do the
# conversion (XNNPACK runs them in one fused pass); everything between is int8.
_FLOAT_IO = [
    {"regex": ".*", "operation": "INPUT", "algorithm_key": "no_quantize"},
    {"regex": ".*", "operation": "OUTPUT", "algorithm_key": "no_quantize"},
]


def running_min_max(qsv: dict, new: dict) -> dict:
    """Widen each tensor's range to cover every calibration sample.

    AI Edge Quantizer's default update is a moving average of per-sample min/max
    (smoothing 0.95), which clips the tails: on the digits CNN it clipped the top
    logits from ~19 to 15 (max error 16.6 vs 0.76 with true min/max, same agreement).
    """
    if not qsv:
        return new
    return {"min": np.minimum(qsv["min"], new["min"]), "max": np.maximum(qsv["max"], new["max"])}


def mean_min_max(qsv: dict, new: dict) -> dict:
    """The mean of every calibration sample's min and max (NNCF's MEAN_MINMAX): outliers of a few samples do not
    stretch the range (on the PP-OCRv4 recognizer: 83 lines of 100 where running min/max reads 69)."""
    if not qsv:
        return {**new, "n": 1}
    n = qsv.get("n", 1)  # AEQ keeps a tensor's first sample as it is, without calling this
    return {"min": (qsv["min"] * n + new["min"]) / (n + 1), "max": (qsv["max"] * n + new["max"]) / (n + 1), "n": n + 1}


def _ops_named(model, names: tuple[str, ...], what: str):
    """Each op (with its graph) of ``model`` (AI Edge Quantizer's flatbuffer object) with an output tensor named in
    ``names``. A repeated name (the layer probe's ``"name #index"``) stands for every op that outputs a tensor of that
    name; a name no op outputs is refused: the artifact would silently differ from what was asked (``what``: the
    option, for the error)."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    from ..layers.litert import tensor_name

    wanted = {tensor_name(name) or name for name in names}
    found = set()
    for graph in model.subgraphs:
        for op in graph.operators:
            outputs = {tfl.get_tensor_name(graph.tensors[i]) for i in op.outputs if i != -1}
            if outputs & wanted:
                found |= outputs & wanted
                yield graph, op
    missing = sorted(wanted - found)
    if missing:
        raise ConversionError(f"tflite target: {what} names no op's output tensor: {', '.join(missing[:5])}"
                              + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))


def kept_scopes(model: str | Path, keep_float: tuple[str, ...]) -> list[dict]:
    """One ``no_quantize`` recipe entry per op with an output tensor named in ``keep_float``, matching that op's
    whole scope and nothing else.

    AI Edge Quantizer matches a recipe's regex (``re.search``) against an op's scope: its output tensor names joined
    by ``;``, with a ``;`` after the last. Tensor names carry ``;`` themselves (litert-torch names a fused op
    ``W;;W;;W;65``), so a pattern built from one name alone also matches other ops' scopes that end in it (``W;;W;65``
    inside ``W;;W;;W;65``): on the PP-OCRv4 recognizer, keeping 36 ops in float kept dozens more."""
    if not keep_float:
        return []
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    flat = tfl.read_model(str(model))
    scopes = [tfl.get_op_scope(op, graph.tensors) for graph, op in _ops_named(flat, keep_float, "keep_float")]
    return [{"regex": f"^{re.escape(scope)}$", "operation": "*", "algorithm_key": "no_quantize"}
            for scope in dict.fromkeys(scopes)]


def layer_tensors(model: str | Path, layers: tuple[str, ...]) -> list[str]:
    """The names of the tensors the ops named in ``layers`` (by an output tensor name, as ``keep_float``) read: the
    tensors whose ranges ``layer_ranges`` replaces (an op's output is its consumers' input, and the model's output
    keeps its own range). A tensor written by an op AI Edge Quantizer gives its input's parameters (a pool, reshape,
    transpose, pad...) brings that op's input along, up the chain: its own range would be ignored. Only ops of the
    graphs' own lists are read (no control flow bodies: AI Edge Quantizer quantizes none)."""
    from ai_edge_litert.tools.flatbuffer_utils import opcode_to_name
    from ai_edge_quantizer.algorithms.utils.common_utils import OpQuantConstraint
    from ai_edge_quantizer.utils import constrained_ops_utils
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    same = {str(getattr(o, "value", o))
            for o in constrained_ops_utils.get_constrained_op_list(OpQuantConstraint.SAME_AS_INPUT_SCALE)}
    data = {"SPLIT": 1}  # the input that carries the values (SPLIT's first is its axis); the first for the others
    flat = tfl.read_model(str(model))
    names = []
    for graph, op in _ops_named(flat, layers, "layer_ranges"):
        producer = {i: p for p in graph.operators for i in p.outputs if i != -1}
        for i in op.inputs:
            seen = set()
            while i != -1 and i not in seen:
                seen.add(i)
                names.append(tfl.get_tensor_name(graph.tensors[i]))
                up = producer.get(i)
                kind = None if up is None else opcode_to_name(flat, up.opcodeIndex)
                if kind not in same or len(up.inputs) <= data.get(kind, 0):
                    break
                i = up.inputs[data.get(kind, 0)]
    return list(dict.fromkeys(names))


# an op type is kept float when its int8 ops take this many times its float ops' time (alone, summed), and the
# difference is at least MIN_SHARE of the int8 model's time: Q/DQ pairs around a float op cost something too
SLOWER = 1.3
MIN_SHARE = 0.02
# ... and at least this many ms per inference: below it the per-op timings are noise (the digits CNN's MAX_POOL_2D
# read "0.00 ms against 0.00 ms" and was kept float in one build of eight)
MIN_MS = 0.05
# the whole model must be this much faster with the choice, timed interleaved, for it to be kept
MIN_GAIN = 0.05
# never kept float for speed: the layers INT8 is for. When these are slower in int8 the model cannot gain from INT8
# on this engine and CPU (small channel counts: BlazeFace, the face mesh); the artifact stays full INT8 (what an
# NPU delegate needs), validation says why it is slower, and the device's first load serves the faster float one
CORE_TYPES = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def speed_choice(float_model: Path, int8_model: Path, sample: list[np.ndarray], requantize) -> dict:
    """Which op types the INT8 model keeps float so that XNNPACK runs it fast, measured op by op on this CPU
    (:mod:`edgesdk.bench.ops.litert`): ``{"kept": {type: reason}, "kept_ops": [tensor name], "text": ..., "ms":
    {type: {"fp32": ms, "int8": ms}}}``.

    Two kinds, both left to AI Edge Quantizer's ``no_quantize`` by op type (the op then runs in float inside
    XNNPACK between a DEQUANTIZE and a QUANTIZE, which XNNPACK runs too):

    - types every int8 op of which runs outside XNNPACK while the float model runs them inside (XNNPACK has a
      float kernel and no int8 one: HARD_SWISH in LiteRT 2.3): on the PP-OCRv4 detector its 24 HARD_SWISH split the
      INT8 graph into 31 XNNPACK partitions;
    - types whose int8 ops take ``SLOWER`` times the float ones' time: XNNPACK's int8 TRANSPOSE_CONV took 32.8 ms
      against 8.9 ms in float on the detector (where every int8 CONV_2D together took 2.4 ms against 19.0); never
      the ``CORE_TYPES``, which INT8 is for.

    Single int8 ops XNNPACK refused while it takes the others of their type are kept float by name.

    ``requantize(kept, kept_ops)`` writes the model with ``kept`` types and ``kept_ops`` float and returns its
    path; the choice is kept only when that model is ``MIN_GAIN`` faster as a whole than ``int8_model`` (timed
    interleaved), else nothing is kept."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_quantizer.utils.tfl_flatbuffer_utils import TFL_OP_NAME_TO_CODE
    from edgesdk.bench.ops import litert as profiler

    from ..tflite_model import operators

    # LiteRT's operator name -> AI Edge Quantizer's (TRANSPOSE_CONV is its CONV_2D_TRANSPOSE)
    builtin = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    nameable = {builtin[code]: str(getattr(name, "value", name)) for name, code in TFL_OP_NAME_TO_CODE.items()
                if code in builtin}
    every = Counter(op.name for op in operators(int8_model) if op.subgraph == 0)
    missed = profiler.ops_outside_xnnpack(int8_model)
    outside_int8, outside_float = Counter(kind for kind, _, _ in missed), profiler.outside_xnnpack(float_model)
    kept = {t: f"XNNPACK has no int8 kernel for it ({n} op(s) would run outside XNNPACK)"
            for t, n in sorted(outside_int8.items())
            if n == every[t] and not outside_float.get(t) and t not in ("QUANTIZE", "DEQUANTIZE") and t in nameable}
    # single int8 ops XNNPACK refused while taking the others of their type (an ADD of a constant whose scale is
    # under 1/1024 of its output's): kept float by name
    kept_ops = sorted({name for kind, name, dtype in missed if dtype in ("int8", "int16") and kind not in kept
                       and not outside_float.get(kind) and kind not in ("QUANTIZE", "DEQUANTIZE") and name})
    ms = {}
    try:
        timed = {side: profiler.profile(path, sample, None, 10, 0.005)
                 for side, path in (("fp32", float_model), ("int8", int8_model))}
    except Exception as exc:  # the choice is a speed-up: a model the profiler cannot cut keeps what it has
        timed, why = None, f"{type(exc).__name__}: {exc}"
    if timed:
        per_type = {side: Counter() for side in timed}
        for side, found in timed.items():
            for row in found["ops"]:
                per_type[side][row["type"]] += row.get("ms") or 0.0
        whole = timed["int8"]["whole_ms"]
        for t, int8_ms in per_type["int8"].items():
            fp32_ms = per_type["fp32"].get(t)
            if (t in nameable and t not in kept and t not in ("QUANTIZE", "DEQUANTIZE", *CORE_TYPES) and fp32_ms
                    and int8_ms > SLOWER * fp32_ms and int8_ms - fp32_ms > max(MIN_SHARE * whole, MIN_MS)):
                kept[t] = f"slower in int8 here ({int8_ms:.2f} ms against {fp32_ms:.2f} ms in float, ops alone)"
                ms[t] = {"fp32": round(fp32_ms, 3), "int8": round(int8_ms, 3)}
    if not kept and not kept_ops:
        return {"kept": {}, "kept_ops": [], "text": "" if timed else f"per-op speed not measured ({why[:200]})",
                "ms": ms}
    try:
        candidate = requantize(kept, kept_ops)
    except ConversionError:  # a name AI Edge Quantizer's scopes do not match: the types alone
        kept_ops = []
        candidate = requantize(kept, kept_ops)
    before, after = _interleaved(int8_model, candidate)
    what = ", ".join(list(kept) + ([f"{len(kept_ops)} single op(s)"] if kept_ops else []))
    if after > (1 - MIN_GAIN) * before:
        return {"kept": {}, "kept_ops": [], "ms": ms, "text": f"keeping {what} float was not {MIN_GAIN:.0%} faster "
                f"as a whole ({after:.2f} ms against {before:.2f} ms): every op quantized"}
    reasons = [f"{t}: {why}" for t, why in kept.items()]
    if kept_ops:
        reasons.append(f"{len(kept_ops)} int8 op(s) XNNPACK refused while taking the others of their type "
                       f"({', '.join(n[-40:] for n in kept_ops[:3])}{', ...' if len(kept_ops) > 3 else ''})")
    return {"kept": kept, "kept_ops": kept_ops, "ms": ms, "text": "kept float for speed on this CPU ("
            + "; ".join(reasons) + f"; the model {before:.2f} -> {after:.2f} ms)"}


def _quantize(quantizer, float_input: str, chosen: list[dict], kept: dict, kept_ops: list[str], qsvs: dict,
              out: Path) -> Path:
    """AI Edge Quantizer's model of ``float_input`` with the op types ``kept`` (LiteRT's names) and the ops writing
    the tensors ``kept_ops`` left float."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_quantizer.utils.tfl_flatbuffer_utils import TFL_OP_NAME_TO_CODE

    names = {getattr(schema.BuiltinOperator, t, None) for t in kept}
    operations = [str(getattr(n, "value", n)) for n, code in TFL_OP_NAME_TO_CODE.items() if code in names]
    qt = quantizer.Quantizer(float_input, chosen + [{"regex": ".*", "operation": o, "algorithm_key": "no_quantize"}
                                                    for o in operations] + kept_scopes(float_input, tuple(kept_ops)))
    qt.quantize(qsvs).export_model(str(out), overwrite=True)
    return out


def _interleaved(first: Path, second: Path, rounds: int = 5) -> tuple[float, float]:
    """Median ms per inference of two models on XNNPACK, timed in alternating rounds (noise hits both alike)."""
    from ai_edge_litert.interpreter import Interpreter
    from edgesdk.bench.ops.timing import time_call

    runs = []
    for path in (first, second):
        interp = Interpreter(model_path=str(path), num_threads=os.cpu_count() or 1)
        interp.allocate_tensors()
        runs.append(interp)
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, interp in enumerate(runs):
            times[i].append(time_call(interp.invoke, 5, 0.02))
    return float(np.median(times[0])), float(np.median(times[1]))


def build(source, samples: list[list[np.ndarray]], out_dir: Path, progress=lambda it: it,
          io: str = "float", keep_float: tuple[str, ...] = (), float_model: Path | None = None,
          statistics: dict | None = None, calibration: str = "minmax", layer_ranges: tuple[str, ...] = (),
          layer_calibration: str = "mean_minmax", speed: dict | None = None) -> list[Built]:
    """``io="float"``: float32 input/output tensors, int8 inside (the fast default on CPUs, GPUs and
    most NPU delegates); ``io="int8"``: integer-only, int8 input/output too (Coral Edge TPU,
    microcontrollers). edgesdk's LiteRT engine quantizes/dequantizes int8 I/O itself. ``keep_float``: output tensor
    names of ops AI Edge Quantizer leaves in float (a ``no_quantize`` recipe entry each, matched on the op's scope:
    its output tensor names); ``float_model``: the float .tflite built before (recovery re-quantizes it without
    converting again); ``statistics``: a dict the calibration statistics are kept in on the first call and read
    from on the next ones, per range choice (recovery's trials calibrate once); ``calibration``: ``minmax`` (running
    min/max, the default) or ``mean_minmax`` (the mean of each sample's min and max, which recovery tries);
    ``layer_ranges``: ops (named as in ``keep_float``) whose input tensors take their ranges from
    ``layer_calibration`` instead (recovery's per-layer range choice: a layer that breaks the model with one range
    choice can pass with the other); ``speed``: a dict the op types kept float for speed (:func:`speed_choice`) are
    kept in on the first call and read from on the next ones (recovery's trials decide once)."""
    for choice in (calibration, layer_calibration):
        if choice not in CALIBRATIONS:
            raise ConversionError(f"tflite target: calibration must be one of {', '.join(CALIBRATIONS)}, got "
                                  f"{choice!r}")
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import calibrator, quantizer, recipe, recipe_manager

    fp32 = Path(float_model) if float_model is not None else source.float_tflite(out_dir / "model_fp32.tflite")
    # MediaPipe's files have no SignatureDef, which AI Edge Quantizer calibrates through: both artifacts get one.
    signature_added = add_signature(fp32)
    signatures = Interpreter(model_path=str(fp32)).get_signature_list()
    key, sig = next(iter(signatures.items()))
    names = sig["inputs"]
    if len(names) != len(source.inputs):
        raise ConversionError(f"tflite signature {key!r} has inputs {names}; the source has {len(source.inputs)}")
    if sorted(names) == sorted(s.name for s in source.inputs):
        names = [s.name for s in source.inputs]  # signatures list inputs by name, not in the model's order
    calib = {key: progress([dict(zip(names, sample)) for sample in samples])}
    int8 = out_dir / "model_int8.tflite"
    calibrated = recipe.static_wi8_ai8() + (_FLOAT_IO if io == "float" else [])
    # calibrated with every op quantized (a quantized op next to a float one needs the statistics of the tensor
    # they share), quantized with the kept ones left out
    with tempfile.TemporaryDirectory(prefix="edgesdk-aeq-") as scratch:  # out_dir becomes the bundle: no extras
        prepared = prepare_for_quantizer(fp32, Path(scratch) / "quantizer_input.tflite")
        float_input = str(Path(scratch) / "quantizer_input.tflite") if prepared else str(fp32)
        chosen = calibrated + kept_scopes(float_input, keep_float)
        swapped = layer_tensors(float_input, layer_ranges) if layer_ranges else []
        try:
            statistics = {} if statistics is None else statistics

            def ranges(choice: str) -> dict:
                if choice not in statistics:
                    recipes = recipe_manager.RecipeManager()
                    recipes.load_quantization_recipe(calibrated)
                    calib_run = calibrator.Calibrator(
                        float_input, num_threads=os.cpu_count() or 1,
                        qsv_update_func=running_min_max if choice == "minmax" else mean_min_max)
                    calib_run.calibrate(calib, recipes)
                    statistics[choice] = calib_run.get_model_qsvs()
                return statistics[choice]

            qsvs = ranges(calibration)
            if swapped:
                other = ranges(layer_calibration)
                if not any(t in other for t in swapped):
                    raise ConversionError(f"layer_ranges: none of the tensors {', '.join(layer_ranges)} read has "
                                          f"{layer_calibration} statistics")
                qsvs = {**qsvs, **{t: other[t] for t in swapped if t in other}}
            qt = quantizer.Quantizer(float_input, chosen)
            qt.quantize(qsvs).export_model(str(int8), overwrite=True)
            # Op types XNNPACK runs slower in int8, or not at all: kept float (decided once, on the first build;
            # recovery's trials reuse the decision through ``speed``)
            speed = {} if speed is None else speed
            if "choice" not in speed:
                def requantize(kept: dict, ops: list[str]) -> Path:
                    return _quantize(quantizer, float_input, chosen, kept, ops, qsvs, Path(scratch) / "kept.tflite")

                speed["choice"] = speed_choice(Path(float_input), int8, samples[0], requantize)
            choice = speed["choice"]
            if choice["kept"] or choice["kept_ops"]:
                _quantize(quantizer, float_input, chosen, choice["kept"], choice["kept_ops"], qsvs, int8)
        except Exception as exc:  # the quantizer raises plain Exceptions/ValueErrors on unsupported ops
            raise ConversionError(f"AI Edge Quantizer failed on {source.name}: {exc}") from exc
    kept_note = speed["choice"]["text"]
    notes = "".join(f"; {note}" for note in [signature_added, *(f"quantizer input: {p}" for p in prepared), kept_note]
                    if note)
    return [
        Built("litert-fp32", "litert", "fp32", [fp32], "float reference"),
        Built("litert-int8", "litert", "int8", [int8],
              METHOD.replace("running min/max", CALIBRATION_TEXT[calibration]) + f", {io} input/output tensors{notes}"
              + kept_text(keep_float, "AI Edge Quantizer no_quantize")
              + ranges_text(layer_ranges, CALIBRATION_TEXT[layer_calibration])),
    ]
