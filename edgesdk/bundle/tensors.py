"""What an app hands a model, made into its input tensors; and its output tensors made into top-k classes.

One place for both, used by :class:`~edgesdk.Model` on the device and by hybrid mode when the cloud answers (the
same tensors go to either, and the same postprocessing reads either's answer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import InputError

MAX_IMAGE_PIXELS = 50_000_000  # a larger "image" is refused before decoding (decompression bombs)
MAX_ARRAY_ELEMENTS = 100_000_000


class Top(NamedTuple):
    """One of the top-k classes (a NamedTuple: built on every prediction, so kept cheap)."""

    index: int
    label: str | None
    score: float


class BundleIO:
    """The input and output side of one bundle (its manifest's ``inputs``, ``preprocess``, ``postprocess`` and
    ``labels``)."""

    def __init__(self, bundle: Any):
        self.name = bundle.name
        self._pre = bundle.preprocess
        self.inputs = bundle.manifest["inputs"]
        self._inputs = self.inputs
        self._shapes = [tuple(t["shape"]) for t in self._inputs]
        self._post = bundle.manifest.get("postprocess") or {}
        self._softmax = bool(self._post.get("softmax"))
        self._top_k = int(self._post.get("top_k", 5))
        self.labels = bundle.labels
        self._labels = self.labels

    @property
    def classification(self) -> bool:
        return self._post.get("type") == "classification"

    def probabilities(self, outputs: list[np.ndarray]) -> np.ndarray | None:
        """The class probabilities of a classification output (softmax applied when the manifest says the model
        gives logits), or None for other models."""
        if not self.classification:
            return None
        scores = outputs[0].reshape(-1).astype(np.float64)
        if self._softmax:
            e = np.exp(scores - scores.max())
            scores = e / e.sum()
        return scores

    def feeds(self, x: Any) -> list[np.ndarray]:
        if len(self._inputs) > 1:
            if isinstance(x, dict):
                missing = [t["name"] for t in self._inputs if t["name"] not in x]
                if missing:
                    raise InputError(f"model {self.name!r} has inputs {[t['name'] for t in self._inputs]}; "
                                     f"missing {missing}")
                x = [x[t["name"]] for t in self._inputs]
            if not isinstance(x, (list, tuple)) or len(x) != len(self._inputs):
                raise InputError(f"model {self.name!r} takes {len(self._inputs)} inputs "
                                 f"({', '.join(t['name'] for t in self._inputs)}): pass a list or a dict")
            return [self._array(v, i) for i, v in enumerate(x)]
        return [self._one(x)]

    def _one(self, x: Any) -> np.ndarray:
        # A uint8 array is an image whenever the bundle says how to preprocess images; other numeric
        # arrays are model inputs already.
        if isinstance(x, np.ndarray) and not (x.dtype == np.uint8 and self._pre is not None):
            return self._array(x, 0)
        if isinstance(x, (str, Path, np.ndarray)) or type(x).__module__.startswith("PIL"):
            if self._pre is None:
                raise InputError(f"bundle {self.name!r} has no preprocess spec: pass a float array of "
                                 f"shape {list(self._shapes[0])}")
            _check_image_size(x)
            return self._pre(x)
        return self._array(x, 0)

    def _array(self, x: Any, i: int) -> np.ndarray:
        spec = self._inputs[i]
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as exc:  # ragged nested lists and the like
            raise InputError(f"input {spec['name']!r} is not an array: {exc}") from exc
        if arr.dtype.kind not in "fiu":
            raise InputError(f"input {spec['name']!r} must be numeric, got dtype {arr.dtype}")
        if arr.size > MAX_ARRAY_ELEMENTS:
            raise InputError(f"input {spec['name']!r} has {arr.size} elements; the model takes "
                             f"{int(np.prod(self._shapes[i]))}")
        shape = self._shapes[i]
        if tuple(arr.shape) == shape[1:]:
            arr = arr[None]
        if tuple(arr.shape) != shape:
            raise InputError(f"input {spec['name']!r} must have shape {list(shape)} (or {list(shape[1:])}); "
                             f"got {list(arr.shape)}")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        # One BLAS pass (vdot: the sum of squares): NaN and Inf propagate into it. Finite values so large
        # that their squares overflow are rare and get the exact check before being refused.
        if not math.isfinite(float(np.vdot(arr, arr))) and not np.isfinite(arr).all():
            raise InputError(f"input {spec['name']!r} holds NaN or Inf values")
        return arr

    def top(self, outputs: list[np.ndarray]) -> list[Top]:
        if self._post.get("type") != "classification":
            return []
        scores = outputs[0].reshape(-1)
        if self._softmax:
            e = np.exp(scores - scores.max(), dtype=np.float64)
            scores = e / e.sum()
        k = min(self._top_k, scores.size)
        idx = np.argsort(-scores, kind="stable") if scores.size <= 64 else np.argpartition(-scores, k - 1)
        idx = idx[:k]
        if scores.size > 64:
            idx = idx[np.argsort(-scores[idx], kind="stable")]
        labels = self._labels or ()
        return [Top(i, labels[i] if i < len(labels) else None, v)
                for i, v in zip(idx.tolist(), scores[idx].tolist())]



def _check_image_size(x: Any) -> None:
    """Refuse absurd images from their header, before decoding a single pixel."""
    if isinstance(x, (str, Path)):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(x) as img:
                w, h = img.size
        except FileNotFoundError as exc:
            raise InputError(f"image not found: {x}") from exc
        except Image.DecompressionBombError as exc:
            raise InputError(f"{x}: image is too large to decode safely ({exc})") from exc
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise InputError(f"{x} is not a readable image: {exc}") from exc
    elif isinstance(x, np.ndarray):
        h, w = x.shape[:2] if x.ndim >= 2 else (x.size, 1)
    else:
        w, h = x.size
    if w * h == 0:
        raise InputError(f"image is {w}x{h} pixels: empty")
    if w * h > MAX_IMAGE_PIXELS:
        raise InputError(f"image is {w}x{h} pixels; more than {MAX_IMAGE_PIXELS} is refused")


__all__ = ["BundleIO", "Top", "MAX_IMAGE_PIXELS", "MAX_ARRAY_ELEMENTS"]
