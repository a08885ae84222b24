"""Which layers accuracy recovery keeps in float, and which it gives the other range choice (:func:`search`): the
order it measures and tries them in, how it weighs a layer's harm, how it prunes a passing set and picks the best
one. It calls the trial it is given (``attempt``: build and validate one artifact) and knows no engine, so its order
can be pinned on a model of a gate (tests/workstation/test_recover_search.py)."""

from __future__ import annotations

import math
from typing import Callable

from ..layers.compare import LayerError

MEASURE_SHARE = 0.4  # of the time cap for measuring the multiplying layers' harm one by one (step 2 of search)
SEARCH_SHARE = 0.7  # of the time cap for finding a passing set; the rest prunes it


Found = tuple[list[LayerError], list[LayerError]]  # (layers kept in float, layers with the other range choice)


def search(ranked: list[LayerError], attempt: Callable[..., dict], out_of_time: Callable[..., bool],
            harm: dict | None = None, name: Callable[[LayerError], str] = lambda r: r.node, ranges: bool = False
            ) -> Found | None:
    """The layers to keep in float, and those in INT8 with the other range choice on the tensors they read
    (``ranges``: the engine has a per-layer range choice): among the passing sets tried within a point of the most
    MACs left in INT8, the fastest (the trial's p50), then the fewest MACs in float, then the fewest layers
    (:func:`best`); None when none passed. ``harm`` receives, per measured layer (``id(row)``), the validation entry of step 2.

    1. The layers that multiply nothing, all of them (they cost no INT8 MACs); when that passes, the shortest prefix
       of them (worst first) that passes.
    2. Otherwise each multiplying layer is measured alone in INT8, every other layer in float (:func:`harm_of` of the
       validation entry), the fewest MACs first (harm per MAC orders them: the cheap ones matter most), until
       ``MEASURE_SHARE`` of the time cap. A layer's added error says little of what it does to the outputs: on the
       PP-OCRv4 recognizer (LiteRT) the first depthwise convolutions add little error where they are, yet each alone
       in INT8 drops 9-31 lines of 100 downstream; the big convolutions of the last stage, worst by added error,
       drop none. The order: the measured harmful ones by harm per MAC, then those not measured (by added error),
       then the measured harmless ones. A passing measurement is a passing set too (nearly all in float).
    3. Prefixes of that order (1, 2, 4... then bisected) on top of the free tier.
    4. The free tier shortened again (bisected prefix) with the multiplying layers found.
    5. :func:`prune`, from the set :func:`best` picks so far: its multiplying layers back to INT8 one by one, the
       most MACs first, each with the artifact's ranges or else (``ranges``) with the other range choice on the
       tensors it reads.
    Steps 1-4 stop at ``SEARCH_SHARE`` of the time cap, step 5 at the cap; trials are cached, so no set is built
    twice."""
    searching = lambda: out_of_time(SEARCH_SHARE)  # noqa: E731
    passing: list[tuple[list[LayerError], list[LayerError], float]] = []  # each passing set, its trial's p50
    total = sum(r.macs for r in ranked)
    harm = {} if harm is None else harm

    def whole(rows) -> list[LayerError]:
        """``rows`` with every row sharing an engine name with one of them: what the converter is told (LiteRT's
        repeated tensor names are one unit to AI Edge Quantizer), so a passing set records what its artifact did."""
        names = {name(r) for r in rows}
        return [r for r in ranked if name(r) in names]

    def ok(rows: list[LayerError], step: str = "search", ranged: list[LayerError] = ()) -> bool:
        rows, ranged = whole(rows), whole(ranged)
        judged = attempt(rows, step=step, ranged=ranged)
        if judged["passed"]:
            passing.append((rows, ranged, p50(judged)))
        return bool(judged["passed"])

    def shortest(prefix_of: list[LayerError], base: list[LayerError], lo: int = 0) -> int | None:
        """The smallest n with base + prefix_of[:n] passing (doubling, then bisection; None: none found)."""
        hi, n = None, max(1, lo)
        while n <= len(prefix_of) and not searching():
            if ok(base + prefix_of[:n]):
                hi = n
                break
            lo = n
            n = len(prefix_of) if n < len(prefix_of) and n * 2 > len(prefix_of) else n * 2
        while hi is not None and hi - lo > 1 and not searching():
            mid = (lo + hi) // 2
            if ok(base + prefix_of[:mid]):
                hi = mid
            else:
                lo = mid
        return hi

    free = [r for r in ranked if r.macs == 0]
    costly = [r for r in ranked if r.macs > 0]
    base: list[LayerError] = []
    if free and not searching():
        if ok(free):
            shortest(free, [])
            return best(passing, total)
        base = free
    shared = {n for n in map(name, costly) if sum(name(r) == n for r in costly) > 1}  # not addressable alone
    for row in sorted(costly, key=lambda r: r.macs):
        if out_of_time(MEASURE_SHARE):
            break
        if name(row) in shared:
            continue
        others = base + [r for r in costly if r is not row]
        harm[id(row)] = judged = attempt(others, step="sensitivity", what=f"{row.source or row.node} alone in INT8")
        if judged["passed"]:
            passing.append((others, [], p50(judged)))
    measured = sorted((r for r in costly if id(r) in harm), key=lambda r: -harm_of(harm[id(r)]) / r.macs)
    harmless = [r for r in measured if harm_of(harm[id(r)]) < HARMLESS]
    order = ([r for r in measured if r not in harmless] + [r for r in costly if id(r) not in harm] + harmless)
    n = shortest(order, base)
    if n is not None and base:
        shortest(base, order[:n])  # the free tier again: fewer layers in float
    # pruned from the set that would be kept now (the fastest near the most MACs in INT8): on LiteRT the shortened
    # free tier is the slow one (the recognizer: 195 layers in float at 5.4 ms, 87 at 13.6 ms, the same MACs)
    prune(best(passing, total), ok, out_of_time, ranges, name)
    return best(passing, total)


