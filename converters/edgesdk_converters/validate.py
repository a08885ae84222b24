"""Validation: every INT8 artifact against its float reference on the same engine, on held-out data.

Samples are streamed (loaded once, run on every artifact, dropped), so the memory
cost does not grow with the validation set. Latency is measured afterwards at
batch 1, INT8 and float interleaved so that machine noise hits both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from edgesdk.engines import Engine, open_engine
from edgesdk.errors import BackendUnavailable, ConversionError, InputError
from edgesdk.runtime.numerics import run_as_given

from .calibration import Dataset
from .targets import Built

GOLDEN_COUNT = 8
# An INT8 artifact may be off the golden float outputs by at most this share of their range (max - min over the
# validation set). Sound INT8 stays well below it (the digits CNN: 0.5 %; a random CNN ending in a softmax over near-equal
# classes, the noisiest seen: 5.2 %); kernels that saturate do not (ONNX Runtime's U8S8 with 8-bit weights on an AVX2
# CPU without VNNI: 12.5 % on the digits CNN, 32 % on tests/workstation/test_int8_cpu.py's saturating model). It bounds both the
# quantize gate and the device's golden tolerance, so an artifact that exceeds it fails at quantize time, and one
# validated on a saturating CPU cannot carry a tolerance that lets the same saturation through elsewhere.
INT8_ERROR_CAP = 0.10
# INT8 steps (of 8 bits over an output's own magnitude) any output may move by, however little it varies.
INT8_STEPS = 4
# Preferred ground truth for the golden outputs (the float reference most engines agree with).
GOLDEN_ORDER = ("onnxruntime-fp32", "openvino-fp32", "litert-fp32")


@dataclass
class _Tally:
    """Running metrics of one artifact against its reference."""

    n: int = 0
    agree: int = 0
    agree_golden: int = 0
    correct: int = 0
    cos_sum: float = 0.0
    max_abs: float = 0.0
    max_abs_golden: float = 0.0
    max_abs_ref: float = 0.0  # largest |output| of this artifact (the output scale)
    out_min: float = float("inf")  # range of this artifact's outputs over the validation set
    out_max: float = float("-inf")
    probs_like: bool = True
    latencies: list[float] = field(default_factory=list)
    # per output j: the largest error against the golden output j, the largest |value| and the range of output j
    err_per: list[float] = field(default_factory=list)
    abs_per: list[float] = field(default_factory=list)
    lo_per: list[float] = field(default_factory=list)
    hi_per: list[float] = field(default_factory=list)


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


def validate(built: list[Built], val: Dataset, max_drop: float,
             progress: Callable[[Iterable], Iterable] = iter, error_cap: float = INT8_ERROR_CAP) -> tuple[dict, dict]:
    """Return (metrics per artifact id, golden arrays + tolerances)."""
    refs = {b.engine: b for b in built if b.precision == "fp32"}
    golden_id = next(i for i in GOLDEN_ORDER if any(b.id == i for b in built))
    engines: dict[str, Engine] = {}
    tallies = {b.id: _Tally() for b in built}
    golden_in: list[list[np.ndarray]] = []
    golden_out: list[list[np.ndarray]] = []
    try:
        for b in built:
            try:
                engines[b.id] = open_for_validation(b)
            except BackendUnavailable as exc:
                raise ConversionError(f"the freshly built artifact {b.id} does not load on {b.engine}: {exc}") from exc
        for i in progress(range(len(val))):
            sample = val.load(i)
            outs = {aid: run_sample(eng, sample) for aid, eng in engines.items()}
            ref_golden = outs[golden_id]
            if len(golden_in) < GOLDEN_COUNT:
                golden_in.append(sample)
                golden_out.append(ref_golden)
            label = None if val.labels is None else int(val.labels[i])
            for b in built:
                own = outs[b.id][0]
                ref = outs[refs[b.engine].id][0]
                _add(tallies[b.id], own, ref, ref_golden[0], label, outs[b.id], ref_golden)
        _measure_latency(built, refs, engines, golden_in[0], tallies)
        effective = {aid: eng.effective_precision for aid, eng in engines.items()}
    finally:
        for eng in engines.values():
            eng.close()

    caps = error_caps(built, tallies, golden_id, error_cap)
    metrics = {b.id: _summary(b, refs[b.engine], tallies, val.labels is not None, max_drop, effective[b.id], caps[b.id])
               for b in built}
    per_output = output_caps(built, tallies, golden_id, error_cap)
    for b in built:  # and every output on its own: one output's range must not excuse another's error
        if b.precision == "int8":
            _check_each_output(metrics[b.id], tallies[b.id], per_output)
    golden = {
        "reference": golden_id,
        "inputs": golden_in,
        "outputs": golden_out,
        "tolerance": {aid: _tolerance(t.max_abs_golden, tallies[golden_id].max_abs_ref, caps[aid])
                      for aid, t in tallies.items()},
        "probabilities": tallies[golden_id].probs_like,
    }
    return metrics, golden


def error_caps(built: list[Built], tallies: dict[str, "_Tally"], golden_id: str,
               share: float = INT8_ERROR_CAP) -> dict[str, float]:
    """The largest error against the golden float outputs each artifact may have, here and on a device.

    Float artifacts: their own error doubled, with the CPU-difference floor of :func:`_tolerance` (a float
    conversion is either faithful or broken). INT8 artifacts: ``share`` (default :data:`INT8_ERROR_CAP`) of the
    golden outputs' range over the validation set, and never less than what the float conversions themselves need.
    """
    g = tallies[golden_id]
    out_range = max(g.out_max - g.out_min, 0.0) if g.n else 0.0
    floor = 1e-4 + 1e-3 * g.max_abs_ref
    floats = [tallies[b.id].max_abs_golden for b in built if b.precision == "fp32"]
    float_need = max([2.0 * e for e in floats] + [floor])
    caps = {}
    for b in built:
        if b.precision == "fp32":
            caps[b.id] = max(2.0 * tallies[b.id].max_abs_golden, floor)
        else:
            caps[b.id] = max(share * out_range, float_need)
    return caps


def output_caps(built: list[Built], tallies: dict[str, "_Tally"], golden_id: str,
                share: float = INT8_ERROR_CAP) -> list[float]:
    """Per output, the largest error an INT8 artifact may have against the golden float output: ``share`` of that
    output's range over the validation set, never less than the float conversions need there (twice their error,
    at least 1e-4 + 0.1% of the output's largest value). :func:`error_caps` pools every output's range into one
    number; a model with a wide output (a recurrent state) and a narrow one (a probability) needs both checked."""
    g = tallies[golden_id]
    caps = []
    for j in range(len(g.err_per)):
        floor = 1e-4 + 1e-3 * g.abs_per[j]
        # an output that barely varies (a score stuck near 0.99) still moves by INT8 steps of its own scale: a few
        # steps of 8 bits over its magnitude are always allowed, so only a real loss of that output fails it
        steps = INT8_STEPS * g.abs_per[j] / 255.0
        floats = [2.0 * tallies[b.id].err_per[j] for b in built if b.precision == "fp32" and tallies[b.id].err_per]
        caps.append(max([share * max(g.hi_per[j] - g.lo_per[j], 0.0), floor, steps] + floats))
    return caps


def _check_each_output(out: dict, t: _Tally, caps: list[float]) -> None:
    """Fail an INT8 artifact whose error on any one output exceeds that output's own cap (:func:`output_caps`),
    recording each output's error and cap."""
    if len(caps) < 2 or len(t.err_per) != len(caps):
        return  # one output: the pooled cap is that output's cap
    out["output_errors"] = [{"max_abs_error": e, "cap": c} for e, c in zip(t.err_per, caps)]
    if any(e > c for e, c in zip(t.err_per, caps)):
        out["passed"] = False
        out["max_abs_error_cap_exceeded"] = True


