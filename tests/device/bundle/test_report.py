"""The plain-text summary and validation table of a bundle."""

from __future__ import annotations

import copy
import re

import pytest

from edgesdk.bundle.report import failing_artifacts, summary, validation_table
from edgesdk.bundle.schema import check_manifest
from edgesdk.errors import BundleError


def test_table_has_a_row_per_artifact(digits_bundle):
    m = digits_bundle.manifest
    table = validation_table(m)
    lines = table.splitlines()
    assert lines[0].startswith("validation on ")
    assert lines[1].split()[0] == "artifact" and lines[1].split()[-1] == "passed"
    for art in m["artifacts"]:
        row = next(line for line in lines if line.startswith(art["id"] + " "))
        assert row.split()[1] == art["precision"]
        assert row.split()[-1] == "yes"
    assert "FAILED" not in table
    assert failing_artifacts(m) == []


def test_table_names_failing_and_slow_artifacts(digits_bundle):
    m = copy.deepcopy(digits_bundle.manifest)
    m["validation"]["openvino-int8"].update(passed=False, accuracy_drop_points=2.5, max_drop_points=1.0)
    m["validation"]["litert-int8"].update(slower_than_float=True, latency_ms=2.0, reference_latency_ms=1.0)
    table = validation_table(m)
    assert failing_artifacts(m) == ["openvino-int8"]
    assert "FAILED: openvino-int8 dropped 2.50 points (accuracy_drop_points); allowed 1.0" in table
    assert "warning: litert-int8 is slower than its float reference (2.000 ms vs 1.000 ms)" in table
    row = next(line for line in table.splitlines() if line.startswith("openvino-int8 "))
    assert row.split()[-1] == "NO"


def test_summary(digits_bundle):
    m = digits_bundle.manifest
    text = summary(m)
    assert text.splitlines()[0] == "bundle digits v1 (format 1)"
    assert "source: digits.pt2 (pytorch)" in text
    assert f"input: {m['inputs'][0]['name']} float32 [1, 1, 8, 8]" in text
    assert "labels (10): 0, 1, 2" in text
    assert f"calibration: 300 samples from {m['calibration']['source']}" in text
    for art in m["artifacts"]:
        for f in art["files"]:
            assert f["path"] in text


def _with_build(manifest: dict, build: dict) -> dict:
    m = copy.deepcopy(manifest)
    m["build"] = build
    return m


def test_summary_says_which_targets_were_dropped_and_why(digits_bundle):
    error = "ConversionError: the importer refused node 'up'\ncaused by RuntimeError: \x1b[31mred\x1b[0m detail"
    m = _with_build(digits_bundle.manifest, {
        "tflite": {"status": "failed", "error": error, "log_tail": ["W converter line", "\x1b[1;31mE kernel\x1b[0m"]},
        "openvino": {"status": "built", "error": None, "log_tail": []},
    })
    check_manifest(m, "manifest.json")
    lines = summary(m).splitlines()
    at = lines.index("build: tflite failed, openvino built")
    assert lines[at + 1:at + 7] == [
        "  tflite FAILED, left out of this bundle:",
        "    ConversionError: the importer refused node 'up'",
        "    caused by RuntimeError: \\x1b[31mred\\x1b[0m detail",  # the error's own line breaks kept, escapes shown
        "    last 2 lines of the converter's output:",
        "      | W converter line",
        "      | \\x1b[1;31mE kernel\\x1b[0m",
    ]


def test_summary_without_build_section_is_unchanged(digits_bundle):
    assert "build:" not in summary({k: v for k, v in digits_bundle.manifest.items() if k != "build"})


@pytest.mark.parametrize(("build", "problem"), [
    ({"tflite": {"status": "broken"}}, 'build.tflite.status must be one of "built", "failed", "refused", got "broken"'),
    ({"tflite": {"error": None}}, "build.tflite is missing key(s) status"),
    ({"tflite": {"status": "failed", "error": 3}}, "build.tflite.error must be a string or null, got 3"),
    ({"tflite": {"status": "failed", "log_tail": "x"}}, 'build.tflite.log_tail must be a list, got "x"'),
    ({"tf\x1blite": {"status": "built"}}, "build key must be one line of printable text"),
    (["tflite"], 'build must be an object or null, got ["tflite"]'),
])
def test_schema_refuses_a_bad_build_section(digits_bundle, build, problem):
    with pytest.raises(BundleError, match=re.escape(problem)):
        check_manifest(_with_build(digits_bundle.manifest, build), "manifest.json")
