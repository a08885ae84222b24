"""The device's commands: ``devices``, ``run``, ``bench``, ``inspect`` and the bundle-trust commands (``keygen``,
``sign``, ``verify``, ``pack``). They need only the device package and the engines installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import BackendUnavailable, BudgetExceeded, CloudError, EdgeSDKError, InputError
from ._app import app


@app.command()
def inspect(
    bundle: Path = typer.Argument(..., help="Bundle directory (with manifest.json) or .edgebundle file."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole manifest as JSON."),
) -> None:
    """Verify a bundle's checksums and show its manifest summary and validation table."""
    from ..bundle.reader import Bundle
    from ..bundle.report import summary, validation_table
    from ..trust import bundle_dir

    b = Bundle.open(bundle_dir(bundle))
    if as_json:
        print(json.dumps(b.manifest, indent=2))
        return
    print(summary(b.manifest))
    print()
    print(validation_table(b.manifest))


@app.command()
def keygen(
    private_key: Path = typer.Argument(..., help="Where to write the new private key (PEM, mode 0600)."),
    public_key: Path = typer.Argument(..., help="Where to write its public key (PEM), the one devices trust."),
) -> None:
    """Make an ECDSA P-256 key pair for `edgesdk sign` (refuses to overwrite an existing key)."""
    from ..trust import generate_keypair

    generate_keypair(private_key, public_key)
    print(f"private key: {private_key} (keep it off the devices)\npublic key:  {public_key}")


@app.command()
def sign(
    bundle: Path = typer.Argument(..., help="Bundle directory (its files are checked against the manifest first)."),
    key: Path = typer.Option(..., "--key", help="EC private key, PEM (make one with `edgesdk keygen`)."),
) -> None:
    """Sign a bundle with OpenSSF model signing (key mode): writes BUNDLE/signature.sig, replacing an old one.

    Sign last: anything that rewrites the bundle afterwards (calibrate-escalation, quantize --force) voids it."""
    from ..trust import sign_bundle

    print(f"signed: {sign_bundle(bundle, key)}")


@app.command()
def verify(
    bundle: Path = typer.Argument(..., help="Bundle directory or .edgebundle archive."),
    pub: Path = typer.Option(..., "--pub", help="The trusted public key, PEM."),
) -> None:
    """Check a bundle's signature and every file's checksum; exits 2 saying what does not match."""
    from ..bundle.reader import Bundle
    from ..trust import Trust, bundle_dir

    Bundle.open(bundle_dir(bundle, Trust(public_key=pub)))
    print(f"verified: {bundle} is signed by the holder of {pub}'s private key and unchanged")


@app.command()
def pack(
    bundle: Path = typer.Argument(..., help="Bundle directory (verified first; sign it before packing)."),
    out: Path = typer.Argument(..., help="The .edgebundle file to write."),
) -> None:
    """Write a bundle as one .edgebundle file (a deterministic tar.gz) that `edgesdk.load` opens directly."""
    from ..trust import pack_bundle

    print(f"packed: {pack_bundle(bundle, out)}")


