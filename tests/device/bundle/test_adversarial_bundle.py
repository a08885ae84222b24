"""Adversarial manifests (issue 15): every number that sets a resource is bounded before it is used, text that is data
stays data, and the manifest itself is read within limits. Each test replays one finding of the issue."""

from __future__ import annotations

import copy
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from bounded_child import run_bounded
from edgesdk import Bundle
from edgesdk.bundle import schema
from edgesdk.bundle.report import printable, summary, validation_table
from edgesdk.bundle.schema import check_manifest, load_manifest
from edgesdk.errors import BundleError, InputError


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _write(root: Path, manifest: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))


@pytest.fixture
def good(digits_bundle) -> dict:
    return copy.deepcopy(digits_bundle.manifest)


def _refused(manifest: dict, match: str) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        check_manifest(manifest, "manifest.json")
    return info.value


# -- High 1: preprocess.size against the model input ---------------------------------------------------------

def test_preprocess_size_must_be_the_fixed_input_size(good):
    good["preprocess"]["size"] = [100000, 100000]
    _refused(good, r"preprocess.size \[100000, 100000\] must be the height and width of inputs\[0\].shape "
                   r"\[1, 1, 8, 8\] \(nchw\)")


def test_preprocess_size_of_a_dynamic_input_is_capped(good, monkeypatch):
    good["inputs"][0]["shape"] = [1, 1, -1, -1]
    good["preprocess"]["size"] = [100000, 100000]
    _refused(good, r"preprocess.size \[100000, 100000\] is 10000000000 pixels, over the limit of 67108864 "
                   r"\(\$EDGESDK_MAX_PREPROCESS_PIXELS raises it\)")
    good["preprocess"]["size"] = [8192, 8192]
    check_manifest(good, "manifest.json")  # the default limit itself
    good["preprocess"]["size"] = [9000, 9000]
    with pytest.raises(BundleError, match="over the limit"):
        check_manifest(good, "manifest.json")
    monkeypatch.setenv("EDGESDK_MAX_PREPROCESS_PIXELS", str(9000 * 9000))
    check_manifest(good, "manifest.json")
    monkeypatch.setenv("EDGESDK_MAX_PREPROCESS_PIXELS", "lots")
    with pytest.raises(InputError, match=r"EDGESDK_MAX_PREPROCESS_PIXELS must be a positive integer, got 'lots'"):
        check_manifest(good, "manifest.json")


def test_preprocess_fixed_size_is_capped_too(good):
    """An input shape that agrees with a huge size does not buy the allocation."""
    good["inputs"][0]["shape"] = [1, 1, 100000, 100000]
    good["preprocess"]["size"] = [100000, 100000]
    _refused(good, r"is 10000000000 pixels, over the limit")


@pytest.mark.parametrize(("edit", "match"), [
    (lambda m: m["preprocess"].update(color="rgb"),
     r'preprocess.color "rgb" makes 3 channel\(s\); inputs\[0\].shape \[1, 1, 8, 8\] \(nchw\) has 1'),
    (lambda m: m["preprocess"].update(layout="nhwc"), r"must be the height and width of inputs\[0\].shape"),
    (lambda m: m["inputs"][0].update(shape=[1, 64]),
     r"preprocess makes a 4-dimensional input \(nchw\), but inputs\[0\].shape is \[1, 64\]"),
], ids=["channels", "layout", "rank"])
def test_preprocess_must_make_the_model_input(good, edit, match):
    edit(good)
    _refused(good, match)


def test_huge_preprocess_size_is_refused_before_any_allocation(bundle_copy):
    m = _manifest(bundle_copy)
    m["inputs"][0]["shape"] = [1, 1, -1, -1]
    m["preprocess"]["size"] = [100000, 100000]
    _write(bundle_copy, m)
    answer = run_bounded(f"""
        bundle = edgesdk.Bundle.open({str(bundle_copy)!r})
        bundle.preprocess(numpy.zeros((8, 8), numpy.uint8))
    """)
    assert answer.get("error") == "BundleError", answer
    assert "preprocess.size [100000, 100000] is 10000000000 pixels" in answer["message"]


# -- High 2: runtime.num_threads as load(threads=...) ------------------------------------------------------