def _add(t: _Tally, own: np.ndarray, ref: np.ndarray, golden: np.ndarray, label: int | None,
         own_all: list[np.ndarray], golden_all: list[np.ndarray]) -> None:
    t.n += 1
    a, r, g = own.reshape(-1), ref.reshape(-1), golden.reshape(-1)
    t.agree += int(a.argmax() == r.argmax())
    t.agree_golden += int(a.argmax() == g.argmax())
    if label is not None:
        t.correct += int(a.argmax() == label)
    denom = float(np.linalg.norm(a) * np.linalg.norm(r))
    t.cos_sum += float(a @ r) / denom if denom > 0 else float(np.array_equal(a, r))
    t.max_abs = max(t.max_abs, float(np.max(np.abs(a - r))))
    t.max_abs_golden = max(t.max_abs_golden, *(float(np.max(np.abs(o - q))) for o, q in zip(own_all, golden_all)))
    t.max_abs_ref = max(t.max_abs_ref, float(np.max(np.abs(a))))
    for o in own_all:
        t.out_min, t.out_max = min(t.out_min, float(np.min(o))), max(t.out_max, float(np.max(o)))
    if not t.err_per:
        t.err_per, t.abs_per = [0.0] * len(own_all), [0.0] * len(own_all)
        t.lo_per, t.hi_per = [float("inf")] * len(own_all), [float("-inf")] * len(own_all)
    for j, (o, q) in enumerate(zip(own_all, golden_all)):
        if o.size:
            t.err_per[j] = max(t.err_per[j], float(np.max(np.abs(o - q))))
            t.abs_per[j] = max(t.abs_per[j], float(np.max(np.abs(o))))
            t.lo_per[j], t.hi_per[j] = min(t.lo_per[j], float(np.min(o))), max(t.hi_per[j], float(np.max(o)))
    t.probs_like = t.probs_like and bool(np.all(a >= 0) and abs(float(a.sum()) - 1.0) < 1e-3)


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


