"""``edgesdk export kserve`` and ``edgesdk export triton``: what is written, what is refused, and that the exported
bundle serves. The InferenceService is checked field by field against KServe's and Kubernetes' own API models, and
config.pbtxt is parsed with Triton's ModelConfig schema (both from the cloud venv); neither a cluster nor Triton
runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from cloud_server import CloudServer, cloud_venv
from edgesdk import Bundle
from edgesdk.file_digest import sha256_file
from edgesdk.errors import BundleError, ConversionError, FailedArtifactWarning
from edgesdk_cloud.export import MARKER, export_kserve, export_triton
from support import fail_validation

SCRIPT = Path(sys.executable).with_name("edgesdk")
ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
KSERVE_ENTRIES = [MARKER, "Dockerfile", "README.md", "digits.bundle/", "inferenceservice.yaml"]


def edgesdk(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300)


def entrypoint(out: Path) -> list[str]:
    line = next(l for l in (out / "Dockerfile").read_text().splitlines() if l.startswith("ENTRYPOINT "))
    return json.loads(line.removeprefix("ENTRYPOINT "))


def container(out: Path) -> dict:
    return yaml.safe_load((out / "inferenceservice.yaml").read_text())["spec"]["predictor"]["containers"][0]


def mebibytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


@pytest.fixture(scope="module")
def kserve_out(digits_bundle, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("export") / "digits-kserve"
    proc = edgesdk("export", "kserve", digits_bundle.bundle, out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


# -- export kserve: what is written ------------------------------------------------------------------------------

def test_kserve_writes_the_bundle_dockerfile_inferenceservice_and_readme(kserve_out, digits_bundle):
    out, proc = kserve_out
    assert sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()) == KSERVE_ENTRIES
    assert f"written to {out}" in proc.stdout and all(f"  {e}" in proc.stdout for e in KSERVE_ENTRIES)
    copy = Bundle.open(out / "digits.bundle")  # checksums verified
    listed = {"manifest.json", *(e["path"] for e in copy.file_entries())}
    assert {p.relative_to(copy.root).as_posix() for p in copy.root.rglob("*") if p.is_file()} == listed
    for rel in listed:
        assert (copy.root / rel).read_bytes() == (digits_bundle.bundle / rel).read_bytes(), rel
    assert json.loads((out / MARKER).read_text())["export"] == "kserve"


def test_dockerfile_installs_the_cloud_extra_and_serves_the_bundle_on_8080(kserve_out):
    out, _ = kserve_out
    text = (out / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim$", text, re.M)
    assert re.search(r"^ARG PYTHON_VERSION=3\.\d+$", text, re.M)
    assert 'ARG EDGESDK_REQUIREMENT="edgesdk-cloud[serve]==0.1.0"' in text
    assert 'ARG ENGINE_REQUIREMENT="edgesdk[onnxruntime]==0.1.0"' in text
    assert 'RUN pip install --no-cache-dir "${EDGESDK_REQUIREMENT}" "${ENGINE_REQUIREMENT}"' in text
    assert 'RUN pip install --no-cache-dir "${EDGESDK_REQUIREMENT}"' in text
    assert re.search(r"^COPY digits\.bundle /mnt/models/digits\.bundle$", text, re.M)
    assert entrypoint(out) == ["edgesdk", "serve", "/mnt/models/digits.bundle", "--artifact", "onnxruntime-fp32",
                               "--host", "0.0.0.0", "--port", "8080"]
    assert "0.0.0.0 is right inside a container" in text


@pytest.mark.parametrize("artifact, extra", [("openvino-fp32", "openvino"), ("litert-int8", "litert")])
def test_dockerfile_installs_the_engine_of_the_chosen_artifact(digits_bundle, tmp_path, artifact, extra):
    out = tmp_path / "out"
    assert export_kserve(digits_bundle.bundle, out, artifact=artifact).artifact == artifact
    assert f'ARG ENGINE_REQUIREMENT="edgesdk[{extra}]==0.1.0"' in (out / "Dockerfile").read_text()
    assert entrypoint(out)[3:5] == ["--artifact", artifact]
    assert yaml.safe_load((out / "inferenceservice.yaml").read_text())["metadata"]["annotations"][
        "edgesdk/artifact"] == artifact


def test_inferenceservice_is_a_v2_custom_predictor_on_8080(kserve_out):
    out, _ = kserve_out
    isvc = yaml.safe_load((out / "inferenceservice.yaml").read_text())
    assert (isvc["apiVersion"], isvc["kind"], isvc["metadata"]["name"]) == (
        "serving.kserve.io/v1beta1", "InferenceService", "digits")
    assert list(isvc["spec"]) == ["predictor"] and list(isvc["spec"]["predictor"]) == ["containers"]
    c = container(out)
    assert (c["name"], c["image"]) == ("kserve-container", "edgesdk-digits:1")
    assert c["env"] == [{"name": "PROTOCOL", "value": "v2"}]  # how KServe reads a custom predictor's protocol
    assert c["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    requests, limits = c["resources"]["requests"], c["resources"]["limits"]
    assert float(requests["cpu"]) <= float(limits["cpu"])
    assert 512 <= mebibytes(requests["memory"]) <= mebibytes(limits["memory"])


CHECK_FIELDS = r"""
import json, re, sys
import kubernetes.client as kc
import kserve.models as km
import yaml

PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": (int, str)}

def check(value, kind, where, errors):
    if m := re.fullmatch(r"(?:list|List)\[(.+)\]", kind):
        if not isinstance(value, list):
            return errors.append(f"{where}: not a list")
        for i, item in enumerate(value):
            check(item, m.group(1), f"{where}[{i}]", errors)
    elif m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", kind):
        if not isinstance(value, dict):
            return errors.append(f"{where}: not a map")
        for key, item in value.items():
            check(item, m.group(1) or m.group(2), f"{where}.{key}", errors)
    elif kind in PRIMITIVE:
        if not isinstance(value, PRIMITIVE[kind]) or (kind == "int" and isinstance(value, bool)):
            errors.append(f"{where}: {value!r} is not {kind}")
    elif model := getattr(km, kind, None) or getattr(kc, kind, None):
        if not isinstance(value, dict):
            return errors.append(f"{where}: not an object ({kind})")
        fields = {key: model.openapi_types[attr] for attr, key in model.attribute_map.items()}
        for key, item in value.items():
            if key not in fields:
                errors.append(f"{where}: {kind} has no field {key!r}")
            else:
                check(item, fields[key], f"{where}.{key}", errors)
    else:
        errors.append(f"{where}: unknown type {kind}")

doc = yaml.safe_load(open(sys.argv[1]))
if len(sys.argv) > 2:  # the negative control: a field that does not exist on a custom predictor
    doc["spec"]["predictor"]["protocolVersion"] = "v2"
errors = []
check(doc, "V1beta1InferenceService", "", errors)
print(json.dumps(errors))
"""


def _field_errors(path: Path, *extra: str) -> list[str]:
    proc = subprocess.run([str(cloud_venv() / "bin" / "python"), "-c", CHECK_FIELDS, str(path), *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_inferenceservice_uses_only_fields_that_kserve_and_kubernetes_define(kserve_out):
    """Every key and value type is looked up in kserve's V1beta1 models and the Kubernetes client's models: what
    kubectl's strict field validation would refuse is caught here (the control shows a bad field is)."""
    out, _ = kserve_out
    assert _field_errors(out / "inferenceservice.yaml") == []
    assert _field_errors(out / "inferenceservice.yaml", "control") == [
        ".spec.predictor: V1beta1PredictorSpec has no field 'protocolVersion'"]


def test_image_option_names_the_image_in_the_yaml_and_readme(digits_bundle, tmp_path):
    out = tmp_path / "out"
    export_kserve(digits_bundle.bundle, out, image="registry.example.com/team/digits:2")
    assert container(out)["image"] == "registry.example.com/team/digits:2"
    assert "docker build -t registry.example.com/team/digits:2 ." in (out / "README.md").read_text()


def test_readme_gives_build_push_apply_and_the_device_command(kserve_out):
    text = (kserve_out[0] / "README.md").read_text()
    for command in ("docker build -t edgesdk-digits:1 .", "docker push edgesdk-digits:1",
                    "kubectl apply -f inferenceservice.yaml",
                    "edgesdk run digits.bundle image.png --mode prefer-device --cloud https://<host>"):
        assert command in text, command


