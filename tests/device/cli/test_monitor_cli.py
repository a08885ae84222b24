"""``edgesdk run --monitor FILE`` and ``edgesdk monitor FILE``, run as a user runs them: the console script in a
subprocess, on the digits bundle (quantize's own reference), with real images."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

SCRIPT = Path(sys.executable).parent / "edgesdk"
IN_DISTRIBUTION = 300  # MonitorOptions' min_window: the first evaluation sees held-out digits only
SHIFTED = 420  # then rotated ones: the window of 500 is mostly rotated by the end


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EDGESDK_CACHE_DIR": str(cache), **extra}


def _cli(cache: Path, *args, env: dict[str, str] | None = None, timeout: float = 300,
         command: tuple[str, ...] = (str(SCRIPT),)) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env or _env(cache))


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kwargs: _cli(tmp_path / "cache", *args, **kwargs)


def _round_robin(digits_images: Path) -> list[Path]:
    """The held-out images, one digit after the other (0, 1, ..., 9, 0, ...): a stream whose classes are mixed as
    the reference's are."""
    folders = [sorted(d.glob("*.png")) for d in sorted((digits_images / "val").iterdir())]
    return [f for row in zip(*folders) for f in row]


@pytest.fixture(scope="module")
def stream(digits_images, tmp_path_factory) -> tuple[list[Path], list[Path]]:
    """IN_DISTRIBUTION held-out digits, then SHIFTED of them rotated by 90 degrees (written as PNGs)."""
    held_out = _round_robin(digits_images)
    assert len(held_out) >= IN_DISTRIBUTION
    out = tmp_path_factory.mktemp("rotated")
    rotated = []
    for i in range(SHIFTED):
        path = out / f"{i:04d}.png"
        Image.open(held_out[i % len(held_out)]).rotate(90).save(path)
        rotated.append(path)
    return held_out[:IN_DISTRIBUTION], rotated


