"""Drift of one signal against its reference, on fixed bins, in numpy.

The reference of a feature (the manifest's ``monitoring.features`` entry, made at quantize time by
:func:`reference_entry`) holds bin edges, the reference's share in each bin, and its moments:

- edges: the deciles of the reference values (``BINS`` bins; repeated deciles merged, so a feature with few
  distinct values gets fewer bins), the two outer bins open (-inf, e1) and [e9, +inf): a window whose values all lie
  beyond the reference's range lands in one outer bin; for a categorical feature (``predicted_class``), one bin per
  value seen, the edges halfway between them;
- ``p``: the reference's share per bin; ``mean``, ``std``, ``n``.

A window of the same feature is binned on those edges (``np.searchsorted``, a value on an edge goes to the bin
above it) and compared with:

- **PSI** (population stability index): sum over bins of (w - r) ln(w / r), both shares floored at ``FLOOR``
  (an empty bin is not infinitely surprising). The usual reading: < 0.1 stable, 0.1-0.25 a moderate shift, > 0.25 a
  major one (the monitor's default warn and alert levels). Its expected value for a window of n values drawn from
  the reference itself is about (bins - 1) / n (0.018 for 10 bins and 500 values): the reason for windows of
  hundreds of predictions.
- **JS** (Jensen-Shannon divergence, base 2): in [0, 1], symmetric, finite on empty bins.

Both have a floor from sampling alone (:func:`noise_floor`); a drift signal is the largest excess over it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

BINS = 10
FLOOR = 1e-4  # smallest share a bin counts with in PSI
DIGITS = 6  # significant digits kept in the manifest


def reference_entry(values: np.ndarray, categorical: bool = False) -> dict[str, Any] | None:
    """The reference of one feature from its values (NaN ignored); None without any finite value."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    distinct = np.unique(v)
    if categorical or distinct.size <= BINS:
        edges = (distinct[:-1] + distinct[1:]) / 2 if distinct.size > 1 else np.array([], dtype=np.float64)
    else:
        edges = np.unique(np.quantile(v, np.linspace(0.0, 1.0, BINS + 1)[1:-1]))
    edges = np.array([_round(e) for e in edges], dtype=np.float64)
    edges = np.unique(edges)
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=edges.size + 1)
    return {"edges": [float(e) for e in edges], "p": [_round(c / v.size) for c in counts],
            "mean": _round(float(v.mean())), "std": _round(float(v.std())), "n": int(v.size)}


def shares(entry: Mapping[str, Any], values: np.ndarray) -> tuple[np.ndarray, int, float]:
    """The window's share per bin of ``entry`` (NaN ignored), how many values counted, and their mean."""
    v = values[np.isfinite(values)]
    edges = entry["edges"]
    if not v.size:
        return np.zeros(len(edges) + 1), 0, math.nan
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
    return counts / v.size, int(v.size), float(v.mean())


def psi(reference: np.ndarray, window: np.ndarray) -> float:
    r = np.maximum(np.asarray(reference, dtype=np.float64), FLOOR)
    w = np.maximum(window, FLOOR)
    r, w = r / r.sum(), w / w.sum()
    return float(np.sum((w - r) * np.log(w / r)))


def js(reference: np.ndarray, window: np.ndarray) -> float:
    r = np.asarray(reference, dtype=np.float64)
    r = r / r.sum() if r.sum() > 0 else r
    w = window
    m = (r + w) / 2

    def kl(a: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / m[mask])))

    return max(0.0, 0.5 * kl(r) + 0.5 * kl(w))


STATISTICS = {"psi": psi, "js": js}


def noise_floor(statistic: str, bins: int, n: int, reference_n: int) -> float:
    """The statistic's expected value when the window is drawn from the reference itself: (bins - 1) (1/n + 1/N)
    for PSI (it is about a chi-square over n), an eighth of that in bits for JS. The monitor compares a feature's
    statistic *above* this floor with its levels, so that a window of 300 is not judged as one of 30,000."""
    base = (bins - 1) * (1.0 / max(n, 1) + 1.0 / max(reference_n, 1))
    return base if statistic == "psi" else base / (8 * math.log(2))


def _round(x: float) -> float:
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{DIGITS}g}")


__all__ = ["reference_entry", "shares", "psi", "js", "noise_floor", "STATISTICS", "BINS", "FLOOR"]
