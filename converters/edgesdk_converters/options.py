"""What a quantize run is asked to do, checked when it is built: :class:`QuantizeOptions`.

One frozen object instead of a dozen keyword parameters (ONNX Runtime's ``StaticQuantConfig`` idea), so a bad value
fails at once, naming the allowed ones, before any model is opened; :func:`edgesdk_converters.quantize.quantize`
takes one (``options=``) and also each field as a keyword shortcut. The data (source, calibration and validation
sets, preprocessing, labels) are arguments of ``quantize`` itself, not options.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from edgesdk.errors import CalibrationError, ConversionError, InputError
from edgesdk.tasks import TaskSpec

from .targets import TARGET_ENGINES
from .recovery import MODES as RECOVER_MODES

RECOVER_VAR = "EDGESDK_RECOVER"
from .targets.tflite import IO_TYPES as TFLITE_IO
from .validation.validate import INT8_ERROR_CAP

DEFAULT_SAMPLES = 300


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize. ``targets``: a subset of ``tflite``, ``openvino``, ``onnx`` (None: every target the source
    allows). ``samples``: calibration samples drawn (with ``seed``); ``val_samples``: validation samples (None: all).
    ``task``: what the outputs mean (a :class:`~edgesdk.tasks.TaskSpec`, its table, or a task type's name; None:
    classification when the source has one 2-D float output, else raw): the bundle records it, and validation judges
    each artifact by the task's own metric. ``metric``: a user metric, ``"module:function"`` (or the function),
    called per validation sample as ``function(outputs, reference, label, task) -> score in [0, 1]``; its mean
    replaces the task's gate. ``max_drop``: what an artifact may lose, in the gate metric's own unit (points of
    accuracy, top-1 agreement, F1, mask IoU...; None: the task's default); ``max_error_cap``: an INT8
    artifact's largest error as a share of the float outputs' range. ``name``/``version``: the bundle's (no control
    characters: they are written into files and terminals). ``tflite_io``: ``float`` or ``int8`` tensors around the
    LiteRT INT8 graph. ``input_shapes``: {input name: shape} for an ONNX model's dynamic dimensions (``()`` for a
    scalar). ``state``: {output name: input name} of a stateful model, each output fed back into that input on the
    next call (recorded in the manifest; the device's ``model.stream()`` carries it). ``fixed_inputs``: {input
    name: value} an ONNX model is specialized for (its ``If`` branches on them folded, as OpenVINO needs): the
    bundle keeps the input, records the value, and a device fills it in or refuses another. ``overwrite``: replace an
    existing bundle. ``progress``/``quiet_toolchains``: console output. ``recover``: ``auto`` (default: an INT8
    artifact that fails its gate is quantized again with its most sensitive layers kept in float, the fewest that
    pass), ``on`` (also record for a passing one that nothing was needed) or ``off``; None: ``$EDGESDK_RECOVER``,
    else ``auto``; ``recover_time``: seconds for all of the run's recovery, shared by the artifacts that fail their
    gate (None: derived from the float model, 60 s under 10 MB; :mod:`~edgesdk_converters.recovery.budget`)."""

    targets: tuple[str, ...] | None = None
    samples: int = DEFAULT_SAMPLES
    val_samples: int | None = None
    seed: int = 0
    max_drop: float | None = None
    task: Any = None
    metric: Any = None
    max_error_cap: float = INT8_ERROR_CAP
    name: str | None = None
    version: str = "1"
    tflite_io: str = "float"
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    state: Mapping[str, str] | None = None
    fixed_inputs: Mapping[str, Any] | None = None
    overwrite: bool = False
    progress: bool = True
    quiet_toolchains: bool = True
    recover: str | None = None
    recover_time: float | None = None

    def __post_init__(self) -> None:
        if self.targets is not None:
            if isinstance(self.targets, str):
                raise ConversionError(f"targets must be a list of target names, got the string {self.targets!r}")
            targets = tuple(self.targets)
            unknown = [t for t in targets if t not in TARGET_ENGINES]
            if unknown:
                raise ConversionError(f"unknown target {', '.join(map(repr, unknown))}; targets are "
                                      f"{', '.join(TARGET_ENGINES)}")
            if not targets:
                raise ConversionError("no targets asked for")
            twice = sorted({t for t in targets if targets.count(t) > 1})
            if twice:
                raise ConversionError(f"target(s) listed more than once: {', '.join(twice)}")
            object.__setattr__(self, "targets", targets)
        if not _is_int(self.samples) or self.samples < 1:
            raise CalibrationError(f"samples must be at least 1, got {self.samples!r}")
        if self.val_samples is not None and (not _is_int(self.val_samples) or self.val_samples < 1):
            raise CalibrationError(f"val_samples must be at least 1 (or None for all), got {self.val_samples!r}")
        if not _is_int(self.seed):
            raise ConversionError(f"seed must be an integer, got {self.seed!r}")
        if self.max_drop is not None and not _is_number(self.max_drop):  # (negative: the artifact must beat float; tests use it to force a fail)
            raise ConversionError(f"max_drop must be a finite number of points, got {self.max_drop!r}")
        if not _is_number(self.max_error_cap) or self.max_error_cap <= 0:
            raise ConversionError(f"max_error_cap must be a positive share of the output range (default "
                                  f"{INT8_ERROR_CAP}), got {self.max_error_cap!r}")
        if self.recover is None:  # the default: $EDGESDK_RECOVER, else auto
            object.__setattr__(self, "recover", os.environ.get(RECOVER_VAR, "auto"))
        if self.recover not in RECOVER_MODES:
            raise ConversionError(f"recover must be one of {', '.join(RECOVER_MODES)} (auto: recover an INT8 artifact "
                                  f"that fails its gate; the default comes from ${RECOVER_VAR}, else auto), got "
                                  f"{self.recover!r}")
        if self.recover_time is not None and (not _is_number(self.recover_time) or self.recover_time <= 0):
            raise ConversionError(f"recover_time must be a positive number of seconds (or None: derived from the "
                                  f"model), got {self.recover_time!r}")
        if self.tflite_io not in TFLITE_IO:
            raise ConversionError(f"tflite_io must be one of {', '.join(TFLITE_IO)}, got {self.tflite_io!r}")
        for field_name in ("name", "version"):
            _check_text(field_name, getattr(self, field_name), optional=field_name == "name")
        if self.input_shapes is not None:
            shapes = {}
            for key, shape in dict(self.input_shapes).items():
                dims = tuple(shape) if isinstance(shape, (tuple, list)) else None
                if not isinstance(key, str) or dims is None or not all(_is_int(d) and d >= 1 for d in dims):
                    raise ConversionError(f"input_shapes[{key!r}] must be a tuple of positive sizes, got {shape!r}")
                shapes[key] = dims
            object.__setattr__(self, "input_shapes", shapes)
        self._check_fixed_inputs()
        if self.task is not None:
            object.__setattr__(self, "task", _task(self.task))
        if self.metric is not None and not callable(self.metric) and not (
                isinstance(self.metric, str) and ":" in self.metric):
            raise ConversionError(f"metric must be 'module:function' or a function, got {self.metric!r}")
        if self.state is not None:
            if not isinstance(self.state, Mapping) or not self.state:
                raise ConversionError(f"state must be a non-empty {{output name: input name}} mapping, got "
                                      f"{self.state!r}")
            pairs = dict(self.state)
            bad = [f"{k!r}: {v!r}" for k, v in pairs.items() if not (isinstance(k, str) and k and isinstance(v, str)
                                                                       and v)]
            if bad:
                raise ConversionError(f"state maps output names to input names (strings); got {', '.join(bad)}")
            fed = list(pairs.values())
            twice = sorted({v for v in fed if fed.count(v) > 1})
            if twice:
                raise ConversionError(f"state feeds input(s) {', '.join(map(repr, twice))} from more than one output")
            object.__setattr__(self, "state", pairs)

    def _check_fixed_inputs(self) -> None:
        if self.fixed_inputs is None:
            return
        if not isinstance(self.fixed_inputs, Mapping):
            raise ConversionError(f"fixed_inputs must map input names to values, got {self.fixed_inputs!r}")
        for name, value in self.fixed_inputs.items():
            if not isinstance(name, str) or not (_is_number(value) or isinstance(value, bool)):
                raise ConversionError(f"fixed_inputs[{name!r}] must be a number (an input held at one value, e.g. "
                                      f"sr=16000), got {value!r}")
        object.__setattr__(self, "fixed_inputs", dict(self.fixed_inputs))

    def merged(self, **overrides: Any) -> "QuantizeOptions":
        """These options with ``overrides`` (keyword shortcuts) applied; an unknown keyword is named."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"quantize() got unknown option(s) {', '.join(unknown)}; options are "
                            f"{', '.join(sorted(known))}")
        return replace(self, **overrides) if overrides else self


def _task(value: Any) -> TaskSpec:
    """A task option as a checked :class:`TaskSpec`: one already, a table (as the manifest's), or a type's name."""
    if isinstance(value, TaskSpec):
        return value
    try:
        return TaskSpec.from_dict({"type": value} if isinstance(value, str) else value)
    except InputError as exc:
        raise ConversionError(str(exc)) from exc


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_text(field_name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise ConversionError(f"{field_name} must be a non-empty string, got {value!r}")
    if len(value) > 200 or any(not ch.isprintable() for ch in value):
        raise ConversionError(f"{field_name} {value[:60]!r} must be at most 200 printable characters (no newlines "
                              "or control characters: it is written into manifests, Dockerfiles and terminals)")
