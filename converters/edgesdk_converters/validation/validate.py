"""Validation: every INT8 artifact against its float reference on the same engine, every float artifact against the
golden float reference (another engine's conversion of the same source), on held-out data, judged by the task.

Samples are streamed (loaded once, run on every artifact, decoded, dropped), so the memory cost does not grow with
the validation set. Each artifact gets one entry in the manifest's ``validation`` table:

- the raw numbers of :mod:`.output_errors` (cosine, max |error|, its cap: the classification and raw tasks' gate,
  reported for the others, and the bound of the golden tolerance a device checks);
- the task's own metric on decoded outputs (:mod:`.task_metrics`): ``task``, ``metric``, ``metric_value``,
  ``reference_metric_value`` (with labels), ``drop`` in ``drop_unit`` against ``max_drop`` (None: the task's
  default), ``details`` (the task's numbers); or a user's plug-in metric (:mod:`.metric_plugin`) in its place;
- with ground truth of the task's kind (detection boxes, segmentation masks, texts: :mod:`.task_truth`), an INT8
  artifact is gated by its drop on the truth against its float reference's (``map50``, ``miou``,
  ``text_accuracy``), the agreement numbers kept in ``details``; every artifact's truth scores are in
  ``details["truth"]`` and ``details["reference_truth"]`` (a float artifact stays judged by agreement);
- the dead-output check every task runs: an output that varies far less than its reference's over the set fails
  the artifact (``dead_output``: their names; ``output_std`` / ``reference_output_std``);
- ``passed``.

Classification keeps every key it had before tasks (``top1_agreement``, ``accuracy_drop_points``, ``gate``,
``max_drop_points``...), so older readers read it. Latency is measured afterwards at batch 1, INT8 and float
interleaved so that machine noise hits both alike.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

import numpy as np

from edgesdk.engines import Engine, open_engine
from edgesdk.errors import BackendUnavailable, ConversionError, InputError
from edgesdk.runtime.numerics import run_as_given
from edgesdk.tasks.decode import decode
from edgesdk.tasks.geometry import Transform, input_image_size
from edgesdk.tasks import TaskSpec, TaskType

from ..calibration import Dataset
from .metric_plugin import DEFAULT_MAX_DROP as PLUGIN_MAX_DROP, PluginScore, load_metric, metric_name
from .output_errors import INT8_ERROR_CAP, INT8_STEPS, Tally, add, check_each_output, error_caps, golden_tolerances
from .output_errors import output_caps
from ..targets import Built
from .output_spread import OutputSpread, dead_outputs
from .metric_base import TaskMetric
from .task_metrics import metric_for
from .task_truth import TruthScore, truth_gate, truth_score_for

# the names tests and options import from here (the tallies moved to output_errors)
_Tally, _add = Tally, add
__all__ = ["GOLDEN_COUNT", "GOLDEN_ORDER", "INT8_ERROR_CAP", "INT8_STEPS", "CLASSIFICATION_MAX_DROP", "error_caps",
           "load_metric", "open_for_validation", "output_caps", "run_sample", "validate"]

GOLDEN_COUNT = 8
# Preferred ground truth for the golden outputs (the float reference most engines agree with).
GOLDEN_ORDER = ("onnxruntime-fp32", "openvino-fp32", "litert-fp32")
CLASSIFICATION_MAX_DROP = 1.0  # points of accuracy (or top-1 agreement), when max_drop is not given
# tasks whose gate includes the max-error caps (the others report them: a map's worst pixel is not the masks). For
# regression and probability the values are the answer, and on data that barely moves them (Silero on near-silence)
# their mean error says little: ONNX Runtime INT8 clipped at its calibrated top (0.0024 where float says 0.10 on a
# burst) passes a relative MAE gate on silence and fails the per-output cap.
CAPS_GATE = (TaskType.CLASSIFICATION, TaskType.RAW, TaskType.REGRESSION, TaskType.PROBABILITY)
DECODED = (TaskType.DETECTION, TaskType.SEGMENTATION, TaskType.TEXT, TaskType.LANDMARKS, TaskType.REGRESSION,
           TaskType.PROBABILITY, TaskType.EMBEDDING)


def open_for_validation(built: Built) -> Engine:
    # The same options the device will use: the manifest records them as the artifact's "runtime".
    return open_engine(built.engine, built.files[0], **built.runtime)


def run_sample(engine: Engine, sample: list[np.ndarray]) -> list[np.ndarray]:
    """Run one dataset sample, each input in its own dtype (``Engine.run`` converts every feed to float32, which an
    int64 or bool input refuses); a sample the artifact does not take is a :class:`ConversionError`."""
    try:
        return run_as_given(engine, sample)
    except InputError as exc:
        raise ConversionError(f"artifact {engine.model_path.name} does not take the data: {exc}") from exc


def validate(built: list[Built], val: Dataset, max_drop: float | None = None,
             progress: Callable[[Iterable], Iterable] = iter, error_cap: float = INT8_ERROR_CAP,
             task: TaskSpec | None = None, metric: str | Callable | None = None, *,
             output_names: list[str] | None = None,
             image_size: tuple[int, int] | None = None,
             observe: Callable[[list[np.ndarray], dict[str, list[np.ndarray]], Callable[[str], Any], str], None]
             | None = None) -> tuple[dict, dict]:
    """Return (the validation entry of each artifact id, golden arrays + tolerances).

    ``task``: the bundle's resolved task (None: classification of the first output, as before tasks).
    ``max_drop``: the gate's limit in its metric's unit (None: the task's default). ``metric``: a plug-in
    (``"module:function"`` or the function) whose mean score gates instead of the task's metric.
    ``output_names``: the manifest's output names, which the task's roles name (None: the golden float
    artifact's own). ``image_size``: (height, width) of the model's image input, decoded boxes and points are in
    its pixels (None: read from the first 4-D input of the data). ``observe(sample, outputs, decode, golden_id)``:
    called for every sample with every artifact's outputs (artifact id -> outputs; ``decode(id)`` decodes them by
    the task, once), for the monitoring reference.
    """
    spec = task if task is not None else TaskSpec.make(TaskType.CLASSIFICATION)
    plugin = load_metric(metric) if metric is not None else None
    plugin_name = metric_name(metric) if metric is not None else None
    refs = {b.engine: b for b in built if b.precision == "fp32"}
    golden_id = next(i for i in GOLDEN_ORDER if any(b.id == i for b in built))
    compared_with = {b.id: refs[b.engine].id if b.precision == "int8" else golden_id for b in built}
    engines: dict[str, Engine] = {}
    tallies = {b.id: Tally() for b in built}
    spreads = {b.id: OutputSpread() for b in built}
    task_metrics: dict[str, TaskMetric | None] = {}
    plugins = {b.id: PluginScore(plugin, plugin_name) for b in built} if plugin is not None else {}
    truth_scores: dict[str, TruthScore] = {}
    golden_in: list[list[np.ndarray]] = []
    golden_out: list[list[np.ndarray]] = []
    try:
        for b in built:
            try:
                engines[b.id] = open_for_validation(b)
            except BackendUnavailable as exc:
                raise ConversionError(f"the freshly built artifact {b.id} does not load on {b.engine}: {exc}") from exc
        names = list(output_names) if output_names is not None else [s.name for s in engines[golden_id].outputs]
        primary = spec.output_index("scores", names) or 0 if spec.type is TaskType.CLASSIFICATION else 0
        scorer = truth_score_for(spec, val.truth, names)
        truth_scores = {b.id: scorer() for b in built} if scorer is not None else {}
        decoder = None
        for i in progress(range(len(val))):
            sample = val.load(i)
            if decoder is None:
                size = image_size if image_size is not None else _image_size(sample)
                decoder = _Decoder(spec, names, size)
                task_metrics = {b.id: metric_for(spec, size) for b in built}
            outs = {aid: run_sample(eng, sample) for aid, eng in engines.items()}
            ref_golden = outs[golden_id]
            if len(golden_in) < GOLDEN_COUNT:
                golden_in.append(sample)
                golden_out.append(ref_golden)
            decoded: dict[str, Any] = {}
            if observe is not None:
                observe(sample, outs, lambda aid: decoder(aid, outs[aid], decoded), golden_id)
            label = None if val.labels is None else int(val.labels[i])
            truth = val.truth.load(i) if truth_scores else None
            for b in built:
                own, ref_id = outs[b.id], compared_with[b.id]
                add(tallies[b.id], own[primary], outs[refs[b.engine].id][primary], ref_golden[primary], label, own,
                    ref_golden)
                spreads[b.id].add(own)
                accumulator = task_metrics[b.id]
                if accumulator is not None:
                    pair = [decoder(aid, outs[aid], decoded) for aid in (b.id, ref_id)]
                    try:
                        accumulator.add(pair[0], pair[1], own, outs[ref_id])
                    except ValueError as exc:
                        raise ConversionError(f"{b.id} and {ref_id} decode to predictions that cannot be compared "
                                              f"({spec.type}): {exc}") from exc
                if plugins:
                    plugins[b.id].add(own, outs[ref_id], label, spec)
                if truth_scores:
                    truth_scores[b.id].add(decoder(b.id, own, decoded), own, truth)
        _measure_latency(built, refs, engines, golden_in[0], tallies)
        effective = {aid: eng.effective_precision for aid, eng in engines.items()}
    finally:
        for eng in engines.values():
            eng.close()

    caps = error_caps(built, tallies, golden_id, error_cap)
    per_output = output_caps(built, tallies, golden_id, error_cap)
    labelled = val.labels is not None
    metrics = {}
    for b in built:
        entry = _numbers(b, refs[b.engine], tallies, labelled, effective[b.id], caps[b.id], spec)
        truths = (truth_scores[b.id], truth_scores[compared_with[b.id]]) if truth_scores else None
        _gate(entry, b, tallies[b.id], spec, task_metrics.get(b.id), plugins.get(b.id), max_drop, caps[b.id], truths)
        if b.precision == "int8":  # every output on its own: one output's range must not excuse another's error
            check_each_output(entry, tallies[b.id], per_output, spec.type in CAPS_GATE)
        _check_spread(entry, spreads[b.id], spreads[compared_with[b.id]], names)
        if entry.get("slower_than_float"):
            entry["slower_because"] = why_slower(b, refs[b.engine], golden_in[0])
        metrics[b.id] = _finite(entry)
    capped = {b.id: spec.type in CAPS_GATE or not metrics[b.id]["passed"] for b in built}
    pooled, each, each_mean = golden_tolerances(built, tallies, golden_id, error_cap, capped)
    golden = {
        "reference": golden_id,
        "inputs": golden_in,
        "outputs": golden_out,
        "tolerance": pooled,
        "tolerance_per_output": each,
        "mean_tolerance_per_output": each_mean,
        "probabilities": tallies[golden_id].probs_like,
    }
    return metrics, golden


class _Decoder:
    """Each artifact's outputs of the current sample decoded once (``cache``: artifact id -> Decoded), by the
    device's own decoder, in model-input pixels (the identity transform of the image input)."""

    def __init__(self, spec: TaskSpec, names: list[str], image_size: tuple[int, int] | None) -> None:
        self.spec, self.names = spec, names
        self.transform = Transform.identity(*image_size) if image_size is not None else None

    def __call__(self, aid: str, outputs: list[np.ndarray], cache: dict[str, Any]) -> Any:
        if self.spec.type not in DECODED:
            return None
        if aid not in cache:
            try:
                cache[aid] = decode(self.spec, outputs, self.names, transform=self.transform)
            except InputError as exc:
                raise ConversionError(f"task {self.spec.type} cannot decode the outputs of {aid}: {exc}") from exc
        return cache[aid]


def _image_size(sample: list[np.ndarray]) -> tuple[int, int] | None:
    """(height, width) of the first image-shaped input, by the device's rule (:func:`input_image_size`)."""
    return next((size for size in (input_image_size(np.shape(a)) for a in sample) if size is not None), None)


def _numbers(b: Built, ref: Built, tallies: dict[str, Tally], labelled: bool, effective: str | None, cap: float,
             spec: TaskSpec) -> dict:
    """The raw numbers of an artifact's entry: agreement of the primary output (classification only), cosine and
    max |error| against its reference, its error against the golden outputs and that error's cap, latency."""
    t, rt = tallies[b.id], tallies[ref.id]
    p50 = float(np.median(t.latencies) * 1e3) if t.latencies else None
    out: dict[str, Any] = {
        "reference": ref.id if b.precision == "int8" else None,  # a float artifact: the golden reference
        "samples": t.n,
        "cosine_similarity": t.cos_sum / t.n,
        "max_abs_error": t.max_abs,
        "max_abs_error_golden": t.max_abs_golden,
        "max_abs_error_cap": cap,
        "latency_ms": p50,
        "effective_precision": effective,
    }
    classifier = spec.type is TaskType.CLASSIFICATION
    if classifier:
        out["top1_agreement"] = t.agree / t.n
        if labelled:
            out["accuracy"] = t.correct / t.n
            out["reference_accuracy"] = rt.correct / rt.n
    if b.precision == "int8":
        ref_p50 = float(np.median(rt.latencies) * 1e3)
        out["reference_latency_ms"] = ref_p50
        out["latency_ratio"] = p50 / ref_p50
        out["slower_than_float"] = p50 > ref_p50
    else:
        for key in ("top1_agreement", "cosine_similarity", "max_abs_error"):  # against itself: says nothing
            out.pop(key, None)
        if classifier:
            out["golden_agreement"] = t.agree_golden / t.n
    return out


def _gate(out: dict, b: Built, t: Tally, spec: TaskSpec, accumulator: TaskMetric | None, plugin: PluginScore | None,
          max_drop: float | None, cap: float, truths: tuple[TruthScore, TruthScore] | None = None) -> None:
    """The task's metric (or the plug-in's) and its gate, the max-error cap where it gates, into ``out``;
    ``truths``: the artifact's score on the ground truth and its reference's, which gate an INT8 artifact."""
    out["task"] = spec.type.value
    if accumulator is None:  # classification: as before tasks
        if b.precision == "fp32":
            name, value, gate = "golden_agreement", out["golden_agreement"], "golden_agreement_drop_points"
        elif "accuracy" in out:
            name, value, gate = "accuracy", out["accuracy"], "accuracy_drop_points"
            out["reference_metric_value"] = out["reference_accuracy"]
        else:
            name, value, gate = "top1_agreement", out["top1_agreement"], "agreement_drop_points"
        base = out.get("reference_accuracy", 1.0) if gate == "accuracy_drop_points" else 1.0
        drop, unit, default = 100.0 * (base - value), "points", CLASSIFICATION_MAX_DROP
    else:
        name, value, gate = accumulator.name, accumulator.value(), accumulator.gate
        drop, unit, default = accumulator.drop(), accumulator.unit, accumulator.default_max_drop()
        out["details"] = accumulator.details()
        judged = truth_gate(out, *truths, b.precision == "int8") if truths is not None else None
        if judged is not None:  # the drop on the truth, as classification's accuracy with labels
            name, value, gate, drop = judged
        why = accumulator.failure()
        if why and plugin is None:  # part of the task's gate, which a plug-in replaces (the numbers stay)
            out["task_failure"] = why
    out[gate] = drop
    if plugin is not None:  # the user's metric gates instead; the task's numbers stay as reported above
        out["task_metric"], out["task_metric_value"] = name, value
        name, value, gate, drop, unit, default = plugin.name, plugin.value(), "metric_drop_points", plugin.drop(), \
            "points", PLUGIN_MAX_DROP
        out[gate] = drop
    limit = default if max_drop is None else float(max_drop)
    out.update(metric=name, metric_value=value, drop=drop, drop_unit=unit, max_drop=limit, gate=gate)
    if unit == "points":
        out["max_drop_points"] = limit
    out["passed"] = bool(math.isfinite(drop) and drop <= limit + 1e-9) and "task_failure" not in out
    if b.precision == "int8" and not t.max_abs_golden <= cap:
        # Off the float outputs by more than INT8 can be: saturating kernels or a broken conversion, whatever
        # the top-1 numbers say (a few flipped answers hide a wrong model on an easy validation set). A task judged
        # on decoded outputs reports it: one flipped pixel of a map is not a wrong mask.
        if spec.type in CAPS_GATE:
            out["passed"] = False
            out["max_abs_error_cap_exceeded"] = True
        else:
            out["max_abs_error_over_cap"] = True


def _check_spread(out: dict, own: OutputSpread, ref: OutputSpread, names: list[str]) -> None:
    """The dead-output check: record each output's spread and its reference's, and fail the artifact when one
    output barely varies where its reference does (:func:`~.output_spread.dead_outputs`)."""
    out["output_std"], out["reference_output_std"] = own.std(), ref.std()
    dead = dead_outputs(own, ref)
    out["dead_output"] = [names[j] if j < len(names) else f"output {j}" for j in dead]
    if dead:
        out["passed"] = False


def why_slower(int8: Built, fp32: Built, sample: list[np.ndarray]) -> str:
    """Where an INT8 artifact measured slower than its float reference loses, op by op on this CPU (the engines'
    profilers, :mod:`edgesdk.bench.ops`): the op types slower in int8 and the int8 ops off the fast kernels. A
    profiler that fails says so instead: the bundle is still written."""
    from edgesdk.bench.ops import compare, profile_model
    from edgesdk.bench.ops import why_slower as explain
    from edgesdk.cpu import cpu_class

    try:
        profiles = [profile_model(b.engine, b.files[0], b.precision, sample, min_runs=10, min_seconds=0.005,
                                  precision_hint=b.runtime.get("precision_hint")) for b in (fp32, int8)]
        comparison = compare([{**p, "artifact": b.id} for p, b in zip(profiles, (fp32, int8))])[0]
    except Exception as exc:  # a speed explanation must never cost the bundle
        return f"not explained: the op profiler failed ({type(exc).__name__}: {str(exc)[:200]})"
    return f"on {cpu_class()['isa_class']}: {explain(comparison)} (edgesdk bench --ops shows every op)"


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float made None (JSON has no NaN; the schema refuses it)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _measure_latency(built, refs, engines, sample, tallies, seconds: float = 0.6, warmup: int = 5) -> None:
    """p50 at batch 1; each INT8 artifact interleaved with its float reference."""
    for b in built:
        for _ in range(warmup):
            run_sample(engines[b.id], sample)
    for b in (b for b in built if b.precision == "int8"):
        pair = (b.id, refs[b.engine].id)
        deadline = time.perf_counter() + seconds
        rounds = 0
        while rounds < 10 or (time.perf_counter() < deadline and rounds < 2000):
            for aid in pair:
                t0 = time.perf_counter()
                run_sample(engines[aid], sample)
                tallies[aid].latencies.append(time.perf_counter() - t0)
            rounds += 1
