"""Opening one candidate and proving it: the isolated probe (``isolate=True``), the engine's load with the
artifact's options, and the numerics self-check on the bundle's golden data. One function,
:func:`open_checked`, used wherever an engine is opened to serve: the load walk, the speed race and autotune, and
the thermal backend switch (:mod:`edgesdk.runtime.thermal_serving`).
"""

from __future__ import annotations

from typing import Any

from . import numerics
from ..bundle.reader import Bundle
from ..engines import Engine, open_engine
from .placement import Candidate

UNCHECKED = {"checked": False, "why": "turned off (check_numerics=False)"}  # the numerics entry of an unchecked open


def open_checked(bundle: Bundle, cand: Candidate, threads: int | None, *, check_numerics: bool,
                 options: dict[str, Any], isolate: bool = False) -> tuple[Engine, dict[str, Any]]:
    """Open ``cand`` with ``threads`` and the load's engine ``options`` (performance, cache_dir), check its numerics,
    return the engine and the check's entry for the placement.

    With ``isolate`` a child process opens and runs it first (:func:`edgesdk.runtime.isolate.probe`): a file that crashes
    its engine's native code kills the child and raises ``BackendUnavailable("isolated_probe_failed")`` here,
    and it is never opened in this process. A failed open or check raises (``BackendUnavailable`` with the engine's
    reason, or whatever the engine or the golden data raised); the engine is closed before a failed check raises.
    """
    art = bundle.artifact(cand.artifact)
    opened_with = art.engine_options(device=cand.device, **options)
    if threads:
        opened_with["num_threads"] = threads  # the app's (or profile's) choice wins over the artifact's
    if isolate:  # raises (a skip) unless a child process opened and ran it first
        from .isolate import probe

        probe(bundle, cand.artifact, cand.engine, opened_with)
    engine = open_engine(cand.engine, art.model_path, **opened_with)
    if not check_numerics:
        return engine, dict(UNCHECKED)
    try:
        return engine, numerics.check(engine, bundle, cand.artifact)
    except BaseException:
        engine.close()
        raise


__all__ = ["open_checked", "UNCHECKED"]
