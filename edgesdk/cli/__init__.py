"""The ``edgesdk`` command line: a thin layer over the public functions, one module per side.

- :mod:`.device` (here): ``devices``, ``bench``, ``inspect``, ``keygen``/``sign``/``verify``/``pack``; :mod:`.run`:
  ``run``; :mod:`.monitoring`: ``monitor`` (a monitor's telemetry file read back); :mod:`.store`: ``store
  install|list|activate|rollback`` (bundle updates with rollback).
- :mod:`edgesdk_converters.cli` (the ``edgesdk-converters`` distribution): ``quantize``, ``demo``,
  ``calibrate-escalation``.
- :mod:`edgesdk_cloud.cli` (the ``edgesdk-cloud`` distribution): ``serve``, ``export kserve|triton``.

The other sides come in through the ``edgesdk.cli`` entry point group (:mod:`._app`), imported only when one of
their commands runs or the command list is shown: a device needs neither, and running a device command imports
neither.
"""

from __future__ import annotations

import sys

from ..errors import BackendUnavailable, BudgetExceeded, EdgeSDKError, ValidationFailed
from . import device, monitoring, run, store  # noqa: F401  (register the device's commands on the app)
from ._app import app

__all__ = ["app", "main", "device", "monitoring", "run", "store"]

def _show_failed_artifact_warnings() -> None:
    """Print every :class:`FailedArtifactWarning` (an artifact that failed its validation gate served under
    --allow-failed) as one ``warning: ...`` line on stderr, each time; other warnings show as Python shows them."""
    import warnings

    from ..errors import FailedArtifactWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, FailedArtifactWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("always", FailedArtifactWarning)


def main() -> None:
    """Entry point: usage errors are click's (exit 2); edgesdk errors print one line, never a traceback."""
    _show_failed_artifact_warnings()
    try:
        app()  # standalone mode: click reports usage errors itself and exits 2
    except ValidationFailed as exc:
        _error(f"error: {exc}")
        raise SystemExit(1)
    except (BackendUnavailable, BudgetExceeded) as exc:
        _error(f"error: {type(exc).__name__}: {exc}")
        _error(f"reason: {exc.reason}")
        raise SystemExit(3)
    except EdgeSDKError as exc:
        _error(f"error: {type(exc).__name__}: {exc}")
        raise SystemExit(2)


def _error(text: str) -> None:
    """An error on stderr, each line escaped: messages quote paths, engine text and server text, which are data."""
    from ..bundle.report import printable

    print("\n".join(printable(line) for line in text.split("\n")), file=sys.stderr)
