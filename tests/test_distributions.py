"""Three installable sides: the device (``edgesdk``), the workstation (``edgesdk-converters``, in converters/) and
the cloud side (``edgesdk-cloud``, in cloud/) build as three wheels, each holding its own package only, and the
``edgesdk`` command finds the other sides' commands through their entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    """Each side's wheel, built as a user would (pip builds it in an isolated environment with hatchling)."""
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for side, folder in (("edgesdk", ROOT), ("edgesdk_converters", ROOT / "converters"),
                         ("edgesdk_cloud", ROOT / "cloud")):
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out / side),
                               str(folder)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (wheel,) = (out / side).glob("*.whl")
        built[side] = zipfile.ZipFile(wheel)
    return built


def _packages(wheel: zipfile.ZipFile) -> set[str]:
    return {name.split("/")[0] for name in wheel.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _metadata(wheel: zipfile.ZipFile, member: str) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{member}")]
    return wheel.read(name).decode()


def test_each_wheel_holds_its_own_package_only(wheels):
    assert _packages(wheels["edgesdk"]) == {"edgesdk"}
    assert _packages(wheels["edgesdk_converters"]) == {"edgesdk_converters"}
    assert _packages(wheels["edgesdk_cloud"]) == {"edgesdk_cloud"}
    # the platform profiles ship inside the device package (edgesdk/_platforms -> ../platforms in a checkout)
    assert "edgesdk/_platforms/raspberry-pi-5.toml" in wheels["edgesdk"].namelist()


def test_the_device_wheel_needs_no_converter_or_cloud_dependency(wheels):
    requires = [line for line in _metadata(wheels["edgesdk"], "METADATA").splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    names = {line.split()[1].split(";")[0].split(">")[0].split("=")[0].split("<")[0].lower() for line in requires}
    assert names == {"numpy", "pillow", "typer", "psutil", "tomli"}, names
    workstation = _metadata(wheels["edgesdk_converters"], "METADATA")
    assert "Requires-Dist: edgesdk==0.1.0" in workstation and "Requires-Dist: torch" in workstation
    cloud = _metadata(wheels["edgesdk_cloud"], "METADATA")
    assert "Requires-Dist: kserve>=0.21; extra == 'serve'" in cloud  # export needs no kserve


def test_the_sides_register_their_commands_through_entry_points(wheels):
    assert "workstation = edgesdk_converters.cli:app" in _metadata(wheels["edgesdk_converters"], "entry_points.txt")
    assert "cloud = edgesdk_cloud.cli:app" in _metadata(wheels["edgesdk_cloud"], "entry_points.txt")
    assert "edgesdk = edgesdk.cli:main" in _metadata(wheels["edgesdk"], "entry_points.txt")


def _edgesdk(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", "from edgesdk.cli import main; main()", *args], capture_output=True,
                          text=True, timeout=120)


def test_every_side_is_listed_where_installed():
    proc = _edgesdk(sys.executable, "--help")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("│ ") and line.split()[1:]
              and line.split()[1][0].isalpha() and not line.split()[1].startswith("-")]
    for name in ("quantize", "demo", "calibrate-escalation", "inspect", "run", "bench", "serve", "export"):
        assert name in listed, (name, proc.stdout)
    assert listed.index("quantize") < listed.index("inspect") < listed.index("serve")  # workstation, device, cloud


@pytest.mark.skipif(not os.environ.get("EDGESDK_DEVICE_VENV"),
                    reason="needs the device-only venv (make test sets EDGESDK_DEVICE_VENV)")
def test_a_command_of_a_side_not_installed_says_what_to_install():
    """The device venv has edgesdk alone: the workstation's and the cloud's commands name their distribution."""
    python = str(Path(os.environ["EDGESDK_DEVICE_VENV"]) / "bin" / "python")
    proc = _edgesdk(python, "quantize", "model.onnx", "--calib", "data")
    assert proc.returncode == 2
    assert "belongs to the workstation side, which is not installed here: pip install edgesdk-converters" in proc.stderr
    proc = _edgesdk(python, "export", "kserve", "b", "out")
    assert proc.returncode == 2 and "pip install edgesdk-cloud" in proc.stderr
    listed = _edgesdk(python, "--help").stdout
    assert "inspect" in listed and "│ quantize" not in listed  # not listed where it cannot run


def test_a_side_that_fails_to_load_is_named_and_the_rest_still_works(tmp_path):
    """A stale or broken install (an entry point whose module is gone) must not take the edgesdk command down."""
    dist = tmp_path / "site" / "broken_side-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-side\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[edgesdk.cli]\nzz_broken = no_such_module_anywhere:app\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    run = [sys.executable, "-c", "from edgesdk.cli import main; main()"]
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "'zz_broken' commands of edgesdk (no_such_module_anywhere:app) failed to load: ModuleNotFoundError" in \
        helped.stderr
    assert "inspect" in helped.stdout and "quantize" in helped.stdout  # the device and the healthy sides
    typo = subprocess.run([*run, "inspectt"], capture_output=True, text=True, timeout=120, env=env)
    assert typo.returncode == 2 and "No such command" in typo.stderr and "Traceback" not in typo.stderr