def _tolerance(max_abs: float, ref_scale: float, cap: float) -> float:
    """Twice the worst error seen on the validation set, with a floor relative to the output scale, never above
    ``cap`` (:func:`error_caps`).

    The floor (1e-4 + 1e-3 of the largest reference output) absorbs kernel differences between
    CPUs (another SIMD width, another summation order) yet stays far below what a broken delegate
    or a damaged artifact produces. The cap keeps an artifact that was already wrong where it was validated from
    buying itself a tolerance it then always meets: twice a saturated error would pass the same saturation anywhere.
    """
    return float(min(max(2.0 * max_abs, 1e-4 + 1e-3 * ref_scale), cap))


def _summary(b: Built, ref: Built, tallies: dict, labelled: bool, max_drop: float, effective: str | None,
             cap: float) -> dict:
    t, rt = tallies[b.id], tallies[ref.id]
    p50 = float(np.median(t.latencies) * 1e3) if t.latencies else None
    out = {
        "reference": ref.id,
        "samples": t.n,
        "top1_agreement": t.agree / t.n,
        "cosine_similarity": t.cos_sum / t.n,
        "max_abs_error": t.max_abs,
        "max_abs_error_golden": t.max_abs_golden,
        "max_abs_error_cap": cap,
        "latency_ms": p50,
        "effective_precision": effective,
    }
    if labelled:
        out["accuracy"] = t.correct / t.n
        out["reference_accuracy"] = rt.correct / rt.n
    if b.precision == "int8":
        ref_p50 = float(np.median(rt.latencies) * 1e3)
        out["reference_latency_ms"] = ref_p50
        out["latency_ratio"] = p50 / ref_p50
        out["slower_than_float"] = p50 > ref_p50
        if labelled:
            out["gate"] = "accuracy_drop_points"
            out["accuracy_drop_points"] = 100.0 * (out["reference_accuracy"] - out["accuracy"])
            drop = out["accuracy_drop_points"]
        else:
            out["gate"] = "agreement_drop_points"
            out["agreement_drop_points"] = 100.0 * (1.0 - out["top1_agreement"])
            drop = out["agreement_drop_points"]
    else:
        # A float artifact is checked against the golden float reference (conversion fidelity).
        out["reference"] = None
        out["golden_agreement"] = t.agree_golden / t.n
        out["gate"] = "golden_agreement_drop_points"
        drop = out["golden_agreement_drop_points"] = 100.0 * (1.0 - out["golden_agreement"])
        for key in ("top1_agreement", "cosine_similarity", "max_abs_error"):
            out.pop(key)
    out["max_drop_points"] = max_drop
    out["passed"] = bool(drop <= max_drop + 1e-9)
    if b.precision == "int8" and not t.max_abs_golden <= cap:
        # Off the float outputs by more than INT8 can be: saturating kernels or a broken conversion, whatever
        # the top-1 numbers say (a few flipped answers hide a wrong model on an easy validation set).
        out["passed"] = False
        out["max_abs_error_cap_exceeded"] = True
    return out
