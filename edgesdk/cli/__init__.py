"""The ``edgesdk`` command line: a thin layer over the public functions, one module per side.

- :mod:`.device`: ``devices``, ``run``, ``bench``, ``inspect``, ``keygen``/``sign``/``verify``/``pack``.
- :mod:`.workstation`: ``quantize``, ``demo``, ``calibrate-escalation`` (the converters, imported lazily).
- :mod:`.cloud`: ``serve``, ``export kserve|triton`` (the cloud package ``edgesdk_cloud``, imported lazily).

A device needs neither the converters nor the cloud package: importing this package imports neither.
"""

from __future__ import annotations

import sys

from ..errors import BackendUnavailable, BudgetExceeded, EdgeSDKError, ValidationFailed
# Each module registers its commands on the app, in this order in --help: workstation, device, cloud.
from . import workstation  # noqa: F401  # isort: skip
from . import device  # noqa: F401  # isort: skip
from . import cloud  # noqa: F401  # isort: skip
from ._app import app

__all__ = ["app", "main", "cloud", "device", "workstation"]

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
