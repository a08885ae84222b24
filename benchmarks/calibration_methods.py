"""Calibration range choice per engine (issue 18, item 3): which way of choosing INT8 ranges keeps real models right.

    python benchmarks/calibration_methods.py [--models ppocr_rec,ppocr_det,digits]
        [--engines onnxruntime,openvino,litert] [--calib-seed 0]

Quantizes each model with each engine's own library (not edgesdk's targets, so that every option can be tried)
once per range-choice method, from the same float model and the same calibration samples, and prints one table:
model x engine x method -> the task metric of the INT8 result, a finer measure against its float model, the
int8/float p50 latency ratio (the two interleaved on the first validation samples) and the quantize time.

Methods (the first of each engine is what edgesdk's target does today):

- onnxruntime ``quantize_static`` (QDQ with the settings of ``edgesdk_converters.targets.onnx.OPTIONS``): MinMax,
  MinMax with ``CalibMovingAverage`` (in one calibration pass: the mean of the per-sample min/max), Percentile
  99.99 / 99.999, Entropy as ``quantize_static`` runs it, Entropy with bins to search, Distribution, and two mixes:
  Percentile or the mean inside, MinMax at the graph outputs. ``quantize_static`` hands its Entropy calibrator no
  bin counts (its ``extra_options`` map only ``CalibPercentile``, ``CalibTensorRangeSymmetric`` and the
  moving-average keys onto the calibrator), so the calibrator keeps 128 bins and 128 quantized bins, collects every
  sample into one histogram, and its KL search has exactly one candidate, the whole range: the model is MinMax's,
  byte for byte (the table's notes say so). Rows other than "MinMax (ours)" and that one are calibrated here with
  ``create_calibrator`` (each set of options once per model) and handed to ``quantize_static`` through its
  ``calibration_cache_path``: the calibrator ``quantize_static`` would build itself (Percentile 99.99 gave the same
  numbers both ways), and the only way to give Entropy bins or mix methods per tensor.
- OpenVINO ``nncf.quantize`` (preset performance unless said; INT8 runs with the plugin's defaults, float with the
  f32 hint, as edgesdk's bundles do): activations MINMAX, NNCF's own default (MEAN_MINMAX for per-tensor
  activations), MEAN_QUANTILE, HISTOGRAM; with MINMAX also full bias correction (``fast_bias_correction=False``),
  no bias correction, preset MIXED (asymmetric activations) and, for the recognizer (an SVTR neck of MatMuls),
  ``model_type=TRANSFORMER`` (SmoothQuant on its MatMuls).
- LiteRT via AI Edge Quantizer ``static_wi8_ai8``: edgesdk's running min/max, AEQ's default (an exponential moving
  average of per-sample min/max, smoothing 0.95), the plain mean of per-sample min/max (``mean_min_max``, NNCF's
  default; also mixed: running min/max at the graph outputs), MSE weight ranges (AEQ's MSE algorithm: a
  closed-form clip of each weight channel at 127 * 0.054 * its RMS, about 6.9 sigma; activations stay min/max), and
  int16 activations (``static_wi8_ai16``) as a reference.
  The float .tflite comes from edgesdk's own route (``open_source(path).float_tflite``: ONNX -> edgesdk's importer
  -> litert-torch).

Models and data (made here; no dataset download works): the PP-OCRv4 recognizer at 48x320 (tests/zoo.py
``text_lines``: 32 calibration lines of seed 0, 100 validation lines of seed 1; metric: exact-string accuracy of
greedy CTC decoding against the truth, the charset from the ONNX metadata as rapidocr reads it); the PP-OCRv4
detector at 256x256 (tests/zoo.py's rendered text pages, 32 + 50; metric: mean mask IoU of prob > 0.3 against the
same engine's float model); the digits CNN of samples/digits (scikit-learn's digits, the sample's 70/30 split,
300 calibration images drawn with seed 0, 540 validation images; metric: top-1 accuracy). A float row per engine
gives the float model's own metric (the detector's: against ONNX Runtime's float output, which shows what the
conversion alone moves). The digits model runs in ~0.05 ms: its latency ratios are noise. Runs in ~15 minutes on
2 vCPUs; progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from calibration_cases import CASES, LEGEND, LEGEND_FLOAT, VAL_SEED, Case

TIMED = 30  # validation samples on which float and INT8 are run interleaved for the latency ratio
THREADS = 2


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- running a model ------------------------------------------------------------------------------------------------

def runner(engine: str, path: Path, f32: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """A call that runs one input through ``path`` on ``engine`` and returns the first output (a copy)."""
    if engine == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})[0]
    if engine == "openvino":
        import openvino as ov

        # f32 for the float reference: on AMX/AVX-512 BF16 CPUs the plugin's default runs "fp32" models in bf16
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"} if f32 else {})
        request = compiled.create_infer_request()
        return lambda x: request.infer([x])[0].copy()
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=THREADS)
    interpreter.allocate_tensors()
    i, o = interpreter.get_input_details()[0]["index"], interpreter.get_output_details()[0]["index"]

    def run(x):
        interpreter.set_tensor(i, x)
        interpreter.invoke()
        return interpreter.get_tensor(o).copy()

    return run


def evaluate(case: Case, int8: Callable, fp32: Callable, ref: list[np.ndarray]):
    """(metric, detail, int8/fp32 p50, int8 p50 ms): every validation sample through ``int8``; on the first TIMED
    ones ``fp32`` runs right after it, so that load on the machine hits both alike."""
    int8(case.val[0]), fp32(case.val[0])  # warm-up
    outs, t8, t32 = [], [], []
    for k, x in enumerate(case.val):
        start = time.perf_counter()
        outs.append(int8(x))
        t8.append(time.perf_counter() - start)
        if k < TIMED:
            start = time.perf_counter()
            fp32(x)
            t32.append(time.perf_counter() - start)
    metric, detail = case.score(outs, ref)
    p8 = float(np.median(t8[:TIMED]))
    return metric, detail, p8 / float(np.median(t32)), p8 * 1e3


@dataclass
class Route:
    """One engine's float model and its ways to build an INT8 one: (label, build(path stem) -> INT8 model path)."""

    engine: str
    fp32: Path
    float_label: str
    methods: list[tuple[str, Callable[[Path], Path]]]


