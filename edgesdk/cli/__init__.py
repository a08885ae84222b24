"""The ``edgesdk`` command line: a thin layer over the public functions, one module per side.

- :mod:`.device` (here): ``devices``, ``run``, ``bench``, ``inspect``, ``keygen``/``sign``/``verify``/``pack``.
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
from . import device  # noqa: F401  (registers the device's commands on the app)
from ._app import app

__all__ = ["app", "main", "device"]

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
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1)
    except (BackendUnavailable, BudgetExceeded) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"reason: {exc.reason}", file=sys.stderr)
        raise SystemExit(3)
    except EdgeSDKError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(2)
