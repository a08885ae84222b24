"""The manifest schema: every manifest key edgesdk reads, with its type and whether it must be there.

:func:`check_manifest` runs when a bundle is opened, before anything in the manifest is used, and raises one
:class:`~edgesdk.errors.BundleError` listing every problem it found, each naming the field's path, what was
expected and what was found::

    manifest.json: artifacts[1].files[0].bytes must be a non-negative integer, got "12" (a string)

Keys this edgesdk does not know are accepted (a newer quantizer may write more), except inside an artifact's
``runtime`` table, whose options are applied to the engine (a misspelt option would silently do nothing).
The schema is written out below as data, checked by a few small classes; no third-party validator.

Whatever in the manifest sets a resource is bounded here, before it is used (file bytes, JSON depth, thread count,
preprocess size: the limits below and in README "Limits"). Names, versions, ids, labels and tensor names must be
one line of printable text; a key twice in one object is refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..choices import TaskType
from ..errors import BundleError, InputError
# the checkers (_show: also the bundle readers' way to quote a value)
from .specs import Bool, Int, ListOf, MapOf, Nullable, Num, Obj, OneOf, Rule, Scalar, Spec, Str, _show  # noqa: F401

FORMAT_VERSION = 1  # the format the quantizer writes
FORMAT_VERSIONS = (FORMAT_VERSION,)  # the formats this edgesdk reads
ENGINES = ("litert", "openvino", "onnxruntime")
PRECISIONS = ("int8", "fp32")
RUNTIME_OPTIONS = ("num_threads", "precision_hint")  # engine options an artifact may record
GOLDEN_LAYOUTS = ("stacked", "joined")  # how golden.npz holds the samples (README "Bundle format")
STATE_INITIAL = ("zeros",)  # what a stateful model's state starts from
MAX_PROBLEMS = 10  # listed in one error; the rest are counted
MAX_THREADS = 256  # runtime.num_threads, as load(threads=...): ONNX Runtime crashes at 100000 and hangs at 2000
MAX_MANIFEST_BYTES = 4 << 20  # a real manifest is a few KiB; json.loads costs ~20 bytes of memory per byte read
MANIFEST_BYTES_VAR = "EDGESDK_MAX_MANIFEST_BYTES"
MAX_JSON_DEPTH = 64  # a real manifest nests 5 deep
MAX_PREPROCESS_PIXELS = 8192 * 8192  # one resized image becomes ~12 bytes a pixel of float32 work arrays
PREPROCESS_PIXELS_VAR = "EDGESDK_MAX_PREPROCESS_PIXELS"
# A tensor the manifest declares: its elements (a -1 counted as 1) at most edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS
# (what predict takes), its bytes at most this; an input edgesdk makes itself at each stream or predict (a state
# input's zeros, a fixed input's value) at most the second.
MAX_TENSOR_BYTES = 512 << 20
TENSOR_BYTES_VAR = "EDGESDK_MAX_TENSOR_BYTES"
MAX_FILLED_INPUT_BYTES = 16 << 20  # Silero VAD's state is 1 KiB; a fixed input is a scalar
FILLED_INPUT_BYTES_VAR = "EDGESDK_MAX_FILLED_INPUT_BYTES"
# The dtypes a tensor may have: numbers and bools of at most 8 bytes (bfloat16, which numpy lacks, is fed as float32).
TENSOR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "bfloat16", "float32", "float64")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# What draws on a terminal instead of showing (C0/C1 controls, line and paragraph separators, bidi overrides and
# isolates) or cannot be printed at all (lone surrogates): refused in names, ids and labels.


def env_limit(variable: str, default: int) -> int:
    """The limit the environment variable ``variable`` sets (a positive integer), else ``default``."""
    raw = os.environ.get(variable, "").strip()
    if raw and (not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1):
        raise InputError(f"{variable} must be a positive integer, got {raw!r}")
    return int(raw) if raw else default


def _preprocess(value: Any) -> str | None:
    from .preprocess import Preprocess  # its own checks are the schema of this table

    try:
        Preprocess.from_dict(value)
    except InputError as exc:
        return f"is not a usable preprocess spec: {exc}"
    return None


def _task(value: Any) -> str | None:
    from ..tasks.spec import TaskSpec  # its own checks are the schema of this table

    try:
        TaskSpec.from_dict(value)
    except InputError as exc:
        return f"is not a usable task: {exc}"
    return None


# -- the schema ---------------------------------------------------------------------
NAME = Str(nonempty=True, plain=True)
THREADS = Int(1, f"an integer from 1 to {MAX_THREADS}", MAX_THREADS)
FILE = Obj(required={"path": NAME, "sha256": Str(pattern=_SHA256, expected="64 lowercase hex digits"),
                     "bytes": Int(0, "a non-negative integer")})
FILES = ListOf(FILE, nonempty=True)
TENSOR = Obj(required={"name": Str(plain=True), "shape": ListOf(Int(-1, "an integer >= -1 (-1: dynamic)")),
                       "dtype": NAME},
             optional={"fixed": Scalar()})  # the value an input was specialized for (quantize's fixed_inputs)
# What accuracy recovery did to an INT8 artifact (quantize --recover): the layers kept in float and why, the gate's
# metric and the artifact's latency before and after, the share of multiply-accumulates still in INT8, each trial.
_NUM = Nullable(Num())
_SECONDS = Num(0.0, expected="a non-negative number of seconds")
_LAYER = Obj(required={"layer": Str()}, optional={
    "engine_node": Str(), "op": Str(), "macs": Int(0, "a non-negative integer"), "reason": Str(), "ranges": Str()})
RECOVERY = Obj(
    required={"status": OneOf("recovered", "not_needed", "failed", "out_of_time")},
    optional={"mechanism": Str(), "ranking": Str(), "note": Str(), "metric": Nullable(Str()), "calibration": Str(),
              "kept_float": ListOf(_LAYER),
              "layer_ranges": ListOf(_LAYER),  # back in INT8 with the other range choice on the tensors they read
              "layers_ranked": Int(0, "a non-negative integer"), "macs": Int(0, "a non-negative integer"),
              "budget_seconds": _SECONDS,  # this artifact's share of the run's recovery budget
              "int8_mac_share_before": Nullable(Num(0.0, 1.0, "a number in [0, 1]")),
              "int8_mac_share": Nullable(Num(0.0, 1.0, "a number in [0, 1]")),
              **{k: _NUM for k in ("metric_before", "metric_after", "drop_before", "drop_after", "latency_ms_before",
                                   "latency_ms_after", "seconds")},
              "trials": ListOf(Obj(optional={"kept": Int(0, "a non-negative integer"),
                                             "layer_ranges": Int(0, "a non-negative integer"), "passed": Bool(),
                                             "calibration": Str(), "step": Str(),
                                             "metric_value": _NUM, "drop": _NUM, "seconds": _NUM,
                                             "latency_ms": _NUM}))},
)
ARTIFACT = Obj(
    required={"id": NAME, "engine": OneOf(*ENGINES), "precision": OneOf(*PRECISIONS), "files": FILES},
    optional={"runtime": Nullable(Obj(optional={"num_threads": THREADS, "precision_hint": NAME}, closed=True)),
              "method": Nullable(Str()), "reference": Nullable(Str()), "recovery": Nullable(RECOVERY)},
)
_METRIC = Nullable(Num())
_TEXT = Nullable(Str(plain=True))
VALIDATION = Obj(
    optional={"passed": Bool(), "slower_than_float": Bool(), "max_abs_error_cap_exceeded": Bool(),
              "effective_precision": Nullable(Str()),
              "reference": Nullable(Str()), "samples": Nullable(Int(0, "a non-negative integer")),
              "gate": Nullable(Str()), "max_drop_points": _METRIC,
              **{k: _METRIC for k in ("accuracy", "reference_accuracy", "accuracy_drop_points", "agreement_drop_points",
                                      "golden_agreement_drop_points", "top1_agreement", "golden_agreement",
                                      "cosine_similarity", "max_abs_error", "latency_ms", "latency_ratio",
                                      "reference_latency_ms", "max_abs_error_golden", "max_abs_error_cap")},
              # the task's own gate (quantize's validation, issue 17): its metric's name and value, the drop in its
              # unit ("points", or "px" for landmarks) against max_drop, the task's numbers (details), a plug-in
              # metric in the task's place (task_metric: the task's own then), a task reason to fail (task_failure:
              # a probability's decisions), an INT8 error over its cap that the task's metric judges instead
              # (max_abs_error_over_cap), and the dead-output check (each output's std and its reference's)
              "task": _TEXT, "metric": _TEXT, "task_metric": _TEXT, "drop_unit": _TEXT, "task_failure": Nullable(Str()),
              # an INT8 artifact slower than its float reference: where it loses, op by op (edgesdk.bench.ops)
              "slower_because": _TEXT,
              **{k: _METRIC for k in ("metric_value", "reference_metric_value", "task_metric_value", "drop",
                                      "max_drop")},
              "details": Nullable(MapOf(Spec())), "max_abs_error_over_cap": Bool(),
              "dead_output": ListOf(Str(plain=True)),
              "output_std": ListOf(_METRIC), "reference_output_std": ListOf(_METRIC)},
)
# Where the validation numbers were measured (edgesdk.cpu.cpu_class): INT8 results depend on the CPU class.
VALIDATION_MACHINE = Obj(optional={
    "arch": Nullable(Str()), "vendor": Nullable(Str()), "model": Nullable(Str()),
    "cpus": Nullable(Int(1, "a positive integer")), "flags": Nullable(MapOf(Bool())), "isa_class": Nullable(Str()),
    "isa_caps": Nullable(MapOf(Str())),
})
_SHARE = Num(0.0, 1.0, "a number in [0, 1]")
# What quantize built, per target (tflite, openvino, onnx): a failed target's artifacts are left out of the bundle and
# its full error (line breaks kept: it is printed line by line, escaped) and the converter's last lines kept here.
BUILD = MapOf(Obj(required={"status": OneOf("built", "failed", "refused")},
                  optional={"error": Nullable(Str()), "log_tail": ListOf(Str()), "seconds": _SECONDS}), keys=NAME)
# How long quantize took, phase by phase (each begins where the last ended; a target's phase is its conversion,
# calibration and load check), and recovery's budget for the run. Beside "build", not in it: readers from before it
# take every key of "build" for a target.
TIMING = Obj(optional={
    "seconds": _SECONDS,
    "phases": ListOf(Obj(required={"phase": NAME, "seconds": _SECONDS}, optional={"target": NAME})),
    "recovery_budget": Obj(optional={"seconds": _SECONDS, "derived": Str(), "spent": _SECONDS}),
})
MAX_MONITOR_BINS = 64  # bins per feature of the monitoring reference (quantize writes 10)


def _monitor_feature(value: Any) -> str | None:
    """One feature's reference (edgesdk.monitor.drift): sorted finite edges, one share per bin (one more than the
    edges), each in [0, 1]."""
    if not isinstance(value, dict):
        return f"must be an object with edges and p, got {_show(value)}"
    edges, shares = value.get("edges"), value.get("p")
    if not isinstance(edges, list) or not isinstance(shares, list):
        return "must hold lists 'edges' and 'p'"
    if len(edges) > MAX_MONITOR_BINS - 1:
        return f"has {len(edges)} edges; at most {MAX_MONITOR_BINS - 1}"
    if len(shares) != len(edges) + 1:
        return f"must have one share per bin (len(p) == len(edges) + 1), got {len(shares)} and {len(edges)}"
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in edges + shares)
    if not numbers or not all(-1e300 < x < 1e300 for x in edges) or any(a >= b for a, b in zip(edges, edges[1:])):
        return "edges must be finite numbers in increasing order"
    if not all(0 <= x <= 1 for x in shares):
        return "shares (p) must be numbers in [0, 1]"
    count = value.get("n")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 10**9):
        return f"n must be an integer from 1 to 1e9, got {_show(count)}"
    for key in ("mean", "std"):
        x = value.get(key)
        if x is not None and (not isinstance(x, (int, float)) or isinstance(x, bool) or not -1e300 < x < 1e300):
            return f"{key} must be a finite number, got {_show(x)}"
    return None


MONITORING = Obj(optional={
    "version": Int(1, "a positive integer"), "bins": Int(1, "a positive integer"), "grid": Int(1, "a positive integer"),
    "inputs_from": Str(), "outputs_from": Str(),
    "inputs": MapOf(Rule(_monitor_feature)), "outputs": MapOf(Rule(_monitor_feature)),
    "artifacts": MapOf(Obj(optional={"outputs": MapOf(Rule(_monitor_feature))})),
})

MANIFEST = Obj(
    required={
        "format_version": Int(), "name": NAME, "version": NAME,
        "created_with": Spec(),  # for people: required, any JSON value
        "inputs": ListOf(TENSOR, nonempty=True), "outputs": ListOf(TENSOR, nonempty=True),
        "artifacts": ListOf(ARTIFACT, nonempty=True),
    },
    optional={
        "created_at": Nullable(Str()),
        "source": Nullable(Obj(optional={"name": Nullable(Str()), "kind": Nullable(Str())})),
        "preprocess": Nullable(Rule(_preprocess)),
        "postprocess": Nullable(Obj(optional={"type": Str(), "softmax": Bool(),
                                              "top_k": Int(1, "a positive integer")})),
        "labels": Nullable(ListOf(Str(plain=True))),
        "task": Nullable(Rule(_task)),  # what the outputs mean (edgesdk.tasks.spec)
        "calibration": Nullable(Obj(optional={
            "samples": Int(0, "a non-negative integer"), "fingerprint": Nullable(Str()), "source": Nullable(Str()),
            "method": Nullable(MapOf(Str())), "seed": Nullable(Int()), "stratified": Bool(),
            "input_ranges": Nullable(ListOf(Obj(required={"min": Num(), "max": Num()},
                                                optional={"name": Str()}))),
        })),
        "validation_data": Nullable(Str()),
        "build": Nullable(BUILD),
        "timing": Nullable(TIMING),
        "validation": Nullable(MapOf(VALIDATION, special={"data": Nullable(Str()),
                                                          "machine": Nullable(VALIDATION_MACHINE)})),
        # Stateful models: each output fed back into an input on the next call (edgesdk.runtime.stream).
        "state": Nullable(ListOf(Obj(required={"output": Str(nonempty=True, plain=True),
                                               "input": Str(nonempty=True, plain=True)},
                                     optional={"initial": OneOf(*STATE_INITIAL)}, closed=True))),
        "golden": Nullable(Obj(required={"files": FILES}, optional={
            # "stacked": each member is (samples, *tensor shape); "joined" (also when absent: bundles from before
            # layouts): the samples joined on the batch axis, which quantize writes when every tensor is batch-1.
            "layout": OneOf(*GOLDEN_LAYOUTS),
            "count": Int(0, "a non-negative integer"), "reference": Nullable(Str()), "metric": Str(),
            "tolerance": MapOf(Num(0.0, expected="a non-negative number")),
            # one tolerance per output (in the manifest's output order), each from that output's own range, on its
            # largest |error| and on its mean |error| over a sample; a device checks each output against its own
            # when the artifact has them, else the pooled tolerance
            "tolerance_per_output": MapOf(ListOf(Num(0.0, expected="a non-negative number"))),
            "mean_tolerance_per_output": MapOf(ListOf(Num(0.0, expected="a non-negative number"))),
        })),
        # reference statistics of the data the bundle was calibrated and validated on (edgesdk.monitor.reference)
        "monitoring": Nullable(MONITORING),
        # the share of devices a BundleStore activates this version on (edgesdk.store.rollout); null: every device
        "rollout_percent": Nullable(Num(0.0, 100.0, "a number from 0 to 100")),
        "hybrid": Nullable(Obj(optional={
            "signal": Str(nonempty=True), "threshold": Nullable(_SHARE), "max_clipped": Nullable(_SHARE),
            "device_artifact": Nullable(Str()), "samples": Int(0, "a non-negative integer"),
            **{k: Nullable(_SHARE) for k in ("escalation_rate", "hybrid_accuracy", "device_accuracy",
                                             "cloud_accuracy")},
            "curve": ListOf(Obj(required={"escalation_rate": _SHARE, "accuracy": _SHARE},
                                optional={"threshold": Num()})),
        })),
    },
)


# -- entry points -------------------------------------------------------------------
def load_manifest(path: Path, max_bytes: int | None = None) -> dict[str, Any]:
    """Read and check ``manifest.json``; any problem is a :class:`BundleError` naming the file.

    A file over ``max_bytes`` (None: ``$EDGESDK_MAX_MANIFEST_BYTES``, else 4 MiB) is refused from its size, before
    it is read; so is JSON nested deeper than 64 levels, and an object that holds a key twice.
    """
    cap = max_bytes if max_bytes is not None else env_limit(MANIFEST_BYTES_VAR, MAX_MANIFEST_BYTES)
    try:
        text = _read_at_most(path, cap).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} cannot be read as UTF-8 text: {exc}") from exc
    try:
        manifest = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as exc:
        raise BundleError(f"{path}: key {_show(exc.args[0])} appears twice in one object (JSON readers disagree on "
                          "which one counts)") from None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer past Python's digit limit
        raise BundleError(f"{path} is not valid JSON: {str(exc)[:200]}") from exc
    if _deeper_than(manifest, MAX_JSON_DEPTH):
        raise BundleError(f"{path}: JSON nested deeper than {MAX_JSON_DEPTH} levels; a manifest nests a few")
    check_manifest(manifest, path)
    return manifest


def _read_at_most(path: Path, cap: int) -> bytes:
    """The bytes of the regular file ``path``, refused from its size when over ``cap`` (a FIFO does not block)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{path} is not a regular file")
        data = fh.read(cap + 1) if info.st_size <= cap else b""
    size = max(info.st_size, len(data))  # len(data): the file grew since fstat
    if size > cap:
        raise BundleError(f"{path} is {size} bytes, over the limit of {cap} for a manifest "
                          f"(${MANIFEST_BYTES_VAR} raises it)")
    return data


