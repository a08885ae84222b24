"""What every float model to quantize has: its inputs and outputs, the targets it can reach and why one cannot,
fixing its dynamic input dimensions, and the OpenVINO hand-off most routes share."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgesdk.engines import TensorSpec
from edgesdk.errors import ConversionError

TARGETS = ("tflite", "openvino", "onnx")
SUFFIXES = {".pt2": "pytorch", ".onnx": "onnx", ".tflite": "tflite"}
# Which targets each source kind can reach, and why not the others.
ROUTES = {
    "pytorch": ("tflite", "openvino", "onnx"),
    "onnx": ("tflite", "openvino", "onnx"),
    "tflite": ("tflite", "openvino"),
}
ROUTES_TEXT = (
    "supported routes: .pt2/nn.Module -> tflite, openvino, onnx; .onnx -> tflite, openvino, onnx; "
    ".tflite -> tflite, openvino"
)


class Source:
    """A float model to quantize. Build with :func:`open_source`."""

    kind: str = ""

    def __init__(self, name: str, path: Path | None):
        self.name = name
        self.path = path
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.shapes_from: str | None = None  # where dynamic input dimensions were fixed from, if there were any
        # What was done to the model on the way to a target (an opset upgrade): ``notes`` are said in the progress
        # log once the targets are checked, ``provenance`` goes into the manifest's ``source`` section.
        self.notes: list[str] = []
        self.provenance: dict[str, Any] = {}
        self.fixed: dict[str, Any] = {}  # inputs the model was specialized for (fix_inputs), by name

    @property
    def targets(self) -> tuple[str, ...]:
        return ROUTES[self.kind]

    def unsupported(self, target: str) -> str | None:
        """Why ``target`` cannot take this model (ops it lacks, an opset it cannot read), found before any work
        starts; None when it can. Sources with such checks override it."""
        return None

    def default_targets(self, say: Callable[[str], None]) -> list[str]:
        """Every target that can take the model; each one that cannot is named in the log with why."""
        chosen = []
        for target in self.targets:
            why = self.unsupported(target)
            if why is None:
                chosen.append(target)
            else:
                say(f"not building {target} from {self.name}: {why}")
        if not chosen:
            raise ConversionError(f"no target can take {self.name}: " + "; ".join(
                f"{t}: {self.unsupported(t)}" for t in self.targets))
        return chosen

    def check_targets(self, targets: list[str]) -> None:
        for t in targets:
            if t not in TARGETS:
                raise ConversionError(f"unknown target {t!r}; targets are {', '.join(TARGETS)}")
            if t not in self.targets:
                raise ConversionError(f"cannot build target {t!r} from a {self.kind} source ({self.name}); {ROUTES_TEXT}")
        refused = [(t, self.unsupported(t)) for t in targets]  # before any data is read or work starts
        refused = [(t, why) for t, why in refused if why is not None]
        if refused:
            fine = [t for t in self.targets if t not in targets and self.unsupported(t) is None]
            raise ConversionError(f"{self.name} cannot go to " + "; ".join(f"{t}: {why}" for t, why in refused)
                                  + (f" (targets that take it: {', '.join(fine)})" if fine else ""))

    def fix_inputs(self, values: dict[str, Any]) -> None:
        """Specialize the model for these input values (``QuantizeOptions.fixed_inputs``); only ONNX sources can."""
        raise ConversionError(f"fixed_inputs specializes ONNX models (their If branches); {self.name} is a "
                              f"{self.kind} source")

    def fix_shapes(self, sample: list[np.ndarray]) -> None:
        """Replace dynamic input dimensions with those of a real sample."""
        if self.shapes_from is None and any(d == -1 for s in self.inputs for d in s.shape):
            self.shapes_from = "calibration data"
        self.inputs = [TensorSpec(s.name, tuple(a.shape), s.dtype) for s, a in zip(self.inputs, sample)]

    def set_input_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Fix the inputs' dynamic dimensions from ``--input-shape name:1x3x48x192`` before any data is read."""
        names = [s.name for s in self.inputs]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise ConversionError(f"--input-shape names {', '.join(map(repr, unknown))}, which {self.name} does not "
                                  f"have (inputs: {', '.join(names)})")
        fixed = []
        for spec in self.inputs:
            shape = tuple(shapes.get(spec.name, spec.shape))
            if len(shape) != len(spec.shape) or any(d != -1 and d != g for d, g in zip(spec.shape, shape)):
                raise ConversionError(f"--input-shape {spec.name}:{'x'.join(map(str, shape))} does not fit "
                                      f"{self.name}'s input {spec.name!r} of shape {_shape_text(spec.shape)}")
            if any(d < 1 for d in shape):
                raise ConversionError(f"--input-shape {spec.name}: every dimension must be at least 1, got "
                                      f"{'x'.join(map(str, shape))}")
            fixed.append(TensorSpec(spec.name, shape, spec.dtype))
        self.inputs = fixed
        self.shapes_from = "--input-shape"

    # Each subclass implements the hand-offs its routes need.
    def float_tflite(self, path: Path) -> Path:
        raise ConversionError(f"no route to tflite from {self.kind}; {ROUTES_TEXT}")

    def float_onnx(self, path: Path) -> Path:
        raise ConversionError(f"no route to onnx from {self.kind}; {ROUTES_TEXT}")

    def openvino_model(self):
        """The float model as an OpenVINO model with the fixed input shapes of the data.

        Static shapes matter: the CPU plugin compiles them faster, and an INT8 IR left
        with dynamic dims (as ``convert_model`` gives for an ExportedProgram) fails to
        compile in bf16 mode ("No suitable implementations").
        """
        import openvino as ov

        try:
            model = ov.convert_model(self._openvino_input())
            model.reshape({i: list(s.shape) for i, s in enumerate(self.inputs)})
        except Exception as exc:
            raise ConversionError(f"OpenVINO could not convert {self.name}: {exc}") from exc
        return model

    def _openvino_input(self):
        return str(self.path)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join("?" if d == -1 else str(d) for d in shape)

def _op_listing(missing: list[tuple[str, int, str]]) -> str:
    return ", ".join(f"{op} ({n} node{'s' if n > 1 else ''}, first {first!r})" for op, n, first in missing)
