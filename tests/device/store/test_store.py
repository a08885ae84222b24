"""BundleStore on the real digits bundle: install from a folder and an archive, activate, rollback, keep-N pruning, the
listing and the history with their reasons, the on_change hook, and one test per misuse."""

from __future__ import annotations

import json
from dataclasses import replace
import pytest

import edgesdk
from edgesdk import (BundleError, BundleStore, InputError, InstallStep, Probation, RuntimeOptions, StoreError,
                     StoreOptions, VersionState)
from edgesdk.choices import StoreReason
from store_support import FAST, LOAD, listing, version_files


def _golden(store: BundleStore):
    return edgesdk.Bundle.open(store.active_path()).golden()["input_0"][:1]


def test_install_from_a_folder_activates_it_and_it_loads_and_predicts(store, versions):
    steps: list[tuple[str, dict]] = []
    version = store.install(versions[0], progress=lambda step, detail: steps.append((step, detail)))
    assert version.state is VersionState.ACTIVE and version.id.startswith("digits@")
    assert version.name == "digits" and version.bundle_version == "1" and version.reason is None
    assert version.path == store.root / "versions" / version.id / "bundle" == store.active_path()
    assert version.probation is not None and version.probation["predictions"] == Probation().predictions
    with store.load(**LOAD) as model:
        assert model.bundle.root == store.active_path()
        assert model.predict(_golden(store)).top[0].label in model.labels
    # the steps ran in the order InstallStep declares them (copy once per file)
    order = list(InstallStep)
    ran = [InstallStep(s) for s, _ in steps]
    assert ran == sorted(ran, key=order.index)
    assert {InstallStep.STAGE, InstallStep.COPY, InstallStep.VERIFY, InstallStep.SELF_CHECK, InstallStep.PUBLISH,
            InstallStep.ROLLOUT, InstallStep.ACTIVATE, InstallStep.DONE} == set(ran)
    copies = [d for s, d in steps if s == InstallStep.COPY]
    assert [d["files"] for d in copies] == list(range(1, len(copies) + 1)) and copies[-1]["of"] == len(copies)
    passed = [d for s, d in steps if s == InstallStep.SELF_CHECK][-1]
    assert passed["passed"] is True and passed["engine"] == "onnxruntime"
    assert listing(store.root)["staging"] == [] and listing(store.root)["trash"] == []


def test_install_from_an_archive(store, archives):
    version = store.install(archives[1])
    assert version.state is VersionState.ACTIVE and version.bundle_version == "2"
    assert json.loads((version.path / "manifest.json").read_text())["version"] == "2"
    assert [e["event"] for e in store.history()] == ["activated"]


def test_a_second_install_keeps_the_first_as_previous_and_rollback_returns_to_it(store, versions):
    first = store.install(versions[0])
    second = store.install(versions[1])
    assert [(v.id, v.state) for v in store.versions()] == [(second.id, VersionState.ACTIVE),
                                                            (first.id, VersionState.PREVIOUS)]
    now = store.rollback()
    assert now.id == first.id and now.state is VersionState.ACTIVE and now.probation is None
    rejected = store.version(second.id)
    assert rejected.state is VersionState.REJECTED and rejected.reason.startswith(f"{StoreReason.MANUAL}: ")
    assert rejected.path is not None  # kept, to activate again by hand
    assert store.history()[-1] | {"time": None} == {"time": None, "event": "rolled_back", "version": second.id,
                                                     "reason": rejected.reason, "to": first.id}
    with store.load(**LOAD) as model:
        assert model.bundle.manifest["version"] == "1"


