"""Opening a store recovers it from what an interrupted process left: leftovers are removed, a pointer naming a
version that is gone or incomplete falls back to the newest complete previous one (logged, with the reason), a
version folder no pointer names goes, an unreadable pointer is rebuilt; a live install's folder is left alone.
(test_crash.py kills real installs at every step; these make each state by hand.)"""

from __future__ import annotations

import json
import os

import pytest

import edgesdk
from edgesdk import BundleStore, StoreError, VersionState
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


def _state(store: BundleStore) -> list[tuple[str, VersionState, bool]]:
    return [(v.id, v.state, v.path is not None) for v in store.versions()]


def _rolled_back_and_staged(store: BundleStore, versions) -> tuple[str, str, str]:
    """Version 1 active (rolled back to), version 2 rejected (kept), version 3 staged (kept)."""
    first, second = store.install(versions[0]).id, store.install(versions[1]).id
    store.rollback()
    third = store.install(versions[2], rollout_percent=0).id
    return first, second, third


def test_an_unreadable_pointer_is_read_from_its_copy(store, versions):
    _rolled_back_and_staged(store, versions)
    before = _state(store)
    (store.root / "ACTIVE").write_text("{not json")
    again = BundleStore(store.root, FAST)
    assert _state(again) == before
    assert "the pointer could not be read" in again.history()[-1]["reason"]
    assert json.loads((store.root / "ACTIVE").read_text())["active"] == before[0][0]  # written back whole


def test_a_rebuilt_pointer_never_activates_a_rejected_or_staged_version(store, versions):
    first, second, third = _rolled_back_and_staged(store, versions)
    for name in ("ACTIVE", "ACTIVE.copy"):
        (store.root / name).write_text("{not json")
    again = BundleStore(store.root, FAST)
    assert again.active().id == first
    found = {v.id: v for v in again.versions()}
    assert found[second].state is VersionState.REJECTED and found[third].state is VersionState.STAGED
    assert sorted(listing(store.root)["versions"]) == sorted([first, second, third])  # nothing deleted


def test_a_missing_pointer_with_versions_kept_is_rebuilt_and_deletes_nothing(store, versions):
    first, second = store.install(versions[0]).id, store.install(versions[1]).id
    for name in ("ACTIVE", "ACTIVE.copy"):
        (store.root / name).unlink(missing_ok=True)
    again = BundleStore(store.root, FAST)
    assert _state(again) == [(second, VersionState.ACTIVE, True), (first, VersionState.PREVIOUS, True)]
    assert sorted(listing(store.root)["versions"]) == sorted([first, second])


def test_a_pointer_that_cannot_be_read_now_is_a_store_error_not_a_rebuild(store, versions):
    first = store.install(versions[0]).id
    pointer = store.root / "ACTIVE"
    pointer.rename(store.root / "ACTIVE.saved")
    pointer.mkdir()  # reading it fails with an OSError that is not ENOENT (as EIO or EACCES would)
    with pytest.raises(StoreError, match="cannot read .*ACTIVE") as info:
        BundleStore(store.root, FAST)
    assert info.value.reason is StoreReason.NOT_A_STORE
    pointer.rmdir()
    (store.root / "ACTIVE.saved").rename(pointer)
    assert BundleStore(store.root, FAST).active().id == first  # nothing was rebuilt or deleted meanwhile


@pytest.mark.parametrize("damage", ["nested", "state_without_state", "probation_since_text", "huge"])
def test_a_damaged_pointer_is_recovered_never_a_raw_exception(store, versions, damage):
    first = store.install(versions[0]).id
    path = store.root / "ACTIVE"
    pointer = json.loads(path.read_text())
    if damage == "nested":
        text = "[" * 200_000
    elif damage == "state_without_state":
        pointer["states"]["x@000000000000"] = {"foo": 1}
        text = json.dumps(pointer)
    elif damage == "probation_since_text":
        pointer["probation"] = {"version": first, "since_unix": "soon"}
        text = json.dumps(pointer)
    else:
        text = json.dumps(pointer | {"padding": "x" * (2 << 20)})
    path.write_text(text)
    assert [v.id for v in store.versions()] == [first]  # an open store reads it again and recovers
    if damage == "huge":
        assert "ACTIVE is over 262144 bytes" in store.history()[-1]["reason"]
    path.write_text(text)
    (store.root / "ACTIVE.copy").write_text(text)
    assert BundleStore(store.root, FAST).active().id == first  # rebuilt from the history


def test_a_damaged_record_or_history_line_is_never_a_raw_exception(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    (first.path.parent / "version.json").write_text("[" * 200_000)
    with open(store.root / "history.jsonl", "a") as fh:
        fh.write("[" * 200_000 + "\n")
    again = BundleStore(store.root, FAST)
    assert [v.id for v in again.versions()] == [second.id]  # the damaged version is incomplete: removed
    assert again.history()[-1]["event"] == "recovered"
