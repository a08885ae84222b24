"""What every validation metric is (:class:`TaskMetric`): one artifact's running agreement with its reference on
one task, its value, the gate's drop in its unit and its default limit. Below :mod:`.task_metrics` and
:mod:`.value_metrics`, which hold the metrics themselves."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from edgesdk.tasks import Decoded


class TaskMetric(ABC):
    """One artifact's running agreement with its reference on one task."""

    name = ""  # the metric, as the manifest and the report name it
    gate = ""  # the entry key holding the drop (old readers find the drop under the entry's "gate")
    unit = "points"
    default = 5.0

    @abstractmethod
    def add(self, own: Decoded | None, ref: Decoded | None, own_raw: list[np.ndarray],
            ref_raw: list[np.ndarray]) -> None:
        """One sample: this artifact's and its reference's decoded predictions and raw outputs."""

    @abstractmethod
    def value(self) -> float:
        """The metric over the samples so far (1 = as the reference, for the shares)."""

    def drop(self) -> float:
        """What the gate compares with its limit: 100 * (1 - value) points unless the metric says otherwise."""
        return 100.0 * (1.0 - self.value())

    def default_max_drop(self) -> float:
        return self.default

    def details(self) -> dict[str, Any]:
        return {self.name: self.value()}

    def failure(self) -> str | None:
        """A reason to fail beyond the drop (probability: decisions that disagree), or None."""
        return None
