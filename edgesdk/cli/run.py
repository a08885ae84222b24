"""``edgesdk run``: load a bundle on the best backend here and predict each input, showing where it ran, the budget
state and each answer (:mod:`.inputs` reads the inputs, :mod:`.show` says and draws the answers); with
``--monitor FILE`` the run's telemetry goes to FILE (:mod:`.monitoring`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import BackendUnavailable, BudgetExceeded, CloudError, EdgeSDKError, InputError
from ._app import app


def _backend(placement) -> str:
    return f"{placement.engine}:{placement.device}:{placement.artifact}"


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
                                        "(boxes, masks, points, text) as a PNG: this file for one input, else a "
                                        "directory of <input>.drawn.png."),
    monitor_file: Optional[Path] = typer.Option(None, "--monitor", help="Append the run's telemetry to this file "
                                                "(JSON lines: a snapshot at each evaluation and at the end, each "
                                                "alert); read it with `edgesdk monitor FILE`. Checked writable "
                                                "before the model loads."),
) -> None:
    """Load a bundle on the best backend here and predict each input; shows where it really ran and the budget state.
    A bundle with a task (detection, segmentation, text, ...) prints its decoded answer: boxes in the original
    image's pixels, masks, text, points, values; ``--json`` carries them in full.

    With --mode other than device-only and --cloud URL, hard inputs (or all, per the mode) go to the cloud; each
    result says its source, why it escalated and whether it is degraded (the cloud failed, the device answered).
    With --monitor FILE the model's monitor (the device model's in hybrid mode) appends its telemetry to FILE: a
    snapshot every 50 predictions once 300 are in, each alert, and at the end one more evaluation (so that a short
    run has its drift figures too) and a last snapshot.
    Exits 3 when the bundle cannot be served (the reason code is printed) or an input was refused by a budget."""
    from ..runtime.loading import load
    from .inputs import describe_output, predictions, read_input
    from .show import describe

    items = [(str(p), read_input(p)) for p in inputs]  # before the (slow) load: a typo fails fast
    unreadable = [v for _, v in items if isinstance(v, InputError)]
    if len(unreadable) == len(items):
        raise unreadable[0]
    governor = _governor(thermal_root, profile) if thermal_root is not None else None
    hybrid = {"mode": mode, "cloud": cloud, "token_env": token_env} if mode != "device-only" or cloud else {}
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
    signals: dict = {}
    specs = model.bundle.manifest["inputs"]
    items = [row for label, value in items for row in predictions(label, value, specs)]  # batches: one row per sample
    labels = [label for label, _ in items]
    results: list = []
    with model:
        for _, value in items:  # one answer per input: a refused or unreadable one does not hide the others
            if isinstance(value, InputError):
                results.append(value)
                continue
            try:
                results.append(model.predict(value))
            except (InputError, BudgetExceeded, CloudError, BackendUnavailable) as exc:
                results.append(exc)
        if watched is not None:
            from .monitoring import finish_run

            signals = finish_run(watched)  # then closing the model writes the last snapshot
    if all(isinstance(r, InputError) for r in results):
        raise results[0]  # nothing usable: an error, as for one bad input
    drawn = _draw_all(draw, items, results) if draw is not None else {}
    refused = any(isinstance(r, (BudgetExceeded, CloudError, BackendUnavailable)) for r in results)
    bad_input = any(isinstance(r, InputError) for r in results)
    if as_json:
        rows = []
        for p, r in zip(labels, results):
            if isinstance(r, BudgetExceeded):
                rows.append({"input": str(p), "source": None, "top": [],
                             "budget": {"action": "refused", "reason": r.reason, "detail": r.detail}})
            elif isinstance(r, EdgeSDKError):
                rows.append({"input": str(p), "source": None, "top": [], "error": r.to_dict()})
            else:
                row = {"input": str(p), **r.to_dict()}
                if r.source == "cloud":
                    row["backend"] = cloud
                if p in drawn:
                    row["drawn"] = drawn[p]
                rows.append(row)
        memory_state = device_model.budget.get("memory") if device_model is not None else None
        state = {"memory": memory_state, "thermal": governor.state() if governor else None}
        placement = device_model.placement.to_dict() if device_model is not None else None
        out = {"placement": placement, "budget": state, "results": rows}
        if mode != "device-only":
            out["hybrid"] = {"mode": mode, "cloud": cloud, "threshold": model.policy.threshold,
                             "signal": model.policy.signal,
                             "device_error": str(model.device_error) if model.device_error else None}
        if watched is not None:
            from .monitoring import run_summary

            out["monitor"] = run_summary(sink, signals)
        print(json.dumps(out, indent=2, default=str))
        _exit(refused, bad_input)
        return
    from ..bundle.report import printable

    def say(line: str) -> None:  # labels, paths and engine or server text are data: never terminal controls
        print(printable(line))

    if mode != "device-only":
        policy = model.policy
        when = (f"when {policy.signal} crosses {policy.threshold:g}" if policy.signal is not None else
                "only on out-of-range input: this task has no confidence signal")
        say(f"hybrid: {mode} with {cloud} (escalates {when})")
    if device_model is None:
        say(f"placement: none on this device ({model.device_error}); the cloud answers")
    pl = device_model.placement if device_model is not None else None
    if pl is not None:
        say(f"placement: {pl}")
        say(f"  numerics: {pl.numerics}")
        race = pl.engine_choice
        if race:  # edgesdk.runtime.precision_choice race: which engine and precision are fastest here?
            times = ", ".join(f"{label.split(':')[-1]} {ms} ms" for label, ms in race["timings_ms"].items())
            say(f"  speed: {race['chosen']} ({'cached' if race['cached'] else 'measured'}; {times}; profile's "
                  f"first: {race['incumbent']})")
        choice = pl.precision_choice
        if choice:  # edgesdk.runtime.precision_choice: was INT8 faster than FP32 here?
            seen = "cached" if choice["cached"] else "measured" if choice["ratio"] is not None else "not measured"
            say(f"  precision: {choice['chosen']} ({seen}; int8/fp32 {choice['ratio']}; {choice['method']})")
        mem = device_model.budget.get("memory", {})
        switched = device_model.budget.get("action") == "artifact_switched"
        say(f"  memory: model ~{mem.get('model_mb')} MB, limit {mem.get('limit_mb')} MB ({mem.get('source')})"
              f"{', artifact switched to fit' if switched else ''}")
        for s in pl.skipped:
            say(f"  skipped {s.candidate.label()}: {s.reason} ({s.detail})")
    if governor is not None:
        st = governor.state()
        say(f"  thermal: {st.get('level')} at {st.get('temperature_c')} C ({st.get('source')})")
    output_names = [o["name"] for o in model.bundle.manifest["outputs"]]
    for p, r in zip(labels, results):
        if isinstance(r, InputError):
            say(f"{p}: error: {r}")
            continue
        if isinstance(r, (BudgetExceeded, CloudError, BackendUnavailable)):
            say(f"{p}: refused ({r.reason}): {r.detail}")
            continue
        task_line = describe(r.decoded)
        if task_line is not None:
            answer = task_line
        elif r.top:
            answer = ", ".join(f"{t.label if t.label is not None else t.index}: {t.score:.3f}" for t in r.top[:3])
        else:  # not a classifier: say what came out (--json gives the values)
            answer = "; ".join(describe_output(name, o) for name, o in zip(output_names, r.outputs))
        if p in drawn:
            answer += f"  (drawn: {drawn[p]})"
        action = r.budget.get("action")
        notes = [f"{r.timings_ms.get('inference', r.timings_ms.get('cloud', 0.0)):.3f} ms"]
        if action:
            notes.append(action)
        if r.source == "device" and pl is not None and _backend(r.placement) != _backend(pl):
            notes.append(f"on {_backend(r.placement)}")
        if r.escalation_reason:
            notes.append(f"escalated: {r.escalation_reason}")
        if r.degraded:
            notes.append(f"degraded: cloud {r.cloud_error}")
        say(f"{p}: {answer}  [{r.source}, {', '.join(notes)}]")
    if watched is not None:
        from .monitoring import run_line

        say(run_line(sink, signals))
    _exit(refused, bad_input)


def _draw_all(out: Path, items: list, results: list) -> dict[str, str]:
    """``--draw``: each answered image input drawn (input label -> the PNG written); an input that is not an image
    is said on stderr, not drawn."""
    from .show import draw, drawn_path

    answered = [(label, value, r) for (label, value), r in zip(items, results) if not isinstance(r, Exception)]
    several = len(items) > 1
    drawn = {}
    for label, value, r in answered:
        try:
            drawn[label] = str(draw(r.decoded, value, drawn_path(out, label, several)))
        except InputError as exc:
            print(f"{label}: not drawn: {exc}", file=sys.stderr)
    return drawn


def _exit(refused: bool, bad_input: bool) -> None:
    """Exit 3 when a budget, the backend or the cloud refused an input, 2 when an input was unusable."""
    if refused:
        raise typer.Exit(3)
    if bad_input:
        raise typer.Exit(2)
