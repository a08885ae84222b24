"""Crash safety (issue 28, item 3): a process installing a new version is killed with SIGKILL at every step of the
install, and the store opened afterwards always has a loadable active version (the previous one, or the new one when
the kill came after the pointer was replaced), no leftovers, and only the folders its pointer names.

The steps are not listed here: one install runs to the end first and records every progress call it makes (a
download chunk, a file copied, a pruned version each count), and then a fresh copy of the store is killed at each of
them in turn. A step added to the install is covered without touching this test."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import edgesdk
from edgesdk import BundleStore, InstallStep
from store_support import LOAD, listing, version_files

# The install of the tests, in a child process that kills itself at its kill_at-th progress call (0: never) and
# prints every call it saw.
CHILD = """
import json, os, signal, sys
from edgesdk import BundleStore, RuntimeOptions, StoreOptions

root, source, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = []

def progress(step, detail):
    calls.append([str(step), detail])
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

check = RuntimeOptions(engine="onnxruntime", speed_check="off", monitor=False)
BundleStore(root, StoreOptions(keep=1, self_check=check)).install(source, progress=progress)
print(json.dumps(calls))
"""


def _install(root: Path, source: str, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(root), source, str(kill_at)], capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def template(versions, tmp_path_factory) -> tuple[Path, str]:
    """A store with version 2 active and version 1 kept (keep=1: installing version 3 prunes version 1)."""
    root = tmp_path_factory.mktemp("template") / "store"
    store = BundleStore(root, keep=1, self_check=edgesdk.RuntimeOptions(**LOAD, monitor=False))
    store.install(versions[0])
    return root, store.install(versions[1]).id


def _check_consistent(root: Path, expected: str, killed_in_download: bool) -> None:
    """The store a killed install left, opened as the next process would: the expected version active and loadable,
    nothing else left behind."""
    store = BundleStore(root, keep=1)
    active = store.active()
    assert active is not None and active.id == expected
    with store.load(**LOAD) as model:
        result = model.predict(edgesdk.Bundle.open(active.path).golden()["input_0"][:1])
        assert result.top[0].label in model.labels
    found = listing(root)
    assert found["staging"] == [] and found["trash"] == [], found
    assert not list(root.glob(".*.tmp")) and not list((root / "downloads").glob(".*.tmp"))
    kept = {v.id for v in store.versions() if v.path is not None}
    assert set(found["versions"]) == kept, (found["versions"], kept)
    assert version_files(root) == {v: ["version.json"] for v in kept}  # each holds its bundle and record only
    for version in store.versions():
        if version.path is not None:
            edgesdk.Bundle.open(version.path)  # every kept version verifies
    if not killed_in_download:
        assert found["downloads"] == [], found


@pytest.mark.parametrize("kind", ["folder", "url"])
def test_sigkill_at_every_step_of_an_install_leaves_a_loadable_active_version(kind, template, versions, archives,
                                                                              server, tmp_path):
    base, previous = template
    source = str(versions[2]) if kind == "folder" else server.serve("v3.edgebundle", archives[2].read_bytes())
    full = tmp_path / "full"
    shutil.copytree(base, full)
    done = _install(full, source, 0)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    steps = [InstallStep(step) for step, _ in calls]
    new = BundleStore(full).active().id
    assert new != previous
    expected_steps = {InstallStep.STAGE, InstallStep.VERIFY, InstallStep.SELF_CHECK, InstallStep.PUBLISH,
                      InstallStep.ROLLOUT, InstallStep.ACTIVATE, InstallStep.PRUNE, InstallStep.DONE}
    expected_steps |= {InstallStep.COPY} if kind == "folder" else {InstallStep.DOWNLOAD, InstallStep.EXTRACT}
    assert set(steps) == expected_steps
    assert steps.count(InstallStep.COPY if kind == "folder" else InstallStep.DOWNLOAD) > 1  # killed within it too
    print(f"{kind}: killing at each of {len(calls)} progress calls: {' '.join(steps)}")
    swapped = next(i for i, (step, detail) in enumerate(calls)
                   if step == InstallStep.ACTIVATE and detail.get("pointer") == "written")
    for kill_at in range(1, len(calls) + 1):
        root = tmp_path / f"kill-{kill_at}"
        shutil.copytree(base, root)
        killed = _install(root, source, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, calls[kill_at - 1], killed.stderr[-2000:])
        # the pointer is replaced just after the progress call that says it is written
        expected = new if kill_at - 1 > swapped else previous
        step = calls[kill_at - 1][0]
        _check_consistent(root, expected, killed_in_download=step == InstallStep.DOWNLOAD)
    if kind == "url":  # a download killed half-way is resumed by the next install
        root = tmp_path / f"kill-{steps.index(InstallStep.DOWNLOAD) + 1}"
        server.behaviour.requests.clear()
        assert _install(root, source, 0).returncode == 0
        assert server.behaviour.requests[0]["range"] is not None
        assert BundleStore(root).active().id == new
