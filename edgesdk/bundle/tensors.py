"""What an app hands a model, made into its input tensors; and its output tensors made into top-k classes.

One place for both, used by :class:`~edgesdk.Model` on the device and by hybrid mode when the cloud answers (the
same tensors go to either, and the same postprocessing reads either's answer).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from ..choices import BudgetReason, TaskType
from ..errors import BudgetExceeded, InputError
from ..tasks.geometry import Transform, input_image_size
from ..tasks.results import Decoded
from ..tasks.spec import task_of

# Limits read at each call, so an app raises them by setting these module values (as with Pillow's own).
MAX_IMAGE_PIXELS = 50_000_000  # a larger "image" is refused before decoding (decompression bombs)
MAX_IMAGE_BYTES = 64 << 20  # an image file larger than this is refused before a byte is read
MAX_ARRAY_ELEMENTS = 100_000_000
# What one pixel costs while it is decoded and converted: Pillow keeps RGB(A), CMYK, I and F pixels in 4 bytes,
# and the conversion to the model's colour makes a second image of the same size.
IMAGE_BYTES_PER_PIXEL = 8
_MB = 1024 * 1024


class Top(NamedTuple):
    """One of the top-k classes (a NamedTuple: built on every prediction, so kept cheap)."""

    index: int
    label: str | None
    score: float


class BundleIO:
    """The input and output side of one bundle (its manifest's ``inputs``, ``preprocess``, ``postprocess`` and
    ``labels``)."""

    def __init__(self, bundle: Any, memory_room_mb: Callable[[], float] | None = None):
        """``memory_room_mb()``: how many MB the memory budget leaves now (None: no budget to respect); an image
        whose decoding would take more is refused with :class:`BudgetExceeded` before it is decoded."""
        self.name = bundle.name
        self._memory_room_mb = memory_room_mb
        self._pre = bundle.preprocess
        self.inputs = bundle.manifest["inputs"]
        self._inputs = self.inputs
        self._shapes = [tuple(t["shape"]) for t in self._inputs]
        self._dtypes = [_numpy_dtype(t["dtype"]) for t in self._inputs]
        self.labels = bundle.labels
        self._labels = self.labels
        self.task = task_of(bundle.manifest)
        self.output_names = self._output_names = [t["name"] for t in bundle.manifest["outputs"]]
        # a classifier's scores: the output its task names (not always the first), softmax and top-k as its task
        # says (a bundle from before tasks: as its postprocess says)
        self._classifier = self.task.type == TaskType.CLASSIFICATION
        self._scores_at = (self.task.output_index("scores", self._output_names) or 0) if self._classifier else 0
        post = self.task.params if self._classifier and bundle.manifest.get("task") else \
            (bundle.manifest.get("postprocess") or {})
        self._softmax = self.softmax = bool(post.get("softmax"))  # whether a classifier's scores are logits
        top_k = post.get("top_k", 5)
        # a manifest value: anything but a non-negative int gives the default rather than a crash at predict
        self._top_k = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 0 else 5
        # (height, width) of an image model's input: arrays fed to it are in its pixels (the identity transform)
        self._image_size = self._pre.size if self._pre is not None else input_image_size(self._shapes[0])

    @property
    def classification(self) -> bool:
        """Whether the bundle is a classifier (its task; for a bundle from before tasks, its postprocess)."""
        return self._classifier

    def probabilities(self, outputs: list[np.ndarray]) -> np.ndarray | None:
        """The class probabilities of a classification output (softmax applied when the manifest says the model
        gives logits), or None for other models."""
        scores = _class_scores(outputs, self._scores_at) if self._classifier else None
        if scores is None:
            return None
        scores = scores.astype(np.float64)
        if self._softmax:
            e = np.exp(scores - scores.max())
            scores = e / e.sum()
        return scores

    def feeds(self, x: Any) -> list[np.ndarray]:
        """The input tensors for ``x``: one input as an image or array; several as a list in input order or a
        ``{input name: array}`` dict (a one-input model takes such a dict too). Each is made its input's dtype (an
        integer or bool input must get values that dtype holds exactly) and shape (the batch axis may be left out;
        a scalar input, shape ``[]``, takes a number or a 0-d array). An input the model was specialized for at
        quantize time (manifest ``fixed``) may be left out of a dict, and refuses any other value."""
        return self.prepare(x)[0]

    def prepare(self, x: Any) -> tuple[list[np.ndarray], Transform | None]:
        """:meth:`feeds` and where the model input's pixels lie in the original image (a
        :class:`~edgesdk.tasks.geometry.Transform`: an image through the preprocess gets its resize; an array None,
        which :meth:`decode` reads as the model input's own pixels), which decoding maps boxes, points and masks back
        with."""
        feeds, transform = self._prepared(x)
        for spec, feed in zip(self._inputs, feeds):
            if "fixed" in spec and not np.all(feed == spec["fixed"]):
                raise InputError(f"model {self.name!r} was specialized for {spec['name']} = {spec['fixed']!r} when "
                                 f"it was quantized; it cannot take another value (leave {spec['name']!r} out and "
                                 "it is filled in)")
        return feeds, transform

    def _prepared(self, x: Any) -> tuple[list[np.ndarray], Transform | None]:
        if isinstance(x, dict):
            names = [t["name"] for t in self._inputs]
            x = {**{t["name"]: np.full(t["shape"], t["fixed"], dtype=t["dtype"]) for t in self._inputs
                    if "fixed" in t and t["name"] not in x}, **x}  # a specialized input may be left out
            missing = [n for n in names if n not in x]
            unknown = [k for k in x if k not in names]
            if missing or unknown:
                raise InputError(f"model {self.name!r} has inputs {names}; "
                                 + "; ".join(([f"missing {missing}"] if missing else [])
                                             + ([f"it has no input {', '.join(map(repr, unknown))}"] if unknown
                                                else [])))
            if len(self._inputs) == 1:
                arr, transform = self._one(x[names[0]])
                return [arr], transform
            x = [x[n] for n in names]
        if len(self._inputs) > 1:
            if not isinstance(x, (list, tuple)) or len(x) != len(self._inputs):
                raise InputError(f"model {self.name!r} takes {len(self._inputs)} inputs "
                                 f"({', '.join(t['name'] for t in self._inputs)}): pass a list or a dict")
            return [self._array(v, i) for i, v in enumerate(x)], None
        arr, transform = self._one(x)
        return [arr], transform

    def _one(self, x: Any) -> tuple[np.ndarray, Transform | None]:
        # A uint8 array is an image whenever the bundle says how to preprocess images; other numeric
        # arrays are model inputs already.
        if isinstance(x, np.ndarray) and not (x.dtype == np.uint8 and self._pre is not None):
            return self._array(x, 0), None
        if isinstance(x, (str, Path, np.ndarray)) or type(x).__module__.startswith("PIL"):
            if self._pre is None:
                raise InputError(f"bundle {self.name!r} has no preprocess spec: pass a float array of "
                                 f"shape {list(self._shapes[0])}")
            return self._pre.apply(self._image(x))
        return self._array(x, 0), None

    def _array(self, x: Any, i: int) -> np.ndarray:
        spec = self._inputs[i]
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as exc:  # ragged nested lists and the like
            raise InputError(f"input {spec['name']!r} is not an array: {exc}") from exc
        dtype = self._dtypes[i]
        if arr.dtype.kind not in ("fiub" if dtype.kind == "b" else "fiu"):  # bools for bool inputs only
            raise InputError(f"input {spec['name']!r} must be numeric, got dtype {arr.dtype}")
        if arr.size > MAX_ARRAY_ELEMENTS:
            raise InputError(f"input {spec['name']!r} has {arr.size} elements; the model takes "
                             f"{int(np.prod(self._shapes[i]))}")
        shape = self._shapes[i]
        if shape and tuple(arr.shape) == shape[1:]:
            arr = arr[None]
        if tuple(arr.shape) != shape:
            also = f" (or {list(shape[1:])})" if shape else " (a scalar)"
            raise InputError(f"input {spec['name']!r} must have shape {list(shape)}{also}; got {list(arr.shape)}")
        if dtype.kind != "f" and arr.dtype != dtype:
            cast = arr.astype(dtype)
            # 16000.0 is the int64 16000; 0.5, 2**40 for an int32 or 2 for a bool are refused, never truncated
            if not np.array_equal(cast, arr):
                raise InputError(f"input {spec['name']!r} is {dtype.name}; the values given ({arr.dtype}) are not all "
                                 f"{dtype.name} values")
            return np.asarray(cast, order="C")  # (ascontiguousarray makes a scalar [1])
        arr = np.asarray(arr, dtype=dtype, order="C")
        # One BLAS pass (vdot: the sum of squares): NaN and Inf propagate into it. Finite values so large
        # that their squares overflow are rare and get the exact check before being refused.
        if dtype.kind == "f" and not math.isfinite(float(np.vdot(arr, arr))) and not np.isfinite(arr).all():
            raise InputError(f"input {spec['name']!r} holds NaN or Inf values")
        return arr

    def decode(self, outputs: list[np.ndarray], transform: Transform | None = None) -> Decoded:
        """``outputs`` decoded by the bundle's task (detections, masks, text, points, values...), coordinates in the
        original image's pixels when ``transform`` says where they came from (:meth:`prepare`). Masks that would
        need more memory than the budget leaves are refused (:class:`BudgetExceeded`) before they are made."""
        from ..tasks.decode import decode

        if transform is None and self._image_size is not None:
            transform = Transform.identity(*self._image_size)
        return decode(self.task, outputs, self._output_names, labels=self._labels, transform=transform,
                      memory_room_mb=self._memory_room_mb)

    def top(self, outputs: list[np.ndarray]) -> list[Top]:
        """The top-k classes of a classification output; empty for outputs that are not class scores (no output,
        no element, a dtype that is not numeric)."""
        scores = _class_scores(outputs, self._scores_at) if self._classifier else None
        if scores is None:
            return []
        if scores.dtype.kind != "f":
            scores = scores.astype(np.float64)  # negating int8 -128 wraps
        if self._softmax:
            e = np.exp(scores - scores.max(), dtype=np.float64)
            scores = e / e.sum()
        k = min(self._top_k, scores.size)
        if k == 0:
            return []
        idx = np.argsort(-scores, kind="stable") if scores.size <= 64 else np.argpartition(-scores, k - 1)
        idx = idx[:k]
        if scores.size > 64:
            idx = idx[np.argsort(-scores[idx], kind="stable")]
        labels = self._labels or ()
        return [Top(i, labels[i] if i < len(labels) else None, v)
                for i, v in zip(idx.tolist(), scores[idx].tolist())]

    def _image(self, x: Any) -> Any:
        """``x`` as an image the preprocess may decode: a path is opened here (a regular file of at most
        MAX_IMAGE_BYTES, without blocking) and decoded once its header's size is known to fit."""
        if isinstance(x, (str, Path)):
            return self._decoded(Path(x))
        if isinstance(x, np.ndarray):
            h, w = x.shape[:2] if x.ndim >= 2 else (x.size, 1)
        else:
            w, h = x.size
        self._check_pixels(w, h, "")
        return x

    def _decoded(self, path: Path) -> Any:
        from PIL import Image, UnidentifiedImageError

        with RegularFile(path, "image") as f:
            try:
                img = Image.open(f)
                self._check_pixels(*img.size, str(path))
                img.load()  # decoded now: the file may close (no copy, which would cost a third image)
                return img
            except Image.DecompressionBombError as exc:
                raise InputError(f"{path}: image is too large to decode safely ({exc})") from exc
            except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
                raise InputError(f"{path} is not a readable image: {exc}") from exc

    def _check_pixels(self, w: int, h: int, path: str) -> None:
        where = f"{path}: " if path else ""
        if w * h == 0:
            raise InputError(f"{where}image is {w}x{h} pixels: empty")
        if w * h > MAX_IMAGE_PIXELS:
            raise InputError(f"{where}image is {w}x{h} pixels; more than {MAX_IMAGE_PIXELS} is refused "
                             f"(edgesdk.bundle.tensors.MAX_IMAGE_PIXELS)")
        needed = w * h * IMAGE_BYTES_PER_PIXEL / _MB
        if self._memory_room_mb is not None and needed > 1.0:  # a small image costs less than measuring the RSS
            room = self._memory_room_mb()
            if needed > room:
                raise BudgetExceeded(BudgetReason.MEMORY,
                                     f"{where}decoding a {w}x{h} image needs ~{needed:.1f} MB; the memory "
                                     f"budget leaves {max(room, 0.0):.1f} MB",
                                     needed=round(needed, 2), available=round(max(room, 0.0), 2))


