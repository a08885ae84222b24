"""Calibration and validation data: every accepted form becomes one :class:`Dataset`.

Accepted forms (the ``--calib`` / ``--val`` argument, or a Python object):

- an image folder, flat or with one sub-folder per class (folder names are the labels);
  images go through the bundle's :class:`~edgesdk.bundle.preprocess.Preprocess`;
- a ``.npy`` array of preprocessed inputs, shape ``(N, *input_shape[1:])``;
- a ``.npz`` with array ``x`` (inputs) and optional ``y`` (integer labels), or the ground truth of a detection,
  segmentation or text task (``boxes`` and ``classes``, ``masks``, ``texts``: :mod:`.validation.task_truth`);
- a ``.npz`` keyed by input name, one array per input whose first axis is the sample (``state`` of shape
  ``[2, 1, 128]`` as ``(N, 2, 1, 128)``, a scalar input as ``(N,)``; an input whose first dimension is the batch may
  leave it out: ``(N, 512)`` for ``[1, 512]``), with optional ``y`` or truth; or a folder of such ``.npz`` files;
- any iterable of arrays (one input each) or of ``{input_name: array}`` dicts.

Every sample comes out as one array per model input, in input order, of the input's own shape and dtype (int64,
int32, bool, float16 kept: integer inputs must hold integers). Samples are loaded lazily (an image is decoded only
when drawn), so a large folder costs only what is used; so is the truth. Image folders carry class labels (their
sub-folders) and no other truth. A ``.npy`` or ``.npz`` is read only from a regular file (a FIFO or a device is
refused before it is read), and an ``.npz`` that holds a member twice is refused (readers differ on which counts).
"""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgesdk.engines import TensorSpec
from edgesdk.errors import CalibrationError, InputError
from edgesdk.bundle.preprocess import IMAGE_SUFFIXES, Preprocess

from .validation.task_truth import TRUTH_KEYS, Truths, join_truths, read_truth


@dataclass
class Dataset:
    """Indexed samples; ``load(i)`` returns the model inputs of sample ``i`` in input order, ``truth.load(i)`` its
    ground truth when the data carry a task's (boxes, masks or texts; ``labels``: class labels)."""

    loaders: list[Callable[[], list[np.ndarray]]]
    labels: np.ndarray | None
    label_names: list[str] | None
    origin: str
    names: list[str]  # a short name of each sample, used in error messages
    inputs: list[TensorSpec] | None = None  # set by read_dataset: every loaded sample is checked against it
    what: str = "calibration"
    truth: Truths | None = None

    def __len__(self) -> int:
        return len(self.loaders)

    def load(self, i: int) -> list[np.ndarray]:
        sample = self.loaders[i]()
        if self.inputs is not None:
            where = f"{self.what} data {self.origin}"
            sample = _conform(sample, self.inputs, where, self.names[i])
            _check_fits(sample, self.inputs, where, self.names[i])
        return sample

    def subset(self, indices: Sequence[int]) -> "Dataset":
        return Dataset(
            [self.loaders[i] for i in indices],
            None if self.labels is None else self.labels[list(indices)],
            self.label_names,
            self.origin,
            [self.names[i] for i in indices],
            self.inputs,
            self.what,
            None if self.truth is None else self.truth.subset(indices),
        )


# -- reading ------------------------------------------------------------------

