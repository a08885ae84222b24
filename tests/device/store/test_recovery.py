"""Opening a store recovers it from what an interrupted process left: leftovers are removed, a pointer naming a
version that is gone or incomplete falls back to the newest complete previous one (logged, with the reason), a
version folder no pointer names goes, an unreadable pointer is rebuilt; a live install's folder is left alone.
(test_crash.py kills real installs at every step; these make each state by hand.)"""

from __future__ import annotations

import os

import edgesdk
from edgesdk import BundleStore, VersionState
from edgesdk.choices import StoreReason
from edgesdk.store.disk import lock_folder
from store_support import FAST, LOAD, listing


def test_leftovers_of_an_interrupted_install_are_removed(store, versions):
    first = store.install(versions[0])
    (store.root / "staging" / "install-x" / "bundle").mkdir(parents=True)
    (store.root / "trash" / "old.1234").mkdir()
    (store.root / ".ACTIVE.999.1.tmp").write_text("{")
    again = BundleStore(store.root, FAST)
    assert listing(again.root)["staging"] == [] and listing(again.root)["trash"] == []
    assert not list(again.root.glob(".*.tmp"))
    assert again.active().id == first.id
    event = again.history()[-1]
    assert event["event"] == "recovered" and set(event["removed"]) == {".ACTIVE.999.1.tmp", "staging/install-x"}


def test_an_incomplete_active_version_falls_back_to_the_newest_complete_previous(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    (second.path.parent / "version.json").unlink()  # as if its folder had been cut short
    again = BundleStore(store.root, FAST)
    assert [(v.id, v.state) for v in again.versions()] == [(first.id, VersionState.ACTIVE)]
    recovered = [e for e in again.history() if e["event"] == "recovered" and e.get("lost")]
    assert recovered[0]["reason"] == (f"{StoreReason.RECOVERY}: the pointer named {second.id}, which is missing or "
                                      f"incomplete; {first.id} serves now")
    assert listing(again.root)["versions"] == [first.id]
    with again.load(**LOAD) as model:
        model.predict(edgesdk.Bundle.open(first.path).golden()["input_0"][:1])


def test_a_version_no_pointer_names_is_removed(store, versions):
    first = store.install(versions[0])
    second = store.install(versions[1])
    store.rollback()
    # a complete folder the pointer does not name: an install killed between its publish and its activation
    orphan = store.root / "versions" / "digits@0123456789ab"
    os.rename(second.path.parent, orphan)
    (orphan / "version.json").write_text((orphan / "version.json").read_text().replace(second.id, orphan.name))
    again = BundleStore(store.root, FAST)
    assert not orphan.exists() and again.active().id == first.id
    assert any(e["event"] == "recovered" and e["version"] == orphan.name for e in again.history())


def test_an_unreadable_pointer_is_rebuilt_from_the_complete_versions(store, versions):
    store.install(versions[0])
    second = store.install(versions[1])
    (store.root / "ACTIVE").write_text("{not json")
    again = BundleStore(store.root, FAST)
    assert again.active().id == second.id and len(again.versions()) == 2
    assert "the pointer could not be read" in again.history()[-1]["reason"]


def test_a_live_install_keeps_its_staging_folder(store, versions):
    working = store.root / "staging" / "install-live"
    working.mkdir()
    fd = lock_folder(working)  # what a running install holds
    try:
        BundleStore(store.root, FAST)
        assert working.is_dir()
    finally:
        os.close(fd)
    BundleStore(store.root, FAST)  # released (its process ended): a leftover now
    assert not working.exists()
