"""``edgesdk export``: what a cloud deployment of a bundle needs, written into a new folder.

- :func:`export_kserve`: the bundle, a ``Dockerfile`` for a custom KServe predictor image that runs
  ``edgesdk serve`` on it, an ``inferenceservice.yaml`` and a README with the commands.
- :func:`export_triton`: a Triton model repository holding one ONNX artifact of the bundle.

Both verify the bundle before anything is written, write into a temporary folder next to ``out`` and move it into
place when complete. ``out`` must be new or empty; ``force`` replaces only a previous export, recognised by the
marker file ``.edgesdk-export`` every export writes, never a folder of the user's own. Errors: :class:`BundleError`
for a bad bundle, an unknown artifact id, or an artifact that failed its validation gate at quantize time (exported
only with ``allow_failed``, then with a :class:`~edgesdk.errors.FailedArtifactWarning`; never the default),
:class:`ConversionError` for an output or option that cannot be used.

Every manifest string written into a generated file is checked first (:func:`~edgesdk_cloud.escaping.check_text`:
one line of printable text, else :class:`BundleError` naming the field) and escaped where it is written (JSON or
protobuf strings for values, :mod:`edgesdk_cloud.escaping` for comments and Markdown, shell quoting in commands).
The KServe manifest's memory is derived from the request caps ``edgesdk serve`` enforces
(:class:`~edgesdk_cloud.limits.ServeLimits`), with the arithmetic in a comment.

Exporting writes text and copies files: this module imports nothing beyond the standard library and edgesdk, and
runs wherever edgesdk is installed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk import __version__
from edgesdk.atomic_file import check_replaceable, publish_dir
from edgesdk.bundle.reader import MANIFEST, Artifact, Bundle, safe_member
from edgesdk.hybrid.served_artifact import serving_artifact
from edgesdk.errors import BundleError, ConversionError

from .escaping import check_text, md_code, one_line
from .limits import ServeLimits
from .triton_files import triton_config, triton_readme

MARKER = ".edgesdk-export"
PORT = 8080  # KServe sends a custom predictor's traffic to this container port
MODELS_DIR = "/mnt/models"  # where KServe images keep models; nothing is mounted over it without a storageUri
PYTHON_VERSION = "3.11"  # the Python the cloud side is tested with (kserve 0.21 takes 3.10 to 3.13)
ISVC_NAME_MAX = 45  # KServe's longest derived name, the Knative revision <name>-predictor-00001, is a 63-char label


@dataclass(frozen=True)
class Export:
    """What an export wrote: the folder, the artifact it serves, and the entries of the folder."""

    out: Path
    artifact: str
    entries: tuple[str, ...]


def export_kserve(bundle_path: str | Path, out: str | Path, image: str | None = None, artifact: str | None = None,
                  force: bool = False, allow_failed: bool = False, max_batch: int | None = None,
                  max_body_bytes: int | None = None) -> Export:
    """Write ``out`` for a KServe InferenceService that serves the bundle with ``edgesdk serve`` (V2 REST).

    ``artifact`` is the artifact id to serve (default: the most accurate float artifact, on a tie the golden
    reference, then manifest order; the image installs its engine). ``image`` is the image name written into
    ``inferenceservice.yaml`` (default ``edgesdk-<bundle name>:<bundle version>``). ``max_batch`` and
    ``max_body_bytes`` are ``edgesdk serve``'s request caps (default: derived from the bundle's inputs); the
    manifest's memory follows from them and the model's size.
    """
    bundle = Bundle.open(bundle_path)
    chosen = bundle.servable_artifact(artifact, allow_failed) if artifact is not None else _default_float(bundle)
    _check_strings(bundle, chosen)
    limits = ServeLimits.for_manifest(bundle.manifest, max_batch, max_body_bytes)
    bundle.warn_if_failed(chosen.id)
    slug = _dns_label(bundle.name)
    image = _check_image(image) if image is not None else f"edgesdk-{slug}:{_tag(bundle.manifest['version'])}"
    out = _check_output(Path(out), bundle, force)
    bundle_dir = f"{slug}.bundle"

    def write(work: Path) -> None:
        _copy_bundle(bundle, work / bundle_dir)
        caps = {"--max-batch": max_batch, "--max-body-bytes": max_body_bytes}
        (work / "Dockerfile").write_text(_dockerfile(bundle, chosen, bundle_dir, caps), encoding="utf-8")
        (work / "inferenceservice.yaml").write_text(_inference_service(bundle, chosen, image, limits),
                                                    encoding="utf-8")
        (work / "README.md").write_text(_kserve_readme(bundle, chosen, image, bundle_dir, limits), encoding="utf-8")

    return _export("kserve", bundle, chosen, out, write)


def export_triton(bundle_path: str | Path, out: str | Path, artifact: str | None = None,
                  force: bool = False, allow_failed: bool = False) -> Export:
    """Write ``out`` as a Triton model repository: ``<name>/config.pbtxt`` and ``<name>/1/model.onnx``.

    ``artifact`` is an ONNX Runtime artifact id (default: the bundle's ``onnxruntime`` fp32 artifact); its file is
    copied unchanged. The model is named after the bundle, as ``edgesdk serve`` names it; its tensors carry the ONNX
    file's own names (Triton requires them; the manifest's may differ), read by opening the artifact on onnxruntime
    (:class:`BackendUnavailable` when it is not installed). ``max_batch_size`` is 0 and the dims are the manifest's
    full shapes: artifacts are compiled for a fixed batch of 1, and a Triton batch dimension would need the model's
    first dimension to vary.
    """
    bundle = Bundle.open(bundle_path)
    chosen = _onnx_artifact(bundle, artifact, allow_failed)
    _check_strings(bundle, chosen)
    bundle.warn_if_failed(chosen.id)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", bundle.name):
        raise ConversionError(f"bundle name {bundle.name!r} cannot name a Triton model directory (letters, digits, "
                              f"'_', '.', '-'); the device calls the model by that name, so it is not changed here")
    names = _onnx_names(bundle, chosen)
    for kind, found in names.items():
        for name in found:
            check_text(name, f"{kind} of the ONNX file of artifact {chosen.id!r} ({name!r})")
    out = _check_output(Path(out), bundle, force)

    def write(work: Path) -> None:
        version_dir = work / bundle.name / "1"
        version_dir.mkdir(parents=True)
        model_dir = chosen.model_path.parent
        for i, src in enumerate(chosen.files):  # files after the first (external weights) keep their place
            rel = Path("model.onnx") if i == 0 else _relative(src, model_dir, chosen)
            (version_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, version_dir / rel)
        (work / bundle.name / "config.pbtxt").write_text(triton_config(bundle, chosen, names),
                                                         encoding="utf-8")
        (work / "README.md").write_text(triton_readme(bundle, chosen, names, MARKER), encoding="utf-8")

    return _export("triton", bundle, chosen, out, write)


def _check_strings(bundle: Bundle, chosen: Artifact) -> None:
    """The manifest strings the generated files hold, each one line of printable text (BundleError naming it)."""
    manifest = bundle.manifest
    check_text(manifest["name"], "'name'")
    version = manifest["version"]
    check_text(str(version) if isinstance(version, int) and not isinstance(version, bool) else version, "'version'")
    check_text(chosen.id, "'artifacts[].id'")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", str(chosen.engine)):
        raise BundleError(f"manifest field 'artifacts[].engine' of artifact {chosen.id!r} must be an engine name "
                          f"(lower-case letters, digits, '_', '-'); got {one_line(chosen.engine)!r}")
    for kind in ("inputs", "outputs"):
        for i, tensor in enumerate(manifest[kind]):
            check_text(tensor["name"], f"'{kind}[{i}].name'")


# -- choosing the artifact ---------------------------------------------------------------------------------------

def _default_float(bundle: Bundle) -> Artifact:
    """``edgesdk serve``'s default without its condition that the engine be installed here: the image installs the
    engine of the artifact chosen."""
    return serving_artifact(bundle, installed_only=False)


def _onnx_artifact(bundle: Bundle, artifact: str | None, allow_failed: bool) -> Artifact:
    onnx = [a for a in bundle.artifacts if a.engine == "onnxruntime"]
    listed = ", ".join(a.id for a in onnx) or "none"
    if artifact is not None:
        chosen = bundle.artifact(artifact)
        if chosen.engine != "onnxruntime":
            raise ConversionError(f"Triton's onnxruntime_onnx platform runs ONNX artifacts; {chosen.id!r} is for "
                                  f"{chosen.engine} (ONNX artifacts of bundle {bundle.name!r}: {listed})")
        return bundle.servable_artifact(chosen.id, allow_failed)
    floats = [a for a in onnx if a.precision == "fp32"]
    if not floats:
        raise ConversionError(f"bundle {bundle.name!r} has no ONNX fp32 artifact to export by default "
                              f"(ONNX artifacts: {listed}); name one with --artifact")
    passed = [a for a in floats if bundle.failed_gate(a.id) is None]
    if not passed:
        raise BundleError(f"bundle {bundle.name!r}: its ONNX fp32 artifact failed its validation gate "
                          f"({bundle.failed_gate(floats[0].id)}); re-quantize the bundle, or name an artifact with "
                          f"--artifact and --allow-failed")
    return passed[0]


# -- the output folder -------------------------------------------------------------------------------------------

def _check_output(out: Path, bundle: Bundle, force: bool) -> Path:
    """Refuse an output that would destroy anything but a previous export (``force`` replaces only exports)."""
    out, source = out.resolve(), bundle.root.resolve()
    if source.is_relative_to(out):
        raise ConversionError(f"output {out} holds the bundle {source}; write the export elsewhere")
    if out.is_relative_to(source):
        raise ConversionError(f"output {out} is inside the bundle {source}; write the export elsewhere")
    check_replaceable(out, force, MARKER, "an edgesdk export", "pass --force to replace a previous export")
    return out


def _export(kind: str, bundle: Bundle, chosen: Artifact, out: Path, write) -> Export:
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(work)
        marker = {"export": kind, "bundle": bundle.name, "version": bundle.manifest["version"],
                  "artifact": chosen.id, "edgesdk": __version__}
        (work / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        publish_dir(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Export(out, chosen.id, tuple(sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())))


def _copy_bundle(bundle: Bundle, dest: Path) -> None:
    """The manifest and the files it lists, nothing else; the copy is verified like any bundle."""
    dest.mkdir()
    shutil.copyfile(bundle.root / MANIFEST, dest / MANIFEST)
    for entry in bundle.file_entries():
        target = dest / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(safe_member(bundle.root, entry["path"]), target)
    Bundle.open(dest)


def _relative(path: Path, base: Path, artifact: Artifact) -> Path:
    if not path.is_relative_to(base):
        raise ConversionError(f"artifact {artifact.id!r}: {path.name} is not beside or below "
                              f"{artifact.model_path.name}, so the ONNX file would not find it in a Triton folder")
    return path.relative_to(base)


# -- names -------------------------------------------------------------------------------------------------------

def _dns_label(name: str) -> str:
    """The bundle name as a Kubernetes (DNS-1035) name, also usable as a Docker repository and folder name."""
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label[:1].isalpha():
        label = f"edgesdk-{label}"
    return label[:ISVC_NAME_MAX].rstrip("-")


def _tag(version: Any) -> str:
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(version))
    return (tag if re.match(r"[A-Za-z0-9_]", tag) else f"v{tag}")[:128]


def _check_image(image: str) -> str:
    if not image or re.search(r"\s", image) or "://" in image or not image.isprintable():
        raise ConversionError(f"--image must be an image reference such as registry.example.com/team/model:1 "
                              f"(no scheme, no spaces); got {image!r}")
    return image


# -- KServe ------------------------------------------------------------------------------------------------------

def _dockerfile(bundle: Bundle, chosen: Artifact, bundle_dir: str, caps: dict[str, int | None]) -> str:
    served = f"{MODELS_DIR}/{bundle_dir}"
    entrypoint = ["edgesdk", "serve", served, "--artifact", chosen.id, "--host", "0.0.0.0", "--port", str(PORT)]
    if bundle.failed_gate(chosen.id) is not None:  # exported with allow_failed: the image must serve it the same way
        entrypoint.insert(5, "--allow-failed")
    for option, value in caps.items():  # a cap left to its default is derived the same way by the server
        if value is not None:
            entrypoint += [option, str(value)]
    requirement = f"edgesdk-cloud[serve]=={__version__}"
    engine_requirement = f"edgesdk[{chosen.engine}]=={__version__}"
    return f"""\