def _opened(case: Case):
    from edgesdk_converters.sources import open_source

    source = open_source(case.path)
    source.set_input_shapes({source.inputs[0].name: case.shape})
    return source


# -- onnxruntime ----------------------------------------------------------------------------------------------------

ORT_METHODS = [  # (label, calibrate_method, calibrator options, the method whose ranges the graph outputs take)
    # Options None: quantize_static calibrates itself, as edgesdk's target does. Otherwise the ranges come from
    # create_calibrator given these options (each set computed once), handed over through calibration_cache_path:
    # the same calibrator quantize_static would build from CalibMovingAverage / CalibPercentile, but also with bin
    # counts (which quantize_static cannot pass on) and mixed per tensor.
    ("MinMax (ours)", "MinMax", None, None),
    ("MinMax, CalibMovingAverage (mean of per-sample min/max)", "MinMax", {"moving_average": True}, None),
    ("Percentile 99.99", "Percentile", {"percentile": 99.99}, None),
    ("Percentile 99.999", "Percentile", {"percentile": 99.999}, None),
    ("Entropy (as quantize_static runs it)", "Entropy", None, None),
    ("Entropy, 512 bins / 128 quantized", "Entropy", {"num_bins": 512, "num_quantized_bins": 128}, None),
    ("Distribution", "Distribution", {}, None),
    ("Percentile 99.99 inside, MinMax at the graph outputs", "Percentile", {"percentile": 99.99}, "MinMax"),
    ("mean of per-sample min/max inside, MinMax at the graph outputs", "MinMax", {"moving_average": True}, "MinMax"),
]


