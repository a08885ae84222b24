"""What ``edgesdk run`` reads and how it shows what came back: input files made into the predictions they ask for
(images, ``.npy`` arrays and batches, ``.npz`` arrays by input name: :mod:`.array_files`, one sample at a time), and
a model's outputs described in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError

MAX_SAMPLES_PER_FILE = 10_000  # `edgesdk run --max-samples`'s default: a .npy or .npz holding more is refused


def read_input(path: Path):
    """An input of ``edgesdk run``: a .npy or .npz with its headers read and checked (no data yet: an
    :class:`~.array_files.ArrayFile`); an image path checked to exist (the model decodes it); or the
    :class:`InputError` saying why it cannot be used."""
    from .array_files import open_array_file

    if not path.is_file():
        return InputError(f"input not found: {path}")
    try:
        return open_array_file(path) if path.suffix in (".npy", ".npz") else path
    except InputError as exc:
        return exc


def predictions(label: str, value: Any, specs: list[dict], images: bool,
                max_samples: int) -> tuple[int, Iterable[tuple[str, Any]]]:
    """One input as the number of predictions it asks for and ``(label, value)`` for each, read lazily. An array
    file is checked against the model's inputs ``specs`` from its headers here (:meth:`.ArrayFile.samples`;
    ``images``: the model takes uint8 arrays as images), at most ``max_samples`` samples; a refusal is one
    prediction whose value is the :class:`InputError`."""
    from .array_files import ArrayFile

    if not isinstance(value, ArrayFile):
        return 1, [(label, value)]
    try:
        samples = value.samples(specs, images, max_samples)
    except InputError as exc:
        return 1, [(label, exc)]
    return samples.count, samples.rows()


def describe_output(name: str, output) -> str:
    """``name [shape] dtype`` and, for numbers, min / mean / max: what a model that is not a classifier answered."""
    import numpy as np

    text = f"{name} {list(output.shape)} {output.dtype}"
    if output.size and output.dtype.kind in "biuf":
        values = output.astype(np.float64, copy=False)
        text += f" min {values.min():.4g} mean {values.mean():.4g} max {values.max():.4g}"
    return text
