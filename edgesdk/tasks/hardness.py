"""Hardness signals per task, for hybrid mode: how unsure one decoded prediction is, so that ``prefer-device``
escalates the hard inputs of tasks other than classification (whose signals stay in :mod:`edgesdk.hybrid.model`).

:data:`SIGNALS` names each signal with its task types, which way is hard ("low": escalate below the threshold;
"high": above it) and its default threshold. :func:`signals` computes those of a spec's type (None where the
prediction gives nothing to measure):

- detection: ``uncertain_share``: of the candidates scoring at least ``uncertain[0]``, the share below
  ``uncertain[1]`` (0 when none reaches ``uncertain[0]``: nothing there, surely; 1 when any candidate over the score
  threshold was unreadable, ``Decoded.unreadable``); ``min_kept_score``: the lowest score among the kept detections
  (None without detections).
- segmentation: ``uncertain_pixel_share``: the share of the model map's pixels that are unsure. Kind probability:
  probability in [``uncertain[0]``, ``uncertain[1]``). Kind classes: top-1 probability below ``uncertain[1]`` (for
  two classes, the same band as probability; the map is read after the task's activation, so a class map with
  activation "none" must hold probabilities already). Letterbox padding counts, as pixels of the map.
- text: ``min_char_confidence`` (None without text); ``mean_margin``: the mean, over the steps emitting a
  character, of top-1 minus top-2 probability (None when no step emits one).
- regression, probability: ``threshold_distance``: min over the values of |v - threshold| / (range width); None
  when the task has no threshold or (regression) no range.

The segmentation signal is named apart from detection's (``uncertain_pixel_share``, not ``uncertain_share``): the
two measure different things (pixels, boxes) with different default thresholds, and one name per signal keeps
:data:`SIGNALS` a plain table.
"""

from __future__ import annotations

import numpy as np

from ..choices import TaskType
from .detection import candidate_scores
from .results import Decoded
from .segmentation import probabilities
from .spec import TaskSpec
from .text import step_probabilities

# signal -> (task types, "low" or "high": the hard side, default threshold)
SIGNALS: dict[str, tuple[tuple[TaskType, ...], str, float]] = {
    "uncertain_share": ((TaskType.DETECTION,), "high", 0.5),
    "min_kept_score": ((TaskType.DETECTION,), "low", 0.6),
    "uncertain_pixel_share": ((TaskType.SEGMENTATION,), "high", 0.1),
    "min_char_confidence": ((TaskType.TEXT,), "low", 0.6),
    "mean_margin": ((TaskType.TEXT,), "low", 0.3),
    "threshold_distance": ((TaskType.REGRESSION, TaskType.PROBABILITY), "low", 0.1),
}


def signals_of(task: TaskType) -> tuple[str, ...]:
    """The signal names a task type has (none for classification: see :mod:`edgesdk.hybrid.model`)."""
    return tuple(name for name, (types, _, _) in SIGNALS.items() if task in types)


def is_hard(signal: str, value: float | None, threshold: float) -> bool:
    """Whether ``value`` of ``signal`` is on its hard side of ``threshold`` (a None value is not hard)."""
    if value is None:
        return False
    return value > threshold if SIGNALS[signal][1] == "high" else value < threshold


def signals(spec: TaskSpec, decoded: Decoded, outputs: list[np.ndarray],
            output_names: list[str]) -> dict[str, float | None]:
    """The hardness signals of one prediction of ``spec``'s type ({} for a type without any)."""
    kind = spec.type
    if kind is TaskType.DETECTION:
        low, high = spec.uncertain
        scores = _read(decoded, lambda: candidate_scores(spec, outputs, output_names))
        reaching = scores[scores >= low]
        kept = [d.score for d in decoded.detections or []]
        share = float(np.mean(reaching < high)) if reaching.size else 0.0
        if decoded.unreadable:  # boxes the decoding could not read: nothing about this answer is sure
            share = 1.0
        return {"uncertain_share": share, "min_kept_score": float(min(kept)) if kept else None}
    if kind is TaskType.SEGMENTATION:
        low, high = spec.uncertain
        probs = _read(decoded, lambda: probabilities(spec, outputs, output_names))
        if spec.kind == "probability":
            unsure = (probs[0] >= low) & (probs[0] < high)
        else:
            unsure = np.max(probs, axis=0) < high
        return {"uncertain_pixel_share": float(np.mean(unsure))}
    if kind is TaskType.TEXT:
        probs = _read(decoded, lambda: step_probabilities(spec, outputs, output_names))
        confidences = decoded.text.char_confidences if decoded.text is not None else ()
        margin = None
        if probs.shape[0] and probs.shape[1] >= 2:
            best = np.argmax(probs, axis=1)
            emitting = best != spec.blank
            if emitting.any():
                top2 = np.partition(probs[emitting], -2, axis=1)[:, -2:]
                margin = float(np.mean(top2[:, 1] - top2[:, 0]))
        return {"min_char_confidence": float(min(confidences)) if confidences else None, "mean_margin": margin}
    if kind in (TaskType.REGRESSION, TaskType.PROBABILITY):
        if spec.threshold is None or spec.range is None or decoded.values is None or not decoded.values.size:
            return {"threshold_distance": None}
        lo, hi = spec.range
        distance = np.min(np.abs(np.asarray(decoded.values, dtype=np.float64) - spec.threshold)) / (hi - lo)
        return {"threshold_distance": float(distance)}
    return {}


def _read(decoded: Decoded, compute) -> np.ndarray:
    """What the decoding already read (``decoded.model_scores``), else computed from the outputs (a ``Decoded``
    made elsewhere)."""
    return decoded.model_scores if decoded.model_scores is not None else compute()


__all__ = ["SIGNALS", "signals_of", "is_hard", "signals"]