@pytest.fixture(scope="module")
def shifted_run(digits_bundle, stream, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One ``edgesdk run --monitor`` over the whole stream: the answers and the telemetry file."""
    folder = tmp_path_factory.mktemp("shifted")
    telemetry = folder / "telemetry.jsonl"
    proc = _cli(folder / "cache", "run", digits_bundle.bundle, *stream[0], *stream[1], "--monitor", telemetry)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, telemetry


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _signal(stdout: str, name: str) -> str:
    """The level ``edgesdk monitor`` prints for a signal."""
    found = re.search(rf"^  {name}\s+(\w+)\s", stdout, re.MULTILINE)
    assert found, stdout
    return found.group(1)


def test_run_monitor_writes_telemetry_that_monitor_reads_back(cli, digits_bundle, stream, tmp_path):
    telemetry = tmp_path / "deep" / "telemetry.jsonl"  # its folder is made
    images = stream[0][:3]
    proc = cli("run", digits_bundle.bundle, *images, "--monitor", telemetry)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()[-4:-1]] == [str(p) for p in images]
    assert proc.stdout.splitlines()[-1].startswith("monitor: input_drift ok")
    assert f"telemetry appended to {telemetry}" in proc.stdout
    records = _records(telemetry)
    last = records[-1]  # written when the model closed
    assert last["type"] == "snapshot" and last["predictions"] == 3
    assert last["identity"]["bundle"] == digits_bundle.manifest["name"]
    assert last["signals"]["input_drift"]["value"] is not None  # evaluated once at the end, though 3 < min_window

    shown = cli("monitor", telemetry)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"model: {digits_bundle.manifest['name']} version " in out
    assert f"artifact {last['identity']['artifact']} on {last['identity']['engine']}" in out
    assert "predictions: 3 (3 calls); window: the last 3" in out
    assert "errors: none" in out
    for stage in ("preprocess", "inference", "total"):
        assert re.search(rf"^  {stage}\s+[\d.e+-]+\s+[\d.e+-]+\s+[\d.e+-]+$", out, re.MULTILINE), out
    assert re.search(r"^memory: [\d.]+ MB", out, re.MULTILINE)
    assert _signal(out, "input_drift") == "ok" and _signal(out, "error_rate") == "ok"
    assert "note: the window holds 3 predictions" in out  # a short run's figures are said to be rough
    assert "drift: not shown: per-feature figures come from 20 predictions on" in out  # 3 would be thumbnails
    assert "alerts: none" in out

    again = cli("run", digits_bundle.bundle, *images, "--monitor", telemetry)  # the sink appends: a second run
    assert again.returncode == 0, again.stderr
    assert "1 run)" in out and "2 runs)" in cli("monitor", telemetry).stdout


def test_a_shifted_stream_shows_input_drift_at_alert(cli, shifted_run, stream, digits_bundle):
    name = re.escape(digits_bundle.manifest["inputs"][0]["name"])
    proc, telemetry = shifted_run
    inputs = {str(p) for p in [*stream[0], *stream[1]]}
    answers = [line for line in proc.stdout.splitlines() if line.split(": ")[0] in inputs]
    assert len(answers) == IN_DISTRIBUTION + SHIFTED  # every answer printed
    assert proc.stdout.splitlines()[-1].startswith("monitor: input_drift alert")

    shown = cli("monitor", telemetry)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"predictions: {IN_DISTRIBUTION + SHIFTED} " in out and "window: the last 500" in out
    assert _signal(out, "input_drift") == "alert"
    assert "note: the window holds" not in out
    drift = out[out.index("input drift ("):out.index("output drift (")].splitlines()
    assert "the 5 largest of" in drift[0] and len(drift) == 2 + 5
    assert drift[2].endswith("alert")  # the most drifted feature first, marked
    assert re.search(rf"^  {name}\.cell\[\d+\] ", drift[2]), drift[2]  # a rotation moves the grid cells
    alerts = out[out.index("alerts ("):].splitlines()
    rises = [line for line in alerts if "input_drift" in line and "-> alert" in line]
    assert rises, out
    assert "threshold 0.25" in rises[0] and re.search(rf"most: {name}\.", rises[0]), rises[0]

    every = cli("monitor", telemetry, "--all").stdout
    features = [k for k in _records(telemetry)[-1]["drift"]["inputs"]]
    drift_all = every[every.index("input drift ("):every.index("output drift (")].splitlines()
    assert len(drift_all) == 2 + len(features) and "--all" not in drift_all[0]


def test_monitor_json(cli, shifted_run, digits_bundle):
    _, telemetry = shifted_run
    proc = cli("monitor", telemetry, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    records = _records(telemetry)
    assert data["records"] == {"snapshots": sum(r["type"] == "snapshot" for r in records),
                               "alerts": sum(r["type"] == "alert" for r in records), "runs": 1}
    assert data["identity"]["bundle"] == digits_bundle.manifest["name"] and data["other_identities"] == []
    latest = data["latest"]
    assert latest["predictions"] == IN_DISTRIBUTION + SHIFTED and latest["errors"] == {}
    assert set(latest["latency_ms"]) == {"preprocess", "inference", "total"}
    assert all(0 < v < 1e4 for stage in latest["latency_ms"].values() for v in stage.values())
    assert latest["memory_mb"] > 0
    assert data["signals"]["input_drift"]["level"] == "alert"
    assert data["signals"]["input_drift"]["value"] >= data["signals"]["input_drift"]["alert"] == 0.25
    rows = data["drift"]["inputs"]
    assert len(rows) == 5 and data["drift"]["features"]["inputs"] > 5
    assert [r["excess"] for r in rows] == sorted((r["excess"] for r in rows), reverse=True)
    assert rows[0]["reaches"] == "alert"
    assert {"psi", "js", "reference_mean", "mean", "n"} <= set(rows[0])
    times = [a["time"] for a in data["alerts"]]
    assert times == sorted(times) and data["alerts_left_out"] == 0
    assert any(a["signal"] == "input_drift" and a["level"] == "alert" for a in data["alerts"])

    every = json.loads(cli("monitor", telemetry, "--json", "--all").stdout)
    assert len(every["drift"]["inputs"]) == every["drift"]["features"]["inputs"]


def test_monitor_reads_one_snapshot_saved_as_json(cli, shifted_run, tmp_path):
    _, telemetry = shifted_run
    snapshot = {k: v for k, v in _records(telemetry)[-1].items() if k != "type"}  # as json.dump(snapshot()) writes
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot, indent=2))
    proc = cli("monitor", path)
    assert proc.returncode == 0, proc.stderr
    assert "(1 snapshot, 0 alerts, 1 run)" in proc.stdout and _signal(proc.stdout, "input_drift") == "alert"


def test_monitor_plot_writes_a_png(cli, shifted_run, tmp_path):
    pytest.importorskip("matplotlib")  # the dev extra has it: this runs in the test venv
    _, telemetry = shifted_run
    out = tmp_path / "series"  # no suffix: .png is added, and said
    proc = cli("monitor", telemetry, "--plot", out)
    assert proc.returncode == 0, proc.stderr
    written = out.with_name("series.png")
    assert proc.stdout.splitlines()[-1] == f"plot: {written}"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(written) as im:
        assert im.width > 400 and im.height > 300
    data = json.loads(cli("monitor", telemetry, "--json", "--plot", tmp_path / "s.svg").stdout)
    assert data["plot"] == str(tmp_path / "s.svg") and (tmp_path / "s.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("name, message", [
    ("out.jpg", "--plot writes .png, .svg, .pdf files; "),
    ("missing/out.png", "does not exist"),
    (".", "is a directory"),
])
def test_monitor_plot_refuses_a_bad_target(cli, shifted_run, tmp_path, name, message):
    _, telemetry = shifted_run
    proc = cli("monitor", telemetry, "--plot", tmp_path / name if name != "." else tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_monitor_plot_without_matplotlib_names_the_extra(shifted_run, tmp_path):
    blocked = tmp_path / "no-matplotlib"  # a stand-in package that fails to import, as on a device without it
    (blocked / "matplotlib").mkdir(parents=True)
    (blocked / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    _, telemetry = shifted_run
    env = _env(tmp_path / "cache", PYTHONPATH=str(blocked))
    proc = _cli(tmp_path, "monitor", telemetry, "--plot", tmp_path / "out.png", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "--plot needs matplotlib" in proc.stderr and "pip install 'edgesdk[plot]'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.png").exists()


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as fh:
        fh.truncate(65 << 20)  # sparse: past the 64 MB default, no disk used
    files = {
        "missing": (tmp_path / "missing.jsonl", "does not exist"),
        "directory": (tmp_path, "is a directory"),
        "fifo": (fifo, "is not a regular file"),
        "huge": (huge, "at most 67108864 are read"),
        "not json": (tmp_path / "notes.txt", "line 1: not JSON"),
        "not an object": (tmp_path / "list.jsonl", "line 1: not a JSON object"),
        "not telemetry": (tmp_path / "other.jsonl", "holds no monitor record"),
        "empty": (tmp_path / "empty.jsonl", "is empty"),
        "too deep": (tmp_path / "deep.jsonl", "line 1: not JSON (or nested too deep)"),
    }
    (tmp_path / "notes.txt").write_text("predictions were fine\n")
    (tmp_path / "list.jsonl").write_text('[1, 2]\n{"type": "alert", "signal": "error_rate"}\n')
    (tmp_path / "other.jsonl").write_text('{"type": "log", "message": "hello"}\n{"type": "log"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "deep.jsonl").write_text('{"a": ' + "[" * 100_000 + "\n")
    return files


@pytest.mark.parametrize("case", ["missing", "directory", "fifo", "huge", "not json", "not an object",
                                  "not telemetry", "empty", "too deep"])
def test_monitor_refuses_a_bad_file_with_exit_2(cli, tmp_path, case):
    folder = tmp_path / "files"
    folder.mkdir()
    path, message = _bad_files(folder)[case]
    proc = cli("monitor", path, timeout=60)  # a FIFO read would block: it must be refused before
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: InputError: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_monitor_max_mb(cli, shifted_run):
    _, telemetry = shifted_run
    proc = cli("monitor", telemetry, "--max-mb", "0.001")
    assert proc.returncode == 2 and "at most 1048 are read" in proc.stderr
    assert "--max-mb must be a positive number" in cli("monitor", telemetry, "--max-mb", "0").stderr


@pytest.mark.parametrize("where, message", [
    ("folder", "exists and is not a regular file"),
    ("under a file", "cannot be written"),
    ("fifo", "exists and is not a regular file"),
])
def test_run_refuses_an_unwritable_monitor_file_before_predicting(cli, digits_bundle, stream, tmp_path, where,
                                                                  message):
    (tmp_path / "plain").write_text("a file, not a folder")
    os.mkfifo(tmp_path / "fifo")
    target = {"folder": tmp_path, "under a file": tmp_path / "plain" / "t.jsonl", "fifo": tmp_path / "fifo"}[where]
    proc = cli("run", digits_bundle.bundle, *stream[0][:2], "--monitor", target, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # refused before the load: no placement, no answer
    assert "error: InputError: monitor sink " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_refuses_monitor_in_cloud_only_mode(cli, digits_bundle, stream, tmp_path):
    proc = cli("run", digits_bundle.bundle, stream[0][0], "--mode", "cloud-only", "--cloud", "http://127.0.0.1:9",
               "--monitor", tmp_path / "t.jsonl")
    assert proc.returncode == 2 and "--mode cloud-only loads none" in proc.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_run_keeps_every_answer_when_the_file_fills_up(digits_bundle, stream, tmp_path):
    """A file that stops taking writes mid-run (here the process's file-size limit, as a full disk would) turns the
    sink off: every answer is still printed, and the run says the file is incomplete."""
    telemetry = tmp_path / "t.jsonl"
    limit = 12_000  # room for the first snapshot or so
    small_files = (sys.executable, "-c", "import resource, sys; from edgesdk.cli import main; "
                   f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
                   "sys.argv[0] = 'edgesdk'; main()")
    images = [*stream[0], *stream[1]]
    proc = _cli(tmp_path / "cache", "run", digits_bundle.bundle, *images, "--monitor", telemetry, "--json",
                command=small_files)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert len(data["results"]) == len(images) and all(r["top"] for r in data["results"])
    assert "File too large" in data["monitor"]["error"] and data["monitor"]["signals"]["input_drift"]["level"]
    assert 0 < telemetry.stat().st_size <= limit
    assert "the sink failed" in proc.stderr and "Traceback" not in proc.stderr