# Written by edgesdk export kserve: a custom KServe predictor that serves, with edgesdk serve (KServe's ModelServer),
# bundle {one_line(json.dumps(bundle.name))} version {_version(bundle)},
# artifact {one_line(chosen.id)} on {chosen.engine}.
ARG PYTHON_VERSION={PYTHON_VERSION}
FROM python:${{PYTHON_VERSION}}-slim

# The cloud side with KServe's ModelServer (edgesdk-cloud[serve]) and the engine of the served artifact (an extra of
# edgesdk). Another source or version: docker build --build-arg EDGESDK_REQUIREMENT=... --build-arg ENGINE_REQUIREMENT=...
ARG EDGESDK_REQUIREMENT="{requirement}"
ARG ENGINE_REQUIREMENT="{engine_requirement}"
RUN pip install --no-cache-dir "${{EDGESDK_REQUIREMENT}}" "${{ENGINE_REQUIREMENT}}"

ENV PYTHONUNBUFFERED=1
COPY {bundle_dir} {served}

EXPOSE {PORT}
# KServe routes requests to port {PORT} of the container. --host 0.0.0.0 is right inside a container: the default,
# 127.0.0.1, cannot be reached from outside the container's own network namespace, and who reaches the pod is
# decided by Kubernetes and KServe's ingress, not by this process.
ENTRYPOINT {json.dumps(entrypoint)}
"""


def _resources(chosen: Artifact, limits: ServeLimits) -> dict[str, Any]:
    """Requests and limits that fit ``edgesdk serve`` at its request caps (:meth:`ServeLimits.memory_mib`)."""
    memory, _ = limits.memory_mib(_model_bytes(chosen))
    # One engine runs one request at a time; the second CPU is for the HTTP server and the engine's own threads.
    return {"requests": {"cpu": "1", "memory": f"{memory}Mi"},
            "limits": {"cpu": "2", "memory": f"{2 * memory}Mi"}}


def _model_bytes(chosen: Artifact) -> int:
    return sum(int(f["bytes"]) for f in chosen.entry["files"])


def _version(bundle: Bundle) -> str:
    return one_line(bundle.manifest["version"])


def _isvc(bundle: Bundle, chosen: Artifact, image: str, limits: ServeLimits) -> dict[str, Any]:
    """The InferenceService as data (what ``inferenceservice.yaml`` holds)."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": _dns_label(bundle.name),
            "labels": {"app.kubernetes.io/managed-by": "edgesdk"},
            "annotations": {"edgesdk/bundle": bundle.name, "edgesdk/bundle-version": str(bundle.manifest["version"]),
                            "edgesdk/artifact": chosen.id, "edgesdk/max-batch": str(limits.max_batch),
                            "edgesdk/max-body-bytes": str(limits.max_body_bytes)},
        },
        "spec": {"predictor": {"containers": [{
            "name": "kserve-container",
            "image": image,
            "env": [{"name": "PROTOCOL", "value": "v2"}],
            "ports": [{"containerPort": PORT, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": PORT},
                               "initialDelaySeconds": 5, "periodSeconds": 5},
            "resources": _resources(chosen, limits),
        }]}},
    }


