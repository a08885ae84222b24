"""Staged rollout: a version for rollout_percent of the fleet is activated on a device only when the stable hash of
the device id and the version id puts the device under that percent; otherwise it is staged with the reason, and can
still be activated by hand. The percent comes from install or from the manifest."""

from __future__ import annotations

import json

import pytest

from edgesdk import BundleError, BundleStore, InputError, VersionState
from edgesdk.choices import StoreReason
from edgesdk.store.rollout import bucket, decide
from store_support import FAST, release


def test_rollout_percent_0_stages_the_version_and_keeps_the_active_one(store, versions):
    first = store.install(versions[0])
    staged = store.install(versions[1], rollout_percent=0)
    assert staged.state is VersionState.STAGED and staged.rollout_percent == 0
    assert staged.reason == (f"{StoreReason.NOT_IN_ROLLOUT}: this device's bucket {staged.bucket:.2f} is not under "
                             "rollout_percent 0")
    assert staged.path.is_dir() and store.active().id == first.id
    assert [v.state for v in store.versions()] == [VersionState.ACTIVE, VersionState.STAGED]
    assert store.history()[-1]["event"] == "staged"
    assert store.activate(staged.id).state is VersionState.ACTIVE  # an operator may still take it


def test_rollout_percent_100_activates_it(store, versions):
    version = store.install(versions[0], rollout_percent=100)
    assert version.state is VersionState.ACTIVE and version.rollout_percent == 100 and 0 <= version.bucket < 100


def test_the_device_id_decides_and_the_decision_is_stable(tmp_path, versions):
    probe = BundleStore(tmp_path / "probe", FAST)
    version = probe.install(versions[0]).id
    inside = next(f"d{i}" for i in range(1000) if bucket(f"d{i}", version) < 50)
    outside = next(f"d{i}" for i in range(1000) if bucket(f"d{i}", version) >= 50)
    assert BundleStore(tmp_path / "a", FAST, device_id=inside).install(versions[0], rollout_percent=50).state \
        is VersionState.ACTIVE
    assert BundleStore(tmp_path / "b", FAST, device_id=outside).install(versions[0], rollout_percent=50).state \
        is VersionState.STAGED
    assert bucket(inside, version) == bucket(inside, version)


def test_buckets_spread_evenly_and_a_higher_percent_only_adds_devices():
    devices = [f"device-{i}" for i in range(4000)]
    at = {p: {d for d in devices if decide(d, "digits@0123456789ab", p)["selected"]} for p in (0, 10, 25, 50, 100)}
    assert at[0] == set() and at[100] == set(devices)
    for p in (10, 25, 50):
        assert abs(len(at[p]) / len(devices) - p / 100) < 0.03, (p, len(at[p]))
    assert at[10] <= at[25] <= at[50]
    other = {d for d in devices if decide(d, "digits@ba9876543210", 25)["selected"]}
    assert len(other & at[25]) < len(at[25]) * 0.5  # each version draws its devices anew


def test_the_manifest_carries_the_percent_and_it_does_not_change_the_version_id(store, versions, tmp_path):
    narrow = release(versions[1], tmp_path / "narrow", "2", rollout_percent=0)
    staged = store.install(narrow)
    assert staged.state is VersionState.STAGED and staged.rollout_percent == 0
    wide = release(versions[1], tmp_path / "wide", "2", rollout_percent=100)
    assert store.install(wide).id == staged.id  # the same release, rolled out to every device now
    assert store.active().id == staged.id
    assert store.install(versions[0], rollout_percent=0).state is VersionState.STAGED  # the call's percent wins


def test_a_percent_out_of_range_is_refused(store, versions):
    with pytest.raises(InputError, match="rollout_percent must be a number from 0 to 100 \\(or None: every "
                                         "device\\), got 150"):
        store.install(versions[0], rollout_percent=150)


def test_a_manifest_percent_out_of_range_is_a_bundle_error(store, versions, tmp_path):
    bad = release(versions[0], tmp_path / "bad", "1", rollout_percent=150)
    with pytest.raises(BundleError, match=f"^{bad}/manifest.json: rollout_percent must be a number from 0 to 100 or "
                                         "null, got 150"):
        store.install(bad)
    assert json.loads((bad / "manifest.json").read_text())["rollout_percent"] == 150