def read_dataset(data: Any, inputs: list[TensorSpec], preprocess: Preprocess | None,
                 label_names: list[str] | None = None, what: str = "calibration") -> Dataset:
    """Turn any accepted form into a :class:`Dataset` whose samples fit ``inputs``."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        if not path.exists():
            raise CalibrationError(f"{what} data not found: {path}")
        if path.is_dir() and _npz_folder(path):
            ds = _read_npz_folder(path, inputs, what)
        elif path.is_dir():
            ds = _read_folder(path, preprocess, label_names, what)
        elif path.suffix == ".npy":
            with _np_load(path, what) as arr:
                if not isinstance(arr, np.ndarray):
                    raise CalibrationError(f"{what} file {path} holds several arrays (an .npz?); a .npy holds one "
                                           "array")
            ds = _from_array(arr, None, str(path), what)
        elif path.suffix == ".npz":
            ds = _read_npz(path, inputs, what)
        else:
            raise CalibrationError(
                f"{what} data {path.name!r} has unknown type {path.suffix or '(none)'}: "
                "give an image folder, a .npy of inputs, a .npz with arrays x (and y) or keyed by input name, or a "
                "folder of such .npz files"
            )
    elif isinstance(data, np.ndarray):
        ds = _from_array(data, None, f"array {data.shape}", what)
    elif isinstance(data, Iterable) and not isinstance(data, (bytes, Mapping)):
        ds = _from_iterable(data, inputs, what)
    else:
        raise CalibrationError(f"cannot read {what} data from {type(data).__name__}")
    if len(ds) == 0:
        raise CalibrationError(f"{what} data {ds.origin} holds no samples")
    ds.inputs, ds.what = inputs, what
    ds.load(0)  # fail now, before any long work, if the data does not fit the model
    return ds


@contextmanager
def _np_load(path: Path, what: str) -> Iterator[Any]:
    """``with _np_load(path, what) as loaded:`` np.load of ``path`` (an array, or an NpzFile read while the block
    runs), which must be a regular file: opened without blocking (a FIFO with no writer would wait for ever) and
    checked on the open descriptor, so the file checked is the file read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CalibrationError(f"{what} file {path} cannot be opened: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CalibrationError(f"{what} data {path} is not a regular file; only regular files are read")
        try:
            loaded = np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise CalibrationError(f"{what} file {path} is not a readable numpy file: {exc}") from exc
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                twice = [n for n, count in Counter(loaded.zip.namelist()).items() if count > 1]
                if twice:  # which one np.load gives is zipfile's choice (the last); another reader takes the first
                    raise CalibrationError(f"{what} file {path} holds the member {twice[0]!r} twice")
                yield loaded
        else:
            yield loaded


def _read_npz(path: Path, inputs: list[TensorSpec], what: str) -> Dataset:
    """A ``.npz`` with ``x`` (one input, samples on the first axis) or one array per input name; ``y``: labels;
    :data:`~.validation.task_truth.TRUTH_KEYS`: a task's ground truth."""
    with _np_load(path, what) as npz:
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise CalibrationError(f"{what} file {path} holds a single array (a .npy?); a .npz holds named arrays: "
                                   "x (and y), or one per input name")
        return _read_npz_arrays(npz, path, inputs, what)


def _read_npz_arrays(npz: Any, path: Path, inputs: list[TensorSpec], what: str) -> Dataset:
    """The arrays of an open ``.npz`` (see :func:`_read_npz`), read while it is open."""
    names = [s.name for s in inputs]
    keyed = "x" not in npz.files or (len(names) > 1 and all(n in npz.files for n in names))
    wanted = names if keyed else ["x"]
    missing = [n for n in wanted if n not in npz.files]
    if missing and keyed and len(names) == 1:
        raise CalibrationError(f"{what} file {path} has no array 'x' nor {names[0]!r} (arrays: "
                               f"{', '.join(npz.files) or 'none'})")
    if missing:
        raise CalibrationError(f"{what} file {path} lacks the array(s) of input(s) {', '.join(missing)} (model "
                               f"inputs: {', '.join(names)}; arrays: {', '.join(npz.files) or 'none'})")
    try:
        arrays = [npz[n] for n in wanted]
        y = npz["y"] if "y" in npz.files else None
        found = {k: npz[k] for k in TRUTH_KEYS if k in npz.files and k not in wanted}
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"{what} file {path}: {exc}") from exc
    if not keyed:
        x = arrays[0]
        if len(inputs) == 1 and x.ndim == len(inputs[0].shape) + 1 and x.ndim > 1 and x.shape[1] == 1:
            x = x[:, 0]  # samples given whole, batch axis included ([n, 1, ...]): the sample axis is the first
        _check_labels(y, len(x), path, what)
        ds = _from_array(x, y, str(path), what)
        ds.truth = read_truth(found, len(x), f"{what} file {path}")
        return ds
    counts = {n: (a.shape[0] if a.ndim else None) for n, a in zip(names, arrays)}
    if len(set(counts.values())) != 1 or None in counts.values():
        shown = ", ".join(f"{n} {list(a.shape)}" for n, a in zip(names, arrays))
        raise CalibrationError(f"{what} file {path}: every input's array must hold the same number of samples on its "
                               f"first axis; they have shapes {shown}")
    count = next(iter(counts.values()))
    _check_labels(y, count, path, what)
    for n, a in zip(names, arrays):
        if a.dtype.kind not in "biuf":
            raise CalibrationError(f"{what} file {path}: input {n!r} must be numeric, got {a.dtype}")
    loaders = [(lambda i=i: [a[i] for a in arrays]) for i in range(count)]
    return Dataset(loaders, y, None, str(path), [f"{path}[{i}]" for i in range(count)],
                   truth=read_truth(found, count, f"{what} file {path}"))


