"""The device package never loads the workstation or the cloud side (nor the cloud package the workstation):
checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

from edgesdk.engines import ENGINE_NAMES

FORBIDDEN = ("torch", "nncf", "litert_torch", "edgesdk_converters", "converters", "tensorflow", "ai_edge_quantizer",
             "onnx", "edgesdk_cloud", "cloud", "kserve", "fastapi", "uvicorn")
ENGINE_PACKAGES = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime")

_PRELUDE = f"""
import importlib, json, pkgutil, sys

def loaded(roots):
    return sorted(m for m in sys.modules if m.split(".")[0] in roots)

FORBIDDEN = {FORBIDDEN!r}
ENGINES = {ENGINE_PACKAGES!r}
report = {{}}
"""

DEVICE_SCRIPT = _PRELUDE + """
import edgesdk
report["after_import"] = loaded(FORBIDDEN)
report["engines_after_import"] = loaded(ENGINES)
report["modules"] = [m.name for m in pkgutil.walk_packages(edgesdk.__path__, "edgesdk.")]
for name in report["modules"]:
    importlib.import_module(name)
report["after_all_modules"] = loaded(FORBIDDEN)

from edgesdk import Bundle
from edgesdk.engines import open_engine

bundle = Bundle.open(sys.argv[1])
golden = bundle.golden()
report["ran"] = []
for art in bundle.artifacts:
    with art.open() as engine:
        engine.run([golden["input_0"][:1]])
        report["ran"].append(art.id)
report["after_engines"] = loaded(FORBIDDEN)

from edgesdk.cli import main  # the device-side command, run as the console script would
sys.argv = ["edgesdk", "inspect", sys.argv[1]]
report["inspect_exit"] = 0
try:
    main()
except SystemExit as exc:
    report["inspect_exit"] = exc.code
report["after_inspect"] = loaded(FORBIDDEN)
print("REPORT " + json.dumps(report))
"""

LAZY_ENGINE_SCRIPT = _PRELUDE + """
import edgesdk, edgesdk.engines
report["after_import"] = loaded(ENGINES)
from edgesdk.engines import open_engine
open_engine("onnxruntime", sys.argv[1]).close()
report["after_onnxruntime"] = loaded(ENGINES)
print("REPORT " + json.dumps(report))
"""


LOAD_SCRIPT = _PRELUDE + """
import edgesdk
model = edgesdk.load(sys.argv[1])
model.predict(sys.argv[2])
report["placement"] = model.placement.engine
for engine in ("litert", "openvino", "onnxruntime"):
    with edgesdk.load(sys.argv[1], engine=engine, policy="cpu-only") as m:
        m.predict(sys.argv[2])
report["after_load"] = loaded(FORBIDDEN)
print("REPORT " + json.dumps(report))
"""

CLOUD_SCRIPT = _PRELUDE + """
import edgesdk_cloud
report["modules"] = [m.name for m in pkgutil.walk_packages(edgesdk_cloud.__path__, "edgesdk_cloud.")]
for name in report["modules"]:
    importlib.import_module(name)
report["after_all_modules"] = loaded(("edgesdk_converters", "converters", "torch", "nncf", "litert_torch", "onnx",
                                      "kserve", "fastapi", "uvicorn"))
print("REPORT " + json.dumps(report))
"""


def _run(script: str, *args, cwd) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):]) | {"stdout": proc.stdout}


def test_device_package_loads_no_workstation_or_cloud_module(digits_bundle, tmp_path):
    report = _run(DEVICE_SCRIPT, digits_bundle.bundle, cwd=tmp_path)
    for name in ("edgesdk.bundle.reader", "edgesdk.cli", "edgesdk.errors", "edgesdk.bundle.preprocess", "edgesdk.bundle.report",
                 "edgesdk.engines", "edgesdk.engines.base", "edgesdk.engines.litert", "edgesdk.engines.openvino",
                 "edgesdk.engines.onnxruntime"):
        assert name in report["modules"], name
    assert report["after_import"] == []
    assert report["engines_after_import"] == []  # no engine is imported until one is asked for
    assert report["after_all_modules"] == []
    assert report["ran"] == [a["id"] for a in digits_bundle.manifest["artifacts"]]
    assert report["after_engines"] == []
    assert report["inspect_exit"] in (None, 0)
    assert "onnxruntime-int8" in report["stdout"]
    assert report["after_inspect"] == []


def test_engine_registry_imports_only_the_engine_asked_for(digits_bundle, tmp_path):
    model = digits_bundle.bundle / "onnx" / "model_int8.onnx"
    report = _run(LAZY_ENGINE_SCRIPT, model, cwd=tmp_path)
    assert report["after_import"] == []
    assert {m.split(".")[0] for m in report["after_onnxruntime"]} == {"onnxruntime"}


def test_load_and_predict_load_no_workstation_or_cloud_module(digits_bundle, digits_images, tmp_path):
    image = sorted((digits_images / "val" / "0").glob("*.png"))[0]
    report = _run(LOAD_SCRIPT, digits_bundle.bundle, image, cwd=tmp_path)
    assert report["placement"] in ENGINE_NAMES
    assert report["after_load"] == []


def test_cloud_package_imports_no_workstation_module_and_kserve_only_to_serve(tmp_path):
    report = _run(CLOUD_SCRIPT, cwd=tmp_path)
    assert {"edgesdk_cloud.server", "edgesdk_cloud.export"} <= set(report["modules"])
    assert report["after_all_modules"] == []