def onnxruntime_route(case: Case, work: Path) -> Route:
    import onnx
    from edgesdk_converters.targets.onnx import OPTIONS
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = _opened(case)
    name = source.inputs[0].name
    fp32 = source.float_onnx(work / "fp32.onnx")  # opset 12 -> 13 where per-channel QDQ needs it, as edgesdk does
    prepared = work / "prepared.onnx"
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(case.calib)

        def get_next(self):
            x = next(self._it, None)
            return None if x is None else {name: x}

    calibrated = {}

    def calibrate(method: str, options: dict):
        key = (method, tuple(sorted(options.items())))
        if key not in calibrated:
            calibrator = create_calibrator(
                prepared, list(set(QLinearOpsRegistry) | set(QDQRegistry)), augmented_model_path=str(work / "aug.onnx"),
                calibrate_method=getattr(CalibrationMethod, method), extra_options=options)
            calibrator.collect_data(Reader())
            calibrated[key] = calibrator.compute_data()
        return calibrated[key]

    outputs = [o.name for o in onnx.load(str(prepared), load_external_data=False).graph.output]

    def build(method: str, options: dict | None, at_outputs: str | None, stem: Path) -> Path:
        out, cache = stem.with_suffix(".onnx"), None
        if options is not None:
            cache = stem.with_suffix(".json")
            ranges = copy.copy(calibrate(method, options))
            ranges.data = dict(ranges.data)  # the memo keeps its own
            for output in outputs if at_outputs else ():
                ranges[output] = calibrate(at_outputs, {})[output]
            save_tensors_data(ranges, cache)
        quantize_static(
            str(prepared), str(out), None if cache else Reader(), quant_format=QuantFormat.QDQ,
            per_channel=OPTIONS["per_channel"], reduce_range=OPTIONS["reduce_range"],
            activation_type=getattr(QuantType, OPTIONS["activation_type"]),
            weight_type=getattr(QuantType, OPTIONS["weight_type"]), calibrate_method=getattr(CalibrationMethod, method),
            calibration_cache_path=str(cache) if cache else None)
        return out

    methods = [(label, lambda stem, m=m, o=o, a=a: build(m, o, a, stem)) for label, m, o, a in ORT_METHODS]
    return Route("onnxruntime", fp32, "float", methods)


# -- openvino -------------------------------------------------------------------------------------------------------

def openvino_methods(case: Case) -> list[tuple[str, dict]]:
    """(label, nncf.quantize settings): ``estimator`` a RangeEstimatorParametersSet name or None (NNCF's default)."""
    methods = [
        ("MINMAX, fast bias correction (ours)", {"estimator": "MINMAX"}),
        ("NNCF default (MEAN_MINMAX)", {"estimator": None}),
        ("MEAN_QUANTILE", {"estimator": "MEAN_QUANTILE"}),
        ("HISTOGRAM", {"estimator": "HISTOGRAM"}),
        ("MINMAX, full bias correction", {"estimator": "MINMAX", "fast_bias_correction": False}),
        ("MINMAX, no bias correction", {"estimator": "MINMAX", "disable_bias_correction": True}),
        ("MINMAX, preset MIXED (asymmetric activations)", {"estimator": "MINMAX", "preset": "MIXED"}),
    ]
    if case.key == "ppocr_rec":
        methods.append(("MINMAX, model_type TRANSFORMER (SmoothQuant)", {"estimator": "MINMAX", "transformer": True}))
    return methods


def openvino_route(case: Case, work: Path) -> Route:
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    fp32 = work / "fp32.xml"
    ov.save_model(_opened(case).openvino_model(), str(fp32), compress_to_fp16=False)

    def build(how: dict, stem: Path) -> Path:
        advanced = AdvancedQuantizationParameters(disable_bias_correction=how.get("disable_bias_correction", False))
        if how["estimator"]:
            advanced.activations_range_estimator_params = getattr(RangeEstimatorParametersSet, how["estimator"])
        quantized = nncf.quantize(
            ov.Core().read_model(str(fp32)), nncf.Dataset(case.calib, lambda x: [x]), subset_size=len(case.calib),
            preset=getattr(nncf.QuantizationPreset, how.get("preset", "PERFORMANCE")),
            fast_bias_correction=how.get("fast_bias_correction", True),
            model_type=nncf.ModelType.TRANSFORMER if how.get("transformer") else None, advanced_parameters=advanced)
        ov.save_model(quantized, str(stem.with_suffix(".xml")), compress_to_fp16=False)
        return stem.with_suffix(".xml")

    methods = [(label, lambda stem, h=how: build(h, stem)) for label, how in openvino_methods(case)]
    return Route("openvino", fp32, "float (f32 hint)", methods)


# -- litert ---------------------------------------------------------------------------------------------------------

