"""``edgesdk devices`` and ``edgesdk run``, run as a user runs them: the console script in a subprocess."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.profiles import load_profile

SCRIPT = Path(sys.executable).parent / "edgesdk"
ENGINES = {"litert": "ai-edge-litert", "openvino": "openvino", "onnxruntime": "onnxruntime"}


@pytest.fixture
def run_cli(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EDGESDK_CACHE_DIR": str(tmp_path / "c")}

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)

    return run


@pytest.fixture(scope="module")
def images(digits_images) -> list[Path]:
    return [sorted((digits_images / "val" / d).glob("*.png"))[0] for d in ("3", "8")]


def test_devices(run_cli):
    proc = run_cli("devices")
    assert proc.returncode == 0, proc.stderr
    for engine, dist in ENGINES.items():
        assert f"{engine} {md.version(dist)}" in proc.stdout
    assert "CPU" in proc.stdout
    assert "platform profile: " in proc.stdout


def test_devices_json(run_cli):
    proc = run_cli("devices", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    engines = {e["engine"]: e for e in data["engines"]}
    assert set(engines) == set(ENGINES)
    for engine, dist in ENGINES.items():
        found = engines[engine]
        assert found["version"] == md.version(dist)
        assert any(d["kind"] == "CPU" for d in found["devices"]), found
        assert all(d["kind"] in ("NPU", "GPU", "CPU") and d["engine"] == engine for d in found["devices"])
        assert isinstance(found["notes"], list)
    # a device this machine lacks is explained, not just absent
    assert any(n.startswith("NPU") for e in engines.values() for n in e["notes"])
    assert load_profile(data["profile"]["name"]).name == data["profile"]["name"]
    assert isinstance(data["profile"]["matched"], list)


def test_run_json(run_cli, digits_bundle, images, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 1, 8, 8), np.float32))
    proc = run_cli("run", digits_bundle.bundle, *images, npy, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    pl = data["placement"]
    assert pl["engine"] in ENGINES and pl["device"] and pl["kind"] == "CPU"
    assert pl["artifact"] in {a["id"] for a in digits_bundle.manifest["artifacts"]}
    assert isinstance(pl["skipped"], list) and pl["numerics"]["checked"] is True
    assert [r["input"] for r in data["results"]] == [str(p) for p in [*images, npy]]
    for r in data["results"]:
        assert r["source"] == "device"
        assert r["top"][0]["label"] in [str(i) for i in range(10)]
        assert 0 < r["top"][0]["score"] <= 1
        assert set(r["timings_ms"]) == {"preprocess", "inference", "postprocess"}
    assert [r["top"][0]["label"] for r in data["results"][:2]] == ["3", "8"]


def test_run_json_with_options(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--json", "--policy", "cpu-only", "--engine", "openvino",
                   "--artifact", "openvino-fp32", "--no-check")
    assert proc.returncode == 0, proc.stderr
    pl = json.loads(proc.stdout)["placement"]
    assert (pl["engine"], pl["artifact"], pl["policy"]) == ("openvino", "openvino-fp32", "cpu-only")
    assert pl["numerics"]["checked"] is False


def test_run_text(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--engine", "openvino", "--device", "GPU")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("placement: ") and "executing on" in lines[0]
    assert any(line.startswith("  numerics: ") for line in lines)
    assert any(line.startswith("  skipped openvino:GPU:") for line in lines)
    assert lines[-1].startswith(f"{images[0]}: 3: ") and "[device, " in lines[-1]


def test_run_require_npu_fails_with_the_reason(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--require", "NPU", "--json")
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert "error: BackendUnavailable: device_missing: no engine reports a NPU device" in proc.stderr
    assert "reason: device_missing" in proc.stderr.splitlines()


def test_run_unknown_policy(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--policy", "fastest")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: InputError: unknown policy 'fastest'")


def test_run_bad_image(run_cli, digits_bundle, tmp_path):
    (tmp_path / "x.png").write_text("text")
    proc = run_cli("run", digits_bundle.bundle, tmp_path / "x.png")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "error: InputError: " in proc.stderr and "x.png is not a readable image" in proc.stderr
