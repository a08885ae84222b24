"""Which engine and precision are fastest on this CPU? Measured once per machine at first load, then cached.

The speed policies (``auto``, ``cpu-only``, ``prefer-npu``, ``prefer-gpu``) rank candidates by the platform
profile's engine order, INT8 before FP32; neither holds everywhere: without VNNI/AMX (an AMD Zen 3, say), XNNPACK's
INT8 depthwise kernels and the quantize/dequantize ops can cost as much as the float ones save, and which engine's
kernels are fastest differs from one CPU class to the next. Two checks, chosen by ``RuntimeOptions.speed_check``:

- ``"full"`` (default), *the race* (bottom of this module): every candidate on the first device kind, INT8 and FP32
  of each engine, timed alone; the fastest displaces the profile's first only on clear evidence.
- ``"precision"`` (and ``"full"`` where the race cannot run), *the pair*: when the first candidate that loads is
  INT8 and an FP32 candidate on the same engine and device remains, :func:`edgesdk.load` opens that one too and
  times both here in pairs of back-to-back runs on the bundle's first golden input (bounded: at most ``2 *
  (WARMUP_PAIRS + MAX_PAIRS)`` inferences, ``MIN_PAIRS`` pairs once ``TIME_CAP_S`` is spent). Each pair gives an
  int8/fp32 ratio under the same machine load. FP32 serves only on clear evidence: the median ratio above ``1 +
  MARGIN`` *and* INT8 slower in at least three pairs of four (the lower quartile above 1). Otherwise INT8 keeps its
  place: it is the smaller model in memory, and on a shared machine a burst of other work can make either run slow,
  so a split measurement must not move a decision that is then cached.

Decisions are cached per (bundle fingerprint, machine, engine versions, the candidates, threads, performance) in
``precision.json`` beside autotune's decisions (:func:`edgesdk.user_cache.cache_dir`), so later loads read them and
time nothing. They show as ``placement.engine_choice`` (the race) and ``placement.precision_choice``.
``max-efficiency`` keeps INT8 first without timing (INT8 moves a quarter of the weight bytes, which saves energy even
where it is not faster), ``autotune`` times every candidate itself, and an explicit ``artifact=`` is never
second-guessed.
"""

from __future__ import annotations

from typing import Any, Collection, Sequence

import numpy as np

from . import autotune, numerics, timing
from ..bundle.reader import Bundle
from ..choices import Performance, Policy, SpeedCheck
from ..engines import Engine
from .placement import Candidate, Placement, Skip
from .. import user_cache

POLICIES = (Policy.AUTO, Policy.CPU_ONLY, Policy.PREFER_NPU, Policy.PREFER_GPU)  # the speed policies
MARGIN = 0.05  # INT8 must be more than 5% slower to lose: closer than that is within the noise of the timing
WARMUP_PAIRS = 1
MIN_PAIRS = 8
MAX_PAIRS = 16
TIME_CAP_S = 0.25  # after MIN_PAIRS, stop timing once this much time went into timed runs
CACHE_FILE = "precision.json"


def time_run(engine: Engine, feeds: Sequence[np.ndarray]) -> float:
    """Seconds one inference of the pair takes (:func:`edgesdk.runtime.timing.seconds`). Module-level so a test can put
    a fake clock here (the engines stay real)."""
    return timing.seconds(lambda: engine.run(feeds))


def applies(speed_check: str, policy: str, artifact: str | None, performance: str, bundle: Bundle) -> bool:
    """Whether the INT8/FP32 pair may be timed (``speed_check`` not off, a speed policy, no artifact named, one
    inference at a time, golden inputs to time on); :func:`race_applies` is the race's own test."""
    return (speed_check != SpeedCheck.OFF and policy in POLICIES and artifact is None
            and performance == Performance.LATENCY and bool(bundle.manifest.get("golden")))


def _label(where: Candidate | Placement) -> str:
    return f"{where.engine}:{where.device}:{where.artifact}"


def _fp32_of(cand: Candidate, cands: Sequence[Candidate], barred: Collection[str]) -> Candidate | None:
    """The first FP32 candidate of ``cands`` on ``cand``'s engine and device (an artifact in ``barred``, one that
    failed its validation gate, never competes)."""
    return next((c for c in cands if c.precision == "fp32" and c.engine == cand.engine and c.device == cand.device
                 and c.artifact not in barred), None)


