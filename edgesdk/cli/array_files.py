"""The array files ``edgesdk run`` reads: ``.npy`` (one array) and ``.npz`` (one array per model input, by name;
first axis = sample), read one sample at a time, so that a file of many samples costs the memory of one.

:func:`open_array_file` reads the headers only, before the model loads, so that a file that is not what it says
fails fast: a regular file opened without blocking; numbers only (never unpickled); each archive member once; at
most MAX_ARRAY_ELEMENTS elements in the file; every array holds the bytes its header declares (an archive member's
inflated size is the archive's directory's word, and no more is ever read). :meth:`ArrayFile.samples` checks the
headers against the model's inputs before any data is read: a dtype the input takes (never complex, strings or
objects), samples of the input's shape (an image model's uint8 arrays: at most MAX_IMAGE_PIXELS pixels of 4
channels), at most ``max_samples`` of them. Only then are the samples read, one by one. Every refusal is an
:class:`~edgesdk.errors.InputError` naming the file (and the member).
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from ..bundle import tensors
from ..bundle.arrays import read_exactly
from ..errors import InputError

_READ_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError)


@dataclass(frozen=True)
class Member:
    """One array of a file, as its header declares it (no data read)."""

    key: str  # the input it is for: "x" for the member x.npy; "" for a .npy file
    entry: str | None  # the archive member's name (x.npy); None for a .npy file
    shown: str  # how messages name it: the path, or path:member
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool


class ArrayFile:
    """An ``.npy`` or ``.npz`` whose headers were read and checked (:func:`open_array_file`); no data read yet."""

    def __init__(self, path: Path, members: list[Member], archive: bool):
        self.path, self.members, self.archive = path, members, archive

    def samples(self, specs: list[dict], images: bool, max_samples: int) -> "Samples":
        """The predictions this file asks of a model whose manifest inputs are ``specs`` (``images``: the model
        takes uint8 arrays as images, through its preprocess), checked from the headers alone. A ``.npy`` whose
        first axis holds more samples than the model's batch of 1 is one prediction per sample (``x.npy[3]``),
        else one; an ``.npz`` holds one array per input (by name; a single-input model takes any one name), first
        axis = sample."""
        label = str(self.path)
        names = [s["name"] for s in specs]
        if not self.archive:
            (member,) = self.members
            if len(specs) != 1:
                raise InputError(f"{label} holds one array; the model takes {len(specs)} inputs {names}: give an "
                                 ".npz with one array per input (first axis = sample)")
            shape = specs[0]["shape"]
            split = len(member.shape) == len(shape) >= 1 and shape[0] in (1, -1) and member.shape[0] > 1
            count = member.shape[0] if split else 1
            sample = (1, *member.shape[1:]) if split else member.shape
            plan = [(member, specs[0], sample)]
        else:
            by_key = {m.key: m for m in self.members}
            if len(names) == 1 and len(by_key) == 1:
                by_key = {names[0]: self.members[0]}
            if set(by_key) != set(names):
                raise InputError(f"{label} holds arrays {sorted(by_key)}; the model's inputs are {names} (one array "
                                 "per input, first axis = sample)")
            counts = {key: (m.shape[0] if m.shape else None) for key, m in by_key.items()}
            if None in counts.values() or len(set(counts.values())) != 1:
                raise InputError(f"{label}: every array needs the same number of samples on its first axis; they "
                                 f"hold {counts}")
            count = next(iter(counts.values()))
            plan = [(by_key[s["name"]], s, by_key[s["name"]].shape[1:]) for s in specs]
        if count > max_samples:
            raise InputError(f"{label} holds {count} samples; more than {max_samples} in one file is refused "
                             "(--max-samples N raises it)")
        for member, spec, sample in plan:
            _check_takes(member, spec, sample, images and len(specs) == 1)
            if member.fortran and count > 1:
                raise InputError(f"{member.shown} is stored in Fortran order, its samples interleaved; save it in C "
                                 "order (np.save(path, np.ascontiguousarray(x)))")
        return Samples(self, [(m, s["name"], sample) for m, s, sample in plan], count)


class Samples:
    """The predictions of one array file, read one at a time (:meth:`rows`)."""

    def __init__(self, file: ArrayFile, plan: list[tuple[Member, str, tuple[int, ...]]], count: int):
        self.file, self.plan, self.count = file, plan, count

    def rows(self) -> Iterator[tuple[str, Any]]:
        """``(label, value)`` per prediction: an array (a ``.npy``), ``{input: array}`` (an ``.npz`` for several
        inputs) or, when reading fails part way (the file changed, a stream is corrupt), an :class:`InputError`
        for that sample, after which nothing more is read from the file."""
        label = str(self.file.path)
        name = (lambda n: f"{label}[{n}]") if self.count > 1 else (lambda n: label)
        i = 0  # the sample being read: a failure is its row
        try:
            with _open(self.file.path) as file, _Streams(file, self.file, self.plan) as streams:
                for i in range(self.count):
                    arrays = [_read_sample(stream, member, sample)
                              for stream, (member, _, sample) in zip(streams, self.plan)]
                    if len(arrays) > 1:
                        yield name(i), {key: a for (_, key, _), a in zip(self.plan, arrays)}
                    else:
                        yield name(i), arrays[0]
        except InputError as exc:
            yield name(i), exc
        except _READ_ERRORS as exc:
            yield name(i), InputError(f"{label} cannot be read: {type(exc).__name__}: {exc}")


def open_array_file(path: Path) -> ArrayFile:
    """The headers of the ``.npy`` or ``.npz`` at ``path``, checked (see the module); no data read."""
    with _open(path) as file:
        if path.suffix == ".npz":
            return ArrayFile(path, _archive_members(file, str(path)), archive=True)
        size = os.fstat(file.fileno()).st_size
        return ArrayFile(path, [_header(file, str(path), "", None, size, tensors.MAX_ARRAY_ELEMENTS)], archive=False)


def _open(path: Path):
    return tensors.RegularFile(Path(path), "array file", max_bytes=tensors.MAX_ARRAY_ELEMENTS * 16 + (1 << 16))


def _archive_members(file: IO[bytes], shown: str) -> list[Member]:
    try:
        with zipfile.ZipFile(file) as npz:
            infos = npz.infolist()
            names = [info.filename for info in infos]
            if not names or any(not n.endswith(".npy") for n in names):
                raise InputError(f"{shown} is not an .npz of arrays: it holds {names[:8]}")
            seen: set[str] = set()
            for n in names:
                if n in seen:
                    raise InputError(f"{shown} holds the member {n!r} twice (readers differ on which one counts)")
                seen.add(n)
            members, left = [], tensors.MAX_ARRAY_ELEMENTS  # one limit for all the members together
            for info in infos:
                with npz.open(info) as stream:
                    member = _header(stream, f"{shown}:{info.filename}", info.filename[:-len(".npy")],
                                     info.filename, info.file_size, left)
                members.append(member)
                left -= math.prod(member.shape)
            return members
    except _READ_ERRORS as exc:
        raise InputError(f"{shown} is not a readable .npz: {type(exc).__name__}: {exc}") from exc


def _header(stream: IO[bytes], shown: str, key: str, entry: str | None, size: int, max_elements: int) -> Member:
    """The ``.npy`` header at the start of ``stream`` (``size`` bytes in all), checked: numbers, at most
    ``max_elements``, every declared byte present."""
    member = Member(key, entry, shown, *_read_header(stream, shown))
    dtype, shape = member.dtype, member.shape
    if dtype.hasobject or dtype.fields is not None:
        raise InputError(f"{shown} holds {dtype}, not numbers (Python objects are never unpickled)")
    if dtype.kind not in "biuf":
        raise InputError(f"{shown} holds {dtype}, which no model input takes (integers, floats or bools)")
    count = math.prod(shape)
    if count > max_elements:
        raise InputError(f"{shown} declares {count} elements ({list(shape)}); more than {max_elements} is refused (at "
                         "most edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS in one file)")
    declared, present = count * dtype.itemsize, size - stream.tell()
    if present < declared:
        raise InputError(f"{shown} is cut short: {max(present, 0)} of the {declared} bytes its header declares")
    return member


def _read_header(stream: IO[bytes], shown: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    try:
        version = np.lib.format.read_magic(stream)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f".npy format version {version} is not read")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(stream)
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise InputError(f"{shown} is not a readable .npy array: {exc}") from exc
    return dtype, tuple(shape), bool(fortran)


def _check_takes(member: Member, spec: dict, sample: tuple[int, ...], image: bool) -> None:
    """Refuse, from the header, samples the input ``spec`` cannot take: a dtype it does not take, or a shape that is
    not the input's (an image: more pixels than MAX_IMAGE_PIXELS)."""
    try:
        wanted = np.dtype(spec["dtype"])
    except (TypeError, ValueError, SyntaxError):
        wanted = np.dtype(np.float32)  # a dtype numpy does not know (bfloat16) is fed as float32
    takes, said = ("biuf", "bools, integers or floats") if wanted.kind == "b" else ("iuf", "integers or floats")
    name = spec["name"]
    if member.dtype.kind not in takes:
        raise InputError(f"{member.shown} holds {member.dtype}; input {name!r} takes {spec['dtype']} (given as "
                         f"{said})")
    if image and member.dtype == np.uint8:
        if math.prod(sample) > tensors.MAX_IMAGE_PIXELS * 4:
            raise InputError(f"{member.shown} holds images of shape {list(sample)}; more than "
                             f"{tensors.MAX_IMAGE_PIXELS} pixels of 4 channels is refused "
                             "(edgesdk.bundle.tensors.MAX_IMAGE_PIXELS)")
        return
    shape = tuple(spec["shape"])
    fits = [s for s in (shape, shape[1:] if shape else None) if s is not None
            and len(s) == len(sample) and all(d in (-1, n) for d, n in zip(s, sample))]
    if not fits:
        also = f" (or {list(shape[1:])})" if shape else " (a scalar)"
        raise InputError(f"{member.shown} holds samples of shape {list(sample)}; input {name!r} takes "
                         f"{list(shape)}{also}")


