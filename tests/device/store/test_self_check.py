"""The self-check an install runs on this machine: a release built to fail it (its golden outputs moved, its checksums
rewritten, so that only running it can tell) is never activated, is recorded as rejected with the reason, and the
version that was active stays active and loads; a version that fails to load during its probation is rolled back."""

from __future__ import annotations

import json

import pytest

import edgesdk
from edgesdk import BundleStore, StoreError, StoreOptions, VersionState
from edgesdk.choices import StoreReason
from store_support import FAST, LOAD, listing


def test_a_release_that_fails_its_self_check_is_not_activated(store, versions, failing):
    before = store.install(versions[0])
    with pytest.raises(StoreError, match=rf"version .* failed its self-check on this machine and is not activated "
                                         rf".*numerics_mismatch.* \(active: {before.id}; previous: none\)") as info:
        store.install(failing)
    assert info.value.reason is StoreReason.SELF_CHECK_FAILED
    assert isinstance(info.value.__cause__, edgesdk.BackendUnavailable)  # the load's own error, chained
    assert store.active().id == before.id
    rejected = store.versions()[-1]
    assert rejected.state is VersionState.REJECTED and rejected.path is None
    assert rejected.reason.startswith(f"{StoreReason.SELF_CHECK_FAILED}: BackendUnavailable: numerics_mismatch")
    assert store.history()[-1]["event"] == "rejected"
    assert listing(store.root)["versions"] == [before.id] and listing(store.root)["staging"] == []
    with store.load(**LOAD) as model:
        assert model.bundle.manifest["version"] == "1"


def test_the_failing_release_verifies_its_checksums_so_only_the_self_check_catches_it(failing):
    edgesdk.Bundle.open(failing)  # no BundleError: every file matches the manifest
    with pytest.raises(edgesdk.BackendUnavailable, match="numerics_mismatch"):
        edgesdk.load(failing, **LOAD)


def test_a_rejected_release_is_not_installed_again_unasked(store, versions, failing):
    store.install(versions[0])
    with pytest.raises(StoreError, match="failed its self-check"):
        store.install(failing)
    with pytest.raises(StoreError, match="was rejected by store .*self_check_failed"):
        store.install(failing)
    with pytest.raises(StoreError, match="failed its self-check"):  # asked for: checked again, and fails again
        store.install(failing, allow_rejected=True)


def test_a_bundle_nothing_can_check_is_refused_unless_allowed(tmp_path, versions):
    import shutil

    bare = shutil.copytree(versions[0], tmp_path / "bare")
    manifest = json.loads((bare / "manifest.json").read_text())
    del manifest["golden"]["tolerance"], manifest["golden"]["tolerance_per_output"], \
        manifest["golden"]["mean_tolerance_per_output"]
    (bare / "manifest.json").write_text(json.dumps(manifest))
    store = BundleStore(tmp_path / "s", FAST)
    with pytest.raises(StoreError, match="loaded, but nothing checked its numerics on this machine \\(the bundle "
                                         "records no golden tolerance") as info:
        store.install(bare)
    assert info.value.reason is StoreReason.NOT_CHECKED and store.active() is None
    lenient = BundleStore(tmp_path / "t", StoreOptions(self_check=FAST.self_check, require_golden=False))
    assert lenient.install(bare).state is VersionState.ACTIVE


def test_a_version_that_fails_to_load_in_probation_is_rolled_back_and_the_previous_one_loads(store, versions):
    first, second = store.install(versions[0]), store.install(versions[1])
    onnx = second.path / "onnx" / "model_int8.onnx"  # damaged on the device after its install
    onnx.write_bytes(onnx.read_bytes()[:-1] + b"\0")
    seen = []
    store.on_change(seen.append)
    with store.load(**LOAD) as model:
        assert model.bundle.root == first.path
    rejected = store.version(second.id)
    assert rejected.state is VersionState.REJECTED
    assert rejected.reason.startswith(f"{StoreReason.LOAD_FAILED}: BundleError: bundle file 'onnx/model_int8.onnx' "
                                      "was altered")
    assert [(e["event"], e["version"]) for e in seen] == [("rolled_back", first.id)]


def test_a_confirmed_version_that_fails_to_load_raises_and_stays(tmp_path, versions):
    store = BundleStore(tmp_path / "s", FAST, probation=None)  # no probation: confirmed at once
    store.install(versions[0])
    second = store.install(versions[1])
    onnx = second.path / "onnx" / "model_int8.onnx"
    onnx.write_bytes(onnx.read_bytes()[:-1] + b"\0")
    with pytest.raises(edgesdk.BundleError, match="was altered"):
        store.load(**LOAD)
    assert store.active().id == second.id
