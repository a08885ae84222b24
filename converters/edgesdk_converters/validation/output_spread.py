"""The dead-output check every task runs: an artifact whose output varies far less than its reference's across
the validation set has lost that output, whatever its other numbers say (Silero VAD's INT8 speech probability on
OpenVINO, 0.345 for every audio chunk, read as 100% top-1 agreement before tasks: a [1, 1] output's arg-max is
always 0).

:class:`OutputSpread` streams how much each output varies from sample to sample: every element's standard deviation
across the samples (Welford, one running mean and sum of squares per element: memory of one output, whatever the
set's size), summed up as their root mean square. An output that answers the same vector for every input is dead
even when its elements differ from each other (a classifier stuck at [0.345, 0.655]). :func:`dead_outputs` compares
an artifact's with its reference's.
"""

from __future__ import annotations

import math

import numpy as np

from .output_errors import INT8_STEPS

DEAD_RATIO = 0.25  # an output whose spread is under this share of its reference's is dead


class OutputSpread:
    """How much each output of one artifact varies over the validation set: per element, the standard deviation
    across samples (streamed), their root mean square per output, and the output's largest |value|."""

    def __init__(self) -> None:
        self.n: list[int] = []
        self.mean: list[np.ndarray | None] = []
        self.m2: list[np.ndarray | None] = []
        self.peak: list[float] = []

    def add(self, outputs: list[np.ndarray]) -> None:
        if not self.n:
            k = len(outputs)
            self.n, self.mean, self.m2, self.peak = [0] * k, [None] * k, [None] * k, [0.0] * k
        for j, o in enumerate(outputs):
            a = np.asarray(o, np.float64).ravel()
            if not a.size:
                continue
            if self.mean[j] is None or self.mean[j].shape != a.shape:  # first sample (a shape change restarts)
                self.n[j], self.mean[j], self.m2[j] = 0, np.zeros_like(a), np.zeros_like(a)
            self.n[j] += 1
            delta = a - self.mean[j]
            self.mean[j] += delta / self.n[j]
            self.m2[j] += delta * (a - self.mean[j])
            self.peak[j] = max(self.peak[j], float(np.abs(a).max()))

    def std(self) -> list[float]:
        """Per output: the root mean square over its elements of each element's standard deviation across the
        samples (0 for an output seen once or never)."""
        return [math.sqrt(float(m2.mean()) / n) if n and m2 is not None else 0.0 for m2, n in zip(self.m2, self.n)]


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
