"""The memory budget: the process's real limit, what each model costs, and whether the next one fits.

The limit is the smallest of the app's budget (``memory_mb``), the cgroup v2 ``memory.max`` of the
process (containers, Android-like sandboxes) and the physical memory. A model's cost is its artifact
files plus the engine's working memory, measured at load as the growth of the process RSS and
remembered per (artifact, engine, device) in the user cache dir, so later loads predict it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..atomic_file import write_json_atomic
from ..choices import BudgetReason
from ..errors import BudgetExceeded
from ..user_cache import cache_dir

MB = 1024 * 1024
# Working memory of an engine before it was ever measured here: a deliberately high guess.
ENGINE_BASE_MB = {"litert": 8.0, "onnxruntime": 24.0, "openvino": 48.0}
FILE_FACTOR = 2.0  # weights are read, then repacked for the kernels


@dataclass(frozen=True)
class MemoryLimit:
    limit_mb: float
    source: str  # "budget", "cgroup:/sys/fs/cgroup/.../memory.max" or "physical"


def cgroup_limit_mb(root: str | Path = "/") -> tuple[float | None, str | None]:
    """The cgroup v2 ``memory.max`` of this process, in MB (None when unlimited or not in a cgroup v2)."""
    root = Path(root)
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    path = next((ln[3:] for ln in lines if ln.startswith("0::")), None)  # the v2 unified hierarchy
    if path is None:
        return None, None
    base = root / "sys/fs/cgroup"
    group = base / path.lstrip("/")
    # The closest limit up the hierarchy is the one that applies.
    while True:
        try:
            text = (group / "memory.max").read_text().strip()
        except OSError:
            text = None
        if text and text != "max":
            try:
                return int(text) / MB, str(group / "memory.max")
            except ValueError:
                return None, None
        if group == base or base not in group.parents:
            return None, None
        group = group.parent


def process_limit(budget_mb: float | None = None, root: str | Path = "/") -> MemoryLimit:
    physical = psutil.virtual_memory().total / MB
    best = MemoryLimit(physical, "physical")
    cg, where = cgroup_limit_mb(root)
    if cg is not None and cg < best.limit_mb:
        best = MemoryLimit(cg, f"cgroup:{where}")
    if budget_mb is not None and budget_mb < best.limit_mb:
        best = MemoryLimit(float(budget_mb), "budget")
    return best


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


class CostBook:
    """Remembered working memory per (artifact sha256, engine, device), in the user cache dir."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / "memory.json"
        try:
            self._data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._data = {}

    @staticmethod
    def key(sha256: str, engine: str, device: str) -> str:
        return f"{sha256}:{engine}:{device}"

    def expected_mb(self, key: str, file_bytes: int, engine: str) -> tuple[float, bool]:
        """(cost in MB, measured?) - a measured value when there is one, else a cautious estimate."""
        if key in self._data:
            return float(self._data[key]), True
        return FILE_FACTOR * file_bytes / MB + ENGINE_BASE_MB.get(engine, 32.0), False

    def remember(self, key: str, cost_mb: float) -> None:
        self._data[key] = round(max(cost_mb, 0.0), 2)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self._data)
        except OSError:
            pass  # a read-only home only costs the estimate next time


def check_fits(label: str, needed_mb: float, limit: MemoryLimit, in_use_mb: float) -> None:
    """Raise BudgetExceeded(memory) when loading ``needed_mb`` more on top of ``in_use_mb`` passes the limit."""
    in_use = in_use_mb
    available = limit.limit_mb - in_use
    if needed_mb > available:
        raise BudgetExceeded(
            BudgetReason.MEMORY,
            f"loading {label} needs ~{needed_mb:.1f} MB; the limit is {limit.limit_mb:.0f} MB ({limit.source}) and "
            f"the process already uses {in_use:.0f} MB, so {max(available, 0):.1f} MB are available",
            needed=round(needed_mb, 2), available=round(max(available, 0.0), 2))
