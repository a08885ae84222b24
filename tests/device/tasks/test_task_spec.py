"""The manifest's task table (edgesdk.tasks.spec): every parameter checked where the spec is built, roles resolved
against the model's outputs, the default task, and bundles written before tasks."""

from __future__ import annotations

import json

import pytest

from edgesdk.bundle.schema import check_manifest
from edgesdk.errors import BundleError, InputError
from edgesdk.tasks import TaskSpec, TaskType, default_task, task_of

BLAZEFACE = {"type": "detection", "format": "anchors", "outputs": {"boxes": "regressors", "scores": "classificators"},
             "anchors": {"strides": [8, 16, 16, 16]}, "box_scale": [128, 128, 128, 128], "keypoints": 6}


def test_defaults_are_filled_in_and_written_out():
    spec = TaskSpec.from_dict(BLAZEFACE)
    assert spec.type is TaskType.DETECTION and spec.score_threshold == 0.5 and spec.iou_threshold == 0.45
    assert spec.anchors == {"strides": (8, 16, 16, 16), "per_layer": 2, "offset": 0.5}
    assert spec.score_activation == "sigmoid"  # anchors (raw logits) default to sigmoid; yolo/boxes to none
    table = spec.to_dict()
    assert "layout" not in table and "box_format" not in table  # another format's parameters stay out
    assert TaskSpec.from_dict(json.loads(json.dumps(table))) == spec  # the manifest round trip
    assert TaskSpec.make("detection", {"predictions": "p"}, format="yolo").score_activation == "none"
    assert TaskSpec.make("probability").threshold == 0.5 and TaskSpec.make("probability").range == (0.0, 1.0)


@pytest.mark.parametrize(("table", "match"), [
    ({"type": "detector"}, r"task 'type' must be one of classification, detection, .*got 'detector'"),
    ({"type": "segmentation", "thresh": 0.3}, r"unknown key\(s\) 'thresh' \(known: outputs, kind, threshold"),
    ({"type": "segmentation", "threshold": 1.5}, r"'threshold' must be a finite number in \[0.0, 1.0\], got 1.5"),
    ({"type": "segmentation", "threshold": True}, r"'threshold' must be a finite number"),
    ({"type": "segmentation", "kind": "binary"}, r"'kind' must be one of 'probability', 'classes', got 'binary'"),
    ({"type": "detection", "format": "anchors"}, r"format 'anchors' needs 'anchors'"),
    ({"type": "detection", "format": "anchors", "anchors": {"strides": [0]}}, r"anchors.strides must be"),
    ({"type": "detection", "format": "anchors", "anchors": {"strides": [8], "size": 1}}, r"unknown key\(s\) size"),
    ({"type": "detection", "uncertain": [0.8, 0.2]}, r"'uncertain' must be \[low, high\]"),
    ({"type": "detection", "max_detections": 0}, r"'max_detections' must be an integer from 1 to 10000"),
    ({"type": "detection", "format": "yolo", "outputs": {"boxes": "b"}}, r"no output role\(s\) 'boxes' \(roles: "
                                                                         r"predictions\)"),
    ({"type": "text", "charset": ["a", "b\n"]}, r"'charset' must be a list .* without control characters"),
    ({"type": "text", "charset": []}, r"'charset' must be a list of 1 to"),
    ({"type": "regression", "range": [0, 1], "threshold": 3}, r"'threshold' 3.0 is outside its 'range' \[0.0, 1.0\]"),
    ({"type": "landmarks", "dims": 4}, r"'dims' must be an integer from 2 to 3"),
    ({"type": "raw", "outputs": "x"}, r"'outputs' must be a table of role = output name"),
    (["detection"], r"task must be a table with a 'type', got list"),
])
def test_bad_tables_name_the_key(table, match):
    with pytest.raises(InputError, match=match):
        TaskSpec.from_dict(table)


