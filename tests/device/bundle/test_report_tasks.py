"""The validation table and the schema for task gates (issue 17): the metric's name and value, the drop in its unit,
and failure lines that name the metric, the dead output and its two spreads. Manifests written here by hand, as
quantize writes them (tests/workstation/test_task_validation.py makes the entries from real artifacts)."""

from __future__ import annotations

import copy

import pytest

from edgesdk.bundle.report import failing_artifacts, validation_table
from edgesdk.bundle.schema import check_manifest
from edgesdk.errors import BundleError

_FILE = {"path": "a.onnx", "sha256": "0" * 64, "bytes": 1}


def manifest(entries: dict[str, dict], outputs=("map",)) -> dict:
    return {
        "format_version": 1, "name": "m", "version": "1", "created_with": {},
        "inputs": [{"name": "x", "shape": [1, 3, 64, 64], "dtype": "float32"}],
        "outputs": [{"name": n, "shape": [1, 1, 64, 64], "dtype": "float32"} for n in outputs],
        "artifacts": [{"id": aid, "engine": "onnxruntime", "precision": aid.rsplit("-", 1)[1],
                       "files": [dict(_FILE, path=f"{aid}.onnx")]} for aid in entries],
        "validation_data": "val.npz", "validation": entries,
    }


SEG_INT8 = {"reference": "onnxruntime-fp32", "samples": 16, "task": "segmentation", "metric": "mask_iou",
            "metric_value": 0.955, "drop": 4.5, "drop_unit": "points", "max_drop": 10.0, "max_drop_points": 10.0,
            "gate": "mask_iou_drop_points", "mask_iou_drop_points": 4.5, "details": {"mask_iou": 0.955, "classes": 1,
                                                                                    "pixels_differing": 0.002},
            "cosine_similarity": 0.999, "max_abs_error": 0.93, "max_abs_error_golden": 0.93,
            "max_abs_error_cap": 0.1, "max_abs_error_over_cap": True,
            "dead_output": [], "output_std": [0.31], "reference_output_std": [0.32], "passed": True}
SEG_FP32 = {"reference": None, "samples": 16, "task": "segmentation", "metric": "mask_iou", "metric_value": 1.0,
            "drop": 0.0, "drop_unit": "points", "max_drop": 10.0, "gate": "mask_iou_drop_points",
            "mask_iou_drop_points": 0.0, "dead_output": [], "passed": True}


def _row(table: str, aid: str) -> list[str]:
    return next(line for line in table.splitlines() if line.startswith(aid + " ")).split()


def test_the_table_names_the_task_metric_and_its_value():
    m = manifest({"onnxruntime-fp32": SEG_FP32, "onnxruntime-int8": SEG_INT8})
    check_manifest(m, "manifest.json")
    table = validation_table(m)
    head = table.splitlines()[1].split()
    row = _row(table, "onnxruntime-int8")
    assert head[3:7] == ["metric", "value", "ref", "drop"]
    assert row[3:7] == ["mask_iou", "95.50%", "-", "+4.50"] and row[-1] == "yes"
    assert _row(table, "onnxruntime-fp32")[3:5] == ["mask_iou", "100.00%"]
    # over the INT8 cap, but judged by its masks: said, not failed
    assert "note: onnxruntime-int8 is off the float outputs by 0.93, over the INT8 cap (reported: its gate is " \
           "mask_iou, on decoded outputs)" in table and "FAILED" not in table
    assert failing_artifacts(m) == []


def test_a_failed_drop_names_the_metric():
    entry = dict(SEG_INT8, metric_value=0.85, drop=15.0, mask_iou_drop_points=15.0, passed=False)
    table = validation_table(manifest({"onnxruntime-int8": entry}))
    assert "FAILED: onnxruntime-int8 dropped 15.00 points (mask_iou_drop_points); allowed 10.0 (mask_iou 85.00%)" \
        in table


