"""What ``edgesdk run`` reads and how it shows what came back: input files made into the predictions they ask for
(images, ``.npy`` arrays and batches, ``.npz`` arrays by input name), and a model's outputs described in one line."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError


def read_input(path: Path):
    """An input of ``edgesdk run``: a .npy array or a .npz of arrays (by input name) read here, headers checked
    first; an image path checked to exist (the model decodes it); or the :class:`InputError` saying why it cannot be
    used."""
    from ..bundle.arrays import read_npy, read_npz

    if not path.is_file():
        return InputError(f"input not found: {path}")
    try:
        return read_npy(path) if path.suffix == ".npy" else read_npz(path) if path.suffix == ".npz" else path
    except InputError as exc:
        return exc


def predictions(label: str, value, specs: list[dict]) -> list[tuple[str, object]]:
    """One input file as the predictions it asks for. A .npy whose first axis holds more samples than the model's
    batch of 1 is one prediction per sample (``x.npy[3]``); a .npz holds one array per model input (by name; a
    single-input model takes any one name), first axis = sample, so it is one prediction per sample."""
    import numpy as np

    if isinstance(value, np.ndarray) and len(specs) == 1:
        shape = specs[0]["shape"]
        if value.ndim == len(shape) >= 1 and shape[0] in (1, -1) and value.shape[0] > 1:
            return [(f"{label}[{i}]", value[i:i + 1]) for i in range(value.shape[0])]
        return [(label, value)]
    if not isinstance(value, dict):
        return [(label, value)]
    names = [s["name"] for s in specs]
    if len(names) == 1 and len(value) == 1:
        value = {names[0]: next(iter(value.values()))}
    if set(value) != set(names):
        return [(label, InputError(f"{label} holds arrays {sorted(value)}; the model's inputs are {names} (one "
                                   "array per input, first axis = sample)"))]
    counts = {name: (array.shape[0] if array.ndim else None) for name, array in value.items()}
    if None in counts.values() or len(set(counts.values())) != 1:
        return [(label, InputError(f"{label}: every array needs the same number of samples on its first axis; "
                                   f"they hold {counts}"))]
    n = next(iter(counts.values()))
    sample = (lambda i: value[names[0]][i]) if len(names) == 1 else (lambda i: {k: value[k][i] for k in names})
    return [(f"{label}[{i}]" if n > 1 else label, sample(i)) for i in range(n)]


def describe_output(name: str, output) -> str:
    """``name [shape] dtype`` and, for numbers, min / mean / max: what a model that is not a classifier answered."""
    import numpy as np

    text = f"{name} {list(output.shape)} {output.dtype}"
    if output.size and output.dtype.kind in "biuf":
        values = output.astype(np.float64, copy=False)
        text += f" min {values.min():.4g} mean {values.mean():.4g} max {values.max():.4g}"
    return text
