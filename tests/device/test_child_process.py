"""The one child-process harness (edgesdk.child_process) behind isolate, bench and cold start."""

from __future__ import annotations

import subprocess

import pytest

from edgesdk.child_process import run_child


def test_the_answer_is_the_file_not_stdout():
    run = run_child('print(json.dumps({"ok": "forged"}))\nanswer({"ok": ARGS["n"] + 1})\n', {"n": 41}, timeout=60)
    assert run.returncode == 0 and run.answer == {"ok": 42} and run.elapsed_ms > 0


def test_a_child_can_answer_once_only():
    run = run_child('answer(1)\nanswer(2)\n', {}, timeout=60)
    assert run.returncode == 1 and run.answer == 1 and "FileExistsError" in run.stderr_tail()


def test_secret_looking_variables_stay_out(monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t")
    monkeypatch.setenv("EDGESDK_CACHE_DIR", "/tmp/x")
    run = run_child("import os\nanswer(sorted(os.environ))\n", {}, timeout=60)
    assert "MY_API_TOKEN" not in run.answer and "EDGESDK_CACHE_DIR" in run.answer


def test_a_planted_module_in_the_working_directory_is_not_imported(tmp_path, monkeypatch):
    (tmp_path / "numpy.py").write_text("raise SystemExit('planted numpy imported')\n")
    monkeypatch.chdir(tmp_path)
    run = run_child("import numpy\nanswer(numpy.__name__)\n", {}, timeout=60)
    assert run.returncode == 0 and run.answer == "numpy"


def test_how_a_crash_ends_is_named():
    run = run_child("import os\nos.abort()\n", {}, timeout=60)
    assert run.answer is None and run.how_it_ended() == "was killed by SIGABRT"
    assert run_child("raise SystemExit(7)\n", {}, timeout=60).how_it_ended() == "exited with status 7"
    assert run_child("pass\n", {}, timeout=60).how_it_ended() == "exited without an answer"


def test_a_child_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        run_child("import time\ntime.sleep(30)\n", {}, timeout=1)
