"""Accuracy recovery: an INT8 artifact that fails its gate is quantized again with its most sensitive layers kept in
float, the fewest that make it pass, by each engine's own mechanism (ONNX Runtime ``nodes_to_exclude``, NNCF
``IgnoredScope``, AI Edge Quantizer ``no_quantize`` recipe entries).

First the engine's other range choice is tried with every layer in INT8 (ONNX Runtime's Percentile 99.99, the mean of
per-sample min/max for NNCF and AI Edge Quantizer: ``OTHER_CALIBRATION``); when it passes nothing is kept in float
and the layers are not ranked (the ranking below can take longer than that one trial).

Which layers: first those that multiply nothing (adds, activations, pooling, softmax: no INT8 MACs lost), ranked by
the layer-by-layer report of :mod:`..layers` (each quantized layer run alone on the float model's inputs: its *added*
error); then the multiplying ones, each measured alone in INT8 with every other layer in float (how far that moves the
validation outputs), cheapest harm first. Prefixes of that order are tried (1, 2, 4... then bisected) until the
artifact passes its gate, then the set is pruned: each multiplying layer kept goes back to INT8 when the artifact
still passes, with its own ranges or, on ONNX Runtime and LiteRT, with the other range choice on the tensors that
layer reads (the per-layer range choice; :func:`~.search.search`). Every trial re-quantizes (the float model is
reused, not converted again) and validates the artifact against its float reference on the whole validation set,
within the artifact's share of the run's recovery budget (:mod:`.budget`). What was kept, why, and what it
cost is recorded in the manifest's artifact entry (``recovery``), with the INT8 MAC share read from the recovered
artifact itself.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..layers import probe_for
from ..layers.compare import LayerError, worst
from ..layers.debug import SourceModel, layer_errors
from ..layers.litert import tensor_name
from .budget import SMALL_BUDGET, SMALL_MODEL_BYTES, Budget, default_budget
from .search import SEARCH_SHARE, search
from ..targets import Built, TARGET_ENGINES, builder
from ..toolchain_output import captured

ENGINE_TARGETS = {engine: target for target, engine in TARGET_ENGINES.items()}
MECHANISM = {"onnxruntime": "onnxruntime nodes_to_exclude", "openvino": "nncf IgnoredScope",
             "litert": "ai-edge-quantizer no_quantize"}
SENSITIVITY_SAMPLES = 4
# what the first trial is expected to take before any was timed (one re-quantization and validation: no real model
# takes less), so that a budget too small for any trial starts none
FIRST_TRIAL_SECONDS = 1.0


class _TrialFailed(Exception):
    """A trial's artifact could not be built or validated."""


@dataclass
class Trial:
    kept: int
    passed: bool
    metric_value: float | None
    drop: float | None
    seconds: float
    calibration: str = "minmax"
    step: str = "search"  # calibration | sensitivity | search | prune | ranges
    layer_ranges: int = 0  # layers in INT8 with the other range choice on the tensors they read
    latency_ms: float | None = None  # the trial artifact's p50 (validation's own measure)


