"""The small interface every engine backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


class Engine(ABC):
    """A loaded model on one engine and device.

    ``run`` takes and returns float32 arrays in the model's input/output order;
    engines whose artifact has integer I/O (fully-int8 TFLite) quantize and
    dequantize at the boundary. Not thread-safe: use one Engine per thread.
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()

    def __init__(self, model_path: str | Path, *, device: str = "CPU", precision_hint: str | None = None,
                 num_threads: int | None = None):
        self.model_path = Path(model_path)
        self.device = device
        self.precision_hint = precision_hint
        self.num_threads = num_threads
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

    @abstractmethod
    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; ``feeds`` in input order."""

    def close(self) -> None:
        """Release engine resources. Safe to call twice."""

    @property
    def effective_precision(self) -> str | None:
        """The precision the engine computes in, where it tells (e.g. OpenVINO's bf16 on AMX)."""
        return None

    def check_feeds(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(feeds) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InputError(f"{self.name} model takes {len(self.inputs)} input(s) ({names}); got {len(feeds)}")
        checked = []
        for spec, arr in zip(self.inputs, feeds):
            arr = np.asarray(arr)
            # -1 marks a dynamic dimension, which accepts any size
            if arr.ndim != len(spec.shape) or any(d not in (-1, a) for d, a in zip(spec.shape, arr.shape)):
                raise InputError(
                    f"{self.name} model input {spec.name!r} has shape {list(spec.shape)}; got {list(arr.shape)}"
                )
            checked.append(np.ascontiguousarray(arr, dtype=np.float32))
        return checked

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