def test_activate_a_kept_version_by_its_id_or_its_start(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    assert store.activate(first.id[:12]).id == first.id
    assert [v.id for v in store.versions()] == [first.id, second.id]
    assert store.active().probation is not None  # activate() starts a probation as an install does
    assert store.activate(first.id).id == first.id  # already active: nothing changes
    assert [e["event"] for e in store.history()].count("activated") == 3


def test_keep_n_prunes_the_oldest_versions(tmp_path, versions):
    store = BundleStore(tmp_path / "s", FAST, keep=1)
    ids = [store.install(v).id for v in versions]
    assert [(v.id, v.state) for v in store.versions()] == [(ids[2], VersionState.ACTIVE),
                                                            (ids[1], VersionState.PREVIOUS)]
    assert listing(store.root)["versions"] == sorted(ids[1:])
    assert [e["version"] for e in store.history() if e["event"] == "pruned"] == [ids[0]]


def test_keep_zero_keeps_no_previous_version(tmp_path, versions):
    store = BundleStore(tmp_path / "s", FAST, keep=0)
    store.install(versions[0])
    store.install(versions[1])
    assert [v.state for v in store.versions()] == [VersionState.ACTIVE]
    with pytest.raises(StoreError, match="has no previous version to roll back to"):
        store.rollback()


def test_installing_the_active_version_again_changes_nothing(store, versions):
    first = store.install(versions[0])
    assert store.install(versions[0]).id == first.id
    assert [v.id for v in store.versions()] == [first.id]
    assert store.history()[-1]["reason"] == "already active"


def test_on_change_tells_each_activation_and_rollback(store, versions):
    seen: list[dict] = []
    store.on_change(seen.append)
    a, b = store.install(versions[0]), store.install(versions[1])
    store.rollback()
    assert [(e["event"], e["version"], e["previous"]) for e in seen] == [
        ("activated", a.id, None), ("activated", b.id, a.id), ("rolled_back", a.id, b.id)]
    store.remove_hook(seen.append)
    store.install(versions[2])
    assert len(seen) == 3


def test_the_state_is_on_disk_so_another_store_object_sees_it(store, versions):
    store.install(versions[0])
    other = BundleStore(store.root, FAST)
    assert other.active().id == store.active().id and other.device_id == store.device_id
    other.install(versions[1])
    assert store.active().bundle_version == "2"


def test_a_progress_callback_may_open_the_same_store_while_the_install_holds_its_lock(store, versions):
    seen: list[list[str]] = []

    def look(step, detail):
        if step in (InstallStep.PUBLISH, InstallStep.PRUNE, InstallStep.DONE):
            seen.append([v.id for v in BundleStore(store.root, FAST).versions()])

    first = store.install(versions[0])
    second = store.install(versions[1], progress=look)
    assert seen == [[first.id], [second.id, first.id]]


def test_a_hook_that_raises_is_logged_not_raised(store, versions, caplog):
    store.on_change(lambda event: 1 / 0)
    assert store.install(versions[0]).state is VersionState.ACTIVE
    assert "an on_change hook raised" in caplog.text


# -- misuse: one test each, matching the message ------------------------------------------------------------------

def test_rollback_with_no_previous_version_names_the_active_one(store, versions):
    first = store.install(versions[0])
    with pytest.raises(StoreError, match=rf"store .* has no previous version to roll back to \(active: {first.id}; "
                                         r"previous: none\)") as info:
        store.rollback()
    assert info.value.reason is StoreReason.NO_PREVIOUS_VERSION


def test_activate_an_unknown_version(store, versions):
    store.install(versions[0])
    with pytest.raises(StoreError, match=r"it has no version 'digits@nope' \(versions: digits@"):
        store.activate("digits@nope")


def test_activate_a_rejected_version_needs_allow_rejected(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    store.rollback()
    with pytest.raises(StoreError, match=rf"version {second.id} was rejected \(manual: .*\); it is activated again "
                                         r"only with allow_rejected=True"):
        store.activate(second.id)
    assert store.activate(second.id, allow_rejected=True).state is VersionState.ACTIVE
    assert store.versions()[1].id == first.id


def test_install_a_rejected_version_needs_allow_rejected(store, versions):
    store.install(versions[0])
    second = store.install(versions[1])
    store.rollback()
    with pytest.raises(StoreError, match=rf"version {second.id} was rejected by store .* installed again only with "
                                         r"allow_rejected=True") as info:
        store.install(versions[1])
    assert info.value.reason is StoreReason.REJECTED_BEFORE
    assert store.install(versions[1], allow_rejected=True).state is VersionState.ACTIVE


def test_load_with_nothing_installed(store):
    with pytest.raises(StoreError, match=r"has no active version to load \(active: none; previous: none\)"):
        store.load()


def test_active_path_with_nothing_installed(store):
    with pytest.raises(StoreError, match="has no active version .*: install one first"):
        store.active_path()


def test_a_folder_of_something_else_is_not_a_store(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(StoreError, match="is a folder of something else") as info:
        BundleStore(tmp_path / "photos")
    assert info.value.reason is StoreReason.NOT_A_STORE


def test_a_file_is_not_a_store(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="is a file, not a store folder"):
        BundleStore(tmp_path / "f")


def test_a_missing_source(store, tmp_path):
    with pytest.raises(StoreError, match="does not exist \\(an install source is a bundle folder, an .edgebundle"):
        store.install(tmp_path / "nowhere")


def test_a_source_of_another_type(store):
    with pytest.raises(StoreError, match="an install source is .* got int"):
        store.install(3)


def test_a_folder_that_is_not_a_bundle(store, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="is not a bundle: it has no manifest.json"):
        store.install(tmp_path / "empty")
    assert store.active() is None and listing(store.root)["staging"] == []


def test_a_tampered_bundle_is_refused_and_recorded(store, versions, tmp_path):
    import shutil

    bad = shutil.copytree(versions[0], tmp_path / "tampered")
    onnx = bad / "onnx" / "model_int8.onnx"
    onnx.write_bytes(onnx.read_bytes()[:-1] + b"\0")
    with pytest.raises(BundleError, match="'onnx/model_int8.onnx' was altered: its sha256 does not match"):
        store.install(bad)
    assert store.history()[-1]["event"] == "refused"


def test_an_unsigned_bundle_in_a_store_that_requires_signatures(tmp_path, versions):
    key = tmp_path / "pub.pem"
    key.write_text("not read: the bundle has no signature to check")
    store = BundleStore(tmp_path / "s", FAST, trust=edgesdk.Trust(public_key=key))
    with pytest.raises(BundleError, match="is unsigned: it has no signature.sig"):
        store.install(versions[0])
    with pytest.raises(BundleError, match="is unsigned"):  # a key given to install asks the same
        BundleStore(tmp_path / "t", FAST).install(versions[0], trust=key)


def test_an_unknown_store_option(tmp_path):
    with pytest.raises(InputError, match="BundleStore\\(\\) got an unknown option"):
        BundleStore(tmp_path / "s", kep=3)


@pytest.mark.parametrize("keep", [-1, 21, 2.0, True])
def test_keep_out_of_range(keep):
    with pytest.raises(InputError, match=f"keep must be an integer from 0 to 20, got {keep!r}"):
        StoreOptions(keep=keep)


def test_a_self_check_without_numerics_is_refused():
    with pytest.raises(InputError, match="self_check must keep check_numerics=True"):
        StoreOptions(self_check=RuntimeOptions(check_numerics=False))


def test_a_self_check_in_a_hybrid_mode_is_refused():
    with pytest.raises(InputError, match="self_check loads on this device only; its hybrid mode is prefer-cloud"):
        StoreOptions(self_check=RuntimeOptions(hybrid=edgesdk.HybridOptions(mode="prefer-cloud",
                                                                           cloud="http://127.0.0.1:1")))


@pytest.mark.parametrize("field,value,message", [
    ("predictions", 0, "probation predictions must be an integer from 1 to"),
    ("seconds", 0, r"probation seconds must be a number in \(0, 2.592e\+06\]"),
    ("signals", ("output_drift", "latency"), "a probation signal must be one of input_drift, output_drift, "
                                             "error_rate, got 'latency'"),
    ("signals", "error_rate", "probation signals must be a non-empty tuple"),
])
def test_probation_options_are_checked(field, value, message):
    with pytest.raises(InputError, match=message):
        replace(Probation(), **{field: value})


@pytest.mark.parametrize("name,value,message", [
    ("max_bytes", 0, "max_bytes must be an integer from 1 to 2\\*\\*40"),
    ("timeout_s", 0, "timeout_s must be a number of seconds in"),
    ("deadline_s", float("inf"), "deadline_s must be a number of seconds in"),
    ("retries", 21, "retries must be an integer from 0 to 20"),
    ("probation", 100, "probation must be a Probation or None, got int"),
    ("trust", "key.pem", "trust must be an edgesdk.Trust or None, got str"),
    ("require_golden", 1, "require_golden must be True or False"),
])
def test_store_options_are_checked(name, value, message):
    with pytest.raises(InputError, match=message):
        StoreOptions(**{name: value})


@pytest.mark.parametrize("device_id", ["", "a\nb", 7, "x" * 129])
def test_a_bad_device_id(tmp_path, device_id):
    with pytest.raises(InputError, match="device_id must be one line of 1 to 128 printable characters"):
        BundleStore(tmp_path / "s", device_id=device_id)


def test_progress_must_be_callable(store, versions):
    with pytest.raises(InputError, match="progress must be a callable\\(step, detail\\) or None, got str"):
        store.install(versions[0], progress="verbose")


def test_trust_of_another_type(store, versions):
    with pytest.raises(InputError, match="trust must be an edgesdk.Trust, a public key path or None, got int"):
        store.install(versions[0], trust=1)


def test_a_version_named_by_something_else(store):
    with pytest.raises(InputError, match="a version is named by its id .* got None"):
        store.activate(None)


def test_a_progress_callback_that_raises_stops_the_install_and_changes_nothing(store, versions):
    first = store.install(versions[0])

    def stop(step, detail):
        if step == InstallStep.PUBLISH:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.install(versions[1], progress=stop)
    assert [v.id for v in store.versions()] == [first.id]
    assert listing(store.root)["staging"] == [] and listing(store.root)["versions"] == [first.id]


def test_options_live_in_the_store_object_not_on_disk(store, versions, tmp_path):
    """Two objects on one store may keep different counts: the one that makes a change prunes by its own."""
    for v in versions:
        store.install(v)
    assert len(store.versions()) == 3
    BundleStore(store.root, FAST, keep=0).rollback()
    assert [v.state for v in store.versions()] == [VersionState.ACTIVE, VersionState.REJECTED]
    assert store.versions()[1].path is None  # keep=0: the rejected version is remembered, its folder gone


def test_a_previous_version_installed_again_outside_its_rollout_stays_previous_and_is_never_pruned(tmp_path,
                                                                                                   five_versions):
    a, b, c, d, e = five_versions
    store = BundleStore(tmp_path / "s", FAST, keep=2)
    first, second = store.install(a).id, store.install(b).id
    assert store.install(a, rollout_percent=0).state is VersionState.PREVIOUS  # not staged: it is kept already
    store.install(c, rollout_percent=0)
    store.install(e, rollout_percent=0)
    store.install(d)  # activates, then prunes the staged folders past keep=2
    pointer = json.loads((store.root / "ACTIVE").read_text())
    assert pointer["previous"] == [second, first]
    assert all((store.root / "versions" / v / "version.json").is_file() for v in pointer["previous"])
    store.rollback()
    assert store.rollback().id == first
    assert BundleStore(store.root, FAST).active().id == first


def test_prune_never_drops_the_active_or_a_previous_version():
    from edgesdk.store import changes
    from edgesdk.store.disk import Pointer

    pointer = Pointer("d@000000000004", ["b@000000000002", "a@000000000001"])
    for version in ("a@000000000001", "c@000000000003", "e@000000000005"):  # a: a stale record of a kept version
        pointer.remember(version, VersionState.STAGED, "not_in_rollout", folder=True)
    assert changes.prune(pointer, 1) == ["a@000000000001", "c@000000000003"]  # a only as a previous past keep=1
    assert pointer.previous == ["b@000000000002"] and list(pointer.states) == ["e@000000000005"]
    pointer = Pointer("d@000000000004", ["a@000000000001"])
    pointer.remember("a@000000000001", VersionState.STAGED, "not_in_rollout", folder=True)
    pointer.remember("c@000000000003", VersionState.STAGED, "not_in_rollout", folder=True)
    assert changes.prune(pointer, 1) == [] and pointer.previous == ["a@000000000001"]


def test_rollback_to_an_incomplete_previous_version_is_refused_before_the_pointer_changes(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    (first.path.parent / "version.json").unlink()  # its folder damaged since it was kept
    with pytest.raises(StoreError, match="has no previous version to roll back to") as info:
        store.rollback()
    assert info.value.reason is StoreReason.NO_PREVIOUS_VERSION
    assert json.loads((store.root / "ACTIVE").read_text())["active"] == second.id
    assert store.active().id == second.id


def test_an_archive_install_keeps_only_the_bundle_and_its_record(store, archives):
    version = store.install(archives[1])
    assert version_files(store.root) == {version.id: ["version.json"]}