@dataclass
class Recovery:
    """What recovery did to one artifact (the manifest's ``recovery`` entry, :meth:`as_dict`)."""

    status: str  # recovered | not_needed | failed | out_of_time
    kept: list[LayerError] = field(default_factory=list)
    ranked: int = 0  # quantized layers ranked
    trials: list[Trial] = field(default_factory=list)
    macs: int = 0
    int8_macs_before: int = 0
    seconds: float = 0.0
    before: dict = field(default_factory=dict)  # the validation entry before recovery
    after: dict | None = None
    note: str = ""
    mechanism: str = ""
    engine: str = ""
    calibration: str = "minmax"
    rank: dict = field(default_factory=dict)  # id(row) -> its rank by added error (1: worst)
    harm: dict = field(default_factory=dict)  # id(row) -> the validation entry with only that layer in INT8
    int8_macs_after: int | None = None  # read from the recovered artifact itself
    macs_after: int | None = None
    ranged: list[LayerError] = field(default_factory=list)  # in INT8 with the other range choice on their tensors
    budget: float | None = None  # the seconds this artifact was given: its share of the run's recovery budget

    def _unranked(self) -> str:
        if self.status == "not_needed":
            return "none: the artifact passes as quantized"
        if self.status == "recovered":
            return "none: the other range choice passed with every layer in INT8"
        return "none: the layers were not ranked (see the note)"

    def as_dict(self) -> dict:
        kept_macs = sum(r.macs for r in self.kept)
        out: dict[str, Any] = {
            "status": self.status, "mechanism": self.mechanism,
            "ranking": self._unranked() if not self.ranked else
                       f"layers without MACs first, by added error (each quantized layer alone on the float "
                       f"model's inputs, SNR over {SENSITIVITY_SAMPLES} calibration samples); then the multiplying "
                       f"ones by measured harm per MAC (the validation set's output cosine with only that layer in "
                       f"INT8, everything else float), those not measured in time by added error",
            "kept_float": [_kept(r, self.rank.get(id(r), 0), self.engine, self.harm.get(id(r))) for r in self.kept],
            "layer_ranges": [_ranged(r, self.engine, self.harm.get(id(r))) for r in self.ranged],
            "layers_ranked": self.ranked,
            "macs": self.macs,
            "int8_mac_share_before": self.int8_macs_before / self.macs if self.macs else None,
            "int8_mac_share": (self.int8_macs_after / self.macs_after if self.macs_after
                               else (self.int8_macs_before - kept_macs) / self.macs if self.macs else None),
            "metric": self.before.get("metric"),
            "metric_before": self.before.get("metric_value"), "drop_before": self.before.get("drop"),
            "latency_ms_before": self.before.get("latency_ms"),
            "calibration": self.calibration,
            "trials": [{"kept": t.kept, "layer_ranges": t.layer_ranges, "step": t.step, "calibration": t.calibration,
                        "passed": t.passed, "latency_ms": t.latency_ms,
                        "metric_value": t.metric_value, "drop": t.drop, "seconds": round(t.seconds, 1)}
                       for t in self.trials],
            "seconds": round(self.seconds, 1),
        }
        if self.budget is not None:
            out["budget_seconds"] = round(self.budget, 1)
        if self.after is not None:
            out.update(metric_after=self.after.get("metric_value"), drop_after=self.after.get("drop"),
                       latency_ms_after=self.after.get("latency_ms"))
        if self.note:
            out["note"] = self.note
        return out


def _kept(row: LayerError, rank: int, engine: str, harm: dict | None = None) -> dict:
    added = row.added.snr_db if row.added is not None and row.added.count else None
    # LiteRT's ops are numbered, and recovery adds (de)quantize ops: its output tensor names what was kept
    node = row.name if engine == "litert" else row.node
    reason = f"rank {rank} by added error" + (f": {added:.1f} dB SNR alone on float inputs" if added is not None
                                              else "")
    if harm is not None:
        reason = (f"alone in INT8 (everything else float) it moves the outputs to cosine "
                  f"{_num(harm.get('cosine_similarity'))}, {harm.get('metric')} {_num(harm.get('metric_value'))}; "
                  + reason)
    return {"layer": row.source or row.node, "engine_node": node, "op": row.op, "macs": row.macs,
            "reason": reason + ("" if row.macs else " (no MACs: free to keep in float)")}


def _ranged(row: LayerError, engine: str, harm: dict | None = None) -> dict:
    """A layer the search kept in float and the per-layer range choice took back to INT8."""
    reason = (f"kept in float by the search; back in INT8 with {RANGES[engine]} ranges on the tensors it reads (and "
              f"those tied to them: a pool's or reshape's input), the rest with the artifact's, the artifact passes")
    if harm is not None:
        reason += (f"; alone in INT8 with the artifact's ranges it moved the outputs to cosine "
                   f"{_num(harm.get('cosine_similarity'))}, {harm.get('metric')} {_num(harm.get('metric_value'))}")
    return {"layer": row.source or row.node, "engine_node": row.name if engine == "litert" else row.node,
            "op": row.op, "macs": row.macs, "ranges": RANGES[engine], "reason": reason}


def sensitivity(int8: Built, ref: Built, samples: list[list[np.ndarray]], source: Built | None = None
                ) -> tuple[list[LayerError], list]:
    """The INT8 artifact's quantized layers, worst added error first, named by the source (``source``: the golden
    float artifact; None: the engine's own names); and all its layers with their MACs."""
    if source is None:
        rows, layers = layer_errors(int8, ref, samples)
    else:
        with SourceModel(source, samples[0]) as named_by:
            rows, layers = layer_errors(int8, ref, samples, named_by)
    ranked = [r for r in worst(rows) if r.quantized]
    # layers that multiply nothing first (adds, activations, pooling, softmax: keeping one in float costs no INT8
    # MACs), then the multiplying ones; each tier worst first
    return [r for r in ranked if r.macs == 0] + [r for r in ranked if r.macs > 0], layers


