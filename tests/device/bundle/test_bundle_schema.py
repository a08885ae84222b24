"""The manifest schema, no code in data (golden files, ONNX external data), and the fuzz targets' seeds."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk import Bundle
from edgesdk.bundle.schema import check_manifest, load_manifest
from edgesdk.engines.model_files import external_data_locations
from edgesdk.errors import BackendUnavailable, BundleError

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("fuzz_bundle", REPO / "tests" / "fuzz" / "fuzz_bundle.py")
fuzz_bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_bundle)


def _refused(manifest, match: str) -> None:
    with pytest.raises(BundleError, match=match):
        check_manifest(manifest, "manifest.json")


@pytest.fixture
def good(digits_bundle) -> dict:
    """A manifest the quantizer wrote (every target), to be damaged by the test."""
    return copy.deepcopy(digits_bundle.manifest)


# -- the schema ------------------------------------------------------------------------------------------

def test_quantizer_manifests_pass(digits_bundle, onnx_bundle):
    for built in (digits_bundle, onnx_bundle):
        check_manifest(built.manifest, "manifest.json")
        assert Bundle.open(built.bundle).name


def test_seed_manifest_of_the_fuzz_target_passes(tmp_path):
    bundle = fuzz_bundle.write_bundle(tmp_path, fuzz_bundle.seed_files())
    assert Bundle.open(bundle).name == "seed"


def test_wrong_type_names_the_path_expected_and_found(good):
    good["artifacts"][1]["files"][0]["bytes"] = "12"
    _refused(good, r'^manifest.json: artifacts\[1\].files\[0\].bytes must be a non-negative integer, got "12"$')


def test_missing_keys_are_listed_at_once(good):
    for key in ("name", "inputs", "artifacts"):
        del good[key]
    _refused(good, r"manifest.json: the manifest is missing key\(s\) name, inputs, artifacts$")


def test_missing_keys_of_a_nested_entry(good):
    del good["artifacts"][0]["engine"], good["artifacts"][0]["files"]
    _refused(good, r"artifacts\[0\] is missing key\(s\) engine, files")


def test_every_problem_is_listed(good):
    good["name"] = 3
    good["labels"] = ["a", None]
    good["postprocess"]["top_k"] = 0
    _refused(good, r"manifest.json: 3 problems: name must be a non-empty string, got 3; "
                   r"postprocess.top_k must be a positive integer, got 0; labels\[1\] must be a string, got null")


def test_unknown_format_version_says_which_this_edgesdk_reads(good):
    good["format_version"] = 2
    _refused(good, r"unknown format_version 2 \(this edgesdk reads 1\)")
    good["format_version"] = "1"
    _refused(good, r'unknown format_version "1" \(this edgesdk reads 1\)')
    good["format_version"] = True  # JSON true is not the number 1
    _refused(good, r"unknown format_version true")


def test_unknown_keys_are_accepted(good):
    good["added_by_a_newer_quantizer"] = {"anything": [1, 2]}
    good["artifacts"][0]["notes"] = "free text"
    good["artifacts"][0]["files"][0]["mtime"] = 0
    check_manifest(good, "manifest.json")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["artifacts"][1].update(engine="tensorrt"),
     r'artifacts\[1\].engine must be one of "litert", "openvino", "onnxruntime", got "tensorrt"'),
    (lambda m: m["artifacts"][1].update(precision="int4"), r'artifacts\[1\].precision must be one of "int8", "fp32"'),
    (lambda m: m["artifacts"][1].update(files=[]), r"artifacts\[1\].files must be a non-empty list, got \[\]"),
    (lambda m: m["artifacts"][1]["files"][0].update(sha256="ABC"),
     r'artifacts\[1\].files\[0\].sha256 must be 64 lowercase hex digits, got "ABC"'),
    (lambda m: m["artifacts"][1]["files"][0].update(path=""), r"artifacts\[1\].files\[0\].path must be a non-empty"),
    (lambda m: m["artifacts"][1]["files"][0].update(bytes=-1), r"bytes must be a non-negative integer, got -1"),
    (lambda m: m["artifacts"][1]["files"][0].update(bytes=True), r"bytes must be a non-negative integer, got true"),
    (lambda m: m["artifacts"][1].update(id=m["artifacts"][0]["id"]), r'ids must be unique; "litert-fp32" appear'),
    (lambda m: m["artifacts"][2].update(runtime={"precision_hint": "f32", "thread": 2}),
     r'artifacts\[2\].runtime has unknown key\(s\) "thread" \(known: num_threads, precision_hint\)'),
    (lambda m: m["artifacts"][2].update(runtime={"num_threads": 0}), r"runtime.num_threads must be an integer from 1 to 256, got 0"),
    (lambda m: m["inputs"][0].update(shape=[1, "8"]), r'inputs\[0\].shape\[1\] must be an integer >= -1'),
    (lambda m: m.update(outputs=[]), r"outputs must be a non-empty list, got \[\]"),
    (lambda m: m.update(version=1), r"version must be a non-empty string, got 1"),
    (lambda m: m["preprocess"].update(size=[8]), r"preprocess is not a usable preprocess spec: .*'size'"),
    (lambda m: m["preprocess"].update(sizes=[8, 8]), r"preprocess is not a usable preprocess spec: .*unknown key"),
    (lambda m: m["postprocess"].update(softmax="yes"), r'postprocess.softmax must be true or false, got "yes"'),
    (lambda m: m["golden"]["tolerance"].update({"litert-int8": -0.1}),
     r"golden.tolerance.litert-int8 must be a non-negative number, got -0.1"),
    (lambda m: m["golden"]["tolerance"].update({"litert-int8": float("nan")}), r"got NaN"),
    (lambda m: m["golden"].pop("files"), r"golden is missing key\(s\) files"),
    (lambda m: m["calibration"]["input_ranges"][0].update(min="0"), r"input_ranges\[0\].min must be a number"),
    (lambda m: m["validation"]["litert-int8"].update(accuracy="high"),
     r'validation.litert-int8.accuracy must be a number or null, got "high"'),
    (lambda m: m["validation"].update({"litert-int8": 3}), r"validation.litert-int8 must be an object, got 3"),
    (lambda m: m.update(hybrid={"signal": "max_prob", "threshold": 1.5}),
     r"hybrid.threshold must be a number in \[0, 1\] or null, got 1.5"),
    (lambda m: m.update(hybrid={"curve": [{"accuracy": 0.9}]}), r"hybrid.curve\[0\] is missing key\(s\) escalation_rate"),
    (lambda m: m.update(labels="0123456789"), r'labels must be a list or null, got "0123456789"'),
], ids=["engine", "precision", "no-files", "sha256", "empty-path", "negative-bytes", "bool-bytes", "duplicate-id",
        "runtime-key", "num-threads", "shape", "no-outputs", "version", "preprocess", "preprocess-key",
        "softmax", "tolerance", "nan", "golden-files", "input-range", "metric", "metrics-table", "threshold",
        "curve", "labels"])
def test_malformed_field(good, edit, message):
    edit(good)
    _refused(good, message)


@pytest.mark.parametrize(("text", "message"), [
    (b"{not json", r"is not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, r"is not valid JSON"),  # deeper than Python's recursion limit
    (b'{"format_version": 1' + b"9" * 5000 + b"}", r"is not valid JSON"),  # past Python's int digit limit
    (b"\xff\xfe{}", r"cannot be read as UTF-8"),
    (b"null", r"the manifest must be a JSON object, got null"),
])
def test_unreadable_manifest(tmp_path, text, message):
    (tmp_path / "manifest.json").write_bytes(text)
    with pytest.raises(BundleError, match=message):
        load_manifest(tmp_path / "manifest.json")


# -- property tests: the parser only ever refuses with a BundleError ----------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _after_acceptance(manifest: dict) -> None:
    """Read an accepted manifest the way the device does: none of this may raise."""
    from edgesdk.hybrid.model import EscalationPolicy
    from edgesdk.bundle.report import failing_artifacts, summary, validation_table

    summary(manifest)
    validation_table(manifest)
    failing_artifacts(manifest)
    EscalationPolicy().resolved(manifest)


def _check(manifest) -> None:
    try:
        check_manifest(manifest, "manifest.json")
    except BundleError:
        return
    _after_acceptance(manifest)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_random_json_only_raises_bundle_error(value):
    _check(value)


def _nodes(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*path, i))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_manifest_only_raises_bundle_error(digits_bundle, data):
    manifest = copy.deepcopy(digits_bundle.manifest)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_nodes(manifest))
        path = data.draw(st.sampled_from(paths[1:]))
        parent = manifest
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_json)
    _check(manifest)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | _json.map(lambda v: json.dumps(v).encode()))
def test_random_manifest_bytes_only_raise_bundle_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("m") / "manifest.json"
    path.write_bytes(raw)
    try:
        load_manifest(path)
    except BundleError:
        pass


# -- no code in data ----------------------------------------------------------------------------------------

class _Marker:
    """Unpickling this creates the file ``path``: proof that code ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_golden_object_array_is_refused_and_not_executed(bundle_copy, tmp_path):
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Marker(control))).close()
    assert control.exists()  # the payload does run when unpickled

    marker = tmp_path / "marker"
    path = bundle_copy / "golden.npz"
    np.savez(path, input_0=np.array([_Marker(marker)], dtype=object))
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["golden"]["files"][0].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), bytes=path.stat().st_size)
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    bundle = Bundle.open(bundle_copy)  # the file is the one the manifest lists
    with pytest.raises(BundleError, match=r"golden file 'golden.npz' is unreadable: .*allow_pickle"):
        bundle.golden()
    assert not marker.exists()