def _key(bundle: Bundle, int8: Candidate | Placement, fp32: Candidate, threads: int | None, performance: str) -> str:
    return autotune.cache_key(bundle, {"precision_check": f"{_label(int8)} vs {_label(fp32)}",
                                       "threads": str(threads), "performance": performance})


def arrange(bundle: Bundle, eligible: list[Candidate], threads: int | None, performance: str,
            barred: Collection[str] = ()) -> tuple[list[Candidate], dict[str, dict[str, Any]]]:
    """Apply the cached decisions: the load order (an FP32 candidate that won moves just before its INT8 one), and
    the decisions by the label of either candidate of their pair (for the placement, and so they are not timed)."""
    order = list(eligible)
    known: dict[str, dict[str, Any]] = {}
    for int8 in [c for c in eligible if c.precision == "int8" and c.artifact not in barred]:
        fp32 = _fp32_of(int8, eligible, barred)
        if fp32 is None:
            continue
        decision = user_cache.lookup(_key(bundle, int8, fp32, threads, performance), CACHE_FILE)
        if not isinstance(decision, dict) or decision.get("chosen") not in ("int8", "fp32"):
            continue
        decision = {**decision, "cached": True}
        known[int8.label()] = known[fp32.label()] = decision
        if decision["chosen"] == "fp32" and order.index(fp32) > order.index(int8):
            order.remove(fp32)
            order.insert(order.index(int8), fp32)
    return order, known


