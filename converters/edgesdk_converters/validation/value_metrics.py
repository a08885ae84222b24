"""Validation metrics of the values a task gives, rather than what it finds: regression and probability values
(:class:`ValueAgreement`), embeddings (:class:`EmbeddingAgreement`) and raw outputs (:class:`RawAgreement`), each
against its reference, one sample at a time (:mod:`.task_metrics` picks them by task)."""

from __future__ import annotations

import math
import numpy as np

from edgesdk.tasks import TaskSpec, TaskType

from .metric_base import TaskMetric

MAX_RECALL_SAMPLES = 4096  # embeddings kept for recall@1 (4096 x 512 float32: 8 MiB)
DECISION_AGREEMENT_MIN = 0.90  # probability: decisions at the threshold must agree on this share of values


def span(lo: float, hi: float, peak: float) -> float:
    """What an error is relative to: the reference's range over the set, but at least half its largest |value|.
    An output that barely moves (a probability near 0.001 on a few chunks of noise, range 1e-5) is measured
    against its magnitude, so the few INT8 steps any output may move by (:func:`~.output_errors.output_caps`:
    1.6 % of that magnitude) stay a few percent, not hundreds."""
    return max(hi - lo, 0.5 * peak, 1e-12) if math.isfinite(hi - lo) else 1.0


class ValueAgreement(TaskMetric):
    """Regression / probability values: mean |error| relative to the output's range (the task's, else the
    reference's over the set) in percent, and the share of values on the same side of the task's threshold."""

    name, gate = "relative_mae", "relative_mae_points"

    def __init__(self, task: TaskSpec) -> None:
        self.probability = task.type is TaskType.PROBABILITY
        self.range, self.threshold = task.params.get("range"), task.params.get("threshold")
        self.abs_sum, self.n, self.same = 0.0, 0, 0
        self.lo, self.hi, self.peak = math.inf, -math.inf, 0.0

    def add(self, own, ref, own_raw, ref_raw):
        a, b = np.asarray(own.values, np.float64).ravel(), np.asarray(ref.values, np.float64).ravel()
        if a.shape != b.shape:
            raise ValueError(f"{a.size} values here and {b.size} in the reference")
        self.abs_sum += float(np.abs(a - b).sum())
        self.n += a.size
        if b.size:
            self.lo, self.hi = min(self.lo, float(b.min())), max(self.hi, float(b.max()))
            self.peak = max(self.peak, float(np.abs(b).max()))
        if self.threshold is not None:
            self.same += int(np.count_nonzero((a >= self.threshold) == (b >= self.threshold)))

    def reference_range(self) -> float:
        if self.range is not None:
            return float(self.range[1] - self.range[0])
        return span(self.lo, self.hi, self.peak) if self.n else 1.0

    def value(self):
        return 100.0 * (self.abs_sum / self.n) / self.reference_range() if self.n else 0.0

    def drop(self):
        return self.value()

    def decision_agreement(self) -> float | None:
        return self.same / self.n if self.threshold is not None and self.n else None

    def details(self):
        return {"relative_mae": self.value(), "mae": self.abs_sum / self.n if self.n else 0.0,
                "range": self.reference_range(), "decision_agreement": self.decision_agreement(),
                "threshold": self.threshold}

    def failure(self):
        agreement = self.decision_agreement()
        if self.probability and agreement is not None and agreement < DECISION_AGREEMENT_MIN:
            return (f"decisions at {self.threshold:g} agree on {100 * agreement:.1f}% of values "
                    f"(< {100 * DECISION_AGREEMENT_MIN:.0f}%)")
        return None


class EmbeddingAgreement(TaskMetric):
    """Mean cosine with the reference's embedding, and recall@1 agreement: the share of samples whose nearest
    neighbour (by cosine, within the validation set) is the one the reference's embeddings pick."""

    name, gate, default = "cosine", "cosine_drop_points", 2.0

    def __init__(self) -> None:
        self.cos_sum, self.n = 0.0, 0
        self.own: list[np.ndarray] = []
        self.ref: list[np.ndarray] = []

    def add(self, own, ref, own_raw, ref_raw):
        a, b = np.asarray(own.embedding, np.float64).ravel(), np.asarray(ref.embedding, np.float64).ravel()
        self.cos_sum += _cosine(a, b)
        self.n += 1
        if len(self.own) < MAX_RECALL_SAMPLES:
            self.own.append(a.astype(np.float32))
            self.ref.append(b.astype(np.float32))

    def value(self):
        return self.cos_sum / self.n if self.n else 1.0

    def recall_agreement(self) -> float | None:
        if len(self.own) < 3:
            return None  # with two samples each one's neighbour is the other: nothing to agree on
        return float(np.mean(_nearest(self.own) == _nearest(self.ref)))

    def details(self):
        return {"cosine": self.value(), "recall_at_1_agreement": self.recall_agreement()}


def _nearest(vectors: list[np.ndarray], rows: int = 256) -> np.ndarray:
    """Each vector's nearest other vector by cosine (its index), a block of ``rows`` at a time: never the whole
    similarity matrix."""
    v = np.stack(vectors).astype(np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    picks = np.empty(len(v), np.int64)
    for start in range(0, len(v), rows):
        sims = v[start:start + rows] @ v.T
        sims[np.arange(sims.shape[0]), np.arange(start, start + sims.shape[0])] = -np.inf
        picks[start:start + rows] = sims.argmax(1)
    return picks


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / denom if denom > 0 else float(np.array_equal(a, b))


class RawAgreement(TaskMetric):
    """Every output against the reference's: max and mean |error| relative to the reference's range over the set
    (in percent) and the mean cosine; the gate is the worst output's relative mean error."""

    name, gate = "relative_mean_error", "relative_mean_error_points"

    def __init__(self) -> None:
        self.outputs: list[dict[str, float]] = []

    def add(self, own, ref, own_raw, ref_raw):
        if not self.outputs:
            self.outputs = [{"max": 0.0, "sum": 0.0, "n": 0, "lo": math.inf, "hi": -math.inf, "peak": 0.0,
                             "cos": 0.0, "samples": 0} for _ in own_raw]
        for acc, a, b in zip(self.outputs, own_raw, ref_raw):
            a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
            if not b.size:
                continue
            gap = np.abs(a - b)
            acc["max"], acc["sum"], acc["n"] = max(acc["max"], float(gap.max())), acc["sum"] + float(gap.sum()), \
                acc["n"] + gap.size
            acc["lo"], acc["hi"] = min(acc["lo"], float(b.min())), max(acc["hi"], float(b.max()))
            acc["peak"] = max(acc["peak"], float(np.abs(b).max()))
            acc["cos"] += _cosine(a, b)
            acc["samples"] += 1

    def per_output(self) -> list[dict[str, float]]:
        out = []
        for acc in self.outputs:
            scale = span(acc["lo"], acc["hi"], acc["peak"]) if acc["n"] else 1.0
            out.append({"relative_max_error": 100.0 * acc["max"] / scale,
                        "relative_mean_error": 100.0 * acc["sum"] / acc["n"] / scale if acc["n"] else 0.0,
                        "cosine": acc["cos"] / acc["samples"] if acc["samples"] else 1.0})
        return out

    def value(self):
        return max((o["relative_mean_error"] for o in self.per_output()), default=0.0)

    def drop(self):
        return self.value()

    def details(self):
        return {"relative_mean_error": self.value(), "outputs": self.per_output()}
