"""The manifest's ``task`` table as a checked, frozen value: :class:`TaskSpec`.

A task says what a model's outputs mean: which output plays which role (``outputs``: role -> output name) and how
they decode (the type's parameters, each with a default). Every parameter is checked when the spec is built, an
unknown key is refused (a misspelt threshold would silently keep the default), and the roles must name outputs of
the model (:meth:`TaskSpec.problems_with`). The table, as quantize writes it::

    "task": {"type": "detection", "outputs": {"predictions": "output0"}, "format": "yolo", "layout": "rows",
             "objectness": true, "score_threshold": 0.5, "iou_threshold": 0.45}

Types and their parameters (README "Tasks" lists them with their meaning):

==============  ==========================================  ===================================================
type            roles                                       parameters
==============  ==========================================  ===================================================
classification  scores                                      softmax, top_k
detection       anchors: boxes, scores; yolo: predictions;  format, score_threshold, iou_threshold,
                boxes: boxes, scores (+ classes)            max_detections, uncertain, anchors, box_scale,
                                                            box_order, keypoints, score_activation, layout,
                                                            objectness, box_format, normalized
segmentation    map                                         kind, threshold, channel_axis, activation, uncertain
text            logits                                      charset, blank, activation
landmarks       points (+ visibility, presence)             dims, coordinates, visibility_activation,
                                                            presence_activation, presence_threshold
regression      values                                      range, threshold
probability     values                                      range, threshold
embedding       embedding                                   normalize
raw             (none)                                      (none)
==============  ==========================================  ===================================================
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..choices import TaskType
from ..errors import InputError
from ..frozen import FrozenDict, thaw

MAX_CHARSET = 100_000  # a CTC charset: PP-OCR's Chinese one has 6,623 characters
MAX_ANCHOR_LAYERS = 16
MAX_DETECTIONS = 10_000


# -- parameter checkers: each returns the value made canonical, or raises InputError naming the key ---------------
def _number(lo: float | None = None, hi: float | None = None) -> Callable[[str, Any], float]:
    def check(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None else ""
            raise InputError(f"task {key!r} must be a finite number{span}, got {value!r}")
        return float(value)
    return check


def _integer(lo: int, hi: int) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise InputError(f"task {key!r} must be an integer from {lo} to {hi}, got {value!r}")
        return int(value)
    return check


def _one_of(*allowed: Any) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        if isinstance(value, bool) != isinstance(allowed[0], bool) or value not in allowed:
            raise InputError(f"task {key!r} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    return check


_BOOL = _one_of(True, False)
_SHARE = _number(0.0, 1.0)


def _band(key: str, value: Any) -> tuple[float, float]:
    pair = _pair(key, value)
    if not 0.0 <= pair[0] <= pair[1] <= 1.0:
        raise InputError(f"task {key!r} must be [low, high] with 0 <= low <= high <= 1, got {value!r}")
    return pair


def _pair(key: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InputError(f"task {key!r} must be a list of two numbers, got {value!r}")
    lo, hi = (_number()(key, v) for v in value)
    if not lo < hi:
        raise InputError(f"task {key!r} must be [low, high] with low < high, got {value!r}")
    return (lo, hi)


def _scales(key: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise InputError(f"task {key!r} must be four positive numbers [x, y, w, h], got {value!r}")
    values = tuple(_number()(key, v) for v in value)
    if min(values) <= 0:
        raise InputError(f"task {key!r} must be four positive numbers [x, y, w, h], got {value!r}")
    return values


# what draws on a terminal instead of showing: C0/C1 controls, line and paragraph separators, bidi overrides and
# isolates, lone surrogates (a charset may hold other unprintables: PP-OCR's has the ideographic space U+3000)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _charset(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_CHARSET \
            or not all(isinstance(c, str) and c and len(c) <= 64 and not _CONTROL.search(c) for c in value):
        raise InputError(f"task {key!r} must be a list of 1 to {MAX_CHARSET} non-empty strings of at most 64 "
                         f"characters without control characters or line breaks (one per class after the blank)")
    return tuple(value)


def _anchors(key: str, value: Any) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise InputError(f"task {key!r} must be a table {{strides: [...], per_layer: n, offset: x}}, got {value!r}")
    unknown = sorted(set(value) - {"strides", "per_layer", "offset"})
    if unknown:
        raise InputError(f"task {key!r} has unknown key(s) {', '.join(unknown)} (known: strides, per_layer, offset)")
    strides = value.get("strides")
    if not isinstance(strides, (list, tuple)) or not 1 <= len(strides) <= MAX_ANCHOR_LAYERS \
            or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 4096 for s in strides):
        raise InputError(f"task {key}.strides must be a list of 1 to {MAX_ANCHOR_LAYERS} integers from 1 to 4096, "
                         f"got {strides!r}")
    return FrozenDict(strides=tuple(strides), per_layer=_integer(1, 64)(f"{key}.per_layer", value.get("per_layer", 2)),
                      offset=_number(0.0, 1.0)(f"{key}.offset", value.get("offset", 0.5)))


_DETECTION_COMMON = {"format": ("anchors", _one_of("anchors", "yolo", "boxes")),
                     "score_threshold": (0.5, _SHARE), "iou_threshold": (0.45, _SHARE),
                     "max_detections": (100, _integer(1, MAX_DETECTIONS)), "uncertain": ((0.3, 0.7), _band)}
# type -> (required roles, optional roles, {parameter: (default, checker)})
_TYPES: dict[TaskType, tuple[tuple[str, ...], tuple[str, ...], dict[str, tuple[Any, Callable]]]] = {
    TaskType.CLASSIFICATION: (("scores",), (), {"softmax": (False, _BOOL), "top_k": (5, _integer(0, 1000))}),
    TaskType.DETECTION: ((), ("boxes", "scores", "classes", "predictions"), {
        **_DETECTION_COMMON,
        # anchors (SSD, MediaPipe BlazeFace)
        "anchors": (None, _anchors), "box_scale": (None, _scales), "box_order": ("xywh", _one_of("xywh", "yxhw")),
        "keypoints": (0, _integer(0, 1000)), "score_activation": (None, _one_of("sigmoid", "none")),
        # yolo
        "layout": ("rows", _one_of("rows", "columns")), "objectness": (True, _BOOL),
        # boxes
        "box_format": ("xyxy", _one_of("xyxy", "yxyx", "xywh")), "normalized": (False, _BOOL)}),
    TaskType.SEGMENTATION: (("map",), (), {
        "kind": ("probability", _one_of("probability", "classes")), "threshold": (0.5, _SHARE),
        "channel_axis": (1, _integer(-4, 3)), "activation": ("none", _one_of("none", "sigmoid", "softmax")),
        "uncertain": ((0.3, 0.7), _band)}),
    TaskType.TEXT: (("logits",), (), {"charset": (None, _charset), "blank": (0, _integer(0, MAX_CHARSET)),
                                      "activation": ("none", _one_of("none", "softmax"))}),
    TaskType.LANDMARKS: (("points",), ("visibility", "presence"), {
        "dims": (2, _integer(2, 3)), "coordinates": ("pixels", _one_of("pixels", "normalized")),
        "visibility_activation": ("sigmoid", _one_of("sigmoid", "none")),
        # presence: one score that the object is there at all (MediaPipe's face mesh: a logit, present above 0.5)
        "presence_activation": ("sigmoid", _one_of("sigmoid", "none")), "presence_threshold": (0.5, _SHARE)}),
    TaskType.REGRESSION: (("values",), (), {"range": (None, _pair), "threshold": (None, _number())}),
    TaskType.PROBABILITY: (("values",), (), {"range": ((0.0, 1.0), _pair), "threshold": (0.5, _number())}),
    TaskType.EMBEDDING: (("embedding",), (), {"normalize": (True, _BOOL)}),
    TaskType.RAW: ((), (), {}),
}
# the detection parameters each format reads (the others are kept out of the manifest's table)
DETECTION_PARAMS = {"anchors": ("anchors", "box_scale", "box_order", "keypoints", "score_activation"),
                    "yolo": ("layout", "objectness", "score_activation", "normalized"),
                    "boxes": ("box_format", "normalized", "score_activation")}
# detection roles each format needs
DETECTION_ROLES = {"anchors": ("boxes", "scores"), "yolo": ("predictions",), "boxes": ("boxes", "scores")}


@dataclass(frozen=True)
class TaskSpec:
    """One model's task: ``type`` (:class:`~edgesdk.choices.TaskType`), ``outputs`` (role -> output name) and
    ``params`` (every parameter of the type, defaults filled in). Build one with :meth:`from_dict` (a manifest's
    table) or :meth:`make` (keywords); both check everything."""

    type: TaskType
    outputs: Mapping[str, str] = field(default_factory=FrozenDict)
    params: Mapping[str, Any] = field(default_factory=FrozenDict)

    def __getattr__(self, name: str) -> Any:  # spec.score_threshold reads params (only called for a missing attr)
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"{type(self).__name__} of type {self.__dict__.get('type')!s} has no parameter {name!r}")

    @classmethod
    def make(cls, type: TaskType | str, outputs: Mapping[str, str] | None = None, **params: Any) -> "TaskSpec":
        return cls.from_dict({"type": type, "outputs": dict(outputs or {}), **params})

    @classmethod
    def from_dict(cls, data: Any) -> "TaskSpec":
        """The spec a manifest's ``task`` table (or a ``--task-config`` file) describes; any problem is an
        :class:`InputError` naming the key."""
        if not isinstance(data, Mapping):
            raise InputError(f"task must be a table with a 'type', got {type(data).__name__}")
        kind = TaskType.parse(data.get("type"), "task 'type'", InputError)
        required, optional, table = _TYPES[kind]
        unknown = sorted(set(data) - {"type", "outputs"} - set(table))
        if unknown:
            raise InputError(f"task of type {kind} has unknown key(s) {', '.join(map(repr, unknown))} (known: "
                             f"{', '.join(['outputs', *table]) or 'outputs'})")
        params = {key: check(key, data[key]) if key in data and data[key] is not None else default
                  for key, (default, check) in table.items()}
        roles = data.get("outputs") or {}
        if not isinstance(roles, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                     for k, v in roles.items()):
            raise InputError(f"task 'outputs' must be a table of role = output name, got {roles!r}")
        if kind is TaskType.DETECTION:
            required = DETECTION_ROLES[params["format"]]
            optional = ("classes",) if params["format"] == "boxes" else ()
            if params["format"] == "anchors":
                if params["anchors"] is None:
                    raise InputError("task detection with format 'anchors' needs 'anchors' = {strides: [...], "
                                     "per_layer: n, offset: x}")
                if params["score_activation"] is None:
                    params["score_activation"] = "sigmoid"
            if params["score_activation"] is None:
                params["score_activation"] = "none"
        unknown_roles = sorted(set(roles) - set(required) - set(optional))
        if unknown_roles:
            raise InputError(f"task {kind} has no output role(s) {', '.join(map(repr, unknown_roles))} (roles: "
                             f"{', '.join(required + optional) or 'none'})")
        if kind is TaskType.REGRESSION and params["threshold"] is not None and params["range"] is not None \
                and not params["range"][0] <= params["threshold"] <= params["range"][1]:
            raise InputError(f"task 'threshold' {params['threshold']} is outside its 'range' {list(params['range'])}")
        return cls(kind, FrozenDict(roles), FrozenDict(params))

    @property
    def required_roles(self) -> tuple[str, ...]:
        if self.type is TaskType.DETECTION:
            return DETECTION_ROLES[self.params["format"]]
        return _TYPES[self.type][0]

    def resolved(self, output_names: list[str]) -> "TaskSpec":
        """This spec with each required role that names no output given one: a type whose roles are all required
        takes the model's outputs in order when the model has exactly as many outputs as roles (a one-output model
        needs no ``outputs`` table). A role still unnamed, or naming no output, is an :class:`InputError`."""
        roles = dict(self.outputs)
        missing = [r for r in self.required_roles if r not in roles]
        if missing and len(roles) == 0 and len(output_names) == len(self.required_roles):
            roles = dict(zip(self.required_roles, output_names))
        problems = self.problems_with(output_names, roles)
        if problems:
            raise InputError("; ".join(problems))
        return TaskSpec(self.type, FrozenDict(roles), self.params)

    def problems_with(self, output_names: list[str], roles: Mapping[str, str] | None = None) -> list[str]:
        """Why this spec does not fit a model with these outputs: a role naming no output, or a required role
        left unnamed."""
        roles = self.outputs if roles is None else roles
        problems = [f"task role {role!r} names output {name!r}, which the model does not have (outputs: "
                    f"{', '.join(output_names)})" for role, name in roles.items() if name not in output_names]
        missing = [r for r in self.required_roles if r not in roles]
        if missing:
            problems.append(f"task {self.type} needs output role(s) {', '.join(map(repr, missing))} (set task "
                            f"outputs = {{role: output name}}; the model's outputs: {', '.join(output_names)})")
        return problems

    def output_index(self, role: str, output_names: list[str]) -> int | None:
        """The index (in the manifest's outputs) of the output playing ``role``, None when no output does."""
        name = self.outputs.get(role)
        return output_names.index(name) if name in output_names else None

    def to_dict(self) -> dict[str, Any]:
        """The manifest table: type, outputs and every parameter (defaults included, so a reader needs none)."""
        params = {k: list(v) if isinstance(v, tuple) else thaw(v) for k, v in self.params.items() if v is not None}
        if self.type is TaskType.DETECTION:
            unread = {k for fmt, keys in DETECTION_PARAMS.items() for k in keys} - set(
                DETECTION_PARAMS[self.params["format"]])
            params = {k: v for k, v in params.items() if k not in unread}
        return {"type": self.type.value, "outputs": dict(self.outputs), **params}


def default_task(outputs: list[dict]) -> TaskSpec:
    """The task a bundle gets when none is asked for: classification when the model has one 2-D float output (a
    score per class), else raw."""
    if len(outputs) == 1 and len(outputs[0].get("shape") or []) == 2 and str(outputs[0].get("dtype")).startswith(
            "float"):
        return TaskSpec.make(TaskType.CLASSIFICATION, {"scores": outputs[0]["name"]})
    return TaskSpec.make(TaskType.RAW)


def task_of(manifest: Mapping[str, Any]) -> TaskSpec:
    """A manifest's task: its ``task`` table, or for a bundle written before tasks, classification when its
    ``postprocess.type`` says so, else raw. The table was checked with the manifest (:mod:`edgesdk.bundle.schema`)."""
    table = manifest.get("task")
    names = [o["name"] for o in manifest.get("outputs") or []]
    if table:
        return TaskSpec.from_dict(table).resolved(names)
    post = manifest.get("postprocess") or {}
    if post.get("type") == TaskType.CLASSIFICATION and names:
        return TaskSpec.make(TaskType.CLASSIFICATION, {"scores": names[0]}, softmax=bool(post.get("softmax")))
    return TaskSpec.make(TaskType.RAW)


__all__ = ["TaskSpec", "TaskType", "default_task", "task_of", "DETECTION_ROLES"]