def recover(int8: Built, ref: Built, entry: dict, src, calib: list[list[np.ndarray]], options: dict,
            check: Callable[[list[Built]], dict], work: Path, source: Built | None = None,
            time_limit: float = SMALL_BUDGET, say: Callable[[str], None] = lambda s: None) -> tuple[Built, Recovery]:
    """Keep the fewest layers of ``int8`` in float that make ``check([candidate, ref])`` (the validation entry of
    the candidate) pass. Returns the artifact to keep (the original when nothing passed) and what was done.
    ``options``: the target's build options; ``work``: a scratch directory; ``time_limit``: seconds. No trial starts
    that would end past the limit by the mean time of this artifact's trials so far (``FIRST_TRIAL_SECONDS`` before
    the first); the layer ranking, after the first trial, runs whatever the limit (it cannot be stopped part way)."""
    started = time.perf_counter()
    engine = int8.engine
    rec = Recovery("failed", before=dict(entry), mechanism=MECHANISM[engine], engine=engine, budget=time_limit)
    options = {k: v for k, v in options.items() if k != "calibration"}
    target = ENGINE_TARGETS[engine]
    caches: dict[str, dict] = {}
    statistics: dict = {}  # AI Edge Quantizer's, per range choice: shared by every trial whatever its calibration
    speed: dict = {}  # the tflite target's op types kept float for speed: decided by the first trial, kept by all
    results: dict[tuple, tuple[Built, dict]] = {}
    calibration = "minmax"

    def name(row: LayerError) -> str:
        # AEQ matches output tensor names (a repeated one keeps every op of that name: the rows sharing it are one
        # unit to AEQ); the others match node names
        return tensor_name(row.name) if engine == "litert" else row.node

    def cache(how: str) -> dict:
        if engine == "litert":
            return {"statistics": statistics, "speed": speed}
        return caches.setdefault(how, _calibration_cache(engine, work, how))

    def attempt(rows: list[LayerError], how: str | None = None, step: str = "search", what: str = "",
                ranged: list[LayerError] = ()) -> dict:
        how = how or calibration
        key = (how, frozenset(name(r) for r in rows), frozenset(name(r) for r in ranged))
        if key in results:
            return results[key][1]
        t0 = time.perf_counter()
        out = Path(tempfile.mkdtemp(prefix=f"recover-{len(rows)}-", dir=work))
        per_layer = {} if not ranged else {
            "layer_ranges": tuple(sorted(key[2])), "layer_calibration": OTHER_CALIBRATION[engine],
            **({"layer_calibration_cache": cache(OTHER_CALIBRATION[engine])["calibration_cache"]}
               if engine == "onnxruntime" else {})}
        try:
            with captured(True):  # the converters' console output (AI Edge Quantizer's bars) stays out of the log
                made = builder(target)(src, calib, out, keep_float=tuple(sorted(key[1])), float_model=ref.files[0],
                                       calibration=how, **options, **cache(how), **per_layer)
            candidate = next(b for b in made if b.precision == "int8")
            judged = check([candidate, ref])
        except Exception as exc:
            failed = f"{len(rows)} layer(s) in float: {type(exc).__name__}: {str(exc)[:300]}"
            if step not in ("prune", "ranges"):  # a converter refusing this split: recovery stops, the bundle keeps
                raise _TrialFailed(failed) from exc  # the original
            # pruning a set that already passed: this one trial failed, the sets found stand
            rec.trials.append(Trial(len(key[1]), False, None, None, time.perf_counter() - t0, how, step, len(key[2])))
            say(f"[{int8.id}] recovery trial {len(rec.trials)} ({step}), {clock()}: a trial could not be built, "
                f"counted as failing: {failed}")
            results[key] = (None, {"passed": False})
            return results[key][1]
        results[key] = (candidate, judged)
        kept_macs = sum(r.macs for r in rows)
        rec.trials.append(Trial(len(key[1]), bool(judged["passed"]), judged.get("metric_value"), judged.get("drop"),
                                time.perf_counter() - t0, how, step, len(key[2]), judged.get("latency_ms")))
        say(f"[{int8.id}] recovery trial {len(rec.trials)} ({step}{': ' + what if what else ''}), {clock()}: {how} "
            f"calibration, {len(key[1])} layer(s) in float"
            + (f", {len(key[2])} with {RANGES[engine]} ranges" if key[2] else "") + " "
            f"({kept_macs / max(rec.macs, 1):.1%} of MACs) -> {judged.get('metric')} "
            f"{_num(judged.get('metric_value'))}, drop {_num(judged.get('drop'))} "
            f"({'passes' if judged['passed'] else 'fails'}, p50 {_num(judged.get('latency_ms'))} ms, "
            f"{time.perf_counter() - t0:.0f} s)")
        return judged

    def clock() -> str:
        return f"{time.perf_counter() - started:.0f}/{time_limit:.0f} s"

    cut = []  # set when a step was skipped or stopped for time

    def out_of_time(share: float = 1.0) -> bool:
        # a trial is not started when it would likely end past the limit: a budget is kept, not overrun by one trial
        built = [t.seconds for t in rec.trials]
        expected = sum(built) / len(built) if built else FIRST_TRIAL_SECONDS
        if time.perf_counter() - started + expected > time_limit * share:
            cut.append(share)
            return True
        return False

    def rank() -> list[LayerError] | None:
        """The quantized layers, the free tier first (None: the probes cannot read them, said in the note)."""
        try:  # a model the probes cannot read (an op an engine cannot expose) keeps its artifact, never stops quantize
            ranked, layers = sensitivity(int8, ref, calib[:SENSITIVITY_SAMPLES], source)
        except Exception as exc:
            rec.note = (f"the layers could not be read, none was kept in float: {type(exc).__name__}: "
                        f"{str(exc)[:500]}")
            say(f"[{int8.id}] recovery stopped: {rec.note}")
            return None
        if engine == "litert":  # AEQ finds an op by its output tensor names: one whose output has none cannot be kept
            ranked = [r for r in ranked if tensor_name(r.name)]
        rec.rank = {id(r): k for k, r in enumerate(worst(ranked), 1)}
        rec.macs = sum(l.macs for l in layers)
        rec.int8_macs_before = sum(l.macs for l in layers if l.quantized)
        rec.ranked = len(ranked)
        say(f"[{int8.id}] recovery: {len(ranked)} quantized layers ranked by added error "
            f"({time.perf_counter() - started:.0f} s); worst: "
            + ", ".join(f"{r.source or r.node} ({_db(r)})" for r in ranked[:5]))
        return ranked

    try:
        # 0. the engine's other range choice, every layer in INT8: when it passes, nothing is kept in float, and the
        #    layers are never ranked (on the PP-OCRv4 recognizer, ONNX Runtime's ranking took 38 s, the Percentile
        #    trial that passed 26). When it only loses less, the search still starts from the artifact's own choice:
        #    a range that clips less of one tensor can clip another that a layer kept in float would have spared
        #    (measured on a 3-layer model: the fewest layers to keep grew from 2 to 3)
        other = OTHER_CALIBRATION[engine]
        if not out_of_time(SEARCH_SHARE) and attempt([], other, "calibration")["passed"]:
            calibration, found = other, ([], [])
            _read_macs(int8, rec, calib[0])
        elif out_of_time(SEARCH_SHARE):  # no time left for a search: the layers are not ranked either
            found = None
            _read_macs(int8, rec, calib[0])
        else:
            ranked = rank()
            if ranked is None:
                rec.seconds = time.perf_counter() - started
                return int8, rec
            found = search(ranked, attempt, out_of_time, rec.harm, name, ranges=engine in RANGES)
    except _TrialFailed as exc:
        rec.seconds = time.perf_counter() - started
        rec.note = f"a trial could not be built, recovery stopped: {str(exc)[:500]}"
        say(f"[{int8.id}] recovery stopped: {rec.note}")
        return int8, rec
    rec.seconds = time.perf_counter() - started
    if found is None:
        rec.status = "out_of_time" if cut else "failed"
        rec.note = (f"no set of layers kept in float passed within its {time_limit:.0f} s of the recovery budget"
                    if cut else "even every quantized layer in float does not pass the gate")
        return int8, rec
    rec.status = "recovered"
    rec.calibration = calibration
    if cut:
        rec.note = (f"stopped by its {time_limit:.0f} s of the recovery budget: the best passing set found so far is "
                    f"kept")
    rec.kept, rec.ranged = found
    if rec.ranged:
        rec.mechanism += f"; {RANGE_MECHANISM[engine]}"
    chosen = results[(calibration, *(frozenset(name(r) for r in rows) for rows in found))][0]
    _check_kept(chosen, rec, calib[0])
    return chosen, rec


