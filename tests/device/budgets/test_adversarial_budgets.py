"""Adversarial cases for the budgets (issue 15): a pool under concurrent load with a tight budget, hostile pool
arguments, and thermal sensor files that are FIFOs, devices or huge. Cases that could hang or allocate without
bound run in a child process under RLIMIT_AS and a timeout, so a regression fails the test, not the machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import edgesdk
from edgesdk import Bundle, BudgetExceeded, InputError, ModelPool
from edgesdk.budgets.memory import CostBook, rss_mb
from edgesdk.budgets.thermal.sensors import LinuxThermalZones

REPO = Path(__file__).resolve().parents[3]


def _child(code: str, *args: str, limit_mb: int = 1024, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python under an address-space limit and a timeout."""
    prelude = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_mb << 20}, {limit_mb << 20}))\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- the pool under load ----------------------------------------------------------------------------------------


def test_eight_threads_over_four_bundles_with_a_tight_budget_never_fail(digits_bundle, cache, tmp_path):
    """The issue's load pattern: 8 threads x 60 predictions over 4 copies of the digits bundle, room for 2.5 models.
    Before leases, eviction closed models other threads were about to use (288 of 480 calls failed)."""
    paths = []
    for i in range(4):
        shutil.copytree(digits_bundle.bundle, tmp_path / f"m{i}.bundle")
        paths.append(tmp_path / f"m{i}.bundle")
    opts = {"require": "onnxruntime", "artifact": "onnxruntime-int8"}
    edgesdk.load(paths[0], **opts).close()  # warm: later loads learn nothing new
    cost = 40.0  # a fixed, known cost: the RSS noise of the test process cannot decide the outcome
    sha = Bundle.open(paths[0]).artifact("onnxruntime-int8").entry["files"][0]["sha256"]
    CostBook().remember(CostBook.key(sha, "onnxruntime", "CPUExecutionProvider"), cost)
    x = Bundle.open(paths[0]).golden()["input_0"][:1]
    failures: list[BaseException] = []
    answers: list[int] = []

    def work(seed: int) -> None:
        for i in range(60):
            try:
                answers.append(pool.predict(paths[(seed + i) % 4], x).top[0].index)
            except BaseException as exc:  # noqa: BLE001 - every failure is counted
                failures.append(exc)

    with ModelPool(rss_mb() + 2.5 * cost, **opts) as pool:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)
        assert not failures, f"{len(failures)} of 480 calls failed, first: {failures[0]!r}"
        assert len(answers) == 480 and len(set(answers)) == 1
        assert pool.evicted  # the budget really forced evictions
        assert len(pool.loaded) <= 2


def test_a_leased_model_is_not_evicted_and_the_load_waits_for_it(digits_bundle, cache, tmp_path):
    a, b = (shutil.copytree(digits_bundle.bundle, tmp_path / f"{n}.bundle") for n in "ab")
    opts = {"require": "onnxruntime", "artifact": "onnxruntime-int8"}
    sha = Bundle.open(a).artifact("onnxruntime-int8").entry["files"][0]["sha256"]
    CostBook().remember(CostBook.key(sha, "onnxruntime", "CPUExecutionProvider"), 40.0)
    x = Bundle.open(a).golden()["input_0"][:1]
    with ModelPool(rss_mb() + 60.0, wait_s=0.3, **opts) as pool:
        with pool.lease(a) as model:
            with pytest.raises(BudgetExceeded, match=r"every loaded model is in use \(a.bundle \(1 lease\)\) and none "
                                                     r"was returned within 0.3 s"):
                pool.get(b)
            assert model.predict(x).top  # still open
        done = threading.Event()
        with pool.lease(a):
            threading.Thread(target=lambda: (pool.predict(b, x), done.set())).start()
            time.sleep(0.1)
            assert not done.is_set()  # waiting for the lease on a
        assert done.wait(30)
        assert pool.evicted == [str(Path(a).resolve())]


