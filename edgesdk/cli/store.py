"""``edgesdk store install|list|activate|rollback``: a :class:`~edgesdk.BundleStore` from the command line (an
update agent's script, an operator on the device). Each command opens the store (recovering it as the app would) and
makes one change under its lock, so it may run while the app serves from the same store; a refusal prints one line
and exits 2, as every command's does."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ._app import app

store_app = typer.Typer(help="Install, list, activate and roll back versions of a bundle in a store folder "
                             "(edgesdk.BundleStore).", no_args_is_help=True)
app.add_typer(store_app, name="store")

_ROOT = typer.Argument(..., help="The store folder (made when it is new or empty).")
_KEEP = typer.Option(2, "--keep", help="Previous versions to keep (older ones are deleted after a change).")
_DEVICE_ID = typer.Option(None, "--device-id", help="This device's id for staged rollouts (default: the store's "
                          "own, made at random once).")


def _open(root: Path, keep: int, device_id: Optional[str] = None, **options: Any):
    from ..store import BundleStore

    return BundleStore(root, keep=keep, device_id=device_id, **options)


def _line(version) -> str:
    state = str(version.state)
    if version.probation:
        state += f" (on probation until {version.probation['until']} or {version.probation['predictions']} predictions)"
    where = f"{version.name or '?'} {version.bundle_version or ''}".strip()
    text = f"{version.id}  {where}  {state}"
    if version.installed:
        text += f"  installed {version.installed}"
    if version.reason:
        text += f"\n    {version.reason}"
    return text


@store_app.command("install")
def install(
    root: Path = _ROOT,
    source: str = typer.Argument(..., help="A bundle folder, an .edgebundle file, or an http(s) URL of one."),
    pub: Optional[Path] = typer.Option(None, "--pub", help="Accept only a bundle signed for this public key (PEM)."),
    rollout_percent: Optional[float] = typer.Option(None, "--rollout-percent", help="Activate only on this share of "
                                                    "devices (0-100; default: the manifest's rollout_percent, else "
                                                    "all); the others keep it staged."),
    allow_rejected: bool = typer.Option(False, "--allow-rejected", help="Install a version the store rejected "
                                        "before."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Run the self-check on this engine first."),
    speed_check: str = typer.Option("full", "--speed-check", help="The self-check's speed check: full, precision, "
                                    "off."),
    keep: int = _KEEP,
    device_id: Optional[str] = _DEVICE_ID,
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print the installed version as JSON."),
) -> None:
    """Install a bundle into the store: download (resumed after an interruption), verify its files and signature,
    load it here with its golden inputs (the self-check), then activate it, unless this device is outside its
    rollout (then it stays staged). A version that fails is not activated; the active one stays. Exits 2 on any
    refusal, naming the store's state."""
    from ..choices import InstallStep, VersionState
    from ..runtime.options import RuntimeOptions

    check = RuntimeOptions(engine=engine, speed_check=speed_check, monitor=False)
    store = _open(root, keep, device_id, self_check=check)
    last: dict[str, Any] = {}

    def progress(step: str, detail: dict[str, Any]) -> None:
        if quiet:
            return
        if step == InstallStep.DOWNLOAD:
            total = detail.get("total")
            shown = f"{detail['bytes']} of {total} bytes" if total else f"{detail['bytes']} bytes"
            if last.get("download") != shown:
                print(f"download: {shown}", file=sys.stderr, flush=True)
            last["download"] = shown
        elif step == InstallStep.COPY:
            print(f"copy: {detail['files']}/{detail['of']} {detail['file']}", file=sys.stderr, flush=True)
        else:
            text = ", ".join(f"{k} {v}" for k, v in detail.items() if v is not None)
            print(f"{step}: {text}" if text else str(step), file=sys.stderr, flush=True)

    version = store.install(source, trust=pub, rollout_percent=rollout_percent, progress=progress,
                            allow_rejected=allow_rejected)
    if as_json:
        print(json.dumps(version.to_dict(), indent=2))
    elif version.state is VersionState.ACTIVE:
        print(f"active: {version.id} (installed in {store.root})")
    else:
        print(f"{version.state}: {version.id} ({version.reason})")


@store_app.command("list")
def list_versions(
    root: Path = _ROOT,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show the store's versions: the active one (and its probation), the previous ones, then the staged and rejected
    ones with their reasons."""
    store = _open(root, keep=2)
    versions = store.versions()
    if as_json:
        print(json.dumps({"root": str(store.root), "device_id": store.device_id,
                          "versions": [v.to_dict() for v in versions]}, indent=2))
        return
    if not versions:
        print(f"store {store.root} holds no version yet")
        return
    for version in versions:
        print(_line(version))


@store_app.command("activate")
def activate(
    root: Path = _ROOT,
    version: str = typer.Argument(..., help="The version's id as `edgesdk store list` shows it (or its start)."),
    allow_rejected: bool = typer.Option(False, "--allow-rejected", help="Activate a version the store rejected."),
    keep: int = _KEEP,
) -> None:
    """Make a kept version active now (the active one becomes the newest previous); it goes on probation."""
    store = _open(root, keep)
    before = store.active()
    now = store.activate(version, allow_rejected=allow_rejected)
    print(f"active: {now.id} (was {before.id if before else 'none'})")


@store_app.command("rollback")
def rollback(root: Path = _ROOT, keep: int = _KEEP) -> None:
    """Go back to the newest previous version; the active one is marked rejected (reason manual)."""
    store = _open(root, keep)
    before = store.active()
    now = store.rollback()
    print(f"rolled back: {before.id if before else 'none'} -> {now.id}")


__all__ = ["store_app", "install", "list_versions", "activate", "rollback"]