# each engine's range choice recovery tries first (benchmarks/results/calibration_methods.txt): ONNX Runtime's
# Percentile 99.99, the mean of per-sample min/max for NNCF (its own default) and AI Edge Quantizer
OTHER_CALIBRATION = {"onnxruntime": "percentile", "openvino": "mean_minmax", "litert": "mean_minmax"}
# the engines whose converter takes a range per tensor (ONNX Runtime TensorQuantOverrides, AI Edge Quantizer's
# statistics per tensor), and the other range choice a layer can get there; NNCF takes one range estimator per model
RANGES = {"onnxruntime": "Percentile 99.99", "litert": "mean of per-sample min/max"}
RANGE_MECHANISM = {"onnxruntime": "onnxruntime TensorQuantOverrides",
                   "litert": "ai-edge-quantizer statistics per tensor"}


def _calibration_cache(engine: str, work: Path, calibration: str) -> dict:
    """Build options that calibrate once per range choice for every trial of a recovery: ONNX Runtime's own
    calibration cache (AI Edge Quantizer's statistics are one dict kept in memory, per range choice, in
    :func:`recover`; NNCF has none: it collects its statistics on every trial)."""
    if engine == "onnxruntime":
        return {"calibration_cache": work / f"onnxruntime-calibration-{calibration}.json"}
    return {}


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def install(candidate: Built, original: Built) -> Built:
    """Move the recovered artifact's files over the original's (same names, same place in the bundle)."""
    files = []
    for new, old in zip(candidate.files, original.files):
        shutil.move(str(new), str(old))
        files.append(old)
    return Built(original.id, original.engine, original.precision, files, candidate.method, dict(original.runtime))


