"""``edgesdk store install|list|activate|rollback``, run as a user runs them: the console script in a subprocess, on
releases of the real digits bundle. Refusals exit 2 with one line naming the store's state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(sys.executable).parent / "edgesdk"
CHECK = ("--engine", "onnxruntime", "--speed-check", "off")


def _release(src: Path, dest: Path, version: str) -> Path:
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["version"] = version
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture(scope="module")
def releases(digits_bundle, tmp_path_factory) -> dict[str, Path]:
    from support import rehash

    out = tmp_path_factory.mktemp("cli-releases")
    found = {v: _release(digits_bundle.bundle, out / f"v{v}", v) for v in ("1", "2")}
    bad = _release(digits_bundle.bundle, out / "bad", "bad")  # fails its self-check: golden outputs moved
    with np.load(bad / "golden.npz") as npz:
        arrays = {k: npz[k] + (25 if k.startswith("output_") else 0) for k in npz.files}
    np.savez(bad / "golden.npz", **arrays)
    rehash(bad)
    return found | {"bad": bad}


@pytest.fixture
def cli(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EDGESDK_CACHE_DIR": str(tmp_path / "c")}

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "store", *map(str, args)], capture_output=True, text=True, env=env,
                              timeout=300)

    return run


def _ids(cli, root: Path) -> list[tuple[str, str]]:
    proc = cli("list", root, "--json")
    assert proc.returncode == 0, proc.stderr
    return [(v["id"], v["state"]) for v in json.loads(proc.stdout)["versions"]]


def test_install_list_activate_rollback(cli, releases, tmp_path):
    root = tmp_path / "store"
    first = cli("install", root, releases["1"], *CHECK)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("active: digits@") and f"(installed in {root})" in first.stdout
    assert "self_check: version digits@" in first.stderr and "copy: 1/" in first.stderr  # progress on stderr
    second = cli("install", root, releases["2"], *CHECK, "--quiet", "--json")
    assert second.returncode == 0 and second.stderr == ""
    v2 = json.loads(second.stdout)
    assert v2["state"] == "active" and v2["bundle_version"] == "2"
    v1 = first.stdout.split()[1]
    assert _ids(cli, root) == [(v2["id"], "active"), (v1, "previous")]
    listed = cli("list", root)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].startswith(f"{v2['id']}  digits 2  active (on probation until ")
    back = cli("rollback", root)
    assert back.returncode == 0 and back.stdout.strip() == f"rolled back: {v2['id']} -> {v1}"
    assert _ids(cli, root) == [(v1, "active"), (v2["id"], "rejected")]
    assert "manual: rolled back by rollback()" in cli("list", root).stdout
    again = cli("activate", root, v2["id"][:10], "--allow-rejected")
    assert again.returncode == 0 and again.stdout.strip() == f"active: {v2['id']} (was {v1})"


def test_staged_by_its_rollout(cli, releases, tmp_path):
    proc = cli("install", tmp_path / "s", releases["1"], *CHECK, "--rollout-percent", "0", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("staged: digits@") and "not_in_rollout: this device's bucket" in proc.stdout


def test_a_release_that_fails_its_self_check_exits_2_and_the_active_one_stays(cli, releases, tmp_path):
    root = tmp_path / "store"
    assert cli("install", root, releases["1"], *CHECK, "--quiet").returncode == 0
    before = _ids(cli, root)
    proc = cli("install", root, releases["bad"], *CHECK, "--quiet")
    assert proc.returncode == 2
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]  # (engines log on stderr too)
    assert len(error) == 1 and error[0].startswith("error: StoreError: self_check_failed: version digits@")
    assert error[0].endswith(f"(active: {before[0][0]}; previous: none)") and "Traceback" not in proc.stderr
    assert _ids(cli, root)[0] == before[0]


def test_rollback_with_nothing_to_go_back_to_exits_2(cli, releases, tmp_path):
    root = tmp_path / "store"
    assert cli("install", root, releases["1"], *CHECK, "--quiet").returncode == 0
    proc = cli("rollback", root)
    assert proc.returncode == 2
    assert "error: StoreError: no_previous_version: store " in proc.stderr
    assert "has no previous version to roll back to (active: digits@" in proc.stderr


def test_activate_an_unknown_version_exits_2(cli, tmp_path):
    proc = cli("activate", tmp_path / "empty", "digits@0000")
    assert proc.returncode == 2
    assert "error: StoreError: unknown_version: store " in proc.stderr and "has no version 'digits@0000'" in proc.stderr


def test_a_file_url_exits_2(cli, tmp_path):
    proc = cli("install", tmp_path / "s", "file:///etc/passwd")
    assert proc.returncode == 2
    assert "error: StoreError: bad_source: file:///etc/passwd: only http and https URLs are downloaded" in proc.stderr


def test_list_of_an_empty_store_and_of_a_folder_that_is_not_one(cli, tmp_path):
    proc = cli("list", tmp_path / "new")
    assert proc.returncode == 0 and "holds no version yet" in proc.stdout
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    proc = cli("list", tmp_path / "docs")
    assert proc.returncode == 2 and "not_a_store" in proc.stderr and "is a folder of something else" in proc.stderr


def test_a_bad_rollout_percent_exits_2(cli, releases, tmp_path):
    proc = cli("install", tmp_path / "s", releases["1"], "--rollout-percent", "120")
    assert proc.returncode == 2
    assert "error: InputError: rollout_percent must be a number from 0 to 100" in proc.stderr