FLOAT_IO = [  # float input/output tensors, int8 inside: edgesdk's default tflite_io
    {"regex": ".*", "operation": "INPUT", "algorithm_key": "no_quantize"},
    {"regex": ".*", "operation": "OUTPUT", "algorithm_key": "no_quantize"},
]
LITERT_METHODS = [  # (label, recipe, algorithm, range update: "running" edgesdk's running min/max, "aeq" AEQ's
    # moving average, "mean" the mean of per-sample min/max, "mean+outputs" that with running min/max at the outputs)
    ("running min/max (ours)", "static_wi8_ai8", "MIN_MAX_UNIFORM_QUANT", "running"),
    ("AEQ default (moving average)", "static_wi8_ai8", "MIN_MAX_UNIFORM_QUANT", "aeq"),
    ("mean of per-sample min/max", "static_wi8_ai8", "MIN_MAX_UNIFORM_QUANT", "mean"),
    ("mean of per-sample min/max inside, running min/max at the graph outputs", "static_wi8_ai8",
     "MIN_MAX_UNIFORM_QUANT", "mean+outputs"),
    ("MSE weight ranges, running min/max", "static_wi8_ai8", "MSE", "running"),
    ("int16 activations (a16w8), running min/max", "static_wi8_ai16", "MIN_MAX_UNIFORM_QUANT", "running"),
]


def litert_route(case: Case, work: Path) -> Route:
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import algorithm_manager, calibrator, quantizer, recipe, recipe_manager
    from edgesdk_converters.targets.tflite import running_min_max
    from edgesdk_converters.tflite_model import add_signature, prepare_for_quantizer

    start = time.perf_counter()
    fp32 = _opened(case).float_tflite(work / "fp32.tflite")  # edgesdk's route: its ONNX importer, litert-torch
    add_signature(fp32)
    say(f"  float .tflite via edgesdk's route in {time.perf_counter() - start:.0f} s")
    key, signature = next(iter(Interpreter(model_path=str(fp32)).get_signature_list().items()))
    calib = {key: [{signature["inputs"][0]: x} for x in case.calib]}
    float_input = work / "quantizer_input.tflite"
    if not prepare_for_quantizer(fp32, float_input):
        float_input = fp32

    outputs = [d["name"] for d in Interpreter(model_path=str(float_input)).get_output_details()]

    def build(recipe_name: str, algorithm: str, update: str, stem: Path) -> Path:
        chosen = getattr(recipe, recipe_name)(getattr(algorithm_manager.AlgorithmName, algorithm)) + FLOAT_IO
        recipes = recipe_manager.RecipeManager()
        recipes.load_quantization_recipe(chosen)
        func = {"running": running_min_max, "mean": mean_min_max, "mean+outputs": mean_min_max}.get(update)
        calibration = calibrator.Calibrator(str(float_input), num_threads=THREADS,
                                            **({"qsv_update_func": func} if func else {}))
        calibration.calibrate(calib, recipes)
        qsvs = calibration.get_model_qsvs()
        if update == "mean+outputs":
            for name in outputs:
                qsv = qsvs[name]
                qsvs[name] = {"min": qsv.get("lo", qsv["min"]), "max": qsv.get("hi", qsv["max"])}
        out = stem.with_suffix(".tflite")
        quantizer.Quantizer(str(float_input), chosen).quantize(qsvs).export_model(str(out), overwrite=True)
        return out

    methods = [(label, lambda stem, r=r, a=a, u=u: build(r, a, u, stem)) for label, r, a, u in LITERT_METHODS]
    return Route("litert", fp32, "float (.tflite via edgesdk)", methods)


def mean_min_max(qsv: dict, new: dict) -> dict:
    """The mean of every calibration sample's min and max (NNCF's MEAN_MINMAX, ORT's CalibMovingAverage in one pass),
    with the running extremes beside it (``lo``, ``hi``)."""
    if not qsv:
        return {**new, "n": 1, "lo": new["min"], "hi": new["max"]}
    n = qsv.get("n", 1)  # AEQ stores a tensor's first sample as it is, without calling this
    return {"min": (qsv["min"] * n + new["min"]) / (n + 1), "max": (qsv["max"] * n + new["max"]) / (n + 1), "n": n + 1,
            "lo": np.minimum(qsv.get("lo", qsv["min"]), new["min"]),
            "hi": np.maximum(qsv.get("hi", qsv["max"]), new["max"])}


ROUTES = {"onnxruntime": onnxruntime_route, "openvino": openvino_route, "litert": litert_route}


