"""Source models: a ``.pt2`` (torch.export), an ``.onnx``, a float ``.tflite``, or an ``nn.Module``.

A :class:`Source` knows its inputs/outputs and how to hand itself to each
target's toolchain as a float model (``float_tflite``, ``float_onnx``,
``openvino_model``). Refused routes raise :class:`ConversionError` naming the
supported ones.

The package holds one module per source kind (``torch``, ``onnx``, ``tflite``) on the shared ``base``;
:func:`open_source` picks one from what it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError

# ROUTES, ROUTES_TEXT, TARGETS: re-exported (what each source kind reaches)
from .base import ROUTES, ROUTES_TEXT, SUFFIXES, TARGETS, Source  # noqa: F401
from .onnx import OnnxSource
from .tflite import TFLiteSource
from .torch import PyTorchSource

__all__ = ["ROUTES", "ROUTES_TEXT", "SUFFIXES", "TARGETS", "OnnxSource", "PyTorchSource", "Source", "TFLiteSource",
           "open_source"]


def open_source(source: Any, example_input: Any = None) -> Source:
    """Open a path (``.pt2``, ``.onnx``, ``.tflite``) or an ``nn.Module`` with ``example_input``."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        kind = SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise ConversionError(
                f"unknown model type {path.suffix or '(no extension)'!r} for {path.name}: "
                f"give a {', '.join(SUFFIXES)} file (or an nn.Module from Python)"
            )
        if not path.is_file():
            raise ConversionError(f"model file not found: {path}")
        if kind == "onnx":
            return OnnxSource(path)
        if kind == "tflite":
            return TFLiteSource(path)
        import torch

        try:
            program = torch.export.load(str(path))
        except Exception as exc:
            raise ConversionError(f"{path} is not a torch.export program (.pt2): {exc}") from exc
        return PyTorchSource(program, path.name, path)
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - convert extra missing
        raise ConversionError("an in-memory model needs torch (pip install 'edgesdk[convert]')") from exc
    if isinstance(source, torch.nn.Module):
        if example_input is None:
            raise ConversionError("an nn.Module source needs example_input (a tensor or tuple of tensors)")
        args = example_input if isinstance(example_input, tuple) else (example_input,)
        args = tuple(torch.as_tensor(a) for a in args)
        try:
            program = torch.export.export(source.eval(), args)
        except Exception as exc:
            raise ConversionError(f"torch.export could not trace {type(source).__name__}: {exc}") from exc
        return PyTorchSource(program, type(source).__name__, None)
    raise ConversionError(f"cannot quantize a {type(source).__name__}; give a model path or an nn.Module")
