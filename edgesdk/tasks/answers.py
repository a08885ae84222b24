"""A bundle's task applied to an answer from elsewhere (a cloud endpoint), before anything uses it:
:class:`AnswerCheck`, which the cloud client calls on every answer that already matches the bundle's outputs in name,
shape, datatype and finiteness (:mod:`edgesdk.hybrid.v2_codec`).

What it refuses is what the device's own decoding would call unreadable: for detection, a candidate over the score
threshold whose box is no number or lies farther than :data:`~edgesdk.tasks.detection.SANE_EXTENT` input sizes from
the input (a box at 1e30 px would otherwise become a zero-area box on the image's edge, or no box, and replace the
device's good ones). Other tasks have nothing to check here yet (:meth:`AnswerCheck.of` gives None).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..choices import TaskType
from ..errors import EdgeSDKError
from .detection import SANE_EXTENT, unreadable_share
from .geometry import Transform, input_image_size
from .spec import TaskSpec, task_of


class AnswerCheck:
    """``check(outputs) -> problems``: what in one answer (the bundle's outputs, in its order; a batch is checked
    sample by sample) the bundle's task cannot use, as sentences (none: usable)."""

    def __init__(self, spec: TaskSpec, output_names: Sequence[str], input_size: tuple[int, int] | None):
        self.spec, self.output_names, self.input_size = spec, list(output_names), input_size

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> "AnswerCheck | None":
        """The check of a bundle's manifest, None when its task has nothing to check (only detection has)."""
        spec = task_of(manifest)
        if spec.type is not TaskType.DETECTION:
            return None
        pre = manifest.get("preprocess") or {}
        size = tuple(pre["size"][:2]) if pre.get("size") else input_image_size(manifest["inputs"][0]["shape"])
        return cls(spec, [o["name"] for o in manifest["outputs"]], size)

    def __call__(self, outputs: Sequence[np.ndarray], names: Sequence[str] | None = None) -> list[str]:
        """``outputs`` in the order of ``names`` (default: the bundle's outputs, in its order)."""
        if names is not None and list(names) != self.output_names:
            given = dict(zip(names, outputs))
            missing = [n for n in self.output_names if n not in given]
            if missing:
                return [f"it lacks output(s) {', '.join(map(repr, missing))} of the bundle's task"]
            outputs = [given[n] for n in self.output_names]
        batch = {int(np.shape(o)[0]) for o in outputs if np.ndim(o)}
        if len(batch) == 1 and (count := batch.pop()) > 1:
            return [p for i in range(count) for p in self([o[i:i + 1] for o in outputs])]
        transform = Transform.identity(*self.input_size) if self.input_size is not None else None
        try:
            unreadable, total = unreadable_share(self.spec, list(outputs), self.output_names, transform=transform)
        except EdgeSDKError as exc:  # an answer its task cannot decode at all
            return [f"its task ({self.spec.type}) cannot decode it: {exc}"]
        if not unreadable:
            return []
        where = f" ({self.input_size[0]}x{self.input_size[1]})" if self.input_size is not None else ""
        return [f"{unreadable} of the {total} candidate boxes over the score threshold are not numbers or lie farther "
                f"than {SANE_EXTENT} input sizes{where} from the input"]


__all__ = ["AnswerCheck"]
