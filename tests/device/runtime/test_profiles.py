"""Platform profiles: the shipped files load, detection on fake machine trees, and every misuse refused."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.errors import InputError
from edgesdk.runtime.profiles import Profile, detect_profile, list_profiles, load_profile, profiles_dir
from support import REPO

SHIPPED = {"generic-x86_64-linux", "generic-arm64-linux", "raspberry-pi-5", "jetson-orin", "intel-core-ultra",
           "google-coral", "qualcomm-snapdragon", "android-arm64"}
GENERIC = {"x86_64": "generic-x86_64-linux", "amd64": "generic-x86_64-linux", "aarch64": "generic-arm64-linux",
           "arm64": "generic-arm64-linux"}

ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n"
INTEL_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) Ultra 7 155H\n"


def fake_machine(root: Path, *, arch: str, model: str | None = None, cpuinfo: str = "",
                 android: bool = False) -> Path:
    """A directory laid out like / with what detection reads: device-tree model, cpuinfo, arch, build.prop."""
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/arch").write_text(arch + "\n")
    (root / "proc/cpuinfo").write_text(cpuinfo)
    if model is not None:
        (root / "proc/device-tree").mkdir()
        (root / "proc/device-tree/model").write_bytes(model.encode() + b"\x00")  # the kernel NUL-terminates it
    if android:
        (root / "system").mkdir()
        (root / "system/build.prop").write_text("ro.product.model=Pixel 8\nro.build.version.sdk=34\n")
    return root


def write_profile(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


VALID = """\
name = "my-board"
description = "A board of ours"
engines = ["litert"]
devices = ["CPU"]
precisions = ["int8"]
"""


# -- the shipped profiles ----------------------------------------------------------------------------------

def test_profiles_dir_is_the_checkout_folder():
    assert profiles_dir() == REPO / "platforms"


def test_every_shipped_profile_loads_by_name():
    profiles = list_profiles()
    assert {p.name for p in profiles} == SHIPPED
    for profile in profiles:
        assert load_profile(profile.name) == profile
        assert profile.source == profiles_dir() / f"{profile.name}.toml"
        assert profile.description and profile.engines and profile.devices and profile.precisions
        assert profile.thermal["warm_c"] < profile.thermal["hot_c"] < profile.thermal["critical_c"]
        # a device family has a memory default; a generic machine has none (cgroup or physical memory rule)
        assert profile.memory.get("budget_mb", 1) > 0
        assert ("budget_mb" in profile.memory) == (not profile.name.startswith("generic-"))
        assert profile.match, "every shipped profile can be detected"
        json.dumps(profile.to_dict())


def test_load_profile_by_path():
    path = REPO / "platforms" / "raspberry-pi-5.toml"
    assert load_profile(path) == load_profile(str(path)) == load_profile("raspberry-pi-5")


def test_shipped_profiles_say_what_the_issue_asks():
    rpi = load_profile("raspberry-pi-5")
    assert rpi.threads == 4 and rpi.thermal == {"warm_c": 70.0, "hot_c": 78.0, "critical_c": 82.0}
    jetson = load_profile("jetson-orin")
    assert jetson.devices[0] == "GPU" and jetson.engines[0] == "onnxruntime"
    assert load_profile("intel-core-ultra").engines[0] == "openvino"
    coral = load_profile("google-coral")
    assert coral.engines == ("litert",) and coral.precisions == ("int8",)
    assert load_profile("android-arm64").engines[0] == "litert"
    x86 = load_profile("generic-x86_64-linux")
    assert x86.engines == ("litert", "openvino", "onnxruntime") and x86.devices == ("NPU", "GPU", "CPU") and x86.threads is None
    assert x86.priority == min(p.priority for p in list_profiles())


def test_to_dict_is_a_copy():
    profile = load_profile("google-coral")
    d = profile.to_dict()
    d["match"]["any_of"].clear()
    d["thermal"]["warm_c"] = 0
    assert profile.match["any_of"] and profile.thermal["warm_c"] == 65.0
    assert d["source"] == str(profile.source)


# -- detection ---------------------------------------------------------------------------------------------

def test_detects_raspberry_pi_5(tmp_path):
    root = fake_machine(tmp_path, arch="aarch64", model="Raspberry Pi 5 Model B Rev 1.0", cpuinfo=ARM_CPUINFO)
    profile, reasons = detect_profile(root=root)
    assert profile.name == "raspberry-pi-5"
    assert reasons == ["device-tree model 'Raspberry Pi 5 Model B Rev 1.0' contains 'Raspberry Pi 5'",
                       "arch aarch64"]


def test_detects_jetson_orin_only_with_its_providers(tmp_path):
    root = fake_machine(tmp_path, arch="aarch64", model="NVIDIA Jetson Orin Nano Developer Kit", cpuinfo=ARM_CPUINFO)
    profile, reasons = detect_profile(root=root, ort_providers={"TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                                "CPUExecutionProvider"})
    assert profile.name == "jetson-orin"
    assert "device-tree model 'NVIDIA Jetson Orin Nano Developer Kit' contains 'NVIDIA Jetson'" in reasons
    assert "ONNX Runtime has TensorrtExecutionProvider, CUDAExecutionProvider" in reasons

    # Without the providers (not asked, or a CPU-only onnxruntime build) the board is a generic arm64 one.
    assert detect_profile(root=root)[0].name == "generic-arm64-linux"
    assert detect_profile(root=root, ort_providers={"CPUExecutionProvider"})[0].name == "generic-arm64-linux"


def test_detects_intel_core_ultra_with_an_openvino_npu(tmp_path):
    root = fake_machine(tmp_path, arch="x86_64", cpuinfo=INTEL_CPUINFO)
    profile, reasons = detect_profile(root=root, openvino_devices={"CPU", "GPU.0", "NPU"})
    assert profile.name == "intel-core-ultra"
    assert reasons == ["cpuinfo contains 'Intel(R) Core(TM) Ultra'", "arch x86_64", "OpenVINO has device NPU, GPU"]

    assert detect_profile(root=root, openvino_devices={"NPU"})[1][-1] == "OpenVINO has device NPU"
    assert detect_profile(root=root, openvino_devices={"CPU"})[0].name == "generic-x86_64-linux"
    assert detect_profile(root=root)[0].name == "generic-x86_64-linux"


def test_detects_android_arm64(tmp_path):
    root = fake_machine(tmp_path, arch="aarch64", cpuinfo=ARM_CPUINFO, android=True)
    profile, reasons = detect_profile(root=root)
    assert profile.name == "android-arm64"
    assert reasons == ["Android (system/build.prop present)", "arch aarch64"]


def test_a_snapdragon_android_phone_gets_the_vendor_profile(tmp_path):
    cpuinfo = ARM_CPUINFO + "Hardware\t: Qualcomm Technologies, Inc SM8550\n"
    root = fake_machine(tmp_path, arch="aarch64", cpuinfo=cpuinfo, android=True)
    profile, reasons = detect_profile(root=root)
    assert profile.name == "qualcomm-snapdragon"
    assert reasons == ["arch aarch64", "cpuinfo contains 'Qualcomm'"]


def test_detects_the_coral_dev_board(tmp_path):
    root = fake_machine(tmp_path, arch="aarch64", model="Freescale i.MX8MQ Phanbell", cpuinfo=ARM_CPUINFO)
    profile, reasons = detect_profile(root=root)
    assert profile.name == "google-coral"
    assert reasons == ["device-tree model 'Freescale i.MX8MQ Phanbell' contains 'Freescale i.MX8MQ Phanbell'"]


def test_an_unknown_arm64_board_falls_back_to_generic(tmp_path):
    root = fake_machine(tmp_path, arch="aarch64", model="Pine64 RockPro64 v2.1", cpuinfo=ARM_CPUINFO)
    profile, reasons = detect_profile(root=root)
    assert profile.name == "generic-arm64-linux"
    assert reasons == ["not Android", "arch aarch64"]


def test_an_architecture_without_a_profile_is_told(tmp_path):
    root = fake_machine(tmp_path, arch="riscv64", cpuinfo="isa\t: rv64imafdc\n")
    profile, reasons = detect_profile(root=root)
    assert profile.name == "generic-x86_64-linux"
    assert reasons == ["no platform profile matches this machine (arch riscv64); generic-x86_64-linux is the fallback"]


def test_this_machine_falls_back_to_its_generic_profile():
    profile, reasons = detect_profile()
    machine = platform.machine().lower()
    assert profile.name == GENERIC[machine]
    assert f"arch {profile.match['arch'][0]}" in reasons


def test_an_empty_fake_root_uses_the_interpreters_arch(tmp_path):
    profile, reasons = detect_profile(root=tmp_path)
    assert profile.name == GENERIC[platform.machine().lower()]


def test_detection_imports_no_engine(tmp_path):
    script = ("import sys, edgesdk.runtime.profiles as p; p.detect_profile(); p.list_profiles(); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('onnxruntime', 'openvino', 'ai_edge_litert', 'tflite_runtime', 'torch')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"


# -- misuse ------------------------------------------------------------------------------------------------

def test_unknown_profile_name_lists_the_known_ones():
    with pytest.raises(InputError, match=r"unknown platform profile 'raspberry-pi-6' \(known: android-arm64, "
                                         r"generic-arm64-linux, .*raspberry-pi-5\)"):
        load_profile("raspberry-pi-6")


def test_missing_profile_file(tmp_path):
    with pytest.raises(InputError, match=r"platform profile file .*nowhere.toml does not exist"):
        load_profile(tmp_path / "nowhere.toml")


def test_bad_toml(tmp_path):
    path = write_profile(tmp_path, "my-board", 'name = "my-board"\nengines = [litert\n')
    with pytest.raises(InputError, match=r"my-board.toml is not valid TOML"):
        load_profile(path)


def test_a_valid_custom_profile_loads(tmp_path):
    profile = load_profile(write_profile(tmp_path, "my-board", VALID))
    assert profile == Profile(name="my-board", description="A board of ours", engines=("litert",), devices=("CPU",),
                              precisions=("int8",), threads=None, thermal={}, memory={}, match={}, priority=0,
                              source=tmp_path / "my-board.toml")


def test_a_profile_without_match_conditions_is_never_detected(tmp_path):
    profile = load_profile(write_profile(tmp_path, "my-board", VALID))
    assert profile.match == {}
    assert detect_profile(root=tmp_path)[0].name in SHIPPED


@pytest.mark.parametrize("extra, message", [
    ('colour = "blue"\n', r"my-board.toml: key 'colour': unknown key \(known: name, description"),
    ('[match]\ngpu_vendor = ["nvidia"]\n', r"key 'match.gpu_vendor': unknown key \(known: device_tree_model"),
    ('[thermal]\nwarm_c = 60.0\nhot_c = 70.0\ncritical_c = 80.0\nemergency_c = 90.0\n',
     r"key 'thermal.emergency_c': unknown key"),
    ('[[match.any_of]]\nram_gb = 4\n', r"key 'match.any_of\[0\].ram_gb': unknown key"),
])
def test_unknown_key(tmp_path, extra, message):
    with pytest.raises(InputError, match=message):
        load_profile(write_profile(tmp_path, "my-board", VALID + extra))


@pytest.mark.parametrize("field, value, message", [
    ("engines", '["litert", "tensorrt"]', r"key 'engines': unknown engine 'tensorrt' \(known: litert, openvino, "
                                          r"onnxruntime\)"),
    ("devices", '["TPU"]', r"key 'devices': unknown device kind 'TPU' \(known: NPU, GPU, CPU\)"),
    ("precisions", '["fp16"]', r"key 'precisions': unknown precision 'fp16' \(known: int8, fp32\)"),
    ("engines", '"litert"', r"key 'engines': must be a list of non-empty strings, got 'litert'"),
    ("engines", "[]", r"key 'engines': must not be empty"),
    ("devices", '["CPU", "CPU"]', r"key 'devices': 'CPU' is listed twice"),
    ("description", "3", r"key 'description': must be a non-empty string, got an integer"),
    ("name", '"other-board"', r"key 'name': 'other-board' must be the file's name without .toml \('my-board'\)"),
])
def test_bad_field(tmp_path, field, value, message):
    text = "\n".join(f"{field} = {value}" if line.startswith(f"{field} =") else line for line in VALID.splitlines())
    with pytest.raises(InputError, match=r"platform profile .*my-board.toml: " + message):
        load_profile(write_profile(tmp_path, "my-board", text))


@pytest.mark.parametrize("extra, message", [
    ('threads = "4"\n', r"key 'threads': must be an integer, got a string '4'"),
    ("threads = 0\n", r"key 'threads': must be at least 1, got 0"),
    ("threads = true\n", r"key 'threads': must be an integer, got a boolean"),
    ('match = "aarch64"\n', r"key 'match': must be a table \(\[match\]\), got a string"),
    ('[match]\narch = "aarch64"\n', r"key 'match.arch': must be a list of non-empty strings"),
    ('[match]\nandroid = "yes"\n', r"key 'match.android': must be true or false, got a string"),
    ('[match]\npriority = 1.5\n', r"key 'match.priority': must be an integer, got a float"),
    ('[match]\nort_providers = ["CUDA"]\n', r"key 'match.ort_providers': 'CUDA' is not an ONNX Runtime provider name"),
    ('[match]\nopenvino_devices = ["VPU"]\n', r"key 'match.openvino_devices': unknown OpenVINO device kind 'VPU'"),
    ('[[match.any_of]]\narch = []\n', r"key 'match.any_of\[0\]': sets no condition"),
    ('[thermal]\nwarm_c = 80.0\nhot_c = 70.0\ncritical_c = 90.0\n', r"key 'thermal.warm_c': thermal limits must rise"),
    ('[thermal]\nwarm_c = 80.0\n', r"key 'thermal.hot_c': missing"),
    ('[thermal]\nwarm_c = "hot"\nhot_c = 70.0\ncritical_c = 90.0\n', r"key 'thermal.warm_c': must be a number"),
    ("[memory]\nbudget_mb = -1\n", r"key 'memory.budget_mb': must be at least 1, got -1"),
])
def test_bad_optional_field(tmp_path, extra, message):
    with pytest.raises(InputError, match=r"platform profile .*my-board.toml: " + message):
        load_profile(write_profile(tmp_path, "my-board", VALID + extra))


def test_missing_required_key(tmp_path):
    text = "\n".join(line for line in VALID.splitlines() if not line.startswith("precisions"))
    with pytest.raises(InputError, match=r"my-board.toml: key 'precisions': missing"):
        load_profile(write_profile(tmp_path, "my-board", text))
