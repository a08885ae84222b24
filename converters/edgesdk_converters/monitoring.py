"""The manifest's ``monitoring`` section: reference statistics of the calibration and validation data and of the
float reference's outputs on the validation data, made with the device's own summaries
(:mod:`edgesdk.monitor.reference`), for the device's drift signals.

A summary that fails (an output the task cannot decode) leaves the section out with a note: monitoring a bundle is
never a reason for its quantize to fail; the device then watches the operational signals only.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from edgesdk.monitor.reference import ReferenceBuilder


class Reference:
    """Collects during quantize; :meth:`section` gives the manifest section (None after a failure)."""

    def __init__(self, src: Any, pre: Any, task: Any, say: Callable[[str], None], calib_samples: list):
        self._say = say
        self.inputs = self.outputs = 0
        self._error: str | None = None
        try:
            # the middle of each input's calibrated range, as the manifest's calibration.input_ranges will say
            centers = [(float(min(np.min(s[i]) for s in calib_samples)) +
                        float(max(np.max(s[i]) for s in calib_samples))) / 2 for i in range(len(src.inputs))]
            self._builder = ReferenceBuilder([(s.name, s.shape) for s in src.inputs],
                                             pre.layout if pre is not None else None, task,
                                             [s.name for s in src.outputs], centers)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            self._fail(exc)

    def add_inputs(self, samples) -> None:
        for sample in samples:
            self._guard(lambda: self._builder.add_input(sample))
            self.inputs += 1

    def observe(self, sample: list[np.ndarray], outputs: dict[str, list[np.ndarray]], decode: Callable[[str], Any],
                golden_id: str) -> None:
        """One validation sample: its input, and each artifact's outputs (the golden float reference's are the
        bundle's ``outputs`` reference; each artifact's own, ``artifacts.<id>``, is what a device running that
        artifact is compared with: INT8 moves scores by a little, which narrow bins would call drift)."""
        self.add_inputs([sample])
        for aid, outs in outputs.items():
            self._guard(lambda: self._builder.add_output(outs, lambda: decode(aid), key=aid))
        self._guard(lambda: self._builder.add_output(outputs[golden_id], lambda: decode(golden_id)))
        self.outputs += 1

    def section(self, softmax: bool, calibration: int) -> dict[str, Any] | None:
        if self._error is not None:
            return None
        table = None
        try:
            table = self._builder.table(
                softmax, f"{self.inputs} samples: {calibration} calibration, {self.inputs - calibration} validation",
                f"the float reference's outputs on {self.outputs} validation samples")
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        return table

    def _guard(self, step: Callable[[], None]) -> None:
        if self._error is None:
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._error = f"{type(exc).__name__}: {exc}"
        self._say(f"monitoring reference left out ({self._error}); the device watches operational signals only")
