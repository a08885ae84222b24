"""Text decoding: CTC greedy decoding of a recognizer's ``logits`` [1, T, C] (or [T, C]) -> a
:class:`~edgesdk.tasks.results.TextLine`.

Each time step takes its arg-max class; a run of equal classes emits one character, the ``blank`` class none (so
a letter repeats only with a blank between: "l l _ l" reads "ll"). ``activation`` softmax turns logits into
probabilities first; with "none" the output is taken as probabilities already (PP-OCR's recognizer ends in one).
A character's confidence is the highest probability over the steps of its run.

``charset`` lists the classes other than the blank, in class order: class i is ``charset[i]`` below the blank and
``charset[i - 1]`` above it (blank 0: class i is ``charset[i - 1]``; a blank last: class i is ``charset[i]``). So
it has C - 1 entries, checked at decoding (PP-OCR's keys file plus the space it appends). Without a charset the
text is the emitted class indices written in decimal, separated by spaces ("17 4 4"), for a caller to map.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .outputs import output_name, role_output, softmax
from .results import Decoded, TextLine
from .spec import TaskSpec


def step_probabilities(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str]) -> np.ndarray:
    """The ``logits`` output as [T, C] probabilities (the task's activation applied), its classes checked against
    the blank and the charset."""
    probs = role_output(spec, outputs, output_names, "logits", (2,), "[1, T, C] (time steps, classes)",
                         unbatched=True)
    name, classes = output_name(spec, "logits"), probs.shape[1]
    if spec.blank >= classes:
        raise InputError(f"task blank {spec.blank} is not a class of output {name!r} (role 'logits'): it has "
                         f"{classes} classes (shape {list(probs.shape)} without the batch axis)")
    if spec.charset is not None and len(spec.charset) != classes - 1:
        raise InputError(f"task charset has {len(spec.charset)} entries, but output {name!r} (role 'logits') has "
                         f"{classes} classes: the charset lists every class but the blank, so it needs "
                         f"{classes - 1}")
    return softmax(probs, axis=1) if spec.activation == "softmax" else probs


def greedy(probs: np.ndarray, blank: int) -> tuple[np.ndarray, np.ndarray]:
    """CTC greedy decoding of [T, C] probabilities: (the emitted classes, each one's confidence = the highest
    top-1 probability over its run of steps)."""
    if probs.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    best = np.argmax(probs, axis=1)
    top = probs[np.arange(probs.shape[0]), best]
    starts = np.flatnonzero(np.r_[True, best[1:] != best[:-1]])
    runs, confidence = best[starts], np.maximum.reduceat(top, starts)
    emitted = runs != blank
    return runs[emitted], confidence[emitted]


def characters(spec: TaskSpec, classes: np.ndarray) -> list[str]:
    """The characters of emitted classes (class indices in decimal without a charset)."""
    if spec.charset is None:
        return [str(int(c)) for c in classes]
    return [spec.charset[c if c < spec.blank else c - 1] for c in classes]


def decode_text(spec: TaskSpec, outputs: list[np.ndarray], output_names: list[str]) -> Decoded:
    """The text line of one prediction."""
    probs = step_probabilities(spec, outputs, output_names)
    classes, confidence = greedy(probs, spec.blank)
    chars = characters(spec, classes)
    text = "".join(chars) if spec.charset is not None else " ".join(chars)
    return Decoded(spec.type.value, text=TextLine(text, tuple(float(c) for c in confidence)), model_scores=probs)


__all__ = ["step_probabilities", "greedy", "characters", "decode_text"]