def engine_rows(case: Case, engine: str, work: Path, onnx_ref: list[np.ndarray]):
    """Yield (label, metric, detail, int8/fp32, int8 p50 ms, quantize s, note) for the float model, then for each
    method; a method that fails yields its error as its label."""
    route = ROUTES[engine](case, work)
    float_run = runner(engine, route.fp32, f32=True)
    ref = [float_run(x) for x in case.val]
    yield (route.float_label, *case.score(ref, onnx_ref), None, None, None, None)
    built: dict[str, str] = {}  # artifact digest -> the first method that built it
    for n, (label, build) in enumerate(route.methods):
        try:
            start = time.perf_counter()
            path = build(work / f"int8_{n}")
            seconds = time.perf_counter() - start
            digest = _digest(path)
            note = f"byte-identical model to {built[digest]!r}" if digest in built else None
            built.setdefault(digest, label)
            yield (label, *evaluate(case, runner(engine, path), float_run, ref), seconds, note)
        except Exception as exc:  # one method failing is a result, not the end of the run
            say(traceback.format_exc())
            yield (f"{label}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
                   None, None, None, None, None, None)


def _digest(path: Path) -> str:
    """The hash of a model file (and of its weights file for OpenVINO IR)."""
    import hashlib

    files = [path] + ([path.with_suffix(".bin")] if path.suffix == ".xml" else [])
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


# -- the table ------------------------------------------------------------------------------------------------------

def main() -> None:
    import edgesdk.cpu

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--engines", default=",".join(ROUTES), help=f"comma-separated, of {', '.join(ROUTES)}")
    parser.add_argument("--calib-seed", type=int, default=0,
                        help=f"seed of the calibration data (default 0; not {VAL_SEED}, the validation data's)")
    args = parser.parse_args()
    models, engines = args.models.split(","), args.engines.split(",")
    unknown = sorted(set(models) - set(CASES)) + sorted(set(engines) - set(ROUTES))
    if unknown:
        parser.error(f"unknown model or engine: {', '.join(unknown)}")
    if args.calib_seed == VAL_SEED:
        parser.error(f"--calib-seed {VAL_SEED} would calibrate on the validation data")
    began = time.perf_counter()
    rows, notes = [], []
    for key in models:
        case = CASES[key](args.calib_seed)
        onnx_run = runner("onnxruntime", case.path)
        onnx_ref = [onnx_run(x) for x in case.val]
        for engine in engines:
            say(f"{key} on {engine}")
            with tempfile.TemporaryDirectory(prefix=f"calib-{key}-{engine}-") as work:
                # the libraries print their progress on stdout: it goes with ours to stderr; stdout is the table
                with contextlib.redirect_stdout(sys.stderr):
                    try:
                        for label, metric, detail, ratio, ms, seconds, note in engine_rows(case, engine, Path(work),
                                                                                            onnx_ref):
                            rows.append((key, engine, label, metric, detail, ratio, ms, seconds))
                            notes += [f"{key} / {engine} / {label}: {note}"] if note else []
                            say(f"  {label}" + ("" if metric is None else
                                                f": {case.metric} {metric:.3f}, {case.detail} {detail:.4f}")
                                + (f", int8/fp32 {ratio:.2f}, quantized in {seconds:.0f} s" if ratio else ""))
                    except Exception as exc:  # the engine could not take the float model at all
                        say(traceback.format_exc())
                        rows.append((key, engine, f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
                                     None, None, None, None, None))
    from importlib.metadata import version

    cls = edgesdk.cpu.cpu_class()
    print(f"# Calibration range choice per engine, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    print(f"CPU class {cls['isa_class']}: {cls['model']}, {cls['cpus']} cpus; flags: "
          + ", ".join(f for f, on in cls["flags"].items() if on) + ".")
    print(", ".join(f"{p} {version(p)}" for p in ("onnxruntime", "openvino", "nncf", "ai-edge-quantizer",
                                                  "ai-edge-litert"))
          + f"; LiteRT on {THREADS} threads, the others on their defaults. Calibration data seed {args.calib_seed}, "
            f"validation {VAL_SEED}. Whole run {(time.perf_counter() - began) / 60:.1f} min.\n")
    print("| model | engine | method | metric | finer | int8/fp32 p50 | int8 p50 ms | quantize s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, engine, label, metric, detail, ratio, ms, seconds in rows:
        cells = [key, engine, label, _num(metric), _num(detail, 4), _num(ratio, 2), _num(ms, 3), _num(seconds, 0)]
        print("| " + " | ".join(cells) + " |")
    print()
    for key in models:
        print(f"- {key}: metric {LEGEND[key]}")
    print(f"- {LEGEND_FLOAT}")
    for note in notes:
        print(f"- {note}")


def _num(value, digits: int = 3) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