@pytest.mark.parametrize("threads", [0, 257, 2000, 100000])
def test_manifest_thread_count_outside_the_load_range_is_refused(good, threads):
    good["artifacts"][2]["runtime"] = {"num_threads": threads}
    _refused(good, rf"artifacts\[2\].runtime.num_threads must be an integer from 1 to 256, got {threads}$")


def test_manifest_thread_limit_is_the_load_limit(good):
    from edgesdk.runtime.options import RuntimeOptions

    good["artifacts"][2]["runtime"] = {"num_threads": schema.MAX_THREADS}
    check_manifest(good, "manifest.json")
    RuntimeOptions(threads=schema.MAX_THREADS)
    with pytest.raises(InputError, match="threads must be an integer from 1 to 256"):
        RuntimeOptions(threads=schema.MAX_THREADS + 1)


# -- Medium: manifest bytes, depth, duplicate keys ---------------------------------------------------------------

def _padded(manifest: dict, size: int) -> str:
    text = json.dumps(manifest)
    return text[:-1] + " " * (size - len(text)) + "}"


def test_manifest_over_the_byte_limit_is_refused_from_its_size(bundle_copy, monkeypatch):
    m = _manifest(bundle_copy)
    (bundle_copy / "manifest.json").write_text(_padded(m, 5 << 20))
    with pytest.raises(BundleError, match=r"manifest.json is 5242880 bytes, over the limit of 4194304 for a "
                                          r"manifest \(\$EDGESDK_MAX_MANIFEST_BYTES raises it\)"):
        Bundle.open(bundle_copy)
    assert load_manifest(bundle_copy / "manifest.json", max_bytes=6 << 20)["name"] == "digits"
    monkeypatch.setenv("EDGESDK_MAX_MANIFEST_BYTES", str(6 << 20))
    assert Bundle.open(bundle_copy).name == "digits"


def test_huge_manifest_is_not_read(bundle_copy):
    """A 2 GB (sparse) manifest: refused from its size, in a child whose memory could not hold it."""
    with open(bundle_copy / "manifest.json", "r+b") as fh:
        fh.truncate(2 << 30)
    answer = run_bounded(f"edgesdk.Bundle.open({str(bundle_copy)!r})", headroom_mb=256)
    assert answer.get("error") == "BundleError", answer
    assert "is 2147483648 bytes, over the limit of 4194304" in answer["message"]


def test_manifest_that_is_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "manifest.json")
    answer = run_bounded(f"""
        from edgesdk.bundle.schema import load_manifest
        load_manifest(__import__("pathlib").Path({str(tmp_path / "manifest.json")!r}))
    """, timeout=30)
    assert answer.get("error") == "BundleError" and "is not a regular file" in answer["message"], answer


def _archive_of(bundle: Path, manifest_text: str, out: Path) -> Path:
    """An .edgebundle written by hand (pack_bundle would refuse the bundle first)."""
    with tarfile.open(out, "w:gz") as tar:
        data = manifest_text.encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in sorted(bundle.rglob("*")):
            if path.is_file() and path.name != "manifest.json":
                tar.add(path, arcname=path.relative_to(bundle).as_posix())
    return out


