"""The manifest quantize writes: what was built, from what, how it validated, and the golden data a device checks
each artifact against (README "Bundle format")."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import platform

import numpy as np

import edgesdk
from edgesdk.bundle.reader import FORMAT_VERSION
from edgesdk.cpu import cpu_class
from edgesdk.engines import ENGINE_NAMES, engine_version
from edgesdk.errors import ConversionError

from . import calibration
from .bundle_writer import file_entry

_CONVERTER_DISTS = ("torch", "litert-torch", "ai-edge-quantizer", "nncf", "onnx", "onnxscript")


def build_manifest(src, pre, label_names, built, work, calib_samples, calib_ds, picked, seed, metrics, golden,
              val_origin, name, version, state=None, task=None) -> dict:
    artifacts = []
    for b in built:
        entry = {"id": b.id, "engine": b.engine, "precision": b.precision,
                 "files": [file_entry(work, f) for f in b.files]}
        if b.runtime:
            entry["runtime"] = b.runtime
        if b.precision == "int8":
            entry["method"] = b.method
            entry["reference"] = next(r.id for r in built if r.engine == b.engine and r.precision == "fp32")
            if b.recovery is not None:
                entry["recovery"] = b.recovery
        artifacts.append(entry)
    golden_path = work / "golden.npz"
    # "stacked": each tensor's samples on a new first axis, exact for a [2, 1, 128] state or a scalar. When every
    # tensor is batch-1, "joined" on that batch axis says the same, and is the layout every edgesdk reads (devices
    # running a release from before layouts load the bundle too).
    first = golden["inputs"][0] + golden["outputs"][0]
    layout = "joined" if all(a.ndim >= 1 and a.shape[0] == 1 for a in first) else "stacked"
    join = np.concatenate if layout == "joined" else np.stack
    arrays = {f"input_{j}": join([s[j] for s in golden["inputs"]]) for j in range(len(src.inputs))}
    arrays |= {f"output_{j}": join([o[j] for o in golden["outputs"]]) for j in range(len(src.outputs))}
    np.savez(golden_path, **arrays)
    out_spec = [{"name": s.name, "shape": list(golden["outputs"][0][j].shape),
                 "dtype": np.asarray(golden["outputs"][0][j]).dtype.name} for j, s in enumerate(src.outputs)]
    state_spec = _state_spec(state, src.inputs, out_spec)
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": version,
        "created_with": _versions(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {"name": src.name, "kind": src.kind, **src.provenance, **({"input_shapes_from": src.shapes_from}
                                                          if src.shapes_from else {})},
        "inputs": [s.to_dict() | ({"fixed": src.fixed[s.name]} if s.name in src.fixed else {}) for s in src.inputs],
        "outputs": out_spec,
        "preprocess": pre.to_dict() if pre else None,
        "postprocess": _postprocess(out_spec, golden["probabilities"], task),
        **({"task": _task_table(task, golden["probabilities"])} if task is not None else {}),
        "labels": label_names,
        "artifacts": artifacts,
        "calibration": {
            "samples": len(calib_samples),
            "fingerprint": calibration.fingerprint(calib_samples),
            "method": {b.id: b.method for b in built if b.precision == "int8"},
            "source": calib_ds.origin,
            "seed": seed,
            "stratified": calib_ds.labels is not None,
            # What the INT8 input quantization was calibrated on (min/max per input): the device measures how
            # much of an input falls outside it (hybrid mode's clipped-share signal).
            "input_ranges": [{"name": spec.name,
                              "min": float(min(float(np.min(s[i])) for s in calib_samples)),
                              "max": float(max(float(np.max(s[i])) for s in calib_samples))}
                             for i, spec in enumerate(src.inputs)],
        },
        "validation_data": val_origin,
        # Where the numbers were measured: INT8 accuracy and speed depend on the CPU's integer kernels.
        "validation": {**metrics, "machine": cpu_class()},
        **({"state": state_spec} if state_spec else {}),
        "golden": {
            "files": [file_entry(work, golden_path)],
            "layout": layout,
            "count": len(golden["inputs"]),
            "reference": golden["reference"],
            "metric": "max_abs_error",
            "tolerance": golden["tolerance"],
            # per output, each from that output's own range: a device checks every output on its own
            "tolerance_per_output": golden["tolerance_per_output"],
            "mean_tolerance_per_output": golden["mean_tolerance_per_output"],
        },
    }


def _state_spec(state: dict[str, str] | None, inputs, outputs: list[dict]) -> list[dict]:
    """The manifest's ``state`` section: each output fed into an input on the next call, starting from zeros. The
    output must have the input's shape and dtype (known once the model has run)."""
    spec = []
    for out_name, in_name in (state or {}).items():
        out = next(o for o in outputs if o["name"] == out_name)
        inp = next(i for i in inputs if i.name == in_name)
        if list(out["shape"]) != list(inp.shape) or out["dtype"] != inp.dtype:
            raise ConversionError(f"state output {out_name!r} ({out['dtype']} {out['shape']}) cannot feed input "
                                  f"{in_name!r} ({inp.dtype} {list(inp.shape)}): shapes and dtypes must match")
        spec.append({"output": out_name, "input": in_name, "initial": "zeros"})
    return spec


def _task_table(task, probabilities: bool) -> dict:
    """The manifest's ``task``: a classifier's softmax flag is what validation saw (probabilities or logits)."""
    table = task.to_dict()
    if table["type"] == "classification":
        table["softmax"] = not probabilities
    return table


def _postprocess(outputs: list[dict], probabilities: bool, task=None) -> dict:
    """The classification postprocess table every edgesdk reads (devices from before tasks read only this)."""
    if task is not None and task.type != "classification":
        return {"type": "none"}
    if len(outputs) == 1 and len(outputs[0]["shape"]) == 2:
        classes = outputs[0]["shape"][1]
        return {"type": "classification", "softmax": not probabilities, "top_k": min(5, classes)}
    return {"type": "none"}


def _versions() -> dict:
    def v(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {
        "edgesdk": edgesdk.__version__,
        "python": platform.python_version(),
        "engines": {e: engine_version(e) for e in ENGINE_NAMES},
        "converters": {d: v(d) for d in _CONVERTER_DISTS},
    }
