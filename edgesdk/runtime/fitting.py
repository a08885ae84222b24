"""Budget fitting for the load walk: the memory limit a load works under, what a candidate is expected to cost
(and what it was charged once opened: the cost learned from a cold load), whether the speed race may open its
entrants, which candidates a loaded model may switch to under a thermal budget, and the budget entry a model starts
with. The limit and the cost book themselves are :mod:`edgesdk.budgets.memory`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..budgets import memory
from ..bundle.reader import Bundle
from ..errors import InputError
from .placement import Candidate

# Engines that served a load in this process (their libraries are warm): only a cold load shows an engine's full cost.
WARM_ENGINES: set[str] = set()


def memory_limit(budget_mb: float | None, profile: Any) -> memory.MemoryLimit:
    """The process's memory limit under the app's ``budget_mb``, else the platform profile's ``memory.budget_mb``
    where it has one (the cgroup and physical limits apply either way)."""
    if budget_mb is None and profile is not None:
        budget_mb = profile.memory.get("budget_mb")  # the device family's default, where it has one
    if budget_mb is not None and not budget_mb > 0:
        raise InputError(f"memory_mb must be positive, got {budget_mb!r}")
    return memory.process_limit(budget_mb)


def _file_bytes(bundle: Bundle, artifact: str) -> int:
    return sum(f["bytes"] for f in bundle.artifact(artifact).entry["files"])


@dataclass(frozen=True)
class Expected:
    """What opening a candidate is expected to cost: ``mb`` (``measured`` here before, or estimated from
    ``file_bytes``), remembered in the cost book under ``key``."""

    key: str
    file_bytes: int
    mb: float
    measured: bool


def expected(bundle: Bundle, cand: Candidate, costs: memory.CostBook) -> Expected:
    files = bundle.artifact(cand.artifact).entry["files"]
    key = memory.CostBook.key(files[0]["sha256"], cand.engine, cand.device)
    file_bytes = sum(f["bytes"] for f in files)
    return Expected(key, file_bytes, *costs.expected_mb(key, file_bytes, cand.engine))


def charged(costs: memory.CostBook, cand: Candidate, cost: Expected, rss_before_mb: float) -> float:
    """Learn what opening ``cand`` cost (the RSS growth since ``rss_before_mb``, at least its files) and return what
    the model is charged. Only a cold load (its engine's first in this process) shows the full cost, libraries
    included; a warm one grows the RSS less (pages reused), so it does not overwrite what was learned."""
    measured_now = max(memory.rss_mb() - rss_before_mb, cost.file_bytes / memory.MB)
    if cand.engine not in WARM_ENGINES or not cost.measured:
        costs.remember(cost.key, measured_now)
    WARM_ENGINES.add(cand.engine)
    return costs.expected_mb(cost.key, 0, cand.engine)[0]


def budget_entry(limit: memory.MemoryLimit, charged_mb: float, cost: Expected, switched: bool) -> dict[str, Any]:
    """A loaded model's budget state: its memory limit and cost, and ``artifact_switched`` when the budget ruled out
    a candidate before it."""
    return {"memory": {"limit_mb": round(limit.limit_mb, 1), "source": limit.source,
                       "model_mb": round(charged_mb, 2), "expected_mb": round(cost.mb, 2),
                       "expected_was_measured": cost.measured},
            "action": "artifact_switched" if switched else None}


def race_fits(bundle: Bundle, entrants: list[Candidate], costs: memory.CostBook, limit: memory.MemoryLimit,
              in_use: float) -> bool:
    """Whether the race may open every entrant: one at a time, but each engine's runtime stays in the process."""
    need = sum(expected(bundle, c, costs).mb for c in entrants)
    return need <= limit.limit_mb - in_use


def switch_candidates(cands: list[Candidate], bundle: Bundle, costs: memory.CostBook, limit: memory.MemoryLimit,
                      in_use: float, loaded: Candidate) -> list[Candidate]:
    """The candidates a loaded model may switch to without breaking the memory limit. On the loaded engine (its
    runtime is in memory already) an artifact whose files are no larger than the loaded one's; on another, one
    whose expected cost fits beside what is in use now (both engines live for a moment during the switch)."""
    fitting = []
    for c in cands:
        if c.engine == loaded.engine:
            if _file_bytes(bundle, c.artifact) <= _file_bytes(bundle, loaded.artifact):
                fitting.append(c)
            continue
        if expected(bundle, c, costs).mb <= limit.limit_mb - in_use:
            fitting.append(c)
    return fitting


__all__ = ["WARM_ENGINES", "memory_limit", "Expected", "expected", "charged", "budget_entry", "race_fits",
           "switch_candidates"]