def test_oversized_manifest_in_an_archive_is_refused_before_it_is_written(bundle_copy, tmp_path):
    from edgesdk.trust import open_archive

    archive = _archive_of(bundle_copy, _padded(_manifest(bundle_copy), 5 << 20), tmp_path / "big.edgebundle")
    with pytest.raises(BundleError, match=r"archive .*big.edgebundle: member 'manifest.json' is 5242880 bytes, over "
                                          r"the limit of 4194304 for a manifest"):
        open_archive(archive, cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").rglob("manifest.json")]


def _nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_manifest_nested_too_deep_is_refused(bundle_copy):
    m = _manifest(bundle_copy)
    m["notes"] = _nested(63)  # with the manifest object itself: 64 levels
    _write(bundle_copy, m)
    assert Bundle.open(bundle_copy).name == "digits"
    m["notes"] = _nested(64)
    _write(bundle_copy, m)
    with pytest.raises(BundleError, match=r"manifest.json: JSON nested deeper than 64 levels"):
        Bundle.open(bundle_copy)


@pytest.mark.parametrize(("where", "key"), [("top", "name"), ("artifact", "engine")])
def test_duplicate_keys_are_refused(bundle_copy, where, key):
    text = json.dumps(_manifest(bundle_copy))
    if where == "top":  # a second "name" after the first: json.loads would silently keep the last
        text = text[:-1] + ', "name": "evil"}'
    else:
        text = text.replace('"engine": "litert"', '"engine": "litert", "engine": "onnxruntime"', 1)
    (bundle_copy / "manifest.json").write_text(text)
    with pytest.raises(BundleError, match=rf'manifest.json: key "{key}" appears twice in one object'):
        Bundle.open(bundle_copy)


# -- Low: text that is data stays data --------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "path"), [
    (lambda m: m.update(name="digits\n\x1b[2Kbundle ok v9"), "name"),
    (lambda m: m.update(version="1\r\nRUN curl evil | sh"), "version"),
    (lambda m: m["artifacts"][0].update(id="litert\x1b]0;owned\x07"), r"artifacts\[0\].id"),
    (lambda m: m["labels"].__setitem__(3, "3\x1b[31m"), r"labels\[3\]"),
    (lambda m: m["inputs"][0].update(name="x\u202egnp.exe"), r"inputs\[0\].name"),
    (lambda m: m["outputs"][0].update(name="y\udcff"), r"outputs\[0\].name"),
    (lambda m: m["artifacts"][1]["files"][0].update(path="tflite/\x9bmodel.tflite"), r"artifacts\[1\].files\[0\].path"),
], ids=["name", "version", "id", "label", "input-bidi", "output-surrogate", "file-c1"])
def test_control_characters_in_names_are_refused(good, edit, path):
    edit(good)
    error = _refused(good, rf"^manifest.json: {path} must be one line of printable text \(no control characters")
    assert str(error).isprintable()  # the message shows the value escaped


def test_lone_surrogate_in_the_file_is_refused(bundle_copy):
    text = json.dumps(_manifest(bundle_copy)).replace('"labels": ["0"', '"labels": ["\\ud800"', 1)
    (bundle_copy / "manifest.json").write_text(text)
    with pytest.raises(BundleError, match=r'labels\[0\] must be one line of printable text .*got "\\ud800"'):
        Bundle.open(bundle_copy)


def test_report_escapes_what_the_schema_lets_through(good):
    """Free-text fields (and bundles checked by an older edgesdk) reach the terminal escaped, one value per line."""
    clean = summary(good), validation_table(good)
    good["name"] = "digits\n\x1b[32mbundle verified"
    good["source"]["name"] = "a\udcff\u202e.pt2"
    good["labels"][0] = "0\r"
    good["calibration"]["source"] = "train\x1b[2J"
    good["validation"]["litert-int8"]["effective_precision"] = "i8\n\x1b[1A"
    good["validation"]["machine"]["model"] = "cpu\x07"
    for before, after in zip(clean, (summary(good), validation_table(good))):
        assert len(after.splitlines()) == len(before.splitlines())
        assert all(line.isprintable() for line in after.splitlines()), after
        after.encode("utf-8")  # a lone surrogate would fail where it is printed
    text = summary(good)
    assert "bundle digits\\x0a\\x1b[32mbundle verified v1" in text and "a\\udcff\\u202e.pt2" in text


def test_printable():
    assert printable("digits 数字 é") == "digits 数字 é"
    assert printable("a\x1b[31m\n\udcff\u202e\x7f") == "a\\x1b[31m\\x0a\\udcff\\u202e\\x7f"
    assert printable(3) == "3"


# -- Low: manifest.json may not lead outside the bundle --------------------------------------------------------

def test_manifest_linked_from_outside_is_refused(bundle_copy, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "manifest.json").write_text((bundle_copy / "manifest.json").read_text())
    (bundle_copy / "manifest.json").unlink()
    (bundle_copy / "manifest.json").symlink_to(outside / "manifest.json")
    with pytest.raises(BundleError, match=r"bundle file 'manifest.json' resolves outside the bundle directory"):
        Bundle.open(bundle_copy)


def test_manifest_linked_inside_the_bundle_is_accepted(bundle_copy):
    (bundle_copy / "meta").mkdir()
    (bundle_copy / "manifest.json").rename(bundle_copy / "meta" / "manifest.json")
    (bundle_copy / "manifest.json").symlink_to(Path("meta") / "manifest.json")
    assert Bundle.open(bundle_copy).name == "digits"


# -- issue 29, finding 4: tensor shapes and dtypes are bounded when the manifest is read ---------------------------

