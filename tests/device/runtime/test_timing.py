"""The one timing loop (edgesdk.runtime.timing.run_times): its stopping rules, and that autotune, the speed race,
``edgesdk bench`` and the op profilers all time through it (each with its own numbers)."""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.runtime import autotune, precision_choice, timing


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def test_warm_up_then_exactly_the_runs_asked_for():
    call = Counter()
    got = timing.run_times(call, warmup=3, min_runs=7, max_runs=7)
    assert (got.warmup_runs, len(got.seconds), call.calls) == (3, 7, 10)
    assert got.median_ms == pytest.approx(got.median_s * 1e3) and all(s >= 0 for s in got.seconds)


def test_min_seconds_run_on_until_the_cap_and_max_runs_zero_is_the_warm_up_alone():
    fake = iter([0.01] * 100)
    got = timing.run_times(Counter(), min_runs=2, max_runs=20, min_s=0.05, timed=lambda: next(fake))
    assert len(got.seconds) == 5  # five fake 10 ms runs reach min_s
    got = timing.run_times(Counter(), min_runs=2, max_runs=3, min_s=1.0, timed=lambda: 0.01)
    assert len(got.seconds) == 3  # max_runs wins over min_s
    got = timing.run_times(Counter(), min_runs=100, max_s=0.03, timed=lambda: 0.01)
    assert len(got.seconds) == 3  # max_s wins over min_runs
    call = Counter()
    got = timing.run_times(call, warmup=4, max_runs=0)
    assert (got.seconds, got.warmup_runs, call.calls) == ((), 4, 4)


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Every call of the one timing loop, with its keyword arguments; a cache dir of its own so nothing is cached."""
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "cache"))
    real, calls = timing.run_times, []

    def spy(call, **kw):
        calls.append(kw)
        return real(call, **kw)

    monkeypatch.setattr(timing, "run_times", spy)
    return calls


def test_autotune_times_through_it(digits_bundle, recorded):
    with edgesdk.load(digits_bundle.bundle, policy="autotune", engine="onnxruntime"):
        pass
    assert recorded and all(kw == {"warmup": autotune.WARMUP, "min_runs": autotune.RUNS, "max_runs": autotune.RUNS}
                            for kw in recorded)


def test_the_race_times_through_it(digits_bundle, recorded):
    with edgesdk.load(digits_bundle.bundle, speed_check="full") as model:
        assert model.placement.engine_choice is not None
    assert len(recorded) >= 2
    assert all(kw["warmup"] == precision_choice.RACE_WARMUP and kw["max_runs"] == precision_choice.RACE_MAX_RUNS
               for kw in recorded)


def test_bench_and_the_op_profilers_time_through_it(digits_bundle, recorded):
    from edgesdk.bench.ops.timing import time_call
    from edgesdk.bench.warm import BenchOptions, MIN_QUERIES_P99, WARMUP_QUERIES, measure_backend

    row = measure_backend(str(digits_bundle.bundle), "onnxruntime", "CPUExecutionProvider", "onnxruntime-int8",
                          BenchOptions(scenario="single-stream", duration_s=0.05, cold_start=False))
    warm, single = recorded
    assert warm["warmup"] == WARMUP_QUERIES and warm["max_runs"] == 0  # the warm-up alone, then the timed queries
    assert single["min_runs"] == MIN_QUERIES_P99 and row["queries"] >= MIN_QUERIES_P99
    recorded.clear()
    assert time_call(Counter(), 3, 0.0) >= 0 and recorded == [{"warmup": 2, "min_runs": 3, "max_runs": 60,
                                                                "min_s": 0.0, "wall": True}]