def _check_labels(y: np.ndarray | None, count: int, path: Path, what: str) -> None:
    if y is not None and (y.ndim != 1 or len(y) != count or not np.issubdtype(y.dtype, np.integer)):
        raise CalibrationError(f"{what} file {path}: 'y' must be {count} integer labels, got {y.dtype} {list(y.shape)}")


def _npz_folder(root: Path) -> bool:
    """Whether ``root`` is a folder of ``.npz`` files (rather than images): any ``.npz`` in it says so."""
    return any(p.suffix == ".npz" for p in root.iterdir() if p.is_file() and not p.name.startswith("."))


def _read_npz_folder(root: Path, inputs: list[TensorSpec], what: str) -> Dataset:
    files = [p for p in sorted(root.iterdir()) if not p.name.startswith(".")]
    other = [p.name for p in files if p.suffix != ".npz" or not p.is_file()]
    if other:
        raise CalibrationError(f"{what} folder {root} mixes .npz files with other entries ({', '.join(other[:5])}); "
                               "a folder of arrays holds only .npz files")
    parts = [_read_npz(p, inputs, what) for p in files]
    labelled = [p.labels is not None for p in parts]
    if any(labelled) and not all(labelled):
        raise CalibrationError(f"{what} folder {root}: some .npz files have labels 'y' and others not "
                               f"({', '.join(p.name for p, has in zip(files, labelled) if not has)[:200]} lack them)")
    labels = np.concatenate([p.labels for p in parts]) if all(labelled) else None
    truth = join_truths([p.truth for p in parts], f"{what} folder {root}", [p.name for p in files])
    return Dataset([f for p in parts for f in p.loaders], labels, None,
                   f"{root} ({len(files)} .npz files)", [n for p in parts for n in p.names], truth=truth)


def _from_array(x: np.ndarray, y: np.ndarray | None, origin: str, what: str) -> Dataset:
    if x.dtype.kind not in "biuf":
        raise CalibrationError(f"{what} data {origin}: inputs must be numeric, got {x.dtype}")
    if x.ndim < 2:
        raise CalibrationError(f"{what} data {origin}: expected (N, ...) inputs, got shape {list(x.shape)}")
    loaders = [(lambda i=i: [x[i : i + 1]]) for i in range(len(x))]
    return Dataset(loaders, y, None, origin, [f"{origin}[{i}]" for i in range(len(x))])