HARMLESS = 1e-5  # a layer whose harm alone is below this goes last


def harm_of(judged: dict) -> float:
    """How far a layer alone in INT8 moves the outputs (the validation entry of that trial): 1 - cosine against
    the float reference, plus the metric's drop over the gate's limit (both in the drop's own unit: points, px),
    plus 1 when that alone fails the gate (for any reason: drop, error cap, dead output)."""
    cosine = judged.get("cosine_similarity")
    drop, limit = judged.get("drop"), judged.get("max_drop")
    value = 1.0 - cosine if cosine is not None and math.isfinite(cosine) else 0.0
    if drop is not None and limit:
        value += max(float(drop), 0.0) / float(limit)
    return value + (0.0 if judged.get("passed") else 1.0)


PRUNE = 12  # multiplying layers taken back to INT8 one by one at most (two trials each with the other range choice)


def prune(found: Found | None, ok: Callable[..., bool], out_of_time: Callable[[], bool], ranges: bool = False,
          name: Callable[[LayerError], str] = lambda r: r.node) -> None:
    """Take the multiplying layers of a passing set back to INT8 one at a time (rows of one engine name together:
    ``name``), the most MACs first, keeping each removal that still passes (a set found by prefixes carries layers
    it did not need). ``ranges``: a layer that fails with the artifact's ranges is tried again with the other range
    choice on the tensors it reads (the per-layer range choice). On the PP-OCRv4 recognizer (LiteRT, every layer
    without MACs in float) five early convolutions, each alone in INT8 with everything else float, read
    69/84/89/91/87 lines of 100 with running min/max and 86/88/99/100/100 with the mean of per-sample min/max on
    their inputs; all five in INT8 read 84 and 98 (97 with the five in float)."""
    if not found:
        return
    current, ranged = list(found[0]), list(found[1])
    # rows sharing an engine name are one unit to the converter (LiteRT's repeated tensor names): taken back together
    units: dict[str, list[LayerError]] = {}
    for r in current:
        units.setdefault(name(r), []).append(r)
    costly = [unit for unit in units.values() if sum(r.macs for r in unit) > 0]
    for unit in sorted(costly, key=lambda u: -sum(r.macs for r in u))[:PRUNE]:
        if out_of_time():
            return
        trial = [r for r in current if all(r is not u for u in unit)]
        if (trial or ranged) and ok(trial, "prune", ranged):
            current = trial
        elif ranges and not out_of_time() and ok(trial, "ranges", ranged + unit):
            current, ranged = trial, ranged + unit


SHARE_SLACK = 0.01  # of all MACs: passing sets this close to the most MACs in INT8 are told apart by their speed


def best(passing: list[tuple[list[LayerError], list[LayerError], float]], total: int, fastest: bool = True
         ) -> Found | None:
    """Among the passing sets within ``SHARE_SLACK`` of the fewest MACs in float, the one with the lowest p50, then
    the fewest MACs in float, then the fewest layers (``fastest=False``: the fewest MACs in float, then the fewest
    layers). Keeping a layer without MACs in float can make an artifact faster, not only slower: on the PP-OCRv4
    recognizer LiteRT runs its INT8 adds, activations and softmax slower than float ones (every such op float:
    5.8 ms, every op INT8: 26.5 ms, float 8.8 ms); in two recoveries of it, a set keeping 2.5% of the MACs in float
    ran at 13.9 ms and one keeping 3.0% with every such op in float at 7.4 ms."""
    if not passing:
        return None
    floats = [sum(r.macs for r in found[0]) for found in passing]
    if not fastest:
        kept, ranged, _ = min(zip(passing, floats), key=lambda pair: (pair[1], len(pair[0][0])))[0]
        return kept, ranged
    near = [pair for pair in zip(passing, floats) if pair[1] <= min(floats) + SHARE_SLACK * total]
    kept, ranged, _ = min(near, key=lambda pair: (pair[0][2], pair[1], len(pair[0][0])))[0]
    return kept, ranged


def p50(judged: dict) -> float:
    value = judged.get("latency_ms")
    return float(value) if value is not None and math.isfinite(value) else math.inf
