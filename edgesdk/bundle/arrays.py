"""Array files an app or ``edgesdk run`` hands a model: ``.npy`` (one array) and ``.npz`` (one array per input, keyed
by input name), read with every header checked before any data: numbers only (never unpickled), at most
:data:`~edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS` elements per array, every declared byte present. Every refusal is
an :class:`~edgesdk.errors.InputError` naming the file (and the member)."""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import InputError
from . import tensors


def read_npy(path: Path) -> np.ndarray:
    """The array in the ``.npy`` file ``path``."""
    with tensors.RegularFile(Path(path), "array file", max_bytes=_max_file_bytes()) as file:
        return read_array(file, str(path))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, by member name (``x.npy`` -> ``x``)."""
    shown = str(path)
    with tensors.RegularFile(Path(path), "array file", max_bytes=_max_file_bytes()) as file:
        try:
            with zipfile.ZipFile(file) as npz:
                names = [n for n in npz.namelist() if n.endswith(".npy")]
                if not names or len(names) != len(npz.namelist()):
                    raise InputError(f"{shown} is not an .npz of arrays: it holds {npz.namelist()[:8]}")
                out, left = {}, tensors.MAX_ARRAY_ELEMENTS  # one limit for all the members together
                for name in names:
                    with npz.open(name) as member:
                        array = read_array(member, f"{shown}:{name}", left)
                    out[name[:-len(".npy")]] = array
                    left -= array.size
                return out
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
            raise InputError(f"{shown} is not a readable .npz: {type(exc).__name__}: {exc}") from exc


def read_array(file: IO[bytes], shown: str, max_elements: int | None = None) -> np.ndarray:
    """One ``.npy`` stream: its header checked (at most ``max_elements``, default MAX_ARRAY_ELEMENTS), then exactly
    the bytes it declares read."""
    limit = tensors.MAX_ARRAY_ELEMENTS if max_elements is None else max_elements
    try:
        version = np.lib.format.read_magic(file)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f".npy format version {version} is not read")
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(file)
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise InputError(f"{shown} is not a readable .npy array: {exc}") from exc
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biufc":
        raise InputError(f"{shown} holds {dtype}, not numbers (Python objects are never unpickled)")
    count = math.prod(shape)
    if count > limit:
        raise InputError(f"{shown} declares {count} elements ({list(shape)}); more than {limit} is refused (at most "
                         "edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS in one file)")
    data, got = read_exactly(file, count * dtype.itemsize)
    if got < len(data):
        raise InputError(f"{shown} is cut short: {got} of the {len(data)} bytes its header declares")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def read_exactly(file: IO[bytes], size: int) -> tuple[bytearray, int]:
    """``size`` bytes from ``file`` into a buffer allocated once, and how many came (fewer: the file was short)."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size and (n := file.readinto(view[got:])):
        got += n
    return data, got


def _max_file_bytes() -> int:
    return tensors.MAX_ARRAY_ELEMENTS * 16 + (1 << 16)