def _inference_service(bundle: Bundle, chosen: Artifact, image: str, limits: ServeLimits) -> str:
    memory, arithmetic = limits.memory_mib(_model_bytes(chosen))
    arithmetic = "\n".join(f"# {line}" for line in textwrap.wrap(f"Memory request: {arithmetic}.", 112))
    head = f"""\
# Written by edgesdk export kserve: bundle {one_line(json.dumps(bundle.name))} version {_version(bundle)},
# artifact {one_line(chosen.id)}. It runs in the image built from ./Dockerfile: push that image where the
# cluster can pull it.
# The protocol: a custom predictor declares it with the PROTOCOL environment variable (v1 or v2). It has no
# protocolVersion field (KServe's model and framework predictors do), so kubectl's strict validation would refuse one.
# No storageUri: the bundle is inside the image at {MODELS_DIR}, where a storage initializer would mount over it.
# Memory: edgesdk serve takes a batch of at most {limits.max_batch} and a body of at most {limits.max_body_bytes} bytes,
# {limits.max_pending} requests at once (the edgesdk/max-* annotations; raise them with export's max_batch and
# max_body_bytes, which the image's entrypoint then passes to serve).
{arithmetic}
# Limit: twice the request ({2 * memory} MiB), for the allocator and a Python heap that does not shrink at once.
"""
    return head + "\n".join(_yaml(_isvc(bundle, chosen, image, limits))) + "\n"


