"""One prediction as the caller gets it: :class:`Result` (raw outputs, top-k read on demand, where it ran, how
long each stage took, the budget state and, in hybrid mode, which side answered and why). Below both the device
runtime (:mod:`edgesdk.runtime.model`) and :mod:`edgesdk.hybrid.model`, which both make results: it imports neither,
so the runtime may import hybrid (``load`` builds a :class:`~edgesdk.HybridModel`) and hybrid never imports the
runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from .bundle.tensors import Top
from .choices import EscalationReason, EscalationSkip, ResultSource
from .frozen import FrozenDict, thaw
from .tasks.results import Decoded, Detection, Landmarks, Mask, TextLine

if TYPE_CHECKING:  # an annotation only: a result names no runtime module, so hybrid and runtime both make results
    from .runtime.placement import Placement


@dataclass
class Result:
    """One prediction: raw outputs, top-k (classification), the outputs decoded by the bundle's task
    (``detections``, ``masks``, ``text``, ``landmarks``, ``embedding``, ``values``: :attr:`decoded`), where it ran
    and how long each stage took.

    In hybrid mode (:mod:`edgesdk.hybrid.model`) also: ``source`` (``device`` / ``cloud``), ``escalation_reason``
    (why the cloud was asked), ``degraded`` (the cloud failed and the device answered), ``cloud_error`` (the
    cloud failure's reason), ``escalation_skipped`` (``budget``: it wanted the cloud, for ``escalation_reason``, but
    the escalation budget was spent, so the device answered) and ``signals`` (the device output's hardness signals).
    ``placement`` is the device's, None when the cloud answered a model that has no device backend.

    The top-k postprocessing runs when ``top`` is first read (an app that only needs the raw outputs
    does not pay for it); ``timings_ms["postprocess"]`` is recorded then.

    ``placement`` and ``budget`` are values, never the model's state: a frozen
    :class:`~edgesdk.runtime.placement.Placement` and a read-only dict (:class:`~edgesdk.frozen.FrozenDict`, nested ones
    too), made once when the model's placement or budget state changes and shared by the results made under it
    (so reading them costs a prediction nothing). Changing one raises ``TypeError``; :meth:`to_dict` and
    ``placement.to_dict()`` give plain, mutable data.
    """

    outputs: list[np.ndarray]
    placement: Placement
    timings_ms: dict[str, float]
    source: str = "device"
    budget: Mapping[str, Any] = field(default_factory=FrozenDict)
    escalation_reason: EscalationReason | None = None
    degraded: bool = False
    signals: dict[str, float | None] | None = None
    cloud_error: str | None = None
    escalation_skipped: EscalationSkip | None = None
    _topk: Any = field(default=None, repr=False, compare=False)
    _top: list[Top] | None = field(default=None, repr=False, compare=False)
    _decoder: Any = field(default=None, repr=False, compare=False)
    _transform: Any = field(default=None, repr=False, compare=False)
    _decoded: Decoded | None = field(default=None, repr=False, compare=False)

    @property
    def top(self) -> list[Top]:
        if self._top is None:
            t0 = time.perf_counter()
            self._top = self._topk(self.outputs) if self._topk is not None else []
            self.timings_ms["postprocess"] = (time.perf_counter() - t0) * 1e3
        return self._top

    @property
    def decoded(self) -> Decoded:
        """The outputs decoded by the bundle's task (:mod:`edgesdk.tasks`), on first read (recorded in
        ``timings_ms["postprocess"]``, with the top-k if read first)."""
        if self._decoded is None:
            t0 = time.perf_counter()
            self._decoded = self._decoder(self.outputs, self._transform) if self._decoder is not None \
                else Decoded("raw")
            self.timings_ms["postprocess"] = self.timings_ms.get("postprocess", 0.0) + (time.perf_counter() - t0) * 1e3
        return self._decoded

    @property
    def task(self) -> str:
        """The bundle's task type (``classification``, ``detection``, ...; ``raw`` for a model without one)."""
        return self.decoded.task

    @property
    def detections(self) -> list[Detection]:
        """Detected objects (a detection task; else empty): box (x1, y1, x2, y2) in the original image's pixels,
        score, class and label, keypoints."""
        return self.decoded.detections or []

    @property
    def masks(self) -> list[Mask]:
        """Segmentation masks in the original image's pixels (a segmentation task; else empty)."""
        return self.decoded.masks or []

    @property
    def text(self) -> TextLine | None:
        """Decoded text with per-character confidence (a text task; else None)."""
        return self.decoded.text

    @property
    def landmarks(self) -> Landmarks | None:
        """Points in the original image's pixels (a landmarks task; else None)."""
        return self.decoded.landmarks

    @property
    def embedding(self) -> np.ndarray | None:
        """The embedding vector (an embedding task; else None)."""
        return self.decoded.embedding

    @property
    def values(self) -> np.ndarray | None:
        """The output values of a regression or probability task (else None)."""
        return self.decoded.values

    def to_dict(self, outputs: bool = True) -> dict[str, Any]:
        """Plain data (JSON-ready): everything above, with ``backend`` (``engine:device:artifact``, None when the
        cloud answered) and the raw outputs as nested lists with their shapes (``outputs=False`` leaves them out)."""
        where = self.placement
        out = {"source": self.source,
               "backend": f"{where.engine}:{where.device}:{where.artifact}" if self.source == ResultSource.DEVICE and
               where is not None else None,
               "escalation_reason": self.escalation_reason, "degraded": self.degraded,
               "cloud_error": self.cloud_error, "escalation_skipped": self.escalation_skipped, "signals": self.signals, "top": [t._asdict() for t in self.top],
               "timings_ms": dict(self.timings_ms), "budget": thaw(self.budget)}
        if self._decoder is not None:
            out.update(self.decoded.to_dict())  # task, and the task's fields (detections, masks, text...)
            out["timings_ms"] = dict(self.timings_ms)
        if outputs:
            out["output_shapes"] = [list(o.shape) for o in self.outputs]
            out["outputs"] = [o.tolist() for o in self.outputs]
        return out


__all__ = ["Result", "Top"]