def _db(row: LayerError) -> str:
    if row.added is not None and row.added.count:
        return f"{row.added.snr_db:.1f} dB"
    return f"{row.accumulated.snr_db:.1f} dB accumulated"


MODES = ("auto", "on", "off")


def recover_bundle(built: list[Built], metrics: dict[str, dict], mode: str, src, calib: list[list[np.ndarray]],
                   target_options: dict[str, dict], check: Callable[[list[Built]], dict], scratch: Path,
                   golden_order: tuple[str, ...], time_limit: float | None = None,
                   say: Callable[[str], None] = lambda s: None) -> tuple[dict[str, Recovery], Budget | None]:
    """Recover each INT8 artifact of ``built`` that failed its gate (``mode="auto"``), or every one (``"on"``: one
    that passes is recorded as ``not_needed`` and left as it is). Replaces recovered artifacts in ``built`` (their
    files moved over the originals); returns what was done per artifact id, and the budget they shared (None when
    none needed recovery). ``check``: the validation entry of the first artifact of a [candidate, its float
    reference] pair. ``time_limit``: seconds for all of them (None: :func:`~.budget.default_budget` of the
    golden float artifact); each failing artifact gets what is left divided by the failing artifacts still to go, and
    one that gets nothing is recorded ``out_of_time`` as quantized."""
    if mode == "off":
        return {}, None
    source = next((b for i in golden_order for b in built if b.id == i), None)
    failing = [b for b in built if b.precision == "int8" and not metrics[b.id].get("passed")]
    budget = None
    if failing:
        budget = (Budget(time_limit, "set by recover_time (--recover-time)") if time_limit is not None
                  else Budget(*_default_budget(source or failing[0], calib[0], len(failing))))
        say(f"recovery: {', '.join(b.id for b in failing)} fail{'s' if len(failing) == 1 else ''} the gate; "
            f"{budget.seconds:.0f} s for all of recovery ({budget.how})")
    done: dict[str, Recovery] = {}
    for index, b in enumerate(list(built)):
        if b.precision != "int8":
            continue
        entry = metrics[b.id]
        if entry.get("passed"):
            if mode == "on":
                done[b.id] = _not_needed(b, entry, calib[0])
            continue
        to_go = len(failing) - sum(f.id in done for f in failing)
        share = budget.share(to_go)
        if share <= 0:
            done[b.id] = rec = Recovery("out_of_time", before=dict(entry), mechanism=MECHANISM[b.engine],
                                        engine=b.engine, budget=0.0,
                                        note=f"the run's {budget.seconds:.0f} s recovery budget was spent before "
                                             f"this artifact's turn: nothing was tried")
            say(f"[{b.id}] recovery out_of_time: {rec.note}")
            continue
        say(f"[{b.id}] recovery: {share:.0f} s of the {budget.left():.0f} s left"
            + (f" for {to_go} artifacts" if to_go > 1 else ""))
        ref = next(r for r in built if r.engine == b.engine and r.precision == "fp32")
        target = ENGINE_TARGETS[b.engine]
        work = Path(tempfile.mkdtemp(prefix=f".recover-{b.id}-", dir=scratch))
        try:
            candidate, rec = recover(b, ref, entry, src, calib, target_options.get(target, {}), check, work, source,
                                     share, say)
            if candidate is not b:
                built[index] = install(candidate, b)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        done[b.id] = rec
        say(f"[{b.id}] recovery {rec.status}: {len(rec.kept)} layer(s) kept in float, "
            + (f"{len(rec.ranged)} in INT8 with the other range choice, " if rec.ranged else "") +
            f"{rec.seconds:.0f} s; {budget.spent():.0f}/{budget.seconds:.0f} s of the budget spent"
            + (f" ({rec.note})" if rec.note else ""))
    if budget is not None:
        budget.finish()
    return done, budget


