"""ONNX -> torch.nn.Module, so ONNX models reach .tflite through litert-torch (no TensorFlow).

::

    module = import_onnx("model.onnx", input_shapes={"images": (1, 3, 224, 224)})
    litert_torch.convert(module, (torch.randn(1, 3, 224, 224),)).export("model.tflite")

The module is a ``torch.fx.GraphModule`` in eval mode. Its ``forward`` takes the graph's inputs
positionally in ONNX order and returns a tensor (one output) or a tuple (several), in NCHW as
in the ONNX model. Every shape is static: dynamic input dims must be fixed with
``input_shapes``, and shape arithmetic in the graph is folded to constants at import time.
Weights become buffers with their ONNX dtype.

Failures raise :class:`edgesdk.errors.ConversionError`: all unsupported ops at once
(:func:`unsupported_ops` lists them without importing), unfixed dynamic dims, and attribute
values the importer does not handle, naming the node.
"""

from __future__ import annotations

import torch

from .graph import import_graph, load
from .graph import unsupported_ops as _unsupported_ops
from .registry import SUPPORTED_OPS

__all__ = ["import_onnx", "unsupported_ops", "SUPPORTED_OPS"]


def import_onnx(model, input_shapes: dict[str, tuple[int, ...]] | None = None) -> torch.nn.Module:
    """An eval-mode ``torch.nn.Module`` computing ``model`` (an ``onnx.ModelProto`` or a path).

    ``input_shapes`` maps input names to full shapes; it must fix every dynamic dim and agree
    with every static one.
    """
    return import_graph(load(model), input_shapes)


def unsupported_ops(model) -> list[tuple[str, int, str]]:
    """``(op_type, node count, first node name)`` per op the importer cannot convert; empty when all are."""
    return _unsupported_ops(model)
