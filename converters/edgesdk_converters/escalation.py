"""``edgesdk calibrate-escalation``: choose the hybrid-mode threshold of a bundle from labelled validation data.

For every validation sample the device model (as ``edgesdk.load`` places it here) and the cloud (a V2 server, or a
bundle run locally in its place) each give a top-1 class; the device's output also gives the hardness signals of
:mod:`edgesdk.hybrid.model`. Sweeping the threshold of one signal traces the curve *escalation rate -> hybrid accuracy*
(the device's answer where it does not escalate, the cloud's where it does; the policy's clipped-share rule applies
throughout). The chosen threshold is the one that

- ``target_escalation=R``: gives the best hybrid accuracy escalating at most R of the inputs (ties: fewer);
- ``target_accuracy=A``: escalates the fewest inputs reaching hybrid accuracy A (if none does: the best point);
- neither: reaches the cloud-only accuracy less ``DEFAULT_GAP`` (0.3 points) with the fewest escalations.

A bundle of another task (detection, segmentation, text, regression, probability) sweeps its own signal
(:mod:`edgesdk.tasks.hardness`: ``uncertain_share``, ``uncertain_pixel_share``, ``min_char_confidence``,
``threshold_distance``...) and its own metric: with the cloud's answer as the reference, a device answer counts as
right when it passes the task's validation gate against it on that one sample (box F1, mask IoU, the same string, the
value within its range...), so no labels are needed; "accuracy" is then the share of answers that agree with what
cloud-only would give.

The manifest's ``hybrid`` entry gets the signal, the threshold, the expected escalation rate and accuracies, and
the curve (at most ``CURVE_POINTS`` points); the runtime uses that threshold unless told otherwise. The manifest is
rewritten atomically; no other bundle file changes (their checksums stay valid).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgesdk import Bundle, EscalationPolicy
from edgesdk.atomic_file import write_json_atomic
from edgesdk.engines import TensorSpec
from edgesdk.errors import CalibrationError, InputError
from edgesdk.hybrid.model import HIGH_IS_HARD, SIGNALS, signals
from edgesdk.tasks import task_of
from edgesdk.tasks.hardness import signals as task_signals

from .validation.task_metrics import metric_for

from . import calibration

DEFAULT_GAP = 0.003  # hybrid accuracy may be this much below cloud-only (0.3 points)
CURVE_POINTS = 101


def calibrate_escalation(bundle: str | Path, val: Any, *, cloud: str | None = None,
                         cloud_bundle: str | Path | None = None,
                         target_escalation: float | None = None, target_accuracy: float | None = None,
                         signal: str | None = None, token_env: str | None = None, write: bool = True,
                         progress: bool = True, say: Callable[[str], None] = print, **load_options: Any) -> dict:
    """Measure, sweep, choose, and (``write``) store; returns the ``hybrid`` entry written to the manifest."""
    import edgesdk

    if (cloud is None) == (cloud_bundle is None):
        raise InputError("calibrate-escalation needs exactly one of --cloud URL or --cloud-bundle PATH")
    if target_escalation is not None and target_accuracy is not None:
        raise InputError("give --target-escalation or --target-accuracy, not both")
    for name, value in (("target_escalation", target_escalation), ("target_accuracy", target_accuracy)):
        if value is not None and not 0.0 <= value <= 1.0:
            raise InputError(f"{name} must be a fraction in [0, 1], got {value}")
    if signal is not None and signal not in SIGNALS:
        raise InputError(f"signal must be one of {', '.join(SIGNALS)}, got {signal!r}")
    bundle_path = Path(bundle)
    b = Bundle.open(bundle_path)
    task = task_of(b.manifest)
    by_task = task.type not in ("classification", "raw")
    # the signal the task measures (None: its usual one); one of another task is refused here, naming the right one
    signal = EscalationPolicy(signal=signal).resolved(b.manifest).signal
    if signal is None:
        raise InputError(f"bundle {b.name!r} is a {task.type} model, which has no hardness signal to calibrate "
                         "(hybrid mode escalates its out-of-range inputs only)")
    specs = [TensorSpec(t["name"], tuple(t["shape"]), t.get("dtype", "float32")) for t in b.manifest["inputs"]]
    ds = calibration.read_dataset(val, specs, b.preprocess, b.labels, "validation")
    if ds.labels is None and not by_task:
        raise CalibrationError(f"validation data {ds.origin} has no labels (use class sub-folders, or an .npz with "
                               "y): the hybrid accuracy cannot be measured without them")
    names = [s.name for s in specs]
    ranges = (b.manifest.get("calibration") or {}).get("input_ranges")
    device = edgesdk.load(bundle_path, **load_options)
    closing = [device]
    try:
        return _measure_and_choose(b, bundle_path, ds, specs, names, ranges, device, closing, cloud, cloud_bundle,
                                   target_escalation, target_accuracy, signal, token_env, write, progress, say,
                                   load_options)
    finally:
        for thing in closing:
            thing.close()


def _measure_and_choose(b, bundle_path, ds, specs, names, ranges, device, closing, cloud, cloud_bundle,
                        target_escalation, target_accuracy, signal, token_env, write, progress, say,
                        load_options) -> dict:
    import edgesdk

    if cloud is not None:
        from edgesdk.hybrid.client import CloudClient
        from edgesdk.tasks.answers import AnswerCheck

        # answers checked against the bundle's outputs and task, as hybrid mode checks them (a wrong one is an error)
        client = CloudClient(cloud, b.name, token_env=token_env, deadline_s=10.0, timeout_s=5.0,
                             expected_outputs=b.manifest["outputs"], answer_check=AnswerCheck.of(b.manifest))
        closing.append(client)
        client.check_inputs(b.manifest["inputs"])
        remote = lambda feeds: client.infer(feeds, names)  # noqa: E731
        cloud_name = cloud
    else:
        from edgesdk.hybrid.served_artifact import serving_artifact

        # What `edgesdk serve` serves by default: the load options' artifact is the device's, not the cloud's.
        served = serving_artifact(Bundle.open(cloud_bundle)).id
        local = edgesdk.load(cloud_bundle, **{**load_options, "artifact": served})
        closing.append(local)
        remote = lambda feeds: local.run_prepared(feeds).outputs  # noqa: E731
        cloud_name = f"bundle {Path(cloud_bundle).name} run here ({local.placement.artifact})"
    policy = EscalationPolicy(signal=signal, threshold=0.0)
    n = len(ds)
    sig = np.zeros(n)
    clipped = np.zeros(n)
    device_ok = np.zeros(n, bool)
    cloud_ok = np.zeros(n, bool)
    say(f"calibrate-escalation: {n} samples of {ds.origin}; device {device.placement.artifact} on "
        f"{device.placement.engine}:{device.placement.device}; cloud {cloud_name}")
    t0 = time.perf_counter()
    task = device.io.task
    by_task = task.type not in ("classification", "raw")
    for i in _bar(range(n), progress):
        feeds = [np.ascontiguousarray(a[None] if a.ndim == len(s.shape) - 1 else a, dtype=np.float32)
                 for a, s in zip(ds.load(i), specs)]
        result = device.run_prepared(feeds)
        if by_task:  # the task's own signal; right = agrees with the cloud's answer under the task's gate
            answer = remote(feeds)
            s = task_signals(task, result.decoded, result.outputs, device.io.output_names)
            # None (no detection, no character) is not hard at run time (EscalationPolicy.reason): measure it so
            sig[i] = s[signal] if s[signal] is not None else (0.0 if HIGH_IS_HARD_SIGNALS(signal) else 1.0)
            s_clip = signals(None, feeds, ranges)["clipped_share"]
            clipped[i] = s_clip or 0.0
            device_ok[i] = agrees(task, result.decoded, device.io.decode(answer), result.outputs, answer)
            cloud_ok[i] = True
            continue
        probs = device.io.probabilities(result.outputs)
        if probs is None:
            raise CalibrationError(f"bundle {b.name!r} is not a classifier (postprocess type "
                                   f"{b.manifest.get('postprocess', {}).get('type')!r}): hybrid thresholds need "
                                   "class probabilities")
        s = signals(probs, feeds, ranges)
        sig[i] = s[signal]
        clipped[i] = s["clipped_share"] or 0.0
        device_ok[i] = int(np.argmax(probs)) == int(ds.labels[i])
        cloud_ok[i] = int(np.argmax(remote(feeds)[0].reshape(-1))) == int(ds.labels[i])
    elapsed = time.perf_counter() - t0
    out_of_range = clipped > policy.max_clipped if policy.max_clipped is not None else np.zeros(n, bool)
    curve = _sweep(sig, out_of_range, device_ok, cloud_ok, signal)
    device_acc, cloud_acc = float(device_ok.mean()), float(cloud_ok.mean())
    chosen, why = _choose(curve, target_escalation, target_accuracy, cloud_acc)
    entry = {
        "signal": signal,
        "threshold": chosen["threshold"],
        "escalation_rate": chosen["escalation_rate"],
        "hybrid_accuracy": chosen["accuracy"],
        "device_accuracy": device_acc,
        "cloud_accuracy": cloud_acc,
        "chosen_by": why,
        "max_clipped": policy.max_clipped,
        "samples": n,
        "validation_data": ds.origin,
        "device_artifact": device.placement.artifact,
        "cloud": cloud_name,
        "curve": _thin(curve),
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if by_task:
        entry["agreement_with"] = "cloud"  # accuracies are agreement with the cloud's answer under the task's gate
    say(f"{'device agrees with cloud' if by_task else 'device-only'} {device_acc:.2%}, cloud-only {cloud_acc:.2%}; "
        f"chosen {signal} threshold "
        f"{chosen['threshold']:.4f} ({why}): escalates {chosen['escalation_rate']:.1%}, hybrid "
        f"{chosen['accuracy']:.2%} ({elapsed:.1f} s)")
    if write:
        _write_manifest(bundle_path, entry)
        say(f"wrote manifest['hybrid'] of {bundle_path}")
    return entry


def HIGH_IS_HARD_SIGNALS(signal: str) -> bool:  # noqa: N802 (reads as the set it asks)
    """Whether high values of ``signal`` mean a hard input (entropy, the uncertain shares)."""
    return signal in HIGH_IS_HARD


def agrees(task, own, ref, own_raw, ref_raw) -> bool:
    """Whether a device answer passes the task's validation gate against the cloud's, on this one sample."""
    metric = metric_for(task)
    metric.add(own, ref, own_raw, ref_raw)
    return metric.drop() <= metric.default_max_drop() + 1e-9 and metric.failure() is None


def _sweep(sig: np.ndarray, out_of_range: np.ndarray, device_ok: np.ndarray, cloud_ok: np.ndarray,
           signal: str) -> list[dict]:
    """Every distinct threshold: escalate when the signal is below it (above, for entropy) or out of range."""
    n = len(sig)
    # Thresholds between consecutive distinct values, plus both ends: each gives a distinct escalated set.
    values = np.unique(sig)
    edges = np.concatenate([[values[0] - 1e-6], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-6]])
    points = []
    for t in np.clip(edges, 0.0, 1.0):  # a policy threshold is in [0, 1]: measure what the runtime will do
        hard = (sig > t) if HIGH_IS_HARD_SIGNALS(signal) else (sig < t)
        escalate = hard | out_of_range
        correct = np.where(escalate, cloud_ok, device_ok)
        points.append({"threshold": float(t), "escalation_rate": float(escalate.sum() / n),
                       "accuracy": float(correct.mean())})
    points.sort(key=lambda p: (p["escalation_rate"], -p["accuracy"]))
    return points


def _choose(curve: list[dict], target_escalation: float | None, target_accuracy: float | None,
            cloud_acc: float) -> tuple[dict, str]:
    if target_escalation is not None:
        within = [p for p in curve if p["escalation_rate"] <= target_escalation + 1e-12]
        if not within:  # out-of-range inputs alone escalate more than the target
            fewest = min(curve, key=lambda p: (p["escalation_rate"], -p["accuracy"]))
            return fewest, (f"at most {target_escalation:.1%} is out of reach (out-of-range inputs alone escalate "
                            f"{fewest['escalation_rate']:.1%}); the fewest escalations instead")
        best = max(within, key=lambda p: (p["accuracy"], -p["escalation_rate"]))
        return best, f"best accuracy escalating at most {target_escalation:.1%}"
    goal = target_accuracy if target_accuracy is not None else cloud_acc - DEFAULT_GAP
    why = (f"fewest escalations reaching {goal:.2%}" if target_accuracy is not None else
           f"fewest escalations within {DEFAULT_GAP:.1%} of cloud-only ({goal:.2%})")
    reaching = [p for p in curve if p["accuracy"] >= goal - 1e-12]
    if reaching:
        return min(reaching, key=lambda p: (p["escalation_rate"], -p["accuracy"])), why
    best = max(curve, key=lambda p: (p["accuracy"], -p["escalation_rate"]))
    return best, f"{goal:.2%} is out of reach; the best hybrid accuracy instead"


def _thin(curve: list[dict]) -> list[dict]:
    """At most CURVE_POINTS points: the best accuracy per escalation-rate step of 1/(CURVE_POINTS - 1)."""
    best: dict[int, dict] = {}
    for p in curve:
        k = round(p["escalation_rate"] * (CURVE_POINTS - 1))
        if k not in best or p["accuracy"] > best[k]["accuracy"]:
            best[k] = p
    return [{k: round(v, 6) for k, v in best[k].items()} for k in sorted(best)]


def _write_manifest(bundle: Path, entry: dict) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["hybrid"] = entry
    write_json_atomic(path, manifest, indent=2)


def _bar(items, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="calibrate-escalation", unit="sample", file=sys.stderr, leave=False)


__all__ = ["calibrate_escalation", "DEFAULT_GAP"]
