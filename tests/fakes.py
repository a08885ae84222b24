"""The one fake of the suite: an NPU this machine does not have.

``FakeNPUEngine`` advertises a single NPU device and runs the bundle's ONNX artifacts for real,
through an onnxruntime CPU session inside, so ranking, ``require`` and the numerics self-check
of the production code are exercised on real numbers. ``FakeNPUEngine.broken = True`` makes it
return wrong numbers (outputs + 5), as a broken delegate would.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnxruntime as ort

from edgesdk.engines import Device, Discovery, Engine, TensorSpec

NAME = "fake-npu"


class FakeNPUEngine(Engine):
    """A pretend NPU backend (hardware this machine lacks) that computes with onnxruntime on the CPU."""

    name = NAME
    suffixes = (".onnx",)
    formats = ("onnxruntime",)
    version = "0.0-fake"
    broken = False  # class-level switch: every instance returns outputs + 5 when True

    @classmethod
    def discover(cls) -> Discovery:
        return Discovery(NAME, cls.version, [Device(NAME, "NPU", "NPU", "Fake NPU (tests only)", ("int8", "fp32"))],
                         [])

    def __init__(self, model_path, **options):
        super().__init__(model_path, **options)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self._session = ort.InferenceSession(str(self.model_path), so, providers=["CPUExecutionProvider"])
        self.inputs = [TensorSpec(a.name, tuple(a.shape), "float32") for a in self._session.get_inputs()]
        self.outputs = [TensorSpec(a.name, tuple(a.shape), "float32") for a in self._session.get_outputs()]

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.run_prepared(self.check_feeds(feeds))

    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        outs = self._session.run(None, {s.name: f for s, f in zip(self.inputs, feeds)})
        return [o + 5 for o in outs] if self.broken else outs

    @property
    def executing(self) -> list[str]:
        return ["NPU"]

    def close(self) -> None:
        self._session = None


class ThrowingNPUEngine(FakeNPUEngine):
    """A fake NPU whose delegate throws at its first run (the 'broken delegate' case)."""

    def run_prepared(self, feeds):
        raise RuntimeError("DSP timeout")

    def run(self, feeds):
        raise RuntimeError("DSP timeout")
