"""edgesdk run with --thermal-root and --memory-mb; edgesdk devices shows the budget state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EDGESDK = str(Path(sys.executable).parent / "edgesdk")


def _zone(root: Path, celsius: float) -> Path:
    zone = root / "class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text(f"{int(celsius * 1000)}\n")
    return root


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EDGESDK, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def image(digits_images) -> Path:
    return sorted((digits_images / "val" / "7").iterdir())[0]


def test_run_at_95_c_refuses_and_says_so(digits_bundle, image, tmp_path):
    root = _zone(tmp_path / "sys", 95.0)
    proc = _run("run", str(digits_bundle.bundle), str(image), "--thermal-root", str(root), "--json")
    assert proc.returncode == 3, proc.stderr[-1000:]
    out = json.loads(proc.stdout)
    assert out["results"][0]["budget"]["action"] == "refused"
    assert out["results"][0]["budget"]["reason"] == "thermal"
    assert "95.0 C" in out["results"][0]["budget"]["detail"]
    assert out["budget"]["thermal"]["level"] == "critical"
    assert "Traceback" not in proc.stderr


def test_run_at_40_c_serves_normally(digits_bundle, image, tmp_path):
    root = _zone(tmp_path / "sys", 40.0)
    proc = _run("run", str(digits_bundle.bundle), str(image), "--thermal-root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr[-1000:]
    out = json.loads(proc.stdout)
    result = out["results"][0]
    assert result["source"] == "device" and result["top"][0]["label"] == "7"
    assert result["budget"]["thermal"]["level"] == "nominal" and result["budget"]["action"] is None
    assert out["budget"]["thermal"]["temperature_c"] == 40.0


def test_run_text_shows_the_refusal(digits_bundle, image, tmp_path):
    root = _zone(tmp_path / "sys", 95.0)
    proc = _run("run", str(digits_bundle.bundle), str(image), "--thermal-root", str(root))
    assert proc.returncode == 3
    assert "thermal: critical at 95.0 C" in proc.stdout and "refused (thermal)" in proc.stdout


def test_thermal_root_without_zones_is_a_clear_error(digits_bundle, image, tmp_path):
    proc = _run("run", str(digits_bundle.bundle), str(image), "--thermal-root", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no thermal zones" in proc.stderr


def test_run_with_one_mb_refuses_with_a_clear_message(digits_bundle, image):
    proc = _run("run", str(digits_bundle.bundle), str(image), "--memory-mb", "1")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "error: BudgetExceeded: memory: no artifact of 'digits' fits" in proc.stderr
    assert "the limit is 1 MB (budget)" in proc.stderr and "reason: memory" in proc.stderr


def test_devices_shows_thermal_level_and_memory_headroom(tmp_path):
    root = _zone(tmp_path / "sys", 72.5)
    proc = _run("devices", "--thermal-root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr[-1000:]
    out = json.loads(proc.stdout)
    assert out["thermal"]["temperature_c"] == 72.5 and out["thermal"]["level"] in ("nominal", "warm", "hot")
    assert out["memory"]["available_mb"] > 0 and out["memory"]["limit_mb"] >= out["memory"]["available_mb"]
    text = _run("devices", "--thermal-root", str(root)).stdout
    assert "thermal: " in text and "72.5 C" in text and "memory: " in text


def test_run_when_hot_serves_from_the_lower_power_artifact_and_says_where(digits_bundle, image, tmp_path):
    root = _zone(tmp_path / "sys", 80.0)  # hot for raspberry-pi-5 (hot 78, critical 82)
    args = ("run", str(digits_bundle.bundle), str(image), "--thermal-root", str(root), "--profile", "raspberry-pi-5",
            "--require", "onnxruntime", "--artifact", "onnxruntime-fp32")
    proc = _run(*args, "--json")
    assert proc.returncode == 0, proc.stderr[-1000:]
    out = json.loads(proc.stdout)
    result = out["results"][0]
    assert out["placement"]["artifact"] == "onnxruntime-fp32"  # where load put it
    assert result["backend"].endswith(":onnxruntime-int8") and result["budget"]["action"] == "artifact_switched"
    assert result["budget"]["thermal"]["level"] == "hot" and result["top"][0]["label"] == "7"
    text = _run(*args).stdout
    assert "artifact_switched, on onnxruntime:" in text and "onnxruntime-int8]" in text