def _yaml(node: Any, indent: int = 0) -> list[str]:
    """Block-style YAML for dicts, lists and scalars; strings are written as JSON strings, which YAML reads as
    double-quoted scalars, so no value can change meaning (``on``, ``1.0``, ``"a: b"``)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{key}:")
                lines += _yaml(value, indent + 2)
            else:
                lines.append(f"{pad}{key}: {_yaml_scalar(value)}")
    else:
        for item in node:
            if isinstance(item, (dict, list)) and item:
                inner = _yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")  # the first key shares the dash's line
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    return lines


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))


def _kserve_readme(bundle: Bundle, chosen: Artifact, image: str, bundle_dir: str, limits: ServeLimits) -> str:
    name = _dns_label(bundle.name)
    model_url = shlex.quote(one_line(f"https://<host>/v2/models/{bundle.name}"))
    return f"""\
# {one_line(bundle.name)} {_version(bundle)} on KServe

Written by `edgesdk export kserve` (edgesdk {__version__}). The image runs `edgesdk serve`: KServe's ModelServer
hosting artifact {md_code(chosen.id)} ({chosen.engine}) of the bundle as model {md_code(bundle.name)}, over the Open
Inference Protocol V2 (REST) on port {PORT}.

| file | what |
| --- | --- |
| `{bundle_dir}/` | the bundle, verified (the manifest and the files it lists) |
| `Dockerfile` | the predictor image: python, `edgesdk-cloud[serve]` and `edgesdk[{chosen.engine}]`, the bundle at `{MODELS_DIR}/{bundle_dir}` |
| `inferenceservice.yaml` | the InferenceService `{name}`: that image as a custom predictor, V2, port {PORT}, ready on `/v2/health/ready` |
| `{MARKER}` | marks this folder as an export, so `edgesdk export ... --force` may replace it |