@pytest.mark.parametrize("kwargs, match", [
    ({"memory_mb": "abc"}, r"memory_mb must be positive, got 'abc'"),
    ({"memory_mb": float("nan")}, r"memory_mb must be positive, got nan"),
    ({"memory_mb": True}, r"memory_mb must be positive, got True"),
    ({"memory_mb": -5}, r"memory_mb must be positive, got -5"),
    ({"memory_mb": 100, "wait_s": "soon"}, r"wait_s must be a number of seconds >= 0, got 'soon'"),
    ({"memory_mb": 100, "wait_s": float("inf")}, r"wait_s must be a number of seconds >= 0, got inf"),
    ({"memory_mb": 100, "wait_s": False}, r"wait_s must be a number of seconds >= 0, got False"),
    ({"memory_mb": 100, "wait_s": True}, r"wait_s must be a number of seconds >= 0, got True"),
    ({"memory_mb": 100, "options": {"policy": "auto"}}, r"options must be a RuntimeOptions or None, got dict"),
    ({"memory_mb": 100, "threads": 100000}, r"threads must be an integer from 1 to 256"),
    ({"memory_mb": 100, "colour": "red"}, r"unknown option"),
])
def test_pool_arguments_are_checked(kwargs, match):
    with pytest.raises(InputError, match=match):
        ModelPool(**kwargs)


def test_a_pool_path_must_be_a_path():
    with ModelPool(100) as pool, pytest.raises(InputError, match=r"must be a str or a Path \(or a BundleStore\), got int"):
        pool.get(3)


# -- thermal sensor files -------------------------------------------------------------------------------------------


def _zone(root: Path, temp: str | None = "45000") -> Path:
    zone = root / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    if temp is not None:
        (zone / "temp").write_text(temp + "\n")
    return zone


SENSOR_CHILD = """
import json, sys
from edgesdk.budgets.thermal.sensors import LinuxThermalZones
reading = LinuxThermalZones(sys.argv[1]).read()
print(json.dumps({"t": reading.temperature_c, "skipped": reading.detail["skipped"]}))
"""


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge", "directory"])
def test_a_sensor_file_that_is_not_a_small_regular_file_is_skipped_at_once(tmp_path, kind):
    zone = _zone(tmp_path, temp=None)
    temp = zone / "temp"
    if kind == "fifo":
        os.mkfifo(temp)  # no writer: a blocking open would hang forever
    elif kind == "dev_zero":
        temp.symlink_to("/dev/zero")  # endless: a whole read runs out of memory
    elif kind == "huge":
        with open(temp, "wb") as f:
            f.truncate(512 << 20)  # sparse: 512 MB of zeros read whole would pass the child's limit
    else:
        temp.mkdir()
    proc = _child(SENSOR_CHILD, str(tmp_path), limit_mb=1024, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["t"] is None
    assert "thermal_zone0" in out["skipped"]
    reason = out["skipped"]["thermal_zone0"]
    assert ("not a regular file" in reason) if kind in ("fifo", "dev_zero", "directory") else ("more than" in reason)


def test_a_fifo_zone_type_does_not_hang_the_constructor(tmp_path):
    zone = _zone(tmp_path)
    (zone / "type").unlink()
    os.mkfifo(zone / "type")
    proc = _child(SENSOR_CHILD, str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"t": 45.0' in proc.stdout


def test_sysfs_like_files_still_read(tmp_path):
    _zone(tmp_path, temp="51234")
    assert LinuxThermalZones(tmp_path).read().temperature_c == pytest.approx(51.234)


TPU_CHILD = """
import sys
from edgesdk.budgets.thermal.sensors import EdgeTpuTemperature
reading = EdgeTpuTemperature(sys.argv[1]).read()
print(reading.temperature_c, reading.detail["skipped"])
"""


def test_an_edge_tpu_temp_that_is_dev_zero_is_skipped(tmp_path):
    chip = tmp_path / "class" / "apex" / "apex_0"
    chip.mkdir(parents=True)
    (chip / "temp").symlink_to("/dev/zero")
    proc = _child(TPU_CHILD, str(tmp_path), limit_mb=1024, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("None {'apex_0': ") and "not a regular file" in proc.stdout
