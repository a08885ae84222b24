"""The dead-output check every task runs: an artifact whose output varies far less than its reference's across
the validation set has lost that output, whatever its other numbers say (Silero VAD's INT8 speech probability on
OpenVINO, 0.345 for every audio chunk, read as 100% top-1 agreement before tasks: a [1, 1] output's arg-max is
always 0).

:class:`OutputSpread` streams each output's standard deviation over all its values of every sample (constant
memory); :func:`dead_outputs` compares an artifact's with its reference's.
"""

from __future__ import annotations

import math

import numpy as np

from .output_errors import INT8_STEPS

DEAD_RATIO = 0.25  # an output whose spread is under this share of its reference's is dead


class OutputSpread:
    """How much each output of one artifact varies over the validation set: the standard deviation of all its
    values over every sample, streamed (Chan's pairwise update), with its largest |value|."""

    def __init__(self) -> None:
        self.n: list[int] = []
        self.mean: list[float] = []
        self.m2: list[float] = []
        self.peak: list[float] = []

    def add(self, outputs: list[np.ndarray]) -> None:
        if not self.n:
            k = len(outputs)
            self.n, self.mean, self.m2, self.peak = [0] * k, [0.0] * k, [0.0] * k, [0.0] * k
        for j, o in enumerate(outputs):
            a = np.asarray(o, np.float64).ravel()
            if not a.size:
                continue
            n, mean, m2 = a.size, float(a.mean()), float(np.square(a - a.mean()).sum())
            total = self.n[j] + n
            delta = mean - self.mean[j]
            self.m2[j] += m2 + delta * delta * self.n[j] * n / total
            self.mean[j] += delta * n / total
            self.n[j] = total
            self.peak[j] = max(self.peak[j], float(np.abs(a).max()))

    def std(self) -> list[float]:
        return [math.sqrt(m2 / n) if n else 0.0 for m2, n in zip(self.m2, self.n)]


def dead_outputs(own: OutputSpread, ref: OutputSpread) -> list[int]:
    """The outputs (indices) that vary far less here than in the reference (std under :data:`DEAD_RATIO` of the
    reference's), where the reference varies by more than a few 8-bit steps of its own magnitude
    (:data:`~.output_errors.INT8_STEPS`, as the per-output cap allows). An output the reference itself holds nearly
    still cannot be judged this way: a presence score stuck at 0.995, or Silero's speech probability on a few
    chunks of noise (std 4e-6 at a magnitude near 0.001: one INT8 step), which INT8 rightly rounds to one value.
    An output that is not finite here while the reference's is counts as dead too."""
    dead = []
    for j, (mine, theirs) in enumerate(zip(own.std(), ref.std())):
        if not math.isfinite(theirs) or j >= len(ref.peak):
            continue
        if theirs > max(1e-6, INT8_STEPS * ref.peak[j] / 255.0) and not mine >= DEAD_RATIO * theirs:
            dead.append(j)
    return dead
