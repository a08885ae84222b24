"""Which layer of one artifact is which layer of the source model.

The source's names are the golden float artifact's (the float ONNX when the bundle has one: its node names are the
source model's, or torch.onnx.export's for a PyTorch source). An engine that kept the source's tensor names
(ONNX Runtime, OpenVINO converting ONNX) is matched by name. One that did not (LiteRT through litert-torch, any
engine of a PyTorch source) is matched by value: run the engine's float artifact and the source on the same input,
and pair each engine tensor with a source tensor holding the same numbers, allowing for a different layout (NHWC
against NCHW) or shape (a flattened copy). Several source tensors can hold the same numbers (a Reshape's output is its
input's): the earliest one not yet taken wins, so a layer is named by the op that computed the numbers.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import Layer

# two float tensors are "the same numbers" when they differ by at most this share of the larger's range
SAME = 1e-3


def align(source: list[Layer], source_values: dict[str, np.ndarray], layers: list[Layer],
          values: dict[str, np.ndarray]) -> dict[str, str]:
    """{layer name of ``layers``: the source layer's name} for every layer that could be matched; ``values`` and
    ``source_values`` are each one's :meth:`~.Probe.capture` of the same input."""
    names = {l.name for l in source}
    order = {l.name: k for k, l in enumerate(source)}
    matched: dict[str, str] = {}
    taken: set[str] = set()
    for layer in layers:
        if layer.name in names:
            matched[layer.name] = layer.name
            taken.add(layer.name)
    by_size: dict[int, list[str]] = {}
    for l in source:
        v = source_values.get(l.name)
        if v is not None and v.dtype.kind == "f" and l.name not in taken:
            by_size.setdefault(v.size, []).append(l.name)
    for layer in layers:
        if layer.name in matched:
            continue
        value = values.get(layer.name)
        if value is None or value.dtype.kind != "f" or value.size < 2 or float(np.ptp(value)) == 0.0:
            continue  # a constant-valued tensor matches anything: it names nothing
        found = [n for n in by_size.get(value.size, []) if _same(value, source_values[n])]
        if found:
            free = [n for n in found if n not in taken] or found
            best = min(free, key=order.__getitem__)
            matched[layer.name] = best
            taken.add(best)
    return matched


def _same(value: np.ndarray, ref: np.ndarray) -> bool:
    scale = float(np.max(np.abs(ref))) or 1.0
    if abs(float(value.mean()) - float(ref.mean())) > SAME * scale or abs(float(value.std()) - float(ref.std())) > \
            SAME * scale:
        return False  # the cheap, layout-free check first
    for view in _views(value, ref.shape):
        if float(np.max(np.abs(view - ref))) <= SAME * scale:
            return True
    return False


def _views(value: np.ndarray, shape: tuple[int, ...]):
    """``value`` laid out as ``shape``: as it is, by a permutation of its axes (NHWC to NCHW...), or reshaped."""
    if value.shape == shape:
        yield value
    squeezed, target = value.squeeze(), tuple(d for d in shape if d != 1)
    if squeezed.ndim == len(target) and squeezed.ndim <= 5:
        for perm in itertools.permutations(range(squeezed.ndim)):
            if perm != tuple(range(squeezed.ndim)) and tuple(squeezed.shape[p] for p in perm) == target:
                yield squeezed.transpose(perm).reshape(shape)
    if value.shape != shape:
        yield value.reshape(shape)