def test_roles_resolve_against_the_outputs():
    # one output, one role: no outputs table needed
    assert TaskSpec.make("segmentation").resolved(["map0"]).outputs == {"map": "map0"}
    # as many outputs as roles, in order
    spec = TaskSpec.make("detection", format="boxes").resolved(["b", "s"])
    assert spec.outputs == {"boxes": "b", "scores": "s"}
    with pytest.raises(InputError, match=r"role 'map' names output 'nope', which the model does not have "
                                         r"\(outputs: a, b\)"):
        TaskSpec.make("segmentation", {"map": "nope"}).resolved(["a", "b"])
    with pytest.raises(InputError, match=r"needs output role\(s\) 'map' .*the model's outputs: a, b"):
        TaskSpec.make("segmentation").resolved(["a", "b"])  # two outputs, one role: which?
    assert TaskSpec.make("raw").resolved(["a", "b"]).outputs == {}


def test_default_task_and_bundles_from_before_tasks():
    assert default_task([{"name": "logits", "shape": [1, 10], "dtype": "float32"}]).type is TaskType.CLASSIFICATION
    assert default_task([{"name": "map", "shape": [1, 1, 64, 64], "dtype": "float32"}]).type is TaskType.RAW
    assert default_task([{"name": "a", "shape": [1, 2], "dtype": "float32"},
                         {"name": "b", "shape": [1, 2], "dtype": "float32"}]).type is TaskType.RAW
    assert default_task([{"name": "ids", "shape": [1, 10], "dtype": "int64"}]).type is TaskType.RAW
    old = {"outputs": [{"name": "out", "shape": [1, 10], "dtype": "float32"}],
           "postprocess": {"type": "classification", "softmax": True}}
    spec = task_of(old)
    assert spec.type is TaskType.CLASSIFICATION and spec.softmax is True and spec.outputs == {"scores": "out"}
    assert task_of({"outputs": old["outputs"], "postprocess": {"type": "none"}}).type is TaskType.RAW


def _manifest(task) -> dict:
    return {"format_version": 1, "name": "m", "version": "1", "created_with": {},
            "inputs": [{"name": "x", "shape": [1, 128, 128, 3], "dtype": "float32"}],
            "outputs": [{"name": "regressors", "shape": [1, 896, 16], "dtype": "float32"},
                        {"name": "classificators", "shape": [1, 896, 1], "dtype": "float32"}],
            "artifacts": [{"id": "a", "engine": "onnxruntime", "precision": "fp32",
                           "files": [{"path": "m.onnx", "sha256": "0" * 64, "bytes": 1}]}],
            "task": task}


def test_the_schema_checks_the_task_table_and_its_roles():
    check_manifest(_manifest(BLAZEFACE), "manifest.json")
    with pytest.raises(BundleError, match=r"task is not a usable task: .*unknown key\(s\) 'thresh'"):
        check_manifest(_manifest({**BLAZEFACE, "thresh": 1}), "manifest.json")
    with pytest.raises(BundleError, match=r"task: task role 'scores' names output 'scores', which the model does "
                                          r"not have"):
        check_manifest(_manifest({**BLAZEFACE, "outputs": {"boxes": "regressors", "scores": "scores"}}),
                       "manifest.json")


def test_an_anchor_table_that_does_not_fit_the_boxes_output_is_refused_at_load_without_making_anchors():
    """16 layers of stride 1 with 64 anchors each would be 16.7 million anchors for a 128x128 input (770 MiB): the
    count is computed, compared with the boxes output's 896 rows and refused when the manifest is read."""
    import tracemalloc

    manifest = _manifest({**BLAZEFACE, "anchors": {"strides": [1] * 16, "per_layer": 64}})
    manifest["inputs"][0]["shape"] = [1, 128, 128, 3]
    tracemalloc.start()
    with pytest.raises(BundleError, match=r"give 16777216 anchors for a 128x128 input; output 'regressors' has 896"):
        check_manifest(manifest, "manifest.json")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10 << 20
    fitting = _manifest(BLAZEFACE)
    fitting["inputs"][0]["shape"] = [1, 128, 128, 3]
    check_manifest(fitting, "manifest.json")  # 896: BlazeFace's own