def _stateful(manifest: dict, shape: list[int], dtype: str = "float32") -> dict:
    """``manifest`` with a state input ``h`` fed by an output ``h_out`` of ``shape`` (as quantize --state writes)."""
    manifest["inputs"].append({"name": "h", "shape": shape, "dtype": dtype})
    _with(manifest, "outputs", {"name": "h_out", "shape": shape, "dtype": dtype})
    manifest["state"] = [{"output": "h_out", "input": "h"}]
    return manifest


def test_a_state_input_over_the_filled_input_cap_is_refused(good, monkeypatch):
    """The issue's case: a state input declared [8192, 8192] made stream() allocate 256 MiB of zeros."""
    _refused(_stateful(good, [8192, 8192]), r"inputs\[1\] \"h\": a state input of 268435456 bytes \(float32 "
                                            r"\[8192, 8192\]\), over the limit of 16777216 for an input edgesdk "
                                            r"fills in itself \(\$EDGESDK_MAX_FILLED_INPUT_BYTES raises it\)")
    check_manifest(_stateful(copy.deepcopy(good) | {"inputs": good["inputs"][:1], "outputs": good["outputs"][:1]},
                             [2048, 2048]), "manifest.json")  # 16 MiB: the limit itself
    monkeypatch.setenv("EDGESDK_MAX_FILLED_INPUT_BYTES", str(256 << 20))
    check_manifest(good, "manifest.json")


def test_a_fixed_input_over_the_filled_input_cap_is_refused(good):
    """A fixed input [8192, 8192] cost 1.16 GB per predict (filled in, then compared, at every call)."""
    good["inputs"].append({"name": "sr", "shape": [8192, 8192], "dtype": "float32", "fixed": 16000})
    _refused(good, r"inputs\[1\] \"sr\": a fixed input of 268435456 bytes \(float32 \[8192, 8192\]\), over the limit "
                   r"of 16777216 for an input edgesdk fills in itself")


@pytest.mark.parametrize(("side", "shape", "match"), [
    ("inputs", [65536, 65536], r"inputs\[1\] \"big\": shape \[65536, 65536\] is 4294967296 elements, over the limit "
                               r"of 100000000 \(edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS\)"),
    ("outputs", [1, -1, 65536, 65536], r"outputs\[1\] \"big\": shape \[1, -1, 65536, 65536\] is 4294967296 elements"),
    ("outputs", [1, 100_000_000], r"outputs\[1\] \"big\": 800000000 bytes \(float64 \[1, 100000000\]\), over the "
                                  r"limit of 536870912 for one tensor \(\$EDGESDK_MAX_TENSOR_BYTES raises it\)"),
], ids=["input-elements", "output-elements-dynamic", "output-bytes"])
def test_a_tensor_over_the_element_or_byte_cap_is_refused(good, side, shape, match):
    _refused(_with(good, side, {"name": "big", "shape": shape, "dtype": "float64"}), match)


def _with(manifest: dict, side: str, tensor: dict) -> dict:
    manifest[side].append(tensor)
    for key in ("tolerance_per_output", "mean_tolerance_per_output"):  # one value per output
        manifest["golden"].pop(key, None)
    return manifest


def test_the_tensor_caps_can_be_raised(good, monkeypatch):
    _with(good, "outputs", {"name": "big", "shape": [1, 100_000_000], "dtype": "float64"})
    monkeypatch.setenv("EDGESDK_MAX_TENSOR_BYTES", str(1 << 30))
    check_manifest(good, "manifest.json")
    good["outputs"][-1]["shape"] = [1, 200_000_000]
    _refused(good, r"is 200000000 elements, over the limit of 100000000")
    from edgesdk.bundle import tensors

    monkeypatch.setattr(tensors, "MAX_ARRAY_ELEMENTS", 200_000_000)
    monkeypatch.setenv("EDGESDK_MAX_TENSOR_BYTES", str(2 << 30))
    check_manifest(good, "manifest.json")


@pytest.mark.parametrize("dtype", ["S1000000000", "U5", "object", "complex64", "float128", "datetime64", "V16",
                                   "int4096", "f" * 300])
def test_a_dtype_that_is_not_numeric_or_bool_is_refused(good, dtype):
    """dtype S1000000000 made a raw MemoryError; only numbers and bools of at most 8 bytes are tensors here."""
    good["inputs"][0]["dtype"] = dtype
    error = _refused(good, r"inputs\[0\] \"x\": dtype .* is not a numeric or bool dtype of at most 8 bytes \(bool, "
                           r"int8 to int64, uint8 to uint64, float16, bfloat16, float32, float64\)")
    assert str(error).isprintable() and len(str(error)) < 600


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "bfloat16", "float64"])
def test_numeric_dtypes_are_accepted(good, dtype):
    good["outputs"][0]["dtype"] = dtype
    check_manifest(good, "manifest.json")