def test_exported_bundle_serves_as_the_entrypoint_says(kserve_out, tmp_path):
    """The copy in OUT is complete: ``edgesdk serve`` with the Dockerfile's arguments (host and port aside, which a
    shared machine cannot give) loads it and answers like the artifact run here, within the memory requested."""
    out, _ = kserve_out
    args = entrypoint(out)
    artifact = args[args.index("--artifact") + 1]
    copy = out / "digits.bundle"
    x = Bundle.open(copy).golden()["input_0"][:1]
    with CloudServer(copy, "--artifact", artifact, log_dir=tmp_path) as server:
        status, answer = server.infer({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                                   "data": x.ravel().tolist()}]})
        server_process = psutil.Process(server.proc.pid)
        rss = sum(p.memory_info().rss for p in [server_process, *server_process.children(recursive=True)])
    assert status == 200, answer
    with Bundle.open(copy).artifact(artifact).open() as engine:
        expected = engine.run([x])[0]
    got = np.asarray(answer["outputs"][0]["data"], dtype=np.float32).reshape(answer["outputs"][0]["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert rss < mebibytes(container(out)["resources"]["requests"]["memory"]) * 2**20


def test_export_module_imports_nothing_of_the_cloud_stack():
    code = ("import sys, edgesdk_cloud.export; "
            "print([m for m in sys.modules if m.split('.')[0] in ('kserve', 'fastapi', 'uvicorn', 'yaml')])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


# -- export kserve: refusals ------------------------------------------------------------------------------------

def test_a_tampered_bundle_is_refused_before_anything_is_written(bundle_copy, tmp_path):
    with open(bundle_copy / "onnx" / "model_fp32.onnx", "ab") as fh:
        fh.write(b"\0")
    out = tmp_path / "out"
    with pytest.raises(BundleError, match=r"bundle file 'onnx/model_fp32.onnx' was altered"):
        export_kserve(bundle_copy, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["copy.bundle"]  # no temporary folder left either


def test_a_missing_bundle_is_a_one_line_error_exit_2(tmp_path):
    proc = edgesdk("export", "kserve", tmp_path / "nowhere", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: BundleError: bundle not found: {tmp_path / 'nowhere'} is not a directory"
    assert not (tmp_path / "out").exists()


def test_an_unknown_artifact_is_refused_naming_the_artifacts(digits_bundle, tmp_path):
    with pytest.raises(BundleError, match=r"has no artifact 'tpu-int8' \(artifacts: litert-fp32, .*onnxruntime-int8\)"):
        export_kserve(digits_bundle.bundle, tmp_path / "out", artifact="tpu-int8")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("image", ["", "https://registry.example.com/digits:1", "my image:1"])
def test_a_bad_image_is_refused(digits_bundle, tmp_path, image):
    with pytest.raises(ConversionError, match=r"--image must be an image reference"):
        export_kserve(digits_bundle.bundle, tmp_path / "out", image=image)


def test_an_existing_folder_is_refused_without_force(kserve_out, digits_bundle):
    out, _ = kserve_out
    before = sorted(out.iterdir())
    proc = edgesdk("export", "kserve", digits_bundle.bundle, out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: ConversionError: output {out} exists and is not empty "
                                   f"(pass --force to replace a previous export)")
    assert sorted(out.iterdir()) == before


def test_force_never_replaces_a_folder_that_is_not_an_export(digits_bundle, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConversionError, match=r"is not an edgesdk export \(no \.edgesdk-export\); refusing to "
                                              r"replace it"):
        export_kserve(digits_bundle.bundle, out, force=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_force_replaces_a_previous_export(digits_bundle, tmp_path):
    out = tmp_path / "out"
    export_kserve(digits_bundle.bundle, out)
    (out / "stale.txt").write_text("from the old export")
    result = export_kserve(digits_bundle.bundle, out, image="other:2", force=True)
    assert list(result.entries) == KSERVE_ENTRIES and not (out / "stale.txt").exists()
    assert container(out)["image"] == "other:2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old export is gone, not set aside


def test_an_empty_folder_is_filled(digits_bundle, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert list(export_kserve(digits_bundle.bundle, out).entries) == KSERVE_ENTRIES


def test_an_output_holding_the_bundle_or_inside_it_is_refused(bundle_copy, tmp_path):
    with pytest.raises(ConversionError, match=r"holds the bundle .*copy\.bundle; write the export elsewhere"):
        export_kserve(bundle_copy, tmp_path, force=True)
    with pytest.raises(ConversionError, match=r"is inside the bundle .*copy\.bundle; write the export elsewhere"):
        export_kserve(bundle_copy, bundle_copy / "export")
    assert not (bundle_copy / "export").exists()
    Bundle.open(bundle_copy)


def test_an_output_that_is_a_file_is_refused(digits_bundle, tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(ConversionError, match=r"exists and is not a directory"):
        export_kserve(digits_bundle.bundle, tmp_path / "out", force=True)
    assert (tmp_path / "out").read_text() == "a file"


# -- export triton -----------------------------------------------------------------------------------------------

PARSE_CONFIG = r"""
import importlib.util, json, pathlib, sys
import tritonclient
from google.protobuf import json_format, text_format

# tritonclient.grpc's package needs grpcio, which the http client does not: load the schema module on its own.
path = pathlib.Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
spec = importlib.util.spec_from_file_location("model_config_pb2", path)
schema = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schema)
config = text_format.Parse(pathlib.Path(sys.argv[1]).read_text(), schema.ModelConfig())
print(json.dumps(json_format.MessageToDict(config, always_print_fields_with_no_presence=True)))
"""


def triton_config(path: Path) -> dict:
    """config.pbtxt parsed with Triton's own ModelConfig protobuf schema (an unknown field or enum fails)."""
    proc = subprocess.run([str(cloud_venv() / "bin" / "python"), "-c", PARSE_CONFIG, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def triton_out(digits_bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model-repository"
    proc = edgesdk("export", "triton", digits_bundle.bundle, out)
    assert proc.returncode == 0, proc.stderr
    assert f"Triton model repository (artifact onnxruntime-fp32) written to {out}" in proc.stdout
    return out


def test_triton_writes_a_model_repository_with_the_onnx_artifact_unchanged(triton_out, digits_bundle):
    files = sorted(p.relative_to(triton_out).as_posix() for p in triton_out.rglob("*") if p.is_file())
    assert files == [MARKER, "README.md", "digits/1/model.onnx", "digits/config.pbtxt"]
    source = Bundle.open(digits_bundle.bundle).artifact("onnxruntime-fp32").model_path
    assert (triton_out / "digits/1/model.onnx").read_bytes() == source.read_bytes()


def check_triton_config(out: Path, manifest: dict) -> dict:
    """config.pbtxt against the manifest (shapes, datatypes, in order) and against the ONNX file, as Triton's
    onnxruntime backend compares them: the same tensor names, shapes and types."""
    import onnxruntime as ort

    config = triton_config(out / "digits" / "config.pbtxt")
    assert (config["name"], config["platform"], config["maxBatchSize"]) == ("digits", "onnxruntime_onnx", 0)
    session = ort.InferenceSession(str(out / "digits/1/model.onnx"), providers=["CPUExecutionProvider"])
    for kind, tensors in (("input", session.get_inputs()), ("output", session.get_outputs())):
        assert [(t["dataType"], [int(d) for d in t["dims"]]) for t in config[kind]] == [
            ("TYPE_FP32", t["shape"]) for t in manifest[kind + "s"]]
        assert [(t.name, t.shape, t.type) for t in tensors] == [
            (c["name"], [int(d) for d in c["dims"]], "tensor(float)") for c in config[kind]]
    return config


def test_triton_config_matches_the_manifest_and_the_onnx_model(triton_out, digits_bundle):
    config = check_triton_config(triton_out, digits_bundle.manifest)
    # The ONNX file names its output differently from the manifest: Triton needs the file's name.
    assert [t["name"] for t in config["input"]] == ["x"] and [t["name"] for t in config["output"]] != ["output_0"]
    readme = (triton_out / "README.md").read_text()
    assert "so its inputs are what a device running the bundle sends" in readme


def test_triton_exports_the_int8_artifact_when_asked(digits_bundle, tmp_path):
    result = export_triton(digits_bundle.bundle, tmp_path / "out", artifact="onnxruntime-int8")
    assert result.artifact == "onnxruntime-int8"
    source = Bundle.open(digits_bundle.bundle).artifact("onnxruntime-int8").model_path
    assert sha256_file(tmp_path / "out/digits/1/model.onnx") == sha256_file(source)
    assert "artifact onnxruntime-int8" in (tmp_path / "out/digits/config.pbtxt").read_text()
    check_triton_config(tmp_path / "out", digits_bundle.manifest)


def test_triton_refuses_an_artifact_that_is_not_onnx(digits_bundle, tmp_path):
    with pytest.raises(ConversionError, match=r"'litert-fp32' is for litert \(ONNX artifacts of bundle 'digits': "
                                              r"onnxruntime-fp32, onnxruntime-int8\)"):
        export_triton(digits_bundle.bundle, tmp_path / "out", artifact="litert-fp32")
    assert not (tmp_path / "out").exists()


def test_triton_refuses_a_bundle_without_onnx_artifacts(bundle_copy, tmp_path):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["engine"] != "onnxruntime"]
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(bundle_copy / "onnx")
    with pytest.raises(ConversionError, match=r"has no ONNX fp32 artifact to export by default \(ONNX artifacts: "
                                              r"none\)"):
        export_triton(bundle_copy, tmp_path / "out")


def test_triton_refuses_to_replace_a_kserve_folder_of_the_users_own_but_replaces_an_export(kserve_out, digits_bundle,
                                                                                           tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.onnx").write_bytes(b"mine")
    with pytest.raises(ConversionError, match=r"not an edgesdk export"):
        export_triton(digits_bundle.bundle, mine, force=True)
    assert (mine / "model.onnx").read_bytes() == b"mine"
    out = tmp_path / "kserve-copy"
    shutil.copytree(kserve_out[0], out)
    assert list(export_triton(digits_bundle.bundle, out, force=True).entries) == [MARKER, "README.md", "digits/"]


# -- artifacts that failed their validation gate ---------------------------------------------------------------

GATE = "accuracy drop 1.48 points > max 0.5 at quantize time"


@pytest.mark.parametrize("kind", ["kserve", "triton"])
def test_a_failed_artifact_is_refused_without_allow_failed_exit_2(bundle_copy, tmp_path, kind):
    fail_validation(bundle_copy, "onnxruntime-int8")
    out = tmp_path / "out"
    proc = edgesdk("export", kind, bundle_copy, out, "--artifact", "onnxruntime-int8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: BundleError: artifact 'onnxruntime-int8' of bundle 'digits' failed its "
                                   f"validation gate ({GATE}); it is served only with allow_failed=True (CLI: "
                                   f"--allow-failed), or re-quantize the bundle")
    assert not out.exists()


def test_kserve_exports_a_failed_artifact_with_allow_failed_and_the_image_serves_it_so(bundle_copy, tmp_path):
    fail_validation(bundle_copy, "onnxruntime-int8")
    proc = edgesdk("export", "kserve", bundle_copy, tmp_path / "out", "--artifact", "onnxruntime-int8",
                   "--allow-failed")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: serving artifact 'onnxruntime-int8' of bundle 'digits', which failed its validation gate " \
           f"({GATE}), because allow_failed is set" in proc.stderr
    assert entrypoint(tmp_path / "out")[:6] == ["edgesdk", "serve", "/mnt/models/digits.bundle", "--artifact",
                                                 "onnxruntime-int8", "--allow-failed"]


def test_triton_exports_a_failed_artifact_with_allow_failed_and_a_warning(bundle_copy, tmp_path):
    fail_validation(bundle_copy, "onnxruntime-int8")
    with pytest.warns(FailedArtifactWarning, match=r"'onnxruntime-int8' .* failed its validation gate"):
        result = export_triton(bundle_copy, tmp_path / "out", artifact="onnxruntime-int8", allow_failed=True)
    assert result.artifact == "onnxruntime-int8"


def test_the_default_artifact_is_never_one_that_failed(bundle_copy, tmp_path):
    fail_validation(bundle_copy, "onnxruntime-fp32")
    kserve = export_kserve(bundle_copy, tmp_path / "kserve")
    assert kserve.artifact != "onnxruntime-fp32" and kserve.artifact.endswith("-fp32")
    assert "--allow-failed" not in entrypoint(tmp_path / "kserve")
    with pytest.raises(BundleError, match=r"bundle 'digits': its ONNX fp32 artifact failed its validation gate "
                                          r"\(golden agreement drop 1\.48 points > max 0\.5 at quantize time\); "
                                          r"re-quantize the bundle, or name an artifact with --artifact and "
                                          r"--allow-failed"):
        export_triton(bundle_copy, tmp_path / "triton")
    assert not (tmp_path / "triton").exists()

