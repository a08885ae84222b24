"""How long quantize takes: recovery's budget for the whole run (derived from the float model unless
``recover_time`` sets it, shared by the artifacts that fail their gate) and the seconds of each phase, recorded in the
manifest's ``timing`` and each target's ``build`` entry, shown by ``edgesdk inspect``. On real engines with the
3-MatMul model of test_recover.py (its INT8 artifacts fail their gate on every engine). Nothing here asserts a speed:
only that the numbers recorded are consistent with each other and with the run's wall time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

from edgesdk import Bundle
from edgesdk.errors import BundleError, ValidationFailed
from edgesdk_converters.options import QuantizeOptions
from edgesdk_converters.recovery.budget import (MAX_BUDGET, SECONDS_PER_GMAC, SMALL_BUDGET, SMALL_MODEL_BYTES, Budget,
                                               default_budget)
from support import quantize
from test_recover import ENV, SCRIPT, artifact, save_model

TARGETS = ["openvino", "onnx"]  # built, validated and recovered in this order


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """failing.onnx and x.npz (300 inputs: 100 calibrate, 200 validate)."""
    root = tmp_path_factory.mktemp("budget-models")
    save_model(root / "failing.onnx", outlier=True)
    np.savez(root / "x.npz", x=np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32))
    return root


def run(models, out, **options) -> tuple[dict, float, list[str]]:
    """quantize failing.onnx (recovery on its default unless ``options`` say otherwise): the manifest written, the
    wall time of the call, and the log."""
    said: list[str] = []
    start = time.perf_counter()
    try:
        quantize(models / "failing.onnx", models / "x.npz", out, samples=100, targets=TARGETS, recover="auto",
                 log=said.append, **options)
    except ValidationFailed:
        pass
    wall = time.perf_counter() - start
    return json.loads((out / "manifest.json").read_text()), wall, said


@pytest.fixture(scope="module")
def timed(failing, tmp_path_factory):
    out = tmp_path_factory.mktemp("timed") / "failing.bundle"
    return (out, *run(failing, out))


# -- the default budget: a pure function of the float model's size and MACs ----------------------------------

@pytest.mark.parametrize(("size", "macs"), [(400_000, 30_000_000), (400_000, None), (9_900_000, 20_000_000_000)],
                         ids=["blazeface-sized", "macs-unknown", "many-macs-small-file"])
def test_a_small_model_gets_a_budget_that_keeps_quantize_under_two_minutes(size, macs):
    """Under 10 MB the budget is SMALL_BUDGET whatever the MACs: a minute, so the run (conversion, validation,
    the trial running when the budget ends, writing) stays within two minutes on two cores."""
    seconds, how = default_budget(size, macs)
    assert seconds == SMALL_BUDGET <= 60.0
    assert f"under {SMALL_MODEL_BYTES / 1e6:g} MB" in how


def test_a_larger_model_gets_a_budget_in_proportion_to_its_macs():
    size = 4 * SMALL_MODEL_BYTES
    two, eight = default_budget(size, 2_000_000_000), default_budget(size, 8_000_000_000)
    assert two[0] == 2 * SECONDS_PER_GMAC and eight[0] == 8 * SECONDS_PER_GMAC > SMALL_BUDGET
    assert "per GMAC" in two[1] and "2.00 GMAC" in two[1]
    assert default_budget(size, 100_000_000) == (SMALL_BUDGET, default_budget(size, 100_000_000)[1])  # the floor
    assert "at least" in default_budget(size, 100_000_000)[1]
    assert default_budget(size, 10**13)[0] == MAX_BUDGET  # the ceiling


def test_above_ten_megabytes_each_failing_artifact_adds_its_own_budget():
    """Each failing artifact runs its own trials: above SMALL_MODEL_BYTES the budget is per failing artifact (the
    PP-OCRv4 recognizer's three needed 15, 30 and 26 s where one 60 s budget left the third out of time); below it
    the whole run keeps SMALL_BUDGET whatever fails (two minutes for a small model)."""
    size = 2 * SMALL_MODEL_BYTES
    one, three = default_budget(size, 700_000_000), default_budget(size, 700_000_000, artifacts=3)
    assert three[0] == pytest.approx(3 * 0.7 * SECONDS_PER_GMAC) and one[0] == SMALL_BUDGET  # 42 s: the floor
    assert "per failing INT8 artifact, 3 failing" in three[1] and "failing" not in one[1]
    assert default_budget(size, None, artifacts=2)[0] == pytest.approx(2 * default_budget(size, None)[0])
    assert default_budget(size // 4, 700_000_000, artifacts=3)[0] == SMALL_BUDGET
    assert default_budget(size, 10**13, artifacts=3)[0] == MAX_BUDGET


def test_a_model_whose_macs_cannot_be_read_goes_by_its_size():
    seconds, how = default_budget(100_000_000, None)
    assert seconds == 300.0 and "could not be read" in how
    assert default_budget(100_000_000, None)[0] < default_budget(200_000_000, None)[0]


def test_the_budget_is_shared_by_the_artifacts_still_to_go():
    """Each artifact gets what is left divided by the artifacts still to go: one that finishes early leaves the rest
    of its share to the others; once spent, nothing is left (a fake clock: seconds as a list)."""
    now = [100.0]
    budget = Budget(60.0, "test", clock=lambda: now[0])
    assert budget.share(3) == 20.0
    now[0] += 5.0  # the first artifact took 5 of its 20 s
    assert budget.share(2) == 27.5
    now[0] += 60.0
    assert budget.left() == 0.0 and budget.share(1) == 0.0
    budget.finish()
    now[0] += 10.0
    assert budget.as_dict() == {"seconds": 60.0, "derived": "test", "spent": 65.0}


def test_recover_time_defaults_to_the_derived_budget():
    assert QuantizeOptions().recover_time is None
    assert QuantizeOptions(recover_time=30).recover_time == 30


# -- a real run: the phases, the budget and the log -----------------------------------------------------------

def test_the_phases_add_up_to_the_wall_time(timed):
    out, manifest, wall, _ = timed
    timing = manifest["timing"]
    phases = timing["phases"]
    assert [row["phase"] for row in phases] == ["source", "calibration_data", "target", "target", "validation",
                                                "recovery", "revalidation", "writing"]
    assert [row.get("target") for row in phases if row["phase"] == "target"] == TARGETS
    assert sum(row["seconds"] for row in phases) == pytest.approx(timing["seconds"], abs=0.01 * len(phases))
    # the run's time up to the manifest: the call also rereads the bundle it wrote (checksums, schema)
    assert 0.8 * wall <= timing["seconds"] <= wall
    for target in TARGETS:
        assert manifest["build"][target]["seconds"] == next(r["seconds"] for r in phases if r.get("target") == target)


def test_recovery_spends_the_default_budget_shared_by_the_failing_artifacts(timed):
    _, manifest, _, _ = timed
    budget = manifest["timing"]["recovery_budget"]
    assert budget["seconds"] == SMALL_BUDGET and "under 10 MB" in budget["derived"]
    recovery = next(r["seconds"] for r in manifest["timing"]["phases"] if r["phase"] == "recovery")
    recs = [artifact(manifest, aid)["recovery"] for aid in ("openvino-int8", "onnxruntime-int8")]
    assert budget["spent"] <= recovery + 0.1
    assert sum(rec["seconds"] for rec in recs) <= budget["spent"] + 0.2
    # the first of two gets half; the second what is left of the whole
    assert recs[0]["budget_seconds"] == pytest.approx(SMALL_BUDGET / 2, abs=0.5)
    assert recs[0]["budget_seconds"] - 0.5 <= recs[1]["budget_seconds"] <= SMALL_BUDGET - recs[0]["seconds"] + 0.5


def test_the_log_says_the_budget_then_each_trial_against_it(timed):
    _, manifest, _, said = timed
    start = [line for line in said if line.startswith("recovery: ")]
    assert len(start) == 1 and f"{SMALL_BUDGET:.0f} s for all of recovery" in start[0], said
    assert "openvino-int8, onnxruntime-int8 fail the gate" in start[0]
    for aid in ("openvino-int8", "onnxruntime-int8"):
        trials = [line for line in said if line.startswith(f"[{aid}] recovery trial ")]
        assert len(trials) == len(artifact(manifest, aid)["recovery"]["trials"]) >= 1, said
        share = artifact(manifest, aid)["recovery"]["budget_seconds"]
        for i, line in enumerate(trials, 1):
            shown = re.match(rf"\[{aid}\] recovery trial {i} \(\w+.*\), (\d+)/(\d+) s: ", line)
            assert shown and abs(int(shown[2]) - share) <= 1 and int(shown[1]) <= share + 1, line
    assert any(line.startswith("time: ") and "recovery " in line for line in said)


def test_inspect_shows_the_time_of_each_phase_and_the_budget(timed):
    out, manifest, _, _ = timed
    proc = subprocess.run([str(SCRIPT), "inspect", str(out)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    shown = next(line for line in lines if line.startswith("time: "))
    assert shown.startswith(f"time: {manifest['timing']['seconds']:.1f} s to build (source ")
    assert "target onnx " in shown and "target openvino " in shown and "validation after recovery " in shown
    assert any(line.strip().startswith(f"recovery budget: {SMALL_BUDGET:.0f} s (the default for a float model "
                                       f"under 10 MB") for line in lines), proc.stdout
    rec = artifact(manifest, "onnxruntime-int8")["recovery"]
    assert f"trial(s) in {rec['seconds']:.0f} of its {rec['budget_seconds']:.0f} s" in proc.stdout


def test_a_tiny_budget_stops_recovery_out_of_time_and_the_bundle_is_still_written(failing, tmp_path):
    manifest, _, said = run(failing, tmp_path / "t.bundle", recover_time=1e-3)
    assert Bundle.open(tmp_path / "t.bundle").manifest["timing"] == manifest["timing"]
    assert manifest["timing"]["recovery_budget"]["seconds"] == 0.0  # 1e-3, to the tenth of a second
    for aid in ("openvino-int8", "onnxruntime-int8"):
        rec = artifact(manifest, aid)["recovery"]
        assert rec["status"] == "out_of_time" and rec["trials"] == [] and rec["kept_float"] == [], rec
        assert "within its 0 s of the recovery budget" in rec["note"] or "spent before" in rec["note"], rec["note"]
        assert manifest["validation"][aid]["passed"] is False
        assert "kept in float" not in artifact(manifest, aid)["method"]
    assert not any(" recovery trial " in line for line in said)
    assert "revalidation" not in [row["phase"] for row in manifest["timing"]["phases"]]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["timing"]["phases"][0].update(seconds=-1), r"timing\.phases\[0\]\.seconds must be a non-negative"),
    (lambda m: m["timing"]["phases"][0].pop("phase"), r"timing\.phases\[0\] is missing key\(s\) phase"),
    (lambda m: m["timing"].update(seconds="60"), r"timing\.seconds must be a non-negative number of seconds"),
    (lambda m: m["build"]["onnx"].update(seconds=-0.5), r"build\.onnx\.seconds must be a non-negative"),
    (lambda m: next(a for a in m["artifacts"] if "recovery" in a)["recovery"].update(budget_seconds=-2),
     r"artifacts\[\d\]\.recovery\.budget_seconds must be a non-negative"),
], ids=["phase_seconds", "phase_name", "total", "build_seconds", "artifact_budget"])
def test_manifest_refuses_bad_times(timed, tmp_path, edit, message):
    out, _, _, _ = timed
    copy = tmp_path / "copy.bundle"
    shutil.copytree(out, copy)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))  # the manifest is not checksummed: no rehash needed
    with pytest.raises(BundleError, match=message):
        Bundle.open(copy)