def _numpy_dtype(name: Any) -> np.dtype:
    """The numpy dtype an input of manifest dtype ``name`` is fed as: float32 for float32 and for what numpy does not
    know (bfloat16: the engine converts), the dtype itself otherwise (int64, int32, bool, float16...)."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        return np.dtype(np.float32)
    return dtype if dtype.kind in "biuf" else np.dtype(np.float32)


def _class_scores(outputs: list[np.ndarray], at: int = 0) -> np.ndarray | None:
    """Output ``at`` (the classifier's scores) as a flat vector of class scores, or None when it cannot be one."""
    if len(outputs) <= at:
        return None
    scores = np.asarray(outputs[at]).reshape(-1)
    if scores.size == 0 or scores.dtype.kind not in "fiu":
        return None
    return scores


class RegularFile:
    """``with RegularFile(path, what) as f:`` a binary file on ``path``, which must be a regular file of at most
    ``max_bytes`` (default MAX_IMAGE_BYTES). Opened without blocking (a FIFO with no writer would wait forever) and checked on the open
    descriptor, so the file checked is the file read."""

    def __init__(self, path: Path, what: str, max_bytes: int | None = None):
        cap = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise InputError(f"{what} not found: {path}") from exc
        except OSError as exc:
            raise InputError(f"{what} {path} cannot be opened: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{what} {path} is not a regular file; only regular files are read as {what}s")
            if st.st_size > cap:
                limit = "MAX_IMAGE_BYTES" if max_bytes is None else "MAX_ARRAY_ELEMENTS"
                raise InputError(f"{what} {path} is {st.st_size} bytes; more than {cap} is refused "
                                 f"(edgesdk.bundle.tensors.{limit})")
        except BaseException:
            os.close(fd)
            raise
        self._file = os.fdopen(fd, "rb")

    def __enter__(self):
        return self._file

    def __exit__(self, *exc: object) -> None:
        self._file.close()


__all__ = ["BundleIO", "Top", "MAX_IMAGE_PIXELS", "MAX_IMAGE_BYTES", "MAX_ARRAY_ELEMENTS"]