def test_a_dead_output_names_the_output_and_both_spreads():
    entry = dict(SEG_INT8, task="probability", metric="relative_mae", metric_value=1.2, drop=1.2,
                 gate="relative_mae_points", relative_mae_points=1.2, dead_output=["output"],
                 output_std=[0.0003, 0.5], reference_output_std=[0.21, 0.52], passed=False)
    entry.pop("max_abs_error_over_cap")
    fp32 = dict(SEG_FP32, dead_output=["stateN"], output_std=[0.2, 0.0], reference_output_std=[0.21, 0.4],
                passed=False)
    m = manifest({"openvino-fp32": fp32, "openvino-int8": entry}, outputs=("output", "stateN"))
    check_manifest(m, "manifest.json")
    table = validation_table(m)
    assert ("FAILED: openvino-int8 output 'output' barely varies (std 0.0003 vs float's 0.21): INT8 flattened it"
            in table)
    assert ("FAILED: openvino-fp32 output 'stateN' barely varies (std 0 vs the golden float's 0.4): the conversion "
            "flattened it" in table)
    assert "dropped" not in table  # its metric passed: only the dead output failed it
    assert _row(table, "openvino-int8")[3:5] == ["relative_mae", "1.20%"]
    assert failing_artifacts(m) == ["openvino-fp32", "openvino-int8"]


def test_landmarks_drop_is_in_pixels():
    entry = dict(SEG_INT8, task="landmarks", metric="p95_point_error_px", metric_value=3.25, drop=3.25,
                 drop_unit="px", max_drop=1.92, gate="p95_point_error_px", p95_point_error_px=3.25, passed=False)
    del entry["max_drop_points"], entry["max_abs_error_over_cap"]
    m = manifest({"onnxruntime-int8": entry})
    check_manifest(m, "manifest.json")
    table = validation_table(m)
    assert _row(table, "onnxruntime-int8")[3:7] == ["p95_point_error_px", "3.25px", "-", "3.25px"]
    assert "FAILED: onnxruntime-int8 p95_point_error_px 3.25px, over the 1.92px allowed" in table


def test_a_probability_task_failure_and_a_plug_in_metric():
    entry = dict(SEG_INT8, task="probability", metric="mymetrics:agreement", metric_value=0.97, drop=3.0,
                 gate="metric_drop_points", metric_drop_points=3.0, task_metric="relative_mae", task_metric_value=7.0,
                 task_failure="decisions at 0.5 agree on 80.0% of values (< 90%)", passed=False)
    m = manifest({"onnxruntime-int8": entry})
    check_manifest(m, "manifest.json")
    table = validation_table(m)
    assert _row(table, "onnxruntime-int8")[3:5] == ["mymetrics:agreement", "97.00%"]
    assert "FAILED: onnxruntime-int8: decisions at 0.5 agree on 80.0% of values (< 90%)" in table


def test_an_entry_written_before_tasks_reads_as_before():
    old = {"reference": "onnxruntime-fp32", "samples": 100, "accuracy": 0.97, "reference_accuracy": 0.995,
           "top1_agreement": 0.975, "gate": "accuracy_drop_points", "accuracy_drop_points": 2.5, "max_drop_points": 1.0,
           "passed": False}
    table = validation_table(manifest({"onnxruntime-int8": old}, outputs=("logits",)))
    assert _row(table, "onnxruntime-int8")[3:8] == ["accuracy", "97.00%", "99.50%", "+2.50", "97.50%"]
    assert "FAILED: onnxruntime-int8 dropped 2.50 points (accuracy_drop_points); allowed 1.0\n" in table + "\n"


@pytest.mark.parametrize("change, problem", [
    (lambda e: e.update(dead_output="output"), r"validation.onnxruntime-int8.dead_output must be a list"),
    (lambda e: e.update(dead_output=["out\x1bput"]), r"dead_output\[0\] must be one line of printable text"),
    (lambda e: e.update(metric_value="high"), r"metric_value must be a number or null"),
    (lambda e: e.update(output_std=[0.1, "x"]), r"output_std\[1\] must be a number or null"),
    (lambda e: e.update(details=[1, 2]), r"details must be an object or null"),
    (lambda e: e.update(max_abs_error_over_cap="yes"), r"max_abs_error_over_cap must be true or false"),
    (lambda e: e.update(metric="mask\niou"), r"metric must be one line of printable text"),
])
def test_the_schema_checks_the_task_keys(change, problem):
    m = manifest({"onnxruntime-int8": copy.deepcopy(SEG_INT8)})
    change(m["validation"]["onnxruntime-int8"])
    with pytest.raises(BundleError, match=problem):
        check_manifest(m, "manifest.json")