def _from_iterable(items: Iterable, inputs: list[TensorSpec], what: str) -> Dataset:
    loaders, names = [], []
    order = [s.name for s in inputs]
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            missing = [n for n in order if n not in item]
            if missing and len(item) == len(order) == 1:
                feeds = list(item.values())  # one input whose name differs (e.g. an exporter renamed it)
            elif missing:
                raise CalibrationError(
                    f"{what} sample {i} lacks input(s) {', '.join(missing)} (model inputs: {', '.join(order)}; "
                    f"sample has: {', '.join(map(str, item))})"
                )
            else:
                feeds = [item[n] for n in order]
        else:
            feeds = [item]
        arrays = []
        for j, arr in enumerate(feeds):
            arr = np.asarray(arr)
            if arr.dtype.kind not in "biuf":
                raise CalibrationError(f"{what} sample {i}: input {j} must be numeric, got {arr.dtype}")
            arrays.append(arr)
        loaders.append(lambda a=arrays: a)
        names.append(f"sample {i}")
    return Dataset(loaders, None, None, "python iterable", names)


def _read_folder(root: Path, preprocess: Preprocess | None, label_names: list[str] | None, what: str) -> Dataset:
    if preprocess is None:
        raise CalibrationError(
            f"{what} data {root} is an image folder, which needs a preprocessing spec (--preprocess FILE.toml)"
        )
    entries = [p for p in sorted(root.iterdir()) if not p.name.startswith(".")]
    subdirs = [p for p in entries if p.is_dir()]
    if subdirs:
        stray = [p.name for p in entries if p.is_file()]
        if stray:
            raise CalibrationError(
                f"{what} folder {root} mixes class sub-folders with loose files ({', '.join(stray[:5])}); "
                "use either one sub-folder per class or a flat folder of images"
            )
        classes = [p.name for p in subdirs]
        index = _class_index(classes, label_names, root, what)
        files, labels = [], []
        for sub in subdirs:
            for f in _images_in(sub, what):
                files.append(f)
                labels.append(index[sub.name])
        y = np.asarray(labels, dtype=np.int64)
        names = label_names or _names_from_index(index)
        origin = f"{root} ({len(files)} images, {len(classes)} classes)"
    else:
        files, y, names = _images_in(root, what), None, label_names
        origin = f"{root} ({len(files)} images)"
    if not files:
        raise CalibrationError(f"{what} folder {root} holds no images ({', '.join(IMAGE_SUFFIXES)})")

    def loader(path: Path) -> list[np.ndarray]:
        try:
            return [preprocess(path)]
        except InputError as exc:
            raise CalibrationError(f"{what} image {path} cannot be used: {exc}") from exc

    loaders = [(lambda p=p: loader(p)) for p in files]
    return Dataset(loaders, y, names, origin, [str(p) for p in files])