## Build, push, apply

```bash
docker build -t {shlex.quote(image)} .
docker push {shlex.quote(image)}     # the cluster pulls this name: export with --image REGISTRY/NAME:TAG to change it
kubectl apply -f inferenceservice.yaml
kubectl get inferenceservice {name}  # READY True, and the URL
```

Check it (`<host>` is the InferenceService's URL host):

```bash
curl https://<host>/v2/health/ready
curl {model_url}    # inputs and outputs, with datatypes and shapes
```

Resources (requests and limits in `inferenceservice.yaml`) leave room for the model, the server and its request
caps (a batch of at most {limits.max_batch}, a body of at most {limits.max_body_bytes} bytes; the arithmetic is in the
file's comments). Requests run one at a time per replica: scale with replicas, not with CPUs. The model-repository
API (load, unload) is off in the image.

## Point a device at it

```bash
edgesdk run {bundle_dir} image.png --mode prefer-device --cloud https://<host>
```

The device runs its own copy of the same bundle and sends the inputs it finds hard to the cloud; each result says
where it came from. The device speaks `https` (plain `http` only to a loopback address): serve the
InferenceService through TLS (the cluster's ingress gateway). With a token: `--token-env VARIABLE`.
"""


# -- Triton ------------------------------------------------------------------------------------------------------

def _onnx_names(bundle: Bundle, chosen: Artifact) -> dict[str, list[str]]:
    """The ONNX file's input and output names, in the order of the manifest's inputs and outputs."""
    with chosen.open() as engine:
        names = {"inputs": [t.name for t in engine.inputs], "outputs": [t.name for t in engine.outputs]}
    for kind, found in names.items():
        if len(found) != len(bundle.manifest[kind]):
            raise BundleError(f"artifact {chosen.id!r} has {len(found)} {kind} ({', '.join(found)}); the manifest of "
                              f"bundle {bundle.name!r} lists {len(bundle.manifest[kind])}")
    return names


__all__ = ["Export", "MARKER", "export_kserve", "export_triton"]
