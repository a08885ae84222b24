"""The ``edgesdk`` Typer application, and the group that adds the other sides' commands to it lazily.

The device's commands register on :data:`app` (module :mod:`.device`). The workstation (``edgesdk-converters``) and
the cloud side (``edgesdk-cloud``) are distributions of their own; each names its Typer app in the ``edgesdk.cli``
entry point group. :class:`SidesGroup` imports a side's app only when one of its commands runs or when the command
list is shown (``edgesdk --help``), so ``edgesdk run`` or ``inspect`` never import them; a command of a side that is
not installed says which distribution to install.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import Any

import typer
from typer.core import TyperGroup

ENTRY_POINT_GROUP = "edgesdk.cli"
# Side name (the entry point's name) -> the distribution that provides it, and the commands it provides, for the
# message when it is missing. The order is the order of --help: workstation, device, cloud.
SIDES = {
    "workstation": ("edgesdk-converters", ("quantize", "debug", "demo", "calibrate-escalation")),
    "cloud": ("edgesdk-cloud", ("serve", "export")),
}


# Typer bundles its own click; the group and command types below are typer's (annotated as Any).


def _side_groups() -> dict[str, Any]:
    """Every installed side's commands as a click group, by side name (imports the sides' CLI modules). A side
    that fails to import is left out with a warning on stderr naming it, so the others (and the device) still work;
    its commands then say why they cannot run."""
    groups = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            groups[ep.name] = typer.main.get_group(ep.load())
        except Exception as exc:  # a broken or stale install must not take the whole command down
            _BROKEN[ep.name] = f"{type(exc).__name__}: {exc}"
            print(f"warning: the {ep.name!r} commands of edgesdk ({ep.value}) failed to load: {_BROKEN[ep.name]}",
                  file=sys.stderr)
    return groups


_BROKEN: dict[str, str] = {}  # side name -> why its entry point failed to load


class SidesGroup(TyperGroup):
    """The device's commands, then the installed sides' (loaded on demand)."""

    _sides: dict[str, Any] | None = None

    def _loaded_sides(self) -> dict[str, Any]:
        if SidesGroup._sides is None:
            SidesGroup._sides = _side_groups()
        return SidesGroup._sides

    def list_commands(self, ctx: Any) -> list[str]:
        sides = self._loaded_sides()
        ordered = [name for side in ("workstation",) if side in sides for name in sides[side].list_commands(ctx)]
        ordered += super().list_commands(ctx)
        ordered += [name for side, group in sides.items() if side != "workstation"
                    for name in group.list_commands(ctx)]
        return ordered

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)  # a device command: no side is imported
        if command is not None:
            return command
        for group in self._loaded_sides().values():
            command = group.get_command(ctx, name)
            if command is not None:
                return command
        for side, (distribution, names) in SIDES.items():
            if name in names:
                return _missing_side_command(name, side, distribution, _BROKEN.get(side))
        return None


def _missing_side_command(name: str, side: str, distribution: str, broken: str | None = None) -> Any:
    """A stand-in for a command of a side that is not installed (or failed to load): says what to install or what
    went wrong, exits 2 (a usage error)."""
    stub = typer.Typer()
    why = (f"is installed but failed to load ({broken}): reinstall {distribution}" if broken else
           f"is not installed here: pip install {distribution} (see the README)")

    @stub.command(name, help=f"(unavailable: {why})",
                  context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def refuse(ctx: typer.Context) -> None:
        print(f"error: `edgesdk {name}` belongs to the {side} side, which {why}", file=sys.stderr)
        raise typer.Exit(2)

    return typer.main.get_command(stub)


app = typer.Typer(
    cls=SidesGroup,
    help="edgesdk: quantize models into validated INT8 bundles, inspect them, and run them on the best device here.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