def _images_in(folder: Path, what: str) -> list[Path]:
    files = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".")]
    nested = [p.name for p in files if p.is_dir()]
    if nested:
        raise CalibrationError(f"{what} folder {folder} has nested folders ({', '.join(nested[:5])}); one level of class folders is supported")
    other = [p.name for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
    if other:
        raise CalibrationError(
            f"{what} folder {folder} holds non-image files: {', '.join(other[:5])}"
            f"{' ...' if len(other) > 5 else ''} (images are {', '.join(IMAGE_SUFFIXES)})"
        )
    return files


def _class_index(classes: list[str], label_names: list[str] | None, root: Path, what: str) -> dict[str, int]:
    if label_names is not None:
        unknown = [c for c in classes if c not in label_names]
        if unknown:
            raise CalibrationError(f"{what} folder {root} has class folders not in the labels: {', '.join(unknown)}")
        return {c: label_names.index(c) for c in classes}
    if all(c.isdigit() for c in classes):
        return {c: int(c) for c in classes}  # folders named by class index: "0", "1", ...
    return {c: i for i, c in enumerate(classes)}


def _names_from_index(index: dict[str, int]) -> list[str]:
    names = [""] * (max(index.values()) + 1)
    for name, i in index.items():
        names[i] = name
    return names


def input_dtype(spec: TensorSpec) -> np.dtype:
    """The numpy dtype of ``spec`` (float32 for a name numpy does not know, such as bfloat16)."""
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        return np.dtype(np.float32)


def _conform(sample: list[np.ndarray], inputs: list[TensorSpec], where: str, name: str) -> list[np.ndarray]:
    """Each array of ``sample`` in its input's dtype, with the batch axis added where it was left out.

    Integer and bool inputs must receive exactly representable values (16000.0 is the int64 16000; 0.5 is refused)."""
    out = []
    for j, arr in enumerate(sample):
        arr = np.asarray(arr)
        if j >= len(inputs):
            out.append(arr)
            continue
        spec = inputs[j]
        if arr.ndim == len(spec.shape) - 1 and spec.shape[0] in (1, -1):
            arr = arr[None]  # one sample given without its batch axis
        dtype = input_dtype(spec)
        if arr.dtype != dtype:
            if arr.dtype.kind not in "biuf":
                raise CalibrationError(f"{where}: input {spec.name!r} must be numeric, got {arr.dtype} ({name})")
            cast = arr.astype(dtype)
            if dtype.kind in "biu" and not np.array_equal(cast, arr):
                raise CalibrationError(f"{where}: input {spec.name!r} is {dtype.name}, and {name} holds values that "
                                       f"{dtype.name} cannot hold exactly (non-integers or out of range)")
            arr = cast
        out.append(arr)
    return out


def _check_fits(sample: list[np.ndarray], inputs: list[TensorSpec], where: str, name: str) -> None:
    for arr in sample:
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise CalibrationError(f"{where}: {name} holds NaN or Inf values")
    if len(sample) != len(inputs):
        raise CalibrationError(
            f"{where} gives {len(sample)} input(s) per sample ({name}); the model takes {len(inputs)} "
            f"({', '.join(s.name for s in inputs)})"
        )
    for spec, arr in zip(inputs, sample):
        fits = arr.ndim == len(spec.shape) and all(d in (-1, a) for d, a in zip(spec.shape, arr.shape))
        if not fits:
            raise CalibrationError(
                f"{where} does not fit the model: input {spec.name!r} has shape "
                f"{list(spec.shape)}, a sample has shape {list(arr.shape)} ({name})"
            )


# -- drawing samples ------------------------------------------------------------

def draw(ds: Dataset, n: int, seed: int) -> tuple[list[int], list[int]]:
    """Pick ``n`` sample indices (stratified by class where labels exist) and return (picked, rest)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds))
    if n >= len(ds):
        return sorted(order.tolist()), []
    if ds.labels is None:
        picked = order[:n]
    else:
        # Round-robin over classes in shuffled order: each class gets its share (+-1).
        by_class: dict[int, list[int]] = {}
        for i in order:
            by_class.setdefault(int(ds.labels[i]), []).append(int(i))
        queues = [by_class[c] for c in sorted(by_class)]
        picked = []
        while len(picked) < n:
            for q in queues:
                if q and len(picked) < n:
                    picked.append(q.pop(0))
    picked_set = set(int(i) for i in picked)
    rest = [int(i) for i in order if int(i) not in picked_set]
    return sorted(picked_set), rest


def materialize(ds: Dataset, progress: Callable[[Iterable], Iterable] = iter) -> list[list[np.ndarray]]:
    """Load every sample of ``ds`` and return them (each a list of arrays in input order)."""
    return [ds.load(i) for i in progress(range(len(ds)))]


def fingerprint(samples: list[list[np.ndarray]]) -> str:
    """sha256 over the shapes and float32 bytes of the data actually used (integer inputs too, as float32: exact for
    the values calibration data holds, and the same digest as before inputs kept their dtype)."""
    digest = hashlib.sha256()
    for sample in samples:
        for arr in sample:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            digest.update(str(arr.shape).encode())
            digest.update(arr.tobytes())
    return digest.hexdigest()
