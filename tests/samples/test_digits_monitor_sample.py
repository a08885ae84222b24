"""samples/digits/monitor.py end to end on the digits bundle: the in-distribution half raises nothing, the darker
half raises input_drift to alert, and `edgesdk monitor` reads the telemetry file back."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_the_monitor_sample_catches_the_darker_half(digits_bundle, tmp_path):
    telemetry = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, str(REPO / "samples" / "digits" / "monitor.py"), "--bundle",
                           str(digits_bundle.bundle), "--telemetry", str(telemetry)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    calibrated, darker = done.stdout.split("30% darker:")
    assert "input_drift" not in calibrated.split("as calibrated:")[1]
    assert "input_drift: warn -> alert" in darker or "input_drift: ok -> alert" in darker
    assert "signals: input_drift alert" in darker
    assert telemetry.is_file() and "$ edgesdk monitor" in darker
    assert "alert" in darker.split("$ edgesdk monitor")[1]
