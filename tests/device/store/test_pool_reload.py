"""ModelPool serving a BundleStore: reload() moves it onto the version active now without dropping a call in flight
on another thread (a lease keeps the old model until it ends, then it is closed; new calls get the new one), under
load from other threads, and after an automatic rollback told by on_change."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PIL import Image

import edgesdk
from edgesdk import BundleStore, InputError, ModelPool, Probation
from edgesdk.budgets.memory import rss_mb
from store_support import FAST, LOAD


@pytest.fixture
def pool():
    with ModelPool(rss_mb() + 2000, **LOAD) as found:
        yield found


def _x(store: BundleStore):
    return edgesdk.Bundle.open(store.active_path()).golden()["input_0"][:1]


def test_reload_keeps_a_call_in_flight_on_the_old_model_and_sends_new_calls_to_the_new(store, versions, pool):
    first = store.install(versions[0])
    x = _x(store)
    assert pool.predict(store, x).top
    holding, go_on = threading.Event(), threading.Event()
    answers: list[str] = []
    failures: list[BaseException] = []
    held: list = []

    def in_flight() -> None:
        try:
            with pool.lease(store) as model:
                held.append(model)
                answers.append(model.bundle.manifest["version"])
                holding.set()
                go_on.wait(30)
                answers.append(model.predict(x).top[0].label)  # after the swap: still the model it started with
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    worker = threading.Thread(target=in_flight)
    worker.start()
    assert holding.wait(30)
    second = store.install(versions[1])
    assert pool.reload() == [str(second.path.resolve())]
    with pool.lease(store) as model:  # a new call: the new version
        assert model.bundle.root.resolve() == second.path.resolve()
    assert held[0].bundle.root.resolve() == first.path.resolve()
    assert held[0].predict(x).top  # not closed while its lease holds it
    go_on.set()
    worker.join(30)
    assert failures == [] and answers[0] == "1" and len(answers) == 2
    with pytest.raises(InputError, match="was closed"):  # closed when the lease ended
        held[0].predict(x)
    assert pool.loaded == [str(store.root.resolve())]
    assert pool.reload() == []  # already on the active version


def test_reload_under_load_from_other_threads_drops_nothing(tmp_path, versions, pool):
    # no probation: the same input over and over is a drifted stream, which would roll a version back by itself
    store = BundleStore(tmp_path / "s", FAST, probation=None)
    store.install(versions[0])
    x = _x(store)
    stop = threading.Event()
    done: list[str] = []
    failures: list[BaseException] = []

    def predicts() -> None:
        while not stop.is_set():
            try:
                pool.predict(store, x)
                done.append("ok")
            except BaseException as exc:  # noqa: BLE001 - counted
                failures.append(exc)
                return

    workers = [threading.Thread(target=predicts) for _ in range(3)]
    for t in workers:
        t.start()
    try:
        for version in (versions[1], versions[2], versions[0]):
            store.install(version, allow_rejected=True)
            before = len(done)
            assert pool.reload()
            while len(done) < before + 20 and not failures:
                time.sleep(0.005)
        store.rollback()
        assert pool.reload()
    finally:
        stop.set()
        for t in workers:
            t.join(30)
    assert failures == []
    with pool.lease(store) as model:
        assert model.bundle.root.resolve() == store.active_path().resolve()


def test_a_probation_rollback_reloads_the_pool_through_on_change(tmp_path, versions, pool, digits_images):
    store = BundleStore(tmp_path / "s", FAST, probation=Probation(predictions=500))
    first = store.install(versions[0])
    second = store.install(versions[1])
    store.on_change(lambda event: pool.reload(store))
    files = sorted(digits_images.glob("val/*/*.png"))
    dark = [(np.asarray(Image.open(f).convert("L")) * 0.5).astype(np.uint8) for f in files[:100]]
    for i in range(400):
        pool.predict(store, dark[i % len(dark)])  # the pool's model of version 2 is watched: pool.get let it
        if store.active().id != second.id:
            break
    assert store.active().id == first.id
    with pool.lease(store) as model:  # reloaded by the hook, within the prediction that raised the alert
        assert model.bundle.root.resolve() == first.path.resolve()
    assert store.version(second.id).reason.startswith("probation_alert: input_drift alert")


def test_a_pool_path_must_be_a_path_or_a_store(pool):
    with pytest.raises(InputError, match="a pool bundle path must be a str or a Path \\(or a BundleStore\\), got int"):
        pool.get(3)
