"""Memory budget: the cgroup reader (fake trees), refusal, cheaper artifacts, and the LRU pool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgesdk
from edgesdk import Bundle, BudgetExceeded, ModelPool
from edgesdk.budgets.memory import MB, CostBook, cgroup_limit_mb, process_limit, rss_mb


def _cgroup_tree(tmp_path: Path, path: str, limits: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(f"0::{path}\n")
    for group, value in limits.items():
        d = tmp_path / "sys/fs/cgroup" / group.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(value + "\n")
    return tmp_path


def test_cgroup_limit_of_the_process_group(tmp_path):
    root = _cgroup_tree(tmp_path, "/app.slice/edge.scope", {"/app.slice/edge.scope": str(256 * MB)})
    limit, where = cgroup_limit_mb(root)
    assert limit == 256 and where.endswith("app.slice/edge.scope/memory.max")


def test_cgroup_max_means_unlimited_and_the_parent_limit_applies(tmp_path):
    root = _cgroup_tree(tmp_path, "/app.slice/edge.scope",
                        {"/app.slice/edge.scope": "max", "/app.slice": str(100 * MB)})
    assert cgroup_limit_mb(root)[0] == 100


def test_cgroup_max_everywhere_is_no_limit(tmp_path):
    root = _cgroup_tree(tmp_path, "/a/b", {"/a/b": "max", "/a": "max"})
    assert cgroup_limit_mb(root) == (None, None)


def test_no_cgroup_v2_line_is_no_limit(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("12:memory:/docker/abc\n")  # v1 only
    assert cgroup_limit_mb(tmp_path) == (None, None)
    assert cgroup_limit_mb(tmp_path / "nothing") == (None, None)


def test_process_limit_is_the_smallest(tmp_path):
    root = _cgroup_tree(tmp_path, "/g", {"/g": str(300 * MB)})
    assert process_limit(None, root).source.startswith("cgroup:")
    assert process_limit(None, root).limit_mb == 300
    assert process_limit(200, root).source == "budget"
    assert process_limit(10**9, root).limit_mb == 300


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_model_larger_than_the_budget_is_refused(digits_bundle, cache):
    with pytest.raises(BudgetExceeded, match=r"no artifact of 'digits' fits: loading .* needs ~[\d.]+ MB; the limit "
                                             r"is 1 MB \(budget\) and the process already uses \d+ MB") as info:
        edgesdk.load(digits_bundle.bundle, memory_mb=1)
    assert info.value.reason == "memory"
    assert info.value.needed > 0 and info.value.available == 0


def test_a_cheaper_artifact_is_chosen_when_the_asked_one_does_not_fit(digits_bundle, cache):
    bundle = Bundle.open(digits_bundle.bundle)
    book = CostBook()
    for aid, cost in (("onnxruntime-fp32", 5000.0), ("onnxruntime-int8", 5.0)):
        sha = bundle.artifact(aid).entry["files"][0]["sha256"]
        book.remember(CostBook.key(sha, "onnxruntime", "CPUExecutionProvider"), cost)
    model = edgesdk.load(digits_bundle.bundle, require="onnxruntime", artifact="onnxruntime-fp32",
                         memory_mb=rss_mb() + 200)
    assert model.placement.artifact == "onnxruntime-int8"
    assert model.budget["action"] == "artifact_switched"
    skipped = [s for s in model.placement.skipped if s.candidate.artifact == "onnxruntime-fp32"]
    assert skipped and skipped[0].reason == "memory" and "needs ~5000.0 MB" in skipped[0].detail
    assert model.predict(bundle.golden()["input_0"][:1]).budget["action"] == "artifact_switched"


def _copies(src: Path, tmp_path: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        shutil.copytree(src, tmp_path / f"m{i}.bundle")
        out.append(tmp_path / f"m{i}.bundle")
    return out


def test_pool_unloads_the_least_recently_used_model(digits_bundle, cache, tmp_path):
    a, b, c = _copies(digits_bundle.bundle, tmp_path, 3)
    edgesdk.load(a, require="onnxruntime", artifact="onnxruntime-int8").close()  # warm: later loads learn nothing new
    # Charge each model a fixed, known cost, so the RSS noise of the test process cannot decide the outcome.
    cost = 40.0
    sha = Bundle.open(a).artifact("onnxruntime-int8").entry["files"][0]["sha256"]
    CostBook().remember(CostBook.key(sha, "onnxruntime", "CPUExecutionProvider"), cost)
    opts = {"require": "onnxruntime", "artifact": "onnxruntime-int8"}
    with ModelPool(rss_mb() + 2.5 * cost, **opts) as pool:
        pool.get(a)
        pool.get(b)
        pool.get(a)  # a is now more recent than b
        pool.get(c)  # does not fit: b goes
        assert pool.evicted == [str(b.resolve())]
        assert sorted(pool.loaded) == sorted([str(a.resolve()), str(c.resolve())])
        x = Bundle.open(a).golden()["input_0"][:1]
        assert pool.predict(b, x).top  # b comes back; a (least recent now) goes
        assert pool.evicted[-1] == str(a.resolve())


def test_pool_refuses_a_model_that_fits_nowhere(digits_bundle, cache):
    with ModelPool(rss_mb() + 0.01, require="onnxruntime") as pool:
        with pytest.raises(BudgetExceeded, match=r"needs ~[\d.]+ MB; .* so [\d.]+ MB are available"):
            pool.get(digits_bundle.bundle)


def test_pool_budget_must_be_positive():
    with pytest.raises(edgesdk.InputError, match=r"memory_mb must be positive, got 0"):
        ModelPool(0)


POOL_SCRIPT = """
import json, shutil, sys
from pathlib import Path
import edgesdk
from edgesdk.budgets.memory import rss_mb
src, tmp = Path(sys.argv[1]), Path(sys.argv[2])
paths = []
for i in range(4):
    shutil.copytree(src, tmp / f"p{i}.bundle")
    paths.append(tmp / f"p{i}.bundle")
