"""The plain-text summary and validation table of a bundle."""

from __future__ import annotations

import copy

from edgesdk.bundle.report import failing_artifacts, summary, validation_table


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
