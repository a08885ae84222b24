"""ModelPool's lock, loads and unloads: a load runs outside the pool's lock (calls on loaded models go on meanwhile),
one load at a time and once per bundle, within the budget; unload never closes a leased model; a model that cannot
fit even in an empty pool is refused at once."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

import edgesdk
from edgesdk import Bundle, BudgetExceeded, InputError, ModelPool
from edgesdk.budgets.memory import CostBook, rss_mb

OPTS = {"require": "onnxruntime", "artifact": "onnxruntime-int8"}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def copies(digits_bundle, cache, tmp_path) -> list[Path]:
    """Three copies of the digits bundle (one artifact sha256, so one remembered cost), the engine warmed."""
    out = [shutil.copytree(digits_bundle.bundle, tmp_path / f"{n}.bundle") for n in "abc"]
    edgesdk.load(out[0], **OPTS).close()  # warm: later loads learn nothing new
    return out


def _charge(path: Path, cost_mb: float) -> None:
    """What the pool will charge for each ONNX artifact from now on (the RSS noise of the test cannot decide; each, so
    the load cannot switch to a cheaper one)."""
    bundle = Bundle.open(path)
    for aid in ("onnxruntime-int8", "onnxruntime-fp32"):
        sha = bundle.artifact(aid).entry["files"][0]["sha256"]
        CostBook().remember(CostBook.key(sha, "onnxruntime", "CPUExecutionProvider"), cost_mb)


def _x(path: Path):
    return Bundle.open(path).golden()["input_0"][:1]


def test_predicts_on_a_loaded_model_go_on_while_another_model_loads(copies):
    """The load of b (isolated: a child process opens it first, about half a second) used to hold the pool's lock,
    so every predict on a, and every lease given back, waited for it."""
    a, b, _ = copies
    x = _x(a)
    stop = threading.Event()
    finished: list[float] = []
    failures: list[BaseException] = []
    window: dict[str, float] = {}

    def predicts() -> None:
        while not stop.is_set():
            try:
                pool.predict(a, x)
            except BaseException as exc:  # noqa: BLE001 - counted
                failures.append(exc)
                return
            finished.append(time.monotonic())

    def load_b() -> None:
        window["start"] = time.monotonic()
        pool.get(b)
        window["end"] = time.monotonic()

    with ModelPool(rss_mb() + 1000, isolate=True, **OPTS) as pool:
        pool.get(a)
        workers = [threading.Thread(target=predicts) for _ in range(2)]
        for t in workers:
            t.start()
        while not finished:  # the predicts are running before the load starts
            time.sleep(0.01)
        loader = threading.Thread(target=load_b)
        loader.start()
        loader.join(timeout=120)
        stop.set()
        for t in workers:
            t.join(timeout=60)
        assert not failures
        assert str(b.resolve()) in pool.loaded
    during = [t for t in finished if window["start"] < t < window["end"]]
    # a generous bound on behaviour, not a benchmark: hundreds complete here, none did when the load held the lock
    assert len(during) >= 5, f"{len(during)} predicts finished during a {window['end'] - window['start']:.2f} s load"


def test_threads_asking_for_one_bundle_load_it_once(copies):
    a = copies[0]
    got: list[object] = []
    with ModelPool(rss_mb() + 1000, isolate=True, **OPTS) as pool:
        threads = [threading.Thread(target=lambda: got.append(pool.get(a))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(got) == 4 and all(m is got[0] for m in got)
        assert pool.loaded == [str(a.resolve())] and not pool.evicted


def test_two_loads_at_once_cannot_both_take_the_room(copies):
    """Room for one and a half models: two threads lease a and b at once. One serves; the other waits for the lease,
    then is refused. The pool never accounts more than its budget."""
    a, b, _ = copies
    _charge(a, 40.0)
    held = threading.Event()
    release = threading.Event()
    outcomes: dict[str, object] = {}
    peak: list[float] = []

    def hold(path: Path) -> None:
        try:
            with pool.lease(path):
                outcomes[path.name] = "leased"
                held.set()
                release.wait(30)
        except BudgetExceeded as exc:
            outcomes[path.name] = exc

    with ModelPool(rss_mb() + 60.0, wait_s=0.5, **OPTS) as pool:
        threads = [threading.Thread(target=hold, args=(p,)) for p in (a, b)]
        for t in threads:
            t.start()
        assert held.wait(60)
        while len(outcomes) < 2:
            peak.append(pool.in_use_mb())
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join(timeout=60)
        assert sorted(map(type, outcomes.values()), key=str) == sorted([str, BudgetExceeded], key=str)
        refused = next(v for v in outcomes.values() if isinstance(v, BudgetExceeded))
        assert "every loaded model is in use" in str(refused)
        assert max(peak) <= pool.memory_mb and len(pool.loaded) == 1


def test_a_failed_load_reaches_every_thread_that_waited_for_it(cache, tmp_path):
    missing = tmp_path / "nothing.bundle"
    errors: list[BaseException] = []

    def get() -> None:
        try:
            pool.get(missing)
        except edgesdk.EdgeSDKError as exc:
            errors.append(exc)

    with ModelPool(100) as pool:
        threads = [threading.Thread(target=get) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(errors) == 3 and pool.loaded == [] and pool.state()["loading"] is None


def test_unload_refuses_a_leased_model_and_leaves_it_open(copies):
    a = copies[0]
    x = _x(a)
    with ModelPool(rss_mb() + 1000, wait_s=0.2, **OPTS) as pool:
        with pool.lease(a) as model:
            with pytest.raises(InputError, match=r"cannot unload a.bundle: 1 lease still holds it after 0.2 s "
                                                 r"\(ModelPool wait_s\); it stays loaded"):
                pool.unload(a)
            assert model.predict(x).top  # not closed under its holder
            assert pool.loaded == [str(a.resolve())]
        pool.unload(a)  # returned: unloaded
        assert pool.loaded == []


def test_unload_waits_for_a_lease_that_ends_in_time(copies):
    a = copies[0]
    with ModelPool(rss_mb() + 1000, wait_s=30, **OPTS) as pool:
        leased = threading.Event()

        def hold() -> None:
            with pool.lease(a):
                leased.set()
                time.sleep(0.3)

        t = threading.Thread(target=hold)
        t.start()
        assert leased.wait(60)
        pool.unload(a)
        assert pool.loaded == []
        t.join(timeout=60)


def test_a_model_that_cannot_fit_even_alone_is_refused_at_once_evicting_nothing(copies):
    """Used to evict every idle model, then wait all of wait_s for the leased ones, and say they were in use."""
    a, b, c = copies
    _charge(a, 40.0)
    with ModelPool(rss_mb() + 60.0, wait_s=30, **OPTS) as pool:
        pool.get(a)
        _charge(a, 5000.0)  # b and c share a's artifacts: from now on each is charged more than the whole pool
        with pytest.raises(BudgetExceeded, match=r"needs ~5000.0 MB.*cannot fit in this pool even with no other "
                                                 r"model loaded") as info:
            pool.get(b)
        assert info.value.reason == "memory" and info.value.needed == 5000.0
        assert pool.loaded == [str(a.resolve())] and pool.evicted == []
        with pool.lease(a):
            started = time.monotonic()
            with pytest.raises(BudgetExceeded, match=r"cannot fit in this pool even"):
                pool.get(c)
            assert time.monotonic() - started < 10  # not the 30 s wait for a's lease