def test_device_side_never_unpickles():
    """Every np.load of edgesdk refuses pickles, and nothing on the device side imports an unpickler."""
    for path in (REPO / "edgesdk").rglob("*.py"):
        text = path.read_text()
        for call in re.findall(r"np\.load\([^)]*\)", text):
            assert "allow_pickle=False" in call, f"{path}: {call}"
        for banned in (r"^\s*(import|from) (pickle|cPickle|dill|joblib|shelve|marshal)\b", r"torch\.load\(",
                       r"\bpickle\.loads?\("):
            assert not re.search(banned, text, re.MULTILINE), f"{path}: {banned}"


# -- ONNX external data stays inside the bundle -----------------------------------------------------------

def _onnx_model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _external_bundle(root: Path, location: str = "weights.bin", listed: bool = True) -> Path:
    """A bundle with one ONNX artifact whose weights are saved (by the onnx package) as external data."""
    import onnx

    (root / "onnx").mkdir(parents=True)
    onnx.save_model(_onnx_model(), root / "onnx" / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    if location != "weights.bin":  # point the tensor elsewhere, as a hostile model would
        model = onnx.load(root / "onnx" / "model.onnx", load_external_data=False)
        for entry in model.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save_model(model, root / "onnx" / "model.onnx")
    files = ["onnx/model.onnx"] + (["onnx/weights.bin"] if listed else [])
    seed = json.loads(fuzz_bundle.seed_files()["manifest.json"])
    # the fuzz module's own manifest-entry helper
    seed["artifacts"][0]["files"] = [fuzz_bundle._entry(f, (root / f).read_bytes()) for f in files]
    (root / "manifest.json").write_text(json.dumps(seed))
    return root


def test_external_data_inside_the_bundle_loads_and_runs(tmp_path):
    bundle = Bundle.open(_external_bundle(tmp_path / "b"))
    art = bundle.artifact("onnxruntime-fp32")
    assert external_data_locations(art.model_path) == ["weights.bin"]
    with art.open() as engine:
        out = engine.run([np.ones((1, 4), np.float32)])
    np.testing.assert_allclose(out[0], np.arange(16, dtype=np.float32).reshape(4, 4).sum(0, keepdims=True))


@pytest.mark.parametrize(("location", "why"), [
    ("../../etc/passwd", r"escapes the model's folder with '\.\.'"),
    ("/etc/passwd", r"is not a relative path inside the model's folder"),
    ("C:/weights.bin", r"is not a relative path"),
    ("..\\weights.bin", r"is not a relative path"),
])
def test_external_data_outside_the_bundle_is_refused(tmp_path, location, why):
    root = _external_bundle(tmp_path / "b", location)
    with pytest.raises(BundleError, match=rf"artifact 'onnxruntime-fp32': onnx/model.onnx names external data "
                                          rf"{re.escape(json.dumps(location))}, which {why}"):
        Bundle.open(root)


def test_external_data_location_that_is_not_utf8_is_still_checked(tmp_path):
    root = fuzz_bundle.write_bundle(tmp_path / "b", fuzz_bundle.seed_files())
    model = fuzz_bundle.onnx_with_external_data(b"../\xff/weights.bin")
    (root / "onnx" / "model.onnx").write_bytes(model)
    manifest = json.loads((root / "manifest.json").read_text())
    # the fuzz module's own manifest-entry helper
    manifest["artifacts"][0]["files"][0] = fuzz_bundle._entry("onnx/model.onnx", model)
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"names external data \"../\\udcff/weights.bin\", which escapes"):
        Bundle.open(root)