@app.command()
def devices(
    thermal_root: Path = typer.Option(Path("/sys"), "--thermal-root", help="Where the thermal zones are (like /sys)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List installed engines, the devices each reports (NPU/GPU/CPU) and why an expected one is missing,
    the platform profile, the thermal level and the memory headroom now."""
    from ..engines import backend_names, discover
    from ..runtime.candidates import detect_platform

    found = [discover(name) for name in backend_names()]
    profile, why = detect_platform({f.engine: f for f in found})
    thermal, memory_now = _thermal_now(thermal_root, profile), _memory_now()
    if as_json:
        print(json.dumps({"engines": [f.to_dict() for f in found],
                          "profile": {"name": profile.name, "matched": why},
                          "thermal": thermal, "memory": memory_now}, indent=2, default=str))
        return
    for f in found:
        print(f"{f.engine} {f.version or '(not installed)'}")
        for d in f.devices:
            extra = f"  precisions: {', '.join(d.precisions)}" if d.precisions else ""
            probe = "  (unverified: tried at load)" if not d.verified else ""
            print(f"  {d.kind:<3}  {d.name:<22} {d.full_name}{extra}{probe}")
        for note in f.notes:
            print(f"  missing {note}")
    print(f"platform profile: {profile.name} ({'; '.join(why) or 'default'})")
    if "error" in thermal:
        print(f"thermal: {thermal['error']}")
    else:
        print(f"thermal: {thermal['level']} at {thermal['temperature_c']} C ({thermal['source']}; limits "
              f"warm {profile.thermal.get('warm_c')}, hot {profile.thermal.get('hot_c')}, "
              f"critical {profile.thermal.get('critical_c')} C)")
    print(f"memory: {memory_now['available_mb']} MB available of {memory_now['limit_mb']} MB "
          f"({memory_now['source']}); this process uses {memory_now['rss_mb']} MB")


@app.command()
def bench(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    backend: Optional[str] = typer.Option(None, "--backend", help="ENGINE:DEVICE:ARTIFACT to measure (default: the "
                                          "one edgesdk.load picks here)."),
    all_backends: bool = typer.Option(False, "--all", help="Every viable backend and artifact, side by side."),
    scenario: str = typer.Option("both", "--scenario", help="single-stream, offline or both."),
    duration: float = typer.Option(5.0, "--duration", help="Seconds per scenario (single-stream runs on until "
                                   "662 queries, for a p99)."),
    no_cold: bool = typer.Option(False, "--no-cold-start", help="Skip the cold-start runs (fresh processes)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: the platform profile's)."),
    allow_failed: bool = typer.Option(False, "--allow-failed", help="Measure artifacts that failed their "
                                      "validation gate at quantize time too (refused otherwise)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a latency CDF per backend to this PNG."),
    ops: bool = typer.Option(False, "--ops", help="Where the time goes, op by op: each engine's fp32 and int8 "
                             "artifacts (of --backend's engine; of every engine here with --all or by default) "
                             "profiled side by side, with the ops that ran outside the engine's fast kernels and why."),
    top: int = typer.Option(12, "--top", help="With --ops: how many op types and ops each table lists."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Measure a bundle on this device, MLPerf-style: single-stream latency p50/p90/p99, offline throughput, cold
    start with and without the compile cache, peak memory; each backend in a fresh process. ``--ops``: per-op time
    instead, int8 beside fp32 on each engine."""
    from ..bench.warm import BenchOptions, parse_backend, plot, table, viable_backends
    from ..bench.warm import bench as run_bench

    if backend and all_backends:
        raise InputError("give --backend or --all, not both")
    if ops:
        from ..bench.ops import artifacts_to_profile, ops_report
        from ..bench.ops import table as ops_table

        if plot_path is not None:
            raise InputError("--plot draws latency CDFs; it does not apply to --ops")
        if top < 1:
            raise InputError(f"--top must be >= 1, got {top}")
        chosen_ops = artifacts_to_profile(bundle, [parse_backend(backend)] if backend else None)
        report = ops_report(bundle, chosen_ops, threads=threads,
                            progress=None if quiet else (lambda text: print(text, file=sys.stderr, flush=True)))
        print(json.dumps(report, indent=2) if as_json else ops_table(report, top))
        if not report["profiles"]:
            raise typer.Exit(3)
        return
    options = BenchOptions(scenario=scenario, duration_s=duration, cold_start=not no_cold, threads=threads,
                           allow_failed=allow_failed)
    chosen = None
    if backend:
        chosen = [parse_backend(backend)]
    elif all_backends:
        chosen, _ = viable_backends(bundle, allow_failed)
        if not chosen:
            raise BackendUnavailable("no_candidate", f"no installed engine can run any artifact of {bundle}")

    bar = None
    if not quiet and sys.stderr.isatty():
        try:
            from tqdm import tqdm  # a bar where tqdm is installed (the workstation); lines elsewhere

            total = len(chosen) if chosen else 1
            bar = tqdm(total=total, desc="bench", unit="backend", file=sys.stderr, leave=False)
        except ImportError:
            pass

    def say(text: str) -> None:
        if quiet:
            return
        if bar is None:
            print(text, file=sys.stderr, flush=True)
        elif text.startswith("[") and "/" in text:  # "[i/n] backend": i - 1 backends are done
            bar.n = int(text[1:text.index("/")]) - 1
            bar.set_postfix_str(text.split("] ", 1)[-1][:60])
        else:
            bar.write(text)

    report = run_bench(bundle, chosen, options, progress=say)
    if bar is not None:
        bar.n = bar.total
        bar.close()
    if plot_path is not None:
        say(f"latency CDF written to {plot(report, plot_path)}")
    for row in report["backends"]:
        row.pop("latencies_ms", None)  # thousands of numbers: the plot has them
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(table(report))
    if not report["backends"]:
        raise typer.Exit(3)


def _thermal_now(root: Path, profile) -> dict:
    from ..errors import InputError
    from ..budgets.thermal import LinuxThermalZones, ThermalGovernor

    try:
        governor = ThermalGovernor.from_profile(LinuxThermalZones(root), profile)
    except InputError as exc:
        return {"error": str(exc)}
    governor.poll()
    return governor.state()


def _memory_now() -> dict:
    from ..budgets.memory import process_limit, rss_mb

    limit, used = process_limit(), rss_mb()
    return {"limit_mb": round(limit.limit_mb), "source": limit.source, "rss_mb": round(used),
            "available_mb": round(limit.limit_mb - used)}


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
) -> None:
    """Load a bundle on the best backend here and predict each input; shows where it really ran and the budget state.
    A bundle with a task (detection, segmentation, text, ...) prints its decoded answer: boxes in the original
    image's pixels, masks, text, points, values; ``--json`` carries them in full.

    With --mode other than device-only and --cloud URL, hard inputs (or all, per the mode) go to the cloud; each
    result says its source, why it escalated and whether it is degraded (the cloud failed, the device answered).
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
    model = load(bundle, policy=policy, require=require, engine=engine, device=device, artifact=artifact,
                 allow_failed=allow_failed, speed_check=speed_check, profile=profile, check_numerics=not no_check,
                 memory_mb=memory_mb, thermal=governor, **hybrid)
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
    if all(isinstance(r, InputError) for r in results):
        raise results[0]  # nothing usable: an error, as for one bad input
    drawn = _draw_all(draw, items, results) if draw is not None else {}
    refused = any(isinstance(r, (BudgetExceeded, CloudError, BackendUnavailable)) for r in results)
    bad_input = any(isinstance(r, InputError) for r in results)
    device_model = getattr(model, "device", model)  # a HybridModel's device side (None: no device backend)
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