def test_a_huge_state_is_refused_before_anything_is_allocated(bundle_copy):
    m = _stateful(_manifest(bundle_copy), [65536, 65536])
    _write(bundle_copy, m)
    answer = run_bounded(f"edgesdk.load({str(bundle_copy)!r}, engine='onnxruntime').stream()", headroom_mb=256)
    assert answer.get("error") == "BundleError", answer
    assert "shape [65536, 65536] is 4294967296 elements" in answer["message"]


# -- issue 29, low: task parameters that cannot fit the outputs are refused at load --------------------------------

def _task(manifest: dict, task: dict, outputs: list[dict]) -> dict:
    manifest["task"] = task
    manifest["outputs"] = outputs
    for key in ("tolerance_per_output", "mean_tolerance_per_output"):
        manifest["golden"].pop(key, None)
    return manifest


LOGITS = [{"name": "logits", "shape": [1, 24, 8], "dtype": "float32"}]
ANCHOR_OUTPUTS = [{"name": "boxes", "shape": [1, 1, 16], "dtype": "float32"},
                  {"name": "scores", "shape": [1, 1, 1], "dtype": "float32"}]
ANCHORS = {"type": "detection", "format": "anchors", "anchors": {"strides": [8], "per_layer": 1},
           "outputs": {"boxes": "boxes", "scores": "scores"}}


@pytest.mark.parametrize(("task", "outputs", "match"), [
    ({"type": "text", "charset": [f"c{i}" for i in range(100_000)]}, LOGITS,
     r"task 'charset' has 100000 entries, but output 'logits' \(role 'logits'\) has 8 classes \(shape \[1, 24, 8\]\): "
     r"the charset lists every class but the blank, so it needs 7"),
    ({"type": "text", "blank": 100_000}, LOGITS,
     r"task 'blank' 100000 is not a class of output 'logits' \(role 'logits'\): it has 8 classes \(shape "
     r"\[1, 24, 8\]\)"),
    ({**ANCHORS, "keypoints": 1000}, ANCHOR_OUTPUTS,
     r"task 'keypoints' 1000 needs 2004 values per row of output 'boxes' \(role 'boxes'\) \(4 for the box, 2 per "
     r"keypoint\); it has 16 \(shape \[1, 1, 16\]\)"),
    ({"type": "segmentation", "kind": "probability"}, [{"name": "map", "shape": [1, 5, 8, 8], "dtype": "float32"}],
     r"task 'kind' 'probability' needs one channel on channel_axis 1 of output 'map' \(role 'map'\); it has 5 "
     r"\(shape \[1, 5, 8, 8\]\)"),
    ({"type": "landmarks", "dims": 3}, [{"name": "points", "shape": [1, 10], "dtype": "float32"}],
     r"task 'dims' 3 does not divide the 10 values of output 'points' \(role 'points'\) \(shape \[1, 10\]\)"),
], ids=["charset", "blank", "keypoints", "seg-channels", "landmark-dims"])
def test_task_parameters_that_cannot_fit_the_outputs_are_refused_at_load(bundle_copy, task, outputs, match):
    """Such bundles loaded and then failed every prediction with an InputError."""
    _write(bundle_copy, _task(_manifest(bundle_copy), task, outputs))
    with pytest.raises(BundleError, match=match):
        Bundle.open(bundle_copy)


def test_task_parameters_that_fit_or_cannot_be_told_are_accepted(good):
    check_manifest(_task(copy.deepcopy(good), {"type": "text", "charset": list("abcdefg"), "blank": 7}, LOGITS),
                   "manifest.json")
    dynamic = [{"name": "logits", "shape": [1, -1, -1], "dtype": "float32"}]  # classes unknown until it runs
    check_manifest(_task(copy.deepcopy(good), {"type": "text", "charset": list("abc" * 100), "blank": 400}, dynamic),
                   "manifest.json")
    check_manifest(_task(copy.deepcopy(good), {**ANCHORS, "keypoints": 6}, ANCHOR_OUTPUTS), "manifest.json")