def _default_budget(float_model: Built, sample: list[np.ndarray], artifacts: int = 1) -> tuple[float, str]:
    """:func:`~.budget.default_budget` of a float artifact and ``artifacts`` failing INT8 artifacts: its files'
    size, and its MACs read by the engine's probe when the size alone does not settle the budget (a model the probe
    cannot read goes by size)."""
    size = sum(Path(f).stat().st_size for f in float_model.files)
    if size < SMALL_MODEL_BYTES:
        return default_budget(size)
    try:
        macs = sum(layer.macs for layer in _layers(float_model, sample))
    except Exception:  # the size stands in for the MACs, and the budget says so
        macs = None
    return default_budget(size, macs, artifacts)


def _layers(b: Built, sample: list[np.ndarray]) -> list:
    """The artifact's layers with their MACs at the sample's shapes."""
    probe = probe_for(b.engine, b.files[0], b.runtime)
    try:
        probe.capture(sample)
        return probe.layers()
    finally:
        probe.close()


def _check_kept(chosen: Built, rec: Recovery, sample: list[np.ndarray]) -> None:
    """Read the INT8 MAC share from the recovered artifact itself, not from what was asked of the converter; say so
    when they differ (an engine that kept more, or fewer, layers in float than it was told)."""
    try:
        layers = _layers(chosen, sample)
    except Exception as exc:  # the share stays the one asked for, and the note says why
        rec.note = (rec.note + "; " if rec.note else "") + (f"the recovered artifact's layers could not be read, its "
                                                            f"INT8 MAC share is the one asked for: "
                                                            f"{type(exc).__name__}: {str(exc)[:300]}")
        return
    rec.int8_macs_after = sum(l.macs for l in layers if l.quantized)
    rec.macs_after = sum(l.macs for l in layers)
    asked = (rec.int8_macs_before - sum(r.macs for r in rec.kept)) / rec.macs if rec.macs else None
    got = rec.int8_macs_after / rec.macs_after if rec.macs_after else None
    if asked is not None and got is not None and abs(got - asked) > 0.005:
        rec.note = (rec.note + "; " if rec.note else "") + (
            f"the recovered artifact keeps {got:.1%} of its MACs in INT8 where the layers asked for leave "
            f"{asked:.1%}: the share recorded is the artifact's")


def _not_needed(b: Built, entry: dict, sample: list[np.ndarray]) -> Recovery:
    rec = Recovery("not_needed", before=dict(entry), after=dict(entry), mechanism=MECHANISM[b.engine],
                   note="the artifact passes its gate as quantized: nothing kept in float")
    _read_macs(b, rec, sample)
    return rec


def _read_macs(b: Built, rec: Recovery, sample: list[np.ndarray]) -> None:
    """The MACs of ``b`` and those in INT8, read by the engine's probe into ``rec`` (before anything is kept in
    float); when its layers cannot be read the shares stay unknown and the note says why."""
    try:
        layers = _layers(b, sample)
    except Exception as exc:  # the MAC shares stay unknown; the artifact is kept as it is either way
        rec.note = ((rec.note + " ") if rec.note else "") + (f"(its layers could not be read: "
                                                              f"{type(exc).__name__}: {str(exc)[:300]})")
        return
    rec.macs = sum(l.macs for l in layers)
    rec.int8_macs_before = sum(l.macs for l in layers if l.quantized)