class _Streams:
    """The data streams of a file's members, opened together (one per input) with their headers read again: the
    file must still be what :func:`open_array_file` checked."""

    def __init__(self, file: IO[bytes], array_file: ArrayFile, plan: list[tuple[Member, str, tuple[int, ...]]]):
        self._zip = zipfile.ZipFile(file) if array_file.archive else None
        self.streams = []
        try:
            for member, _, _ in plan:
                stream = self._zip.open(member.entry) if self._zip is not None else file
                self.streams.append(stream)
                if _read_header(stream, member.shown) != (member.dtype, member.shape, member.fortran):
                    raise InputError(f"{member.shown} changed since its header was read")
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self) -> list[IO[bytes]]:
        return self.streams

    def __exit__(self, *exc: object) -> None:
        if self._zip is not None:
            for stream in self.streams:
                stream.close()
            self._zip.close()


def _read_sample(stream: IO[bytes], member: Member, sample: tuple[int, ...]) -> np.ndarray:
    """The next sample of ``member`` from ``stream``: exactly its bytes (a Fortran-order member is one sample)."""
    size = math.prod(sample) * member.dtype.itemsize
    data, got = read_exactly(stream, size)
    if got < size:
        raise InputError(f"{member.shown} is cut short: {got} of the {size} bytes of a sample")
    return np.frombuffer(data, dtype=member.dtype).reshape(sample, order="F" if member.fortran else "C")


__all__ = ["ArrayFile", "Member", "Samples", "open_array_file"]
