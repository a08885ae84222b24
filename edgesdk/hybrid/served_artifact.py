"""Which artifact of a bundle a cloud server serves when none is named.

Read from the bundle alone, so every side asks the same question here: the cloud package's ``edgesdk serve`` and
``edgesdk export kserve`` (:mod:`edgesdk_cloud`), and the workstation's ``calibrate-escalation``, which runs the
artifact the cloud would serve.
"""

from __future__ import annotations

import math

from ..bundle.reader import Artifact, Bundle
from ..engines import engine_version
from ..choices import BackendReason
from ..errors import BackendUnavailable, BundleError


def serving_artifact(bundle: Bundle, installed_only: bool = True) -> Artifact:
    """The artifact served when none is named: the most accurate float artifact (whose engine is installed here,
    unless ``installed_only`` is False: an image that installs the engine).

    Accuracy is the bundle's validation ``accuracy``; on a tie the golden reference artifact wins, then manifest order.
    An artifact that failed its validation gate is never the default.
    """
    floats = [a for a in bundle.artifacts if a.precision == "fp32"]
    if not floats:
        ids = ", ".join(a.id for a in bundle.artifacts)
        raise BundleError(f"bundle {bundle.name!r} has no float artifact to serve by default; name one "
                          f"(artifacts: {ids})")
    failed = {a.id: gate for a in floats if (gate := bundle.failed_gate(a.id)) is not None}
    if len(failed) == len(floats):
        gates = "; ".join(f"{aid}: {gate}" for aid, gate in failed.items())
        raise BundleError(f"bundle {bundle.name!r}: every float artifact failed its validation gate ({gates}); "
                          f"re-quantize the bundle, or name one with --artifact and --allow-failed")
    floats = [a for a in floats if a.id not in failed]
    runnable = [a for a in floats if engine_version(a.engine) is not None] if installed_only else floats
    if not runnable:
        engines = ", ".join(sorted({a.engine for a in floats}))
        raise BackendUnavailable(BackendReason.ENGINE_MISSING,
                                 f"bundle {bundle.name!r} has float artifacts for {engines}, "
                                 f"and none of these engines is installed (pip install 'edgesdk[{floats[0].engine}]')")
    validation = bundle.manifest.get("validation") or {}
    reference = (bundle.manifest.get("golden") or {}).get("reference")

    def rank(a: Artifact) -> tuple[float, bool]:
        accuracy = (validation.get(a.id) or {}).get("accuracy")
        known = isinstance(accuracy, (int, float)) and not isinstance(accuracy, bool)
        return (-accuracy if known else math.inf, a.id != reference)

    return min(runnable, key=rank)  # min keeps the first of equals: manifest order