probe = edgesdk.load(paths[0], require="onnxruntime", artifact="onnxruntime-int8")
cost = probe.cost_mb
probe.close()
budget = rss_mb() + 2.5 * cost
pool = edgesdk.ModelPool(budget, require="onnxruntime", artifact="onnxruntime-int8")
peak = 0.0
x = edgesdk.Bundle.open(paths[0]).golden()["input_0"][:1]
for round_ in range(3):
    for p in paths:
        pool.predict(p, x)
        peak = max(peak, rss_mb())
print(json.dumps({"budget": budget, "peak": peak, "evicted": len(pool.evicted), "cost": cost}))
"""


def test_process_rss_stays_within_the_budget_plus_ten_percent(digits_bundle, cache, tmp_path):
    """Measured in a fresh process: four models cycled through a pool sized for two and a half."""
    proc = subprocess.run([sys.executable, "-c", POOL_SCRIPT, str(digits_bundle.bundle), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["evicted"] >= 8  # the pool really cycled
    assert report["peak"] <= 1.10 * report["budget"], report


def _profile_with_budget(tmp_path: Path, budget_mb: int) -> Path:
    """A copy of the generic profile of this machine with a memory default."""
    from edgesdk.runtime.profiles import detect_profile

    source = detect_profile()[0].source
    text = source.read_text().replace(f'name = "{source.stem}"', 'name = "tiny-board"')
    path = tmp_path / "tiny-board.toml"
    path.write_text(text + f"\n[memory]\nbudget_mb = {budget_mb}\n")
    return path


def test_the_profile_memory_default_applies(digits_bundle, cache, tmp_path):
    with pytest.raises(BudgetExceeded, match=r"the limit is 1 MB \(budget\)"):
        edgesdk.load(digits_bundle.bundle, profile=str(_profile_with_budget(tmp_path, 1)))


def test_an_explicit_budget_overrides_the_profile_default(digits_bundle, cache, tmp_path):
    profile = str(_profile_with_budget(tmp_path, 1))
    budgets = edgesdk.Budgets(memory_mb=rss_mb() + 1000)
    with edgesdk.load(digits_bundle.bundle, edgesdk.RuntimeOptions(profile=profile, budgets=budgets)) as model:
        assert model.budget["memory"]["source"] == "budget"
        assert model.budget["memory"]["limit_mb"] == pytest.approx(budgets.memory_mb, abs=0.1)
    with edgesdk.load(digits_bundle.bundle, profile=profile, memory_mb=rss_mb() + 1000) as model:  # shortcut
        assert model.budget["memory"]["limit_mb"] > 100


def test_a_non_positive_budget_is_refused(digits_bundle):
    with pytest.raises(edgesdk.InputError, match=r"memory_mb must be positive, got -5"):
        edgesdk.load(digits_bundle.bundle, memory_mb=-5)