def shown(cand: Candidate, known: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The cached decision for the placement of ``cand`` (None: none), saying so when ``cand`` serves although the
    other one was chosen (that one did not load this time; the placement's skips say why)."""
    decision = known.get(cand.label())
    if decision is None or decision["chosen"] == cand.precision:
        return decision
    return {**decision, "chosen": cand.precision,
            "method": f"{decision['method']}; the cached choice, {decision['chosen']}, did not load this time"}


def rival(cand: Candidate, remaining: Sequence[Candidate], known: dict[str, dict[str, Any]],
          barred: Collection[str] = ()) -> Candidate | None:
    """The FP32 candidate of ``remaining`` to time a freshly loaded INT8 ``cand`` against (None: nothing to time)."""
    if cand.precision != "int8" or cand.label() in known or cand.artifact in barred:
        return None
    return _fp32_of(cand, remaining, barred)


def unmeasured(int8: Candidate | Placement, fp32: Candidate, skipped: Sequence[Skip],
               why: str | None = None) -> dict[str, Any]:
    """The decision when FP32 could not be timed (it did not load or fit: its skip in ``skipped`` says why, else
    ``why``): INT8 serves, and nothing is cached, so the next load tries again."""
    skip = next((s for s in reversed(skipped) if s.candidate == fp32), None)
    why = why or (f"{_label(fp32)} did not load ({skip.reason}: {skip.detail})" if skip else "FP32 did not load")
    return {"int8": _label(int8), "fp32": _label(fp32), "int8_ms": None, "fp32_ms": None, "ratio": None,
            "pairs": 0, "int8_slower_in": None, "chosen": "int8", "cached": False, "method": f"not measured: {why}"}


def measure(bundle: Bundle, int8: Candidate | Placement, int8_engine: Engine, fp32: Candidate, fp32_engine: Engine,
            threads: int | None, performance: str) -> dict[str, Any]:
    """Time the two loaded engines interleaved on golden input 0, decide, and cache the decision."""
    feeds = numerics.golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]
    engines = {"int8": int8_engine, "fp32": fp32_engine}
    for _ in range(WARMUP_PAIRS):
        for engine in engines.values():
            engine.run(feeds)
    times: dict[str, list[float]] = {"int8": [], "fp32": []}
    spent = 0.0
    for i in range(MAX_PAIRS):
        if i >= MIN_PAIRS and spent >= TIME_CAP_S:
            break
        # Each goes first every other pair: the first run after a pause can pay for waking the engine's threads.
        for name in ("int8", "fp32") if i % 2 == 0 else ("fp32", "int8"):
            seconds = time_run(engines[name], feeds)
            times[name].append(seconds)
            spent += seconds
    int8_s, fp32_s = np.asarray(times["int8"]), np.asarray(times["fp32"])
    ratios = int8_s / np.maximum(fp32_s, 1e-12)
    ratio, lower_quartile = float(np.median(ratios)), float(np.percentile(ratios, 25))
    slower = ratio > 1 + MARGIN and lower_quartile > 1.0
    decision = {"int8": _label(int8), "fp32": _label(fp32), "int8_ms": round(float(np.median(int8_s)) * 1e3, 4),
                "fp32_ms": round(float(np.median(fp32_s)) * 1e3, 4), "ratio": round(ratio, 3),
                "pairs": len(ratios), "int8_slower_in": int(np.sum(ratios > 1.0)),
                "chosen": "fp32" if slower else "int8", "cached": False,
                "method": f"{len(ratios)} back-to-back int8/fp32 pairs on golden input 0 after {WARMUP_PAIRS} warm-up; "
                          f"ratio = median of the pairs' int8/fp32; fp32 when it is above {1 + MARGIN:g} and int8 "
                          f"was slower in at least 3 pairs of 4"}
    user_cache.store(_key(bundle, int8, fp32, threads, performance), decision, CACHE_FILE)
    return decision


# -- which engine and precision: the candidates of the first device kind, each timed alone --------------------------
# The profile's engine order is a guess made for a device family; on a given CPU another engine's kernels may be
# clearly faster (OpenVINO's INT8 beats XNNPACK's by ~15% on an AMX Xeon), and INT8 may not beat FP32 at all (LiteRT
# on an AVX2 CPU without VNNI). So at the first load under the speed policies (``speed_check="full"``, the default),
# with no engine, device or artifact named, every candidate on the device kind that comes first (each engine's INT8
# and FP32 artifact) is timed on golden input 0, each alone in the process (opened, timed, closed: engines loaded side
# by side slow each other down through their worker threads, LiteRT by up to 2x, which a served model never sees).
# Then the fastest and the profile's first are timed once more; the fastest displaces the profile's first only when
# it is more than ENGINE_MARGIN faster both times. The decision is cached like the INT8 one.

SPEED_CHECKS = tuple(SpeedCheck)
ENGINE_MARGIN = 0.05
RACE_WARMUP = 2
RACE_MIN_RUNS = 5
RACE_MAX_RUNS = 20
RACE_TIME_CAP_S = 0.1  # per candidate and pass, once RACE_MIN_RUNS are timed


def race_time_run(engine: Engine, feeds: Sequence[np.ndarray]) -> float:
    """Seconds one inference takes in the race (:func:`edgesdk.runtime.timing.seconds`; a seam of its own, so a test
    may fake one check's clock and not the other's)."""
    return timing.seconds(lambda: engine.run(feeds))


def race_applies(speed_check: str, policy: str, engine: str | None, device: str | None, artifact: str | None,
                 performance: str, bundle: Bundle) -> bool:
    """Only for one inference at a time (``performance="throughput"`` is a matter of parallel streams, which a
    latency race does not see) and where golden inputs exist to time on."""
    return (speed_check == SpeedCheck.FULL and policy in POLICIES and engine is None and device is None
            and artifact is None and performance == Performance.LATENCY and bool(bundle.manifest.get("golden")))


def shortlist(eligible: Sequence[Candidate], barred: Collection[str] = (),
              unverified: Collection[tuple[str, str]] = ()) -> list[Candidate]:
    """Every candidate on the device kind of the first candidate, in load order, except artifacts that failed their
    gate (``barred``) and devices only a load can confirm (``unverified``: LiteRT's GPU/NPU, left to the load walk's
    probe)."""
    eligible = [c for c in eligible if (c.engine, c.device) not in unverified]
    if not eligible:
        return []
    kind = eligible[0].kind
    return [c for c in eligible if c.kind == kind and c.artifact not in barred]


def _race_key(bundle: Bundle, entrants: Sequence[Candidate], threads: int | None, performance: str) -> str:
    return autotune.cache_key(bundle, {"race": " vs ".join(c.label() for c in entrants),
                                       "threads": str(threads), "performance": performance})


def cached_race(bundle: Bundle, entrants: Sequence[Candidate], threads: int | None,
                performance: str) -> dict[str, Any] | None:
    decision = user_cache.lookup(_race_key(bundle, entrants, threads, performance), CACHE_FILE)
    if not isinstance(decision, dict) or decision.get("chosen") not in {c.label() for c in entrants}:
        return None
    return {**decision, "cached": True}


def put_first(eligible: list[Candidate], decision: dict[str, Any]) -> list[Candidate]:
    """On the raced device kind: the winner first, then the other candidates of its engine, then the rest (each in
    its order); the places of other kinds' candidates do not change."""
    kind, label = decision["kind"], decision["chosen"]
    engine = next(c.engine for c in eligible if c.label() == label) if any(c.label() == label for c in eligible) \
        else None
    slots = [i for i, c in enumerate(eligible) if c.kind == kind]
    raced = sorted((eligible[i] for i in slots), key=lambda c: (c.label() != label, c.engine != engine))
    order = list(eligible)
    for i, c in zip(slots, raced):
        order[i] = c
    return order


def race_feeds(bundle: Bundle) -> list[np.ndarray]:
    """Golden input 0, what the race times every candidate on (read once per race)."""
    return numerics.golden_feeds(bundle.golden(), len(bundle.manifest["inputs"]))[0]


def time_alone(engine: Engine, feeds: Sequence[np.ndarray]) -> float:
    """Median seconds of one inference of ``engine`` on ``feeds``, after a warm-up (bounded: at most
    ``RACE_WARMUP + RACE_MAX_RUNS`` runs, ``RACE_MIN_RUNS`` once ``RACE_TIME_CAP_S`` is spent)."""
    return timing.run_times(lambda: engine.run(feeds), warmup=RACE_WARMUP, min_runs=RACE_MIN_RUNS,
                            max_runs=RACE_MAX_RUNS, min_s=RACE_TIME_CAP_S,
                            timed=lambda: race_time_run(engine, feeds)).median_s


def leader(first: dict[Candidate, float]) -> Candidate:
    return min(first, key=first.get)


def decide_race(bundle: Bundle, entrants: Sequence[Candidate], first: dict[Candidate, float],
                second: dict[Candidate, float], threads: int | None, performance: str) -> dict[str, Any]:
    """The candidate that serves, from the first pass (every candidate that opened; the first of them is the
    incumbent) and the second (the incumbent and the first pass's leader again); cached under ``entrants``."""
    timed = list(first)
    incumbent, best = timed[0], leader(first)
    ratios = [first[best] / max(first[incumbent], 1e-12)]
    if best in second and incumbent in second:
        ratios.append(second[best] / max(second[incumbent], 1e-12))
    clear = best != incumbent and len(ratios) == 2 and max(ratios) < 1 - ENGINE_MARGIN
    winner = best if clear else incumbent
    decision = {"kind": incumbent.kind, "chosen": winner.label(), "engine": winner.engine,
                "precision": winner.precision, "incumbent": incumbent.label(),
                "timings_ms": {c.label(): round(first[c] * 1e3, 4) for c in timed},
                "leader_ratio": [round(r, 3) for r in ratios], "cached": False,
                "method": f"each candidate alone on golden input 0 (median of {RACE_MIN_RUNS}-{RACE_MAX_RUNS} runs "
                          f"after {RACE_WARMUP} warm-up), then the fastest and the profile's first once more; the "
                          f"fastest displaces the profile's first ({incumbent.label()}) when it is more than "
                          f"{ENGINE_MARGIN:.0%} faster both times"}
    user_cache.store(_race_key(bundle, entrants, threads, performance), decision, CACHE_FILE)
    return decision


def precision_from_race(decision: dict[str, Any], eligible: Sequence[Candidate]) -> dict[str, Any] | None:
    """The INT8-against-FP32 view of a race, for ``placement.precision_choice``: the winner engine's two artifacts as
    the race timed them (None when it timed only one)."""
    on = [c for c in eligible if c.kind == decision["kind"] and c.engine == decision["engine"]]
    int8 = next((c for c in on if c.precision == "int8" and c.label() in decision["timings_ms"]), None)
    fp32 = next((c for c in on if c.precision == "fp32" and c.label() in decision["timings_ms"]), None)
    if int8 is None or fp32 is None:
        return None
    i_ms, f_ms = decision["timings_ms"][int8.label()], decision["timings_ms"][fp32.label()]
    return {"int8": int8.label(), "fp32": fp32.label(), "int8_ms": i_ms, "fp32_ms": f_ms,
            "ratio": round(i_ms / max(f_ms, 1e-9), 3), "pairs": None, "int8_slower_in": None,
            "chosen": decision["precision"], "cached": decision["cached"],
            "method": "from the race (placement.engine_choice): " + decision["method"]}