def test_external_data_not_listed_in_the_manifest_is_refused(tmp_path):
    root = _external_bundle(tmp_path / "b", listed=False)
    with pytest.raises(BundleError, match=r"names external data \"weights.bin\", which is not among the artifact's "
                                          r"files in the manifest"):
        Bundle.open(root)


def test_external_data_through_a_link_is_refused(tmp_path):
    root = _external_bundle(tmp_path / "b", "linked/weights.bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(root / "onnx" / "weights.bin", outside / "weights.bin")
    (root / "onnx" / "linked").symlink_to(outside)
    with pytest.raises(BundleError, match=r"resolves outside the model's folder"):
        Bundle.open(root)


def test_engine_refuses_escaping_external_data_before_reading_it(tmp_path):
    """A model opened on its own (no manifest) is checked by the engine too."""
    from edgesdk.engines import open_engine

    root = _external_bundle(tmp_path / "b", "../../etc/passwd")
    with pytest.raises(BundleError, match=r"model.onnx names external data '../../etc/passwd', which escapes"):
        open_engine("onnxruntime", root / "onnx" / "model.onnx")


def test_locations_found_in_any_field_order(tmp_path):
    """protobuf lets an entry's value come before its key: the scan reads messages, not one byte pattern."""
    path = tmp_path / "m.onnx"
    path.write_bytes(fuzz_bundle.onnx_with_external_data("../x", value_first=True))
    assert external_data_locations(path) == ["../x"]


def test_locations_found_in_an_over_long_encoding(tmp_path):
    """A length written as a 2-byte varint (protobuf accepts it) hides from a search for b"\\x0a\\x08location"."""
    entry = b"\x0a\x88\x00location" + b"\x12\x04/etc"
    tensor = b"\x6a" + bytes([len(entry)]) + entry
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x3a" + bytes([len(tensor) + 2]) + b"\x2a" + bytes([len(tensor)]) + tensor)
    assert b"\x0a\x08location" not in path.read_bytes()
    assert external_data_locations(path) == ["/etc"]


def test_locations_match_the_onnx_package(tmp_path):
    import onnx
    from onnx.external_data_helper import _get_all_tensors  # onnx's own walk over tensors

    model = _onnx_model()
    bias = onnx.numpy_helper.from_array(np.ones(4, np.float32), "B")
    model.graph.initializer.append(bias)
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    expected = [e.value for t in _get_all_tensors(loaded) for e in t.external_data if e.key == "location"]
    assert sorted(external_data_locations(tmp_path / "m.onnx")) == sorted(expected) == ["B", "W"]


@pytest.mark.parametrize("data", [b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x3a\x05ab", b"\x07"])
def test_malformed_onnx_is_a_bundle_error(tmp_path, data):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(BundleError, match=r"is not a well-formed ONNX file"):
        external_data_locations(path)


# -- the fuzz targets do not rot -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["manifest", "archive", "onnx"])
def test_fuzz_target_runs_its_seeds(kind):
    target = fuzz_bundle.Target(kind)
    try:
        seeds = target.seeds()
        for seed in seeds + [s[: len(s) // 2] for s in seeds] + [bytes(reversed(s)) for s in seeds]:
            target.one_input(seed)
    finally:
        target.close()


# -- OpenVINO artifacts: what OpenVINO reads beside the manifest (security review findings) -------------------

def _add_model_onnx(weights_location: str):
    """y = x + W, W (float[4]) kept as external data at ``weights_location``: an ONNX file."""
    from onnx import TensorProto, helper

    init = helper.make_tensor("W", TensorProto.FLOAT, [4], [0.0, 1.0, 2.0, 3.0])
    init.ClearField("float_data")
    init.data_location = TensorProto.EXTERNAL
    for k, v in (("location", weights_location), ("offset", "0"), ("length", "16")):
        entry = init.external_data.add()
        entry.key, entry.value = k, v
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _openvino_bundle(root, files: list[str]):
    from support import file_entry, write_manifest

    write_manifest(root, {
        "format_version": 1, "name": "ov", "version": "1", "created_with": "tests",
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [1, 4], "dtype": "float32"}],
        "artifacts": [{"id": "openvino-fp32", "engine": "openvino", "precision": "fp32",
                       "files": [file_entry(root, root / f) for f in files]}]})
    return root


def test_an_onnx_file_named_xml_cannot_bring_unlisted_external_data(tmp_path):
    """OpenVINO picks its reader by content: an ONNX model saved as model.xml loads, and its external data must be
    checked like any .onnx file's; the engine itself refuses a non-IR .xml that OpenVINO could read."""
    import onnx

    from edgesdk.engines import open_engine

    (tmp_path / "weights.dat").write_bytes(np.arange(4, dtype=np.float32).tobytes())  # not listed
    onnx.save(_add_model_onnx("weights.dat"), str(tmp_path / "model.xml"))
    (tmp_path / "model.bin").write_bytes(b"")
    _openvino_bundle(tmp_path, ["model.xml", "model.bin"])
    with pytest.raises(BundleError, match=r"model.xml names external data \"weights.dat\", which is not among"):
        Bundle.open(tmp_path)
    with pytest.raises(BackendUnavailable, match=r"load_failed: model.xml is not an OpenVINO IR \(XML\)"):
        open_engine("openvino", tmp_path / "model.xml")


def test_an_openvino_artifact_must_list_its_bin(digits_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b.bundle"
    shutil.copytree(digits_bundle.bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    art = next(a for a in manifest["artifacts"] if a["id"] == "openvino-int8")
    art["files"] = [f for f in art["files"] if not f["path"].endswith(".bin")]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"artifacts\[\d\].files must list \"openvino/model_int8.bin\", the weights"):
        Bundle.open(copy)