class _DuplicateKey(ValueError):
    """A key found twice in one JSON object (``args[0]``)."""


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _DuplicateKey(next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1))
    return found


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def check_manifest(manifest: Any, where: Path | str) -> None:
    """Raise one :class:`BundleError` listing every way ``manifest`` breaks the schema (nothing if it fits)."""
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: the manifest must be a JSON object, got {_show(manifest)}")
    version = manifest.get("format_version")
    if "format_version" in manifest and not any(type(version) is type(v) and version == v for v in FORMAT_VERSIONS):
        raise BundleError(f"{where}: unknown format_version {_show(version)} (this edgesdk reads "
                          f"{', '.join(map(str, FORMAT_VERSIONS))})")
    problems: list[str] = []
    MANIFEST.check(manifest, "", problems)
    if not problems:
        problems += _cross_checks(manifest)
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS])
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        head = f"{where}: " if len(problems) == 1 else f"{where}: {len(problems)} problems: "
        raise BundleError(head + shown + more)


def _cross_checks(manifest: dict[str, Any]) -> list[str]:
    """What the types alone do not say: artifact ids are unique. (An int8 artifact's ``reference`` may name an
    artifact left out of this bundle: a device bundle can ship the int8 artifact alone.)"""
    problems = []
    ids = [a["id"] for a in manifest["artifacts"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        problems.append(f"artifacts: ids must be unique; {', '.join(map(_show, twice))} appear more than once")
    for i, art in enumerate(manifest["artifacts"]):
        if art["engine"] != "openvino":
            continue
        # OpenVINO reads <stem>.bin beside the .xml whatever the manifest says: it must be a listed (hashed) file.
        paths = [f["path"] for f in art["files"]]
        first = paths[0]
        if not first.lower().endswith(".xml"):
            problems.append(f"artifacts[{i}].files[0] must be the OpenVINO IR .xml, got {_show(first)}")
        elif first[:-4] + ".bin" not in paths:
            problems.append(f"artifacts[{i}].files must list {_show(first[:-4] + '.bin')}, the weights OpenVINO reads "
                            f"beside {_show(first)}")
    return problems + _tensors_fit(manifest) + _state_fits(manifest) + _preprocess_fits(manifest) \
        + _task_fits(manifest) + _golden_fits(manifest)


def tensor_bytes_per_element(dtype: str) -> int | None:
    """The bytes one element of a tensor of manifest ``dtype`` takes as edgesdk feeds it (bfloat16: as float32);
    None for a dtype that is not one of :data:`TENSOR_DTYPES`."""
    if dtype not in TENSOR_DTYPES:
        return None
    return 4 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _tensors_fit(manifest: dict[str, Any]) -> list[str]:
    """Every declared tensor has a number or bool dtype and a bounded size; the inputs edgesdk fills in itself
    (state, fixed) a smaller one. Counted from the shape, never allocated."""
    from . import tensors  # its MAX_ARRAY_ELEMENTS, read now: an app may have raised it

    max_elements = tensors.MAX_ARRAY_ELEMENTS
    max_bytes = env_limit(TENSOR_BYTES_VAR, MAX_TENSOR_BYTES)
    max_filled = env_limit(FILLED_INPUT_BYTES_VAR, MAX_FILLED_INPUT_BYTES)
    state_inputs = {pair.get("input") for pair in manifest.get("state") or [] if isinstance(pair, dict)}
    problems = []
    for side in ("inputs", "outputs"):
        for i, t in enumerate(manifest[side]):
            where = f"{side}[{i}] {_show(t['name'])}"
            itemsize = tensor_bytes_per_element(t["dtype"])
            if itemsize is None:
                problems.append(f"{where}: dtype {_show(t['dtype'])} is not a numeric or bool dtype of at most 8 "
                                "bytes (bool, int8 to int64, uint8 to uint64, float16, bfloat16, float32, float64)")
                continue
            elements = 1
            for d in t["shape"]:
                elements *= max(d, 1)
            declared = f"({t['dtype']} {t['shape']})"
            if elements > max_elements:
                problems.append(f"{where}: shape {t['shape']} is {elements} elements, over the limit of {max_elements} "
                                f"(edgesdk.bundle.tensors.MAX_ARRAY_ELEMENTS)")
            elif elements * itemsize > max_bytes:
                problems.append(f"{where}: {elements * itemsize} bytes {declared}, over the limit of {max_bytes} for "
                                f"one tensor (${TENSOR_BYTES_VAR} raises it)")
            filled = "a state input" if side == "inputs" and t["name"] in state_inputs else \
                "a fixed input" if side == "inputs" and "fixed" in t else None
            if filled and elements <= max_elements and elements * itemsize > max_filled:
                problems.append(f"{where}: {filled} of {elements * itemsize} bytes {declared}, over the limit of "
                                f"{max_filled} for an input edgesdk fills in itself (${FILLED_INPUT_BYTES_VAR} "
                                "raises it)")
    return problems


def _golden_fits(manifest: dict[str, Any]) -> list[str]:
    """Each artifact's per-output golden tolerances hold one value per output."""
    golden, n_out = manifest.get("golden") or {}, len(manifest["outputs"])
    return [f"golden.{key}[{_show(aid)}] has {len(values)} value(s); the model has {n_out} output(s)"
            for key in ("tolerance_per_output", "mean_tolerance_per_output")
            for aid, values in (golden.get(key) or {}).items() if len(values) != n_out]


def _state_fits(manifest: dict[str, Any]) -> list[str]:
    """Each ``state`` pair names an output and an input of the same shape and dtype; an input is fed once."""
    problems = []
    ins = {t["name"]: t for t in manifest["inputs"]}
    outs = {t["name"]: t for t in manifest["outputs"]}
    fed: list[str] = []
    for i, pair in enumerate(manifest.get("state") or []):
        out, inp = outs.get(pair["output"]), ins.get(pair["input"])
        if out is None:
            problems.append(f"state[{i}].output {_show(pair['output'])} is not one of the outputs "
                            f"({', '.join(map(_show, outs))})")
        if inp is None:
            problems.append(f"state[{i}].input {_show(pair['input'])} is not one of the inputs "
                            f"({', '.join(map(_show, ins))})")
        elif pair["input"] in fed:
            problems.append(f"state[{i}].input {_show(pair['input'])} is fed by more than one output")
        if out is not None and inp is not None and (out["shape"] != inp["shape"] or out["dtype"] != inp["dtype"]
                                                    or -1 in inp["shape"]):
            problems.append(f"state[{i}]: output {_show(pair['output'])} ({out['dtype']} {out['shape']}) cannot feed "
                            f"input {_show(pair['input'])} ({inp['dtype']} {inp['shape']}): the same fixed shape "
                            "and dtype are needed")
        fed.append(pair["input"])
    return problems


def _task_fits(manifest: dict[str, Any]) -> list[str]:
    """The task's output roles name outputs of the model (every required role, once resolved), and its parameters
    fit those outputs' declared shapes (:func:`edgesdk.tasks.fit.shape_problems`)."""
    from ..tasks.fit import shape_problems
    from ..tasks.spec import TaskSpec

    if not manifest.get("task"):
        return []
    names = [o["name"] for o in manifest["outputs"]]
    try:
        spec = TaskSpec.from_dict(manifest["task"]).resolved(names)
    except InputError as exc:
        return [f"task: {exc}"]
    return [f"task: {p}" for p in shape_problems(spec, manifest["outputs"])] + _anchors_fit(spec, manifest)


def _anchors_fit(spec: Any, manifest: dict[str, Any]) -> list[str]:
    """An anchor detector's strides and per-layer count give as many anchors as its boxes output has rows (counted,
    never made: a hostile table could ask for millions)."""
    from ..tasks.detection import anchor_count
    from ..tasks.geometry import input_image_size

    if spec.type != TaskType.DETECTION or spec.params["format"] != "anchors":
        return []
    pre = manifest.get("preprocess") or {}
    size = tuple(pre["size"]) if pre.get("size") else input_image_size(manifest["inputs"][0]["shape"])
    boxes = next(o for o in manifest["outputs"] if o["name"] == spec.outputs["boxes"])
    rows = boxes["shape"][1] if len(boxes["shape"]) >= 2 else None
    if size is None or rows is None or rows < 1:
        return []
    count = anchor_count(spec.params["anchors"]["strides"], spec.params["anchors"]["per_layer"], size)
    if count != rows:
        return [f"task: anchors {{strides: {list(spec.params['anchors']['strides'])}, per_layer: "
                f"{spec.params['anchors']['per_layer']}}} give {count} anchors for a {size[0]}x{size[1]} input; "
                f"output {spec.outputs['boxes']!r} has {rows} rows"]
    return []


def _preprocess_fits(manifest: dict[str, Any]) -> list[str]:
    from .preprocess import Preprocess

    if not manifest.get("preprocess"):
        return []
    pre = Preprocess.from_dict(manifest["preprocess"])  # the schema accepted it
    return pre.problems_making(manifest["inputs"][0]["shape"], env_limit(PREPROCESS_PIXELS_VAR, MAX_PREPROCESS_PIXELS),
                               PREPROCESS_PIXELS_VAR)
