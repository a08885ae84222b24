"""``edgesdk run``: load a bundle on the best backend here and predict each input, showing where it ran, the budget
state and each answer as it comes (:mod:`.inputs` reads the inputs, an array file sample by sample; :mod:`.answers`
prints the answers; :mod:`.show` says and draws them); with ``--monitor FILE`` the run's telemetry goes to FILE
(:mod:`.monitoring`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..choices import BudgetAction, HybridMode
from ..errors import BackendUnavailable, BudgetExceeded, CloudError, InputError
from ._app import app
from .inputs import MAX_SAMPLES_PER_FILE


def _governor(root: Path, profile: Optional[str]):
    """A thermal governor over the zones under ``root``, with the platform profile's limits."""
    from ..runtime.profiles import detect_profile, load_profile
    from ..budgets.thermal import LinuxThermalZones, ThermalGovernor

    chosen = load_profile(profile) if profile else detect_profile()[0]
    return ThermalGovernor.from_profile(LinuxThermalZones(root), chosen)


@app.command()
def run(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    inputs: List[Path] = typer.Argument(..., help="Images (or .npy arrays of the model's input shape)."),
    policy: str = typer.Option("auto", "--policy", help="auto, prefer-npu, prefer-gpu, cpu-only, max-efficiency, "
                               "autotune."),
    require: Optional[str] = typer.Option(None, "--require", help="Fail unless served by this device kind "
                                          "(NPU, GPU, CPU) or engine."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Try this engine first."),
    device: Optional[str] = typer.Option(None, "--device", help="Try this device first (e.g. GPU, CPU, GPU.1)."),
    artifact: Optional[str] = typer.Option(None, "--artifact", help="Try this artifact id first."),
    allow_failed: bool = typer.Option(False, "--allow-failed", help="Serve an artifact that failed its validation "
                                      "gate at quantize time (--artifact, or when nothing else serves), with a "
                                      "warning."),
    speed_check: str = typer.Option("full", "--speed-check", help="At the first load here, time every candidate "
                                     "of the first device kind and serve the fastest (full), only INT8 against FP32 "
                                     "(precision), or nothing (off). Cached per machine."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Platform profile name or file (default: detect)."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the golden numerics self-check at load."),
    memory_mb: Optional[float] = typer.Option(None, "--memory-mb", help="Memory budget of the process in MB."),
    thermal_root: Optional[Path] = typer.Option(None, "--thermal-root", help="A directory laid out like /sys "
                                                "(class/thermal/thermal_zone*/): govern inference by its zones."),
    mode: str = typer.Option("device-only", "--mode", help="Hybrid mode: device-only, cloud-only, prefer-device, "
                             "prefer-cloud."),
    cloud: Optional[str] = typer.Option(None, "--cloud", help="The cloud endpoint (Open Inference Protocol V2 "
                                        "server URL) for hybrid modes."),
    token_env: Optional[str] = typer.Option(None, "--token-env", help="Environment variable holding the cloud's "
                                            "bearer token."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    draw: Optional[Path] = typer.Option(None, "--draw", help="Write each image input with its answer drawn on it "
                                        "(boxes, masks, points, text) as a PNG: this file for one input, else (or "
                                        "when it is a directory) a directory of <input>.drawn.png. An existing "
                                        "file is not replaced without --force."),
    force: bool = typer.Option(False, "--force", help="Let --draw replace existing files (a symlink is replaced "
                               "itself, never written through)."),
    max_samples: int = typer.Option(MAX_SAMPLES_PER_FILE, "--max-samples", help="Refuse a .npy or .npz holding "
                                    "more samples than this (one prediction each), from its header."),
    monitor_file: Optional[Path] = typer.Option(None, "--monitor", help="Append the run's telemetry to this file "
                                                "(JSON lines: a snapshot at each evaluation and at the end, each "
                                                "alert); read it with `edgesdk monitor FILE`. Checked writable "
                                                "before the model loads."),
) -> None:
    """Load a bundle on the best backend here and predict each input; shows where it really ran and the budget state.
    A bundle with a task (detection, segmentation, text, ...) prints its decoded answer: boxes in the original
    image's pixels, masks, text, points, values; ``--json`` carries them in full. Each answer is printed as it comes;
    a .npy or .npz is read one sample at a time, its headers checked against the model's inputs first.

    With --mode other than device-only and --cloud URL, hard inputs (or all, per the mode) go to the cloud; each
    result says its source, why it escalated and whether it is degraded (the cloud failed, the device answered).
    With --monitor FILE the model's monitor (the device model's in hybrid mode) appends its telemetry to FILE: a
    snapshot every 50 predictions once 300 are in, each alert, and at the end one more evaluation (so that a short
    run has its drift figures too) and a last snapshot.
    Exits 3 when the bundle cannot be served (the reason code is printed) or an input was refused by a budget; 2
    when an input was unusable or could not be drawn (every other answer is still printed)."""
    from ..runtime.loading import load
    from .inputs import predictions, read_input

    if max_samples < 1:
        raise InputError(f"--max-samples must be at least 1, got {max_samples}")
    items = [(str(p), read_input(p)) for p in inputs]  # headers only, before the (slow) load: a typo fails fast
    unreadable = [v for _, v in items if isinstance(v, InputError)]
    if len(unreadable) == len(items):
        raise unreadable[0]
    governor = _governor(thermal_root, profile) if thermal_root is not None else None
    hybrid = {"mode": mode, "cloud": cloud, "token_env": token_env} if mode != HybridMode.DEVICE_ONLY or cloud else {}
    sink, monitoring = None, {}
    if monitor_file is not None:
        from .monitoring import open_run_sink, run_options

        sink = open_run_sink(monitor_file, mode)  # before the load and any answer: an unwritable file fails here
        monitoring = {"monitor": run_options(sink)}
    try:
        model = load(bundle, policy=policy, require=require, engine=engine, device=device, artifact=artifact,
                     allow_failed=allow_failed, speed_check=speed_check, profile=profile,
                     check_numerics=not no_check, memory_mb=memory_mb, thermal=governor, **hybrid, **monitoring)
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    device_model = getattr(model, "device", model)  # a HybridModel's device side (None: no device backend)
    watched = getattr(device_model, "monitor", None) if sink is not None else None
    if sink is not None and watched is None:
        sink.close()
        print(f"warning: --monitor {monitor_file}: no device model ran here, nothing is monitored", file=sys.stderr)
    specs = model.bundle.manifest["inputs"]
    images = model.bundle.preprocess is not None
    # Every file's headers against the model's inputs, before any data is read: how many predictions, each lazy.
    planned = [predictions(label, value, specs, images, max_samples) for label, value in items]
    drawings = None
    if draw is not None:
        from .show import Drawings

        drawings = Drawings(draw, sum(count for count, _ in planned) > 1, force)
    shown = _JsonRun(model, mode, cloud) if as_json else _TextRun(model, mode, cloud, governor)
    tally = _Tally()
    signals: dict = {}
    with model:
        for _, rows in planned:
            for label, value in rows:  # one answer per input: a refused or unusable one does not hide the others
                result = value if isinstance(value, InputError) else _predict(model, value)
                drawn = not_drawn = None
                if drawings is not None and not isinstance(result, Exception):
                    try:
                        drawn = str(drawings.write(label, result.decoded, value))
                    except InputError as exc:
                        not_drawn = str(exc)
                        _stderr(f"{label}: not drawn: {exc}")
                shown.add(label, result, drawn, not_drawn)
                tally.add(result, not_drawn)
        if watched is not None:
            from .monitoring import finish_run

            signals = finish_run(watched)  # then closing the model writes the last snapshot
    shown.finish(governor, sink if watched is not None else None, signals)
    if tally.first_error is not None and not tally.usable:
        raise tally.first_error  # nothing usable: an error, as for one bad input
    if tally.refused:
        raise typer.Exit(3)
    if tally.bad_input or tally.not_drawn:
        raise typer.Exit(2)


def _predict(model, value):
    """The model's answer to ``value``, or the refusal that stands in its place."""
    try:
        return model.predict(value)
    except (InputError, BudgetExceeded, CloudError, BackendUnavailable) as exc:
        return exc


class _Tally:
    """What the exit code needs to know of the answers, without holding them."""

    def __init__(self) -> None:
        self.usable = self.refused = self.bad_input = self.not_drawn = False
        self.first_error: InputError | None = None

    def add(self, result, not_drawn: str | None) -> None:
        if isinstance(result, InputError):
            self.bad_input = True
            self.first_error = self.first_error or result
        else:
            self.usable = True
            self.refused |= isinstance(result, (BudgetExceeded, CloudError, BackendUnavailable))
        self.not_drawn |= not_drawn is not None


class _JsonRun:
    """``run --json``: the placement (and the hybrid set-up) first, each result as it comes, the budget state and
    the monitor's summary at the end."""

    def __init__(self, model, mode: str, cloud: Optional[str]):
        from .answers import JsonAnswers

        self.model, self.cloud = model, cloud
        self.device = getattr(model, "device", model)
        head = {"placement": self.device.placement.to_dict() if self.device is not None else None}
        if mode != HybridMode.DEVICE_ONLY:
            head["hybrid"] = {"mode": mode, "cloud": cloud, "threshold": model.policy.threshold,
                              "signal": model.policy.signal,
                              "device_error": str(model.device_error) if model.device_error else None}
        self.out = JsonAnswers(head)

    def add(self, label: str, result, drawn: Optional[str], not_drawn: Optional[str]) -> None:
        from .answers import json_row

        self.out.add(json_row(label, result, self.cloud, drawn, not_drawn))

    def finish(self, governor, sink, signals: dict) -> None:
        memory_state = self.device.budget.get("memory") if self.device is not None else None
        tail = {"budget": {"memory": memory_state, "thermal": governor.state() if governor else None}}
        if sink is not None:
            from .monitoring import run_summary

            tail["monitor"] = run_summary(sink, signals)
        self.out.finish(tail)


class _TextRun:
    """``run``'s text: where it runs (placement, numerics, speed, memory, thermal) first, a line per answer as it
    comes, the monitor's line at the end. Every line is escaped: labels, paths and engine or server text are data,
    never terminal controls."""

    def __init__(self, model, mode: str, cloud: Optional[str], governor):
        from ..bundle.report import printable
        from .answers import Stdout

        self.out, self.printable = Stdout(), printable
        device_model = getattr(model, "device", model)
        self.placement = device_model.placement if device_model is not None else None
        self.output_names = [o["name"] for o in model.bundle.manifest["outputs"]]
        if mode != HybridMode.DEVICE_ONLY:
            policy = model.policy
            when = (f"when {policy.signal} crosses {policy.threshold:g}" if policy.signal is not None else
                    "only on out-of-range input: this task has no confidence signal")
            self.say(f"hybrid: {mode} with {cloud} (escalates {when})")
        if device_model is None:
            self.say(f"placement: none on this device ({model.device_error}); the cloud answers")
        pl = self.placement
        if pl is not None:
            self.say(f"placement: {pl}")
            self.say(f"  numerics: {pl.numerics}")
            race = pl.engine_choice
            if race:  # edgesdk.runtime.precision_choice race: which engine and precision are fastest here?
                times = ", ".join(f"{label.split(':')[-1]} {ms} ms" for label, ms in race["timings_ms"].items())
                self.say(f"  speed: {race['chosen']} ({'cached' if race['cached'] else 'measured'}; {times}; "
                         f"profile's first: {race['incumbent']})")
            choice = pl.precision_choice
            if choice:  # edgesdk.runtime.precision_choice: was INT8 faster than FP32 here?
                seen = "cached" if choice["cached"] else "measured" if choice["ratio"] is not None else "not measured"
                self.say(f"  precision: {choice['chosen']} ({seen}; int8/fp32 {choice['ratio']}; "
                         f"{choice['method']})")
            mem = device_model.budget.get("memory", {})
            switched = device_model.budget.get("action") == BudgetAction.ARTIFACT_SWITCHED
            self.say(f"  memory: model ~{mem.get('model_mb')} MB, limit {mem.get('limit_mb')} MB "
                     f"({mem.get('source')}){', artifact switched to fit' if switched else ''}")
            for s in pl.skipped:
                self.say(f"  skipped {s.candidate.label()}: {s.reason} ({s.detail})")
        if governor is not None:
            governor.poll()  # the state the run starts in (the sensor is read once more only after its interval)
            st = governor.state()
            self.say(f"  thermal: {st.get('level')} at {st.get('temperature_c')} C ({st.get('source')})")

    def say(self, line: str) -> None:
        self.out.write(self.printable(line) + "\n")

    def add(self, label: str, result, drawn: Optional[str], not_drawn: Optional[str]) -> None:
        from .answers import answer_line

        self.say(answer_line(label, result, self.output_names, self.placement, drawn))

    def finish(self, governor, sink, signals: dict) -> None:
        if sink is not None:
            from .monitoring import run_line

            self.say(run_line(sink, signals))
        self.out.flush()


def _stderr(line: str) -> None:
    from ..bundle.report import printable

    print(printable(line), file=sys.stderr, flush=True)
