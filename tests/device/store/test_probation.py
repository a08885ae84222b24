"""Probation on the real digits bundle and its production monitor: a new version whose inputs drift (digits gone
dark) or whose calls fail during its probation is rolled back by itself, rejected with the reason, and the app is
told; one that serves its probation cleanly is confirmed and no longer watched; the time bound confirms an idle one."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from PIL import Image

from edgesdk import BundleStore, InputError, Probation, VersionState
from edgesdk.choices import StoreReason
from edgesdk.monitor import MonitorOptions
from store_support import FAST, LOAD

PROBATION = Probation(predictions=500, seconds=3600)
FIRST_ALERT = 350  # the default monitor's first evaluation (300) and the second in a row that must agree (rise 2)


@pytest.fixture(scope="module")
def held_out(digits_images) -> np.ndarray:
    files = sorted(digits_images.glob("val/*/*.png"))
    return np.stack([np.asarray(Image.open(f).convert("L")) for f in files])


def _dark(image: np.ndarray) -> np.ndarray:
    return (image.astype(np.float32) * 0.5).astype(np.uint8)


@pytest.fixture
def updated(tmp_path, versions) -> tuple[BundleStore, str, str]:
    """A store with version 1 confirmed and version 2 just activated (on probation)."""
    store = BundleStore(tmp_path / "s", FAST, probation=PROBATION)
    first = store.install(versions[0]).id
    return store, first, store.install(versions[1]).id


def test_an_input_drift_alert_in_probation_rolls_back_to_the_previous_version(updated, held_out):
    store, first, second = updated
    told: list[dict] = []
    store.on_change(told.append)
    with store.load(**LOAD) as model:
        for i in range(PROBATION.predictions):
            model.predict(_dark(held_out[i % len(held_out)]))
            if told:
                break
        assert model.predict(held_out[0]).top  # the app's model still answers: the store never closes it
    assert i + 1 == FIRST_ALERT
    assert [(e["event"], e["version"], e["previous"]) for e in told] == [("rolled_back", first, second)]
    rejected = store.version(second)
    assert rejected.state is VersionState.REJECTED
    assert rejected.reason.startswith(f"{StoreReason.PROBATION_ALERT}: input_drift alert during probation (psi ")
    assert f"after {FIRST_ALERT} predictions of this model" in rejected.reason
    assert store.history()[-1]["event"] == "rolled_back" and store.history()[-1]["to"] == first
    assert store.active().id == first and store.active().probation is None
    with store.load(**LOAD) as model:  # the app loads again: the version rolled back to, not watched
        assert model.bundle.manifest["version"] == "1"
        for i in range(FIRST_ALERT + 50):
            model.predict(_dark(held_out[i % len(held_out)]))
    assert store.active().id == first


def test_an_error_rate_alert_in_probation_rolls_back(updated, held_out):
    store, first, second = updated
    with store.load(**LOAD) as model:
        for i in range(PROBATION.predictions):
            try:
                model.predict(np.zeros((3, 3), np.float32) if i % 5 == 0 else held_out[i % len(held_out)])
            except InputError:
                pass
            if store.active().id != second:
                break
    assert store.active().id == first
    assert re.match(rf"{StoreReason.PROBATION_ALERT}: error_rate alert during probation \(share 0\.2\d* >= 0\.05\)",
                    store.version(second).reason)


def test_a_clean_probation_confirms_the_version_and_ends_the_watch(updated, held_out):
    store, first, second = updated
    with store.load(**LOAD) as model:
        for i in range(PROBATION.predictions):
            model.predict(held_out[i % len(held_out)])
        assert store.active().probation is None
        assert store.history()[-1]["event"] == "confirmed" and store.history()[-1]["predictions"] == 500
        for i in range(FIRST_ALERT + 50):  # confirmed: a drift now is the app's to judge, not a rollback
            model.predict(_dark(held_out[i % len(held_out)]))
        assert model.monitor.level("input_drift") == "alert"
    assert store.active().id == second


def test_the_time_bound_confirms_a_version_that_saw_no_predictions(tmp_path, versions, held_out):
    store = BundleStore(tmp_path / "s", FAST, probation=Probation(predictions=500, seconds=0.5))
    store.install(versions[0])
    second = store.install(versions[1])
    assert second.probation is not None
    time.sleep(0.6)
    assert store.active().probation is None and store.history()[-1]["event"] == "confirmed"
    with store.load(**LOAD) as model:
        for i in range(FIRST_ALERT + 50):
            model.predict(_dark(held_out[i % len(held_out)]))
    assert store.active().id == second.id


def test_an_alert_with_no_previous_version_keeps_it_and_says_so(tmp_path, versions, held_out):
    store = BundleStore(tmp_path / "s", FAST, probation=PROBATION)
    only = store.install(versions[0]).id
    with store.load(**LOAD) as model:
        for i in range(FIRST_ALERT):
            model.predict(_dark(held_out[i % len(held_out)]))
    assert store.active().id == only
    assert store.history()[-1]["event"] == "probation_alert"
    assert "no previous version to roll back to: it stays active" in store.history()[-1]["reason"]


def test_no_probation_no_watch(tmp_path, versions, held_out):
    store = BundleStore(tmp_path / "s", FAST, probation=None)
    store.install(versions[0])
    second = store.install(versions[1])
    assert second.probation is None
    with store.load(**LOAD) as model:
        for i in range(FIRST_ALERT + 50):
            model.predict(_dark(held_out[i % len(held_out)]))
    assert store.active().id == second.id


def test_a_model_on_probation_needs_its_monitor(updated):
    store, _, second = updated
    with pytest.raises(InputError, match=f"version {second} is on probation, and it is watched through the model's "
                                         "monitor: load it with a monitor \\(monitor=False was given\\)"):
        store.load(monitor=False, **LOAD)


def test_a_probation_shorter_than_the_first_alert_is_refused(tmp_path, versions):
    store = BundleStore(tmp_path / "s", FAST, probation=Probation(predictions=100))
    store.install(versions[0])
    with pytest.raises(InputError, match=r"a probation of 100 predictions ends before this model's monitor can raise "
                                         r"its first alert \(after min_window \+ \(rise - 1\) x every = 350 "
                                         r"predictions\)"):
        store.load(**LOAD)
    short = MonitorOptions(window=100, min_window=50, every=10)  # or the monitor's window shorter
    with store.load(monitor=short, **LOAD) as model:
        assert model.monitor.options.min_window == 50
