"""How far each artifact's raw outputs are from float: running tallies (:class:`Tally`), the largest error an INT8
artifact may have (:func:`error_caps` pooled over the outputs, :func:`output_caps` per output) and the golden
tolerances a device checks an artifact against (:func:`golden_tolerances`), pooled and per output.

These numbers are the classification and raw tasks' gates; for the other tasks they are reported (a map's worst
pixel says little about the masks it decodes to), and they bound the tolerance a device gets either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..targets import Built

# An INT8 artifact may be off the golden float outputs by at most this share of their range (max - min over the
# validation set). Sound INT8 stays well below it (the digits CNN: 0.5 %; a random CNN ending in a softmax over near-equal
# classes, the noisiest seen: 5.2 %); kernels that saturate do not (ONNX Runtime's U8S8 with 8-bit weights on an AVX2
# CPU without VNNI: 12.5 % on the digits CNN, 32 % on tests/workstation/test_int8_cpu.py's saturating model). It bounds both the
# quantize gate and the device's golden tolerance, so an artifact that exceeds it fails at quantize time, and one
# validated on a saturating CPU cannot carry a tolerance that lets the same saturation through elsewhere.
INT8_ERROR_CAP = 0.10
# INT8 steps (of 8 bits over an output's own magnitude) any output may move by, however little it varies.
INT8_STEPS = 4


@dataclass
class Tally:
    """Running numbers of one artifact against its reference (``primary``: the output classification reads)."""

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
    # per output j: the largest error against the golden output j, the largest mean |error| of one sample against
    # it, the largest |value| and the range of output j
    err_per: list[float] = field(default_factory=list)
    mean_err_per: list[float] = field(default_factory=list)
    abs_per: list[float] = field(default_factory=list)
    lo_per: list[float] = field(default_factory=list)
    hi_per: list[float] = field(default_factory=list)


def add(t: Tally, own: np.ndarray, ref: np.ndarray, golden: np.ndarray, label: int | None,
        own_all: list[np.ndarray], golden_all: list[np.ndarray]) -> None:
    """One sample into ``t``: ``own``/``ref``/``golden`` the primary output of the artifact, its reference and the
    golden float reference; ``own_all``/``golden_all`` every output."""
    t.n += 1
    a, r, g = own.reshape(-1), ref.reshape(-1), golden.reshape(-1)
    t.agree += int(a.argmax() == r.argmax())
    t.agree_golden += int(a.argmax() == g.argmax())
    if label is not None:
        t.correct += int(a.argmax() == label)
    a64, r64 = a.astype(np.float64), r.astype(np.float64)
    denom = float(np.linalg.norm(a64) * np.linalg.norm(r64))
    t.cos_sum += float(a64 @ r64) / denom if denom > 0 else float(np.array_equal(a, r))
    t.max_abs = max(t.max_abs, float(np.max(np.abs(a64 - r64))) if a.size else 0.0)
    t.max_abs_ref = max(t.max_abs_ref, float(np.max(np.abs(a64))) if a.size else 0.0)
    if not t.err_per:
        t.err_per, t.mean_err_per, t.abs_per = [0.0] * len(own_all), [0.0] * len(own_all), [0.0] * len(own_all)
        t.lo_per, t.hi_per = [float("inf")] * len(own_all), [float("-inf")] * len(own_all)
    for j, (o, q) in enumerate(zip(own_all, golden_all)):
        if not o.size:
            continue
        o64 = _f(o)
        gap = np.abs(o64 - _f(q))
        err = float(np.max(gap))
        t.max_abs_golden = max(t.max_abs_golden, err)
        t.err_per[j] = max(t.err_per[j], err)
        t.mean_err_per[j] = max(t.mean_err_per[j], float(np.mean(gap)))
        t.abs_per[j] = max(t.abs_per[j], float(np.max(np.abs(o64))))
        lo, hi = float(np.min(o64)), float(np.max(o64))
        t.lo_per[j], t.hi_per[j] = min(t.lo_per[j], lo), max(t.hi_per[j], hi)
        t.out_min, t.out_max = min(t.out_min, lo), max(t.out_max, hi)
    t.probs_like = t.probs_like and bool(np.all(a >= 0) and abs(float(a.sum()) - 1.0) < 1e-3)


def _f(array: np.ndarray) -> np.ndarray:
    """An output as float64 (an int64 class output minus another would wrap in its own dtype)."""
    return np.asarray(array, dtype=np.float64)


def error_caps(built: list[Built], tallies: dict[str, Tally], golden_id: str,
               share: float = INT8_ERROR_CAP) -> dict[str, float]:
    """The largest error against the golden float outputs each artifact may have, here and on a device.

    Float artifacts: their own error doubled, with the CPU-difference floor of :func:`tolerance` (a float
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


def output_caps(built: list[Built], tallies: dict[str, Tally], golden_id: str,
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


def check_each_output(out: dict, t: Tally, caps: list[float], gates: bool) -> None:
    """Record each output's error against the golden float output and its own cap (:func:`output_caps`) for an INT8
    artifact; an output over its cap fails the artifact when the caps are its gate (``gates``), and is only
    recorded (``max_abs_error_over_cap``) when its task's metric is."""
    if len(caps) < 2 or len(t.err_per) != len(caps):
        return  # one output: the pooled cap is that output's cap
    out["output_errors"] = [{"max_abs_error": e, "cap": c} for e, c in zip(t.err_per, caps)]
    if any(e > c for e, c in zip(t.err_per, caps)):
        if gates:
            out["passed"] = False
            out["max_abs_error_cap_exceeded"] = True
        else:
            out["max_abs_error_over_cap"] = True


def tolerance(max_abs: float, ref_scale: float, cap: float) -> float:
    """Twice the worst error seen on the validation set, with a floor relative to the output scale, never above
    ``cap`` (:func:`error_caps`).

    The floor (1e-4 + 1e-3 of the largest reference output) absorbs kernel differences between
    CPUs (another SIMD width, another summation order) yet stays far below what a broken delegate
    or a damaged artifact produces. The cap keeps an artifact that was already wrong where it was validated from
    buying itself a tolerance it then always meets: twice a saturated error would pass the same saturation anywhere.
    """
    return float(min(max(2.0 * max_abs, 1e-4 + 1e-3 * ref_scale), cap))


def golden_tolerances(built: list[Built], tallies: dict[str, Tally], golden_id: str, share: float,
                      capped: dict[str, bool]) -> tuple[dict[str, float], dict[str, list[float]],
                                                        dict[str, list[float]]]:
    """The golden tolerances a device checks each artifact against: (pooled over the outputs, what devices before
    per-output tolerances read; one per output on the max |error|; one per output on the mean |error| of a sample).

    Per output j, each tolerance is twice the artifact's worst error on that output against the golden float output
    (its largest |error|, or its largest mean |error| over one sample's values), at least the CPU-difference floor
    of :func:`tolerance` for that output's own scale, and at most a bound. For a float artifact: its own need (as
    :func:`error_caps`). For an INT8 artifact's mean error: that output's cap (:func:`output_caps`): no sound INT8
    moves a whole output by that much on average, while a flattened, constant or saturated one does. For an INT8
    artifact's max error: that output's cap when ``capped[id]`` (its caps are its gate, or it failed validation),
    else that output's whole range over the validation set: an artifact that passed its task's own gate (mask IoU,
    box F1, ...) while a pixel of a map flipped from 0 to 1 must load where it was judged good (PP-OCRv4's detector
    on OpenVINO INT8: mask IoU 0.96, max error 0.9987 on a [0, 1] map); the mean tolerance still holds that map.
    """
    g = tallies[golden_id]
    pooled_caps = error_caps(built, tallies, golden_id, share)
    per_output_caps = output_caps(built, tallies, golden_id, share)
    pooled = {b.id: tolerance(tallies[b.id].max_abs_golden, g.max_abs_ref, pooled_caps[b.id]) for b in built}
    worst: dict[str, list[float]] = {}
    mean: dict[str, list[float]] = {}
    for b in built:
        t = tallies[b.id]
        worst[b.id], mean[b.id] = [], []
        for j in range(len(g.err_per)):
            floor = 1e-4 + 1e-3 * g.abs_per[j]
            need, need_mean = max(2.0 * t.err_per[j], floor), max(2.0 * t.mean_err_per[j], floor)
            if b.precision == "fp32":
                bound, bound_mean = need, need_mean
            else:
                capped_here = capped.get(b.id, True)
                # a passed artifact must load where it was judged good, whatever an output its task does not read
                # did (the face mesh's presence logit: 2.0 off, over its cap of 1.6, reported): at least 1.25 x
                # its own worst mean error there, as the same kernels elsewhere give it
                bound_mean = per_output_caps[j] if capped_here else max(per_output_caps[j], 1.25 * t.mean_err_per[j])
                bound = per_output_caps[j] if capped_here else max(per_output_caps[j], g.hi_per[j] - g.lo_per[j])
            worst[b.id].append(float(min(need, bound)))
            mean[b.id].append(float(min(need_mean, bound_mean)))
    return pooled, worst, mean
