"""A task's outputs as arrays: the output playing a role, its batch axis checked and a wrong shape named
(:func:`role_output`, :func:`shape_error`), and the activations the decoders apply (:func:`sigmoid`,
:func:`softmax`), written so that a clipped logit or a wide map cannot overflow.

Every decoder reads its outputs through here, so a bundle whose task names the wrong output (or a model whose
output is not what its task says) fails with one kind of message: the role, the output's name, its shape and the
shape the task needs.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .spec import TaskSpec


def role_output(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str], role: str,
                ranks: tuple[int, ...], need: str, optional: bool = False,
                unbatched: bool = False) -> np.ndarray | None:
    """The output playing ``role`` without its batch axis, as floating point (float32 stays float32: a detector's
    25k rows are not copied; others become float64); None for an ``optional`` role the spec gives
    no output (a required one is an :class:`InputError`: the spec was not resolved). ``ranks`` are the ranks the
    task accepts once the batch axis is gone; the batch axis comes first and must be 1 (one sample is decoded at a
    time). ``unbatched``: an output without a batch axis is accepted too (a text recognizer's [T, C]). ``need``
    says the shape in words for the error (e.g. "[1, N, 4]")."""
    index = spec.output_index(role, output_names)
    if index is None:
        if optional:
            return None
        raise InputError(f"task {spec.type} needs output role {role!r}, which names none of the model's outputs "
                         f"({', '.join(output_names)}); resolve the spec against them first")
    if index >= len(outputs):
        raise InputError(f"task role {role!r} names output {output_names[index]!r} (index {index}), but only "
                         f"{len(outputs)} output(s) were given")
    array = np.asarray(outputs[index])
    name = output_names[index]
    if array.ndim - 1 in ranks and array.ndim >= 1:
        if array.shape[0] != 1:
            if not (unbatched and array.ndim in ranks):
                raise InputError(f"task role {role!r} (output {name!r}) has batch {array.shape[0]} (shape "
                                 f"{list(array.shape)}); a task decodes one sample at a time (batch 1)")
        else:
            array = array[0]
    elif not (unbatched and array.ndim in ranks):
        raise shape_error(role, name, array.shape, need)
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise InputError(f"task role {role!r} (output {name!r}) holds {array.dtype}, not real numbers")
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)


def output_name(spec: TaskSpec, role: str) -> str:
    return str(spec.outputs.get(role))


def shape_error(role: str, name: str, shape: tuple[int, ...], need: str) -> InputError:
    """The error for an output whose shape does not fit its role."""
    return InputError(f"task role {role!r} (output {name!r}) has shape {list(shape)}; the task needs {need}")


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) of logits clipped to [-100, 100] (as MediaPipe clips detector scores), in the input's float
    type (e^100 overflows float32 to inf, whose sigmoid is the 0 it should be)."""
    x = np.asarray(x)
    x = x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float64)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-np.clip(x, -100.0, 100.0)))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, shifted by the maximum (no overflow), in float64."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def label_of(labels: list[str] | None, index: int) -> str | None:
    """The label of class ``index``, None without labels or past their end."""
    return labels[index] if labels is not None and 0 <= index < len(labels) else None


__all__ = ["role_output", "output_name", "shape_error", "sigmoid", "softmax", "label_of"]
