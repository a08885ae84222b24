"""The device's commands: ``devices``, ``bench``, ``inspect`` and the bundle-trust commands (``keygen``, ``sign``,
``verify``, ``pack``); ``run`` is :mod:`.run`'s, ``monitor`` :mod:`.monitoring`'s. They need only the device package
and the engines installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..choices import BackendReason
from ..errors import BackendUnavailable, InputError
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
            raise BackendUnavailable(BackendReason.NO_CANDIDATE,
                                     f"no installed engine can run any artifact of {bundle}")

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
