"""The numerics self-check: a loaded backend must reproduce the bundle's golden outputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..bundle.reader import Bundle
from ..engines import Engine
from ..choices import BackendReason
from ..errors import BackendUnavailable, BundleError, EdgeSDKError, InputError


def golden_feeds(golden: dict[str, np.ndarray], n_inputs: int) -> list[list[np.ndarray]]:
    """One list of input arrays per golden sample, each of its tensor's exact shape and dtype (a scalar input as a
    0-d array). ``golden``: what :meth:`Bundle.golden` or :func:`read_golden` return; a plain dict is taken as the
    joined layout (batch-1 tensors, one row a sample)."""
    samples = getattr(golden, "samples", None)
    if samples is None:
        count = len(golden["input_0"])
        return [[golden[f"input_{j}"][i : i + 1] for j in range(n_inputs)] for i in range(count)]
    count = len(samples["input_0"])
    return [[samples[f"input_{j}"][i, ...] for j in range(n_inputs)] for i in range(count)]


def golden_outputs(golden: dict[str, np.ndarray], n_outputs: int) -> list[list[np.ndarray]]:
    """The reference outputs of each golden sample, as :func:`golden_feeds` gives its inputs."""
    samples = getattr(golden, "samples", None)
    if samples is None:
        count = len(golden["output_0"])
        return [[golden[f"output_{j}"][i : i + 1] for j in range(n_outputs)] for i in range(count)]
    return [[samples[f"output_{j}"][i, ...] for j in range(n_outputs)] for i in range(len(samples["output_0"]))]


def run_as_given(engine: Engine, feeds: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``feeds`` each in its own dtype (``Engine.run`` makes every feed float32, which an int64, bool or float16
    input refuses), after the count and shape checks ``Engine.run`` makes (an :class:`InputError` when they fail)."""
    if len(feeds) != len(engine.inputs):
        names = ", ".join(s.name for s in engine.inputs)
        raise InputError(f"{engine.name} model takes {len(engine.inputs)} input(s) ({names}); got {len(feeds)}")
    for spec, arr in zip(engine.inputs, feeds):
        if arr.ndim != len(spec.shape) or any(d not in (-1, a) for d, a in zip(spec.shape, arr.shape)):
            raise InputError(f"{engine.name} model input {spec.name!r} has shape {list(spec.shape)}; got "
                             f"{list(arr.shape)}")
    return engine.run_prepared([np.asarray(a, order="C") for a in feeds])


def check(engine: Engine, bundle: Bundle, artifact_id: str) -> dict[str, Any]:
    """Run every golden input; raise ``numerics_mismatch`` when an output is off by more than its tolerance.

    Each output has its own tolerance on its largest |error| when the bundle records them
    (``golden.tolerance_per_output``: set from that output's own range at quantize time, so a [0, 1] probability is
    not checked against the scale of a wide state or logits beside it), and one on its mean |error| over a sample
    (``golden.mean_tolerance_per_output``: a map where a few pixels may flip from 0 to 1 is still held as a whole);
    a bundle from before them has one ``tolerance`` for every output. Catches a broken delegate or kernel, an output
    flattened or saturated on this CPU, and an artifact damaged in a way its checksum does not show. Golden data
    that does not fit the manifest, or holds no sample, is a :class:`BundleError` (never "checked" on nothing).
    """
    golden_meta = bundle.manifest.get("golden") or {}
    pooled = (golden_meta.get("tolerance") or {}).get(artifact_id)
    each = (golden_meta.get("tolerance_per_output") or {}).get(artifact_id)
    each_mean = (golden_meta.get("mean_tolerance_per_output") or {}).get(artifact_id)
    n_out = len(bundle.manifest["outputs"])
    for key, values in (("tolerance_per_output", each), ("mean_tolerance_per_output", each_mean)):
        if values is not None and len(values) != n_out:  # the schema refuses this; a hand-made Bundle may not
            raise BundleError(f"bundle {bundle.name!r}: golden.{key}.{artifact_id} has {len(values)} value(s); the "
                              f"model has {n_out} output(s)")
    if pooled is None and each is None:
        return {"checked": False, "why": f"the bundle records no golden tolerance for {artifact_id}"}
    tolerances = [float(t) for t in each] if each is not None else [float(pooled)] * n_out
    golden = bundle.golden()
    runs = golden_feeds(golden, len(bundle.manifest["inputs"]))
    refs = golden_outputs(golden, n_out)
    if not runs:  # Bundle.golden refuses this already; a check on zero samples must never read as passed
        raise BundleError(f"bundle {bundle.name!r}: the golden data holds no sample to check {artifact_id} on")
    names = [o.get("name") or f"output {j}" for j, o in enumerate(bundle.manifest["outputs"])]
    worst, worst_mean = [0.0] * n_out, [0.0] * n_out
    where = f"{artifact_id} on {engine.name}:{engine.device}"
    for i, feeds in enumerate(runs):
        try:
            outs = run_as_given(engine, feeds)
        except InputError as exc:  # the artifact does not take the bundle's own inputs: it is not this bundle's model
            raise BackendUnavailable(BackendReason.NUMERICS_MISMATCH,
                                     f"{where} does not take the bundle's golden input {i}: "
                                     f"{exc}") from exc
        except EdgeSDKError:
            raise
        except Exception as exc:  # a delegate that throws at its first run is a broken backend, not a crash
            raise BackendUnavailable(BackendReason.RUN_FAILED, f"{where} failed on golden input {i}: {exc}") from exc
        if len(outs) < n_out:
            raise BackendUnavailable(BackendReason.NUMERICS_MISMATCH,
                                     f"{where} returned {len(outs)} outputs; the bundle has {n_out}")
        for j in range(n_out):
            ref = refs[i][j]
            got = np.asarray(outs[j], dtype=np.float32)
            if got.size != ref.size:
                raise BackendUnavailable(BackendReason.NUMERICS_MISMATCH,
                                         f"{where} output {j} has shape {list(got.shape)}; "
                                         f"the golden output has {list(ref.shape)}")
            got = got.reshape(ref.shape)
            finite = bool(np.all(np.isfinite(got)))
            gap = np.abs(got - ref)
            err = float(np.max(gap)) if finite and gap.size else (0.0 if finite else float("inf"))
            mean = float(np.mean(gap, dtype=np.float64)) if finite and gap.size else (0.0 if finite else float("inf"))
            worst[j], worst_mean[j] = max(worst[j], err), max(worst_mean[j], mean)
            if not err <= tolerances[j]:
                whose = "that output's own" if each is not None else "one for every output"
                raise BackendUnavailable(
                    BackendReason.NUMERICS_MISMATCH,
                    f"{where} is off by {err:.4g} on golden input {i} output {j} ({names[j]!r}; tolerance "
                    f"{tolerances[j]:.4g}, {whose})")
            if each_mean is not None and not mean <= each_mean[j]:
                raise BackendUnavailable(
                    BackendReason.NUMERICS_MISMATCH,
                    f"{where} is off by {mean:.4g} on average on golden input {i} output {j} ({names[j]!r}; mean "
                    f"tolerance {float(each_mean[j]):.4g}, that output's own): the output moved as a whole")
    result = {"checked": True, "max_abs_error": max(worst, default=0.0),
              "tolerance": float(pooled) if pooled is not None else max(tolerances, default=0.0),
              "inputs": len(runs)}
    if each is not None:
        result.update(max_abs_error_per_output=worst, tolerance_per_output=tolerances)
    if each_mean is not None:
        result.update(mean_abs_error_per_output=worst_mean, mean_tolerance_per_output=[float(t) for t in each_mean])
    return result
