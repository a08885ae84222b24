"""``edgesdk quantize``: a float model + calibration data -> a validated INT8 bundle."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from edgesdk.atomic_file import check_replaceable, publish_dir
from edgesdk.bundle.reader import MANIFEST, Bundle
from edgesdk.errors import CalibrationError, ConversionError, InputError, TargetsFailed, ValidationFailed
from edgesdk.bundle.preprocess import Preprocess
from edgesdk.bundle.report import failing_artifacts, timing_report, validation_table

from . import calibration
from .bundle_writer import write_manifest
from .manifest import build_manifest
from .monitoring import Reference
from .sources import open_source
from .options import QuantizeOptions
from .targets import TARGET_ENGINES, Built, builder
from .toolchain_output import TAIL_LINES, captured
from .task_choice import choose_task
from .validation.metric_plugin import load_metric
from .recovery import recover_bundle
from .validation.validate import GOLDEN_ORDER, open_for_validation, run_sample, validate

# A failed target's error as the manifest keeps it (the exception raised keeps it whole): the first and last half of
# this many characters. Converters can fail with a whole MLIR module or graph dump in their message.
MAX_ERROR_CHARS = 20_000
MAX_LOG_LINE_CHARS = 2_000  # each converter output line kept in the manifest (MLIR prints whole modules on one line)


@dataclass
class QuantizeResult:
    bundle: Path
    manifest: dict

    def table(self) -> str:
        return validation_table(self.manifest)


def quantize(
    source: Any,
    calib: Any,
    out: str | Path,
    options: QuantizeOptions | None = None,
    *,
    val: Any = None,
    preprocess: Preprocess | dict | str | Path | None = None,
    labels: list[str] | str | Path | None = None,
    example_input: Any = None,
    log: Callable[[str], None] | None = None,
    **shortcuts: Any,
) -> QuantizeResult:
    """Quantize ``source`` for every target, validate, and write the bundle at ``out``.

    ``options`` (:class:`~edgesdk_converters.options.QuantizeOptions`) says how; each of its fields may also be
    given as a keyword (``quantize(src, calib, out, samples=100, targets=["onnx"])``), applied over ``options``.
    A bad option raises before anything is opened.

    ``tflite_io`` is ``"float"`` (float I/O tensors around an int8 graph) or ``"int8"``
    (integer-only, for Coral / microcontrollers). ``input_shapes`` ({input name: shape}) fixes an ONNX model's
    dynamic input dimensions; without it they are fixed from the first calibration sample, and the bundle
    records the fixed shapes (``source.input_shapes_from`` says which). ``quiet_toolchains`` hides the converters' own console output (replayed on failure).
    Each target's artifacts are opened in their engine and run on one calibration sample as soon as they are built.
    A target that fails (conversion, quantization, or that check) does not stop the others: the bundle is written
    with the targets that worked, its manifest's ``build`` section records each target's status, full error and the
    converter's last output lines, and :class:`TargetsFailed` is raised afterwards naming each failed target with its
    full error (``bundle`` set); when no target worked nothing is written and ``TargetsFailed.bundle`` is None.
    Raises :class:`ValidationFailed` (after writing the bundle, with ``passed: false``
    recorded) when an INT8 artifact loses more than ``max_drop`` points against its float
    reference, or a float artifact's top-1 disagrees with the golden float reference (another
    engine's conversion of the same source) on more than ``max_drop`` points of the samples, or an INT8 artifact's
    max-abs error against the golden float outputs exceeds ``max_error_cap`` times their range (saturating integer
    kernels, a broken conversion); that cap also bounds the golden tolerance a device checks the artifact against.
    """
    phases = Phases()
    opts = (options or QuantizeOptions()).merged(**shortcuts)
    targets, samples, val_samples, seed = opts.targets, opts.samples, opts.val_samples, opts.seed
    max_drop, max_error_cap, progress = opts.max_drop, opts.max_error_cap, opts.progress
    say = log or (lambda msg: print(msg, file=sys.stderr) if progress else None)
    bar = _progress_bar(progress)
    out = _check_output(Path(out), opts.overwrite, [source, calib, val])

    src = open_source(source, example_input)
    if opts.input_shapes:  # before the routes are checked: folding and the importers need the fixed shapes
        src.set_input_shapes(dict(opts.input_shapes))
    if opts.fixed_inputs:
        src.fix_inputs(opts.fixed_inputs)
    wanted = list(targets) if targets is not None else src.default_targets(say)
    if not wanted:
        raise ConversionError("no targets asked for")
    src.check_targets(wanted)
    task = choose_task(opts.task, src)
    if opts.metric is not None:
        load_metric(opts.metric)  # a missing plug-in fails before any work
    for note in src.notes:  # what was done to the model on the way (an opset upgrade, a signature added)
        say(note)
    target_options = {"tflite": {"io": opts.tflite_io}}
    pre = _preprocess(preprocess)
    label_names = _labels(labels)
    phases.end("source")

    _check_state_names(opts.state, src)
    calib_ds = calibration.read_dataset(calib, src.inputs, pre, label_names, "calibration")
    src.fix_shapes(calib_ds.load(0))
    calib_ds.inputs = src.inputs  # later samples are checked against the fixed shapes
    picked, rest = calibration.draw(calib_ds, samples, seed)
    if len(calib_ds) < samples:
        raise CalibrationError(
            f"calibration data {calib_ds.origin} has {len(calib_ds)} samples; {samples} were asked for (lower --samples)"
        )
    if val is None:
        if not rest:
            raise CalibrationError(
                f"calibration data {calib_ds.origin} has {len(calib_ds)} samples, all used for calibration: nothing is "
                "left to validate on; pass --val or lower --samples"
            )
        val_ds = calib_ds.subset(rest)
        val_origin = f"held-out split of {calib_ds.origin}"
    else:
        val_ds = calibration.read_dataset(val, src.inputs, pre, label_names or calib_ds.label_names, "validation")
        val_origin = val_ds.origin
    if val_samples is not None and len(val_ds) > val_samples:
        val_ds = val_ds.subset(calibration.draw(val_ds, val_samples, seed + 1)[0])

    say(f"calibration: {len(picked)} of {calib_ds.origin} (seed {seed})")
    calib_samples = calibration.materialize(calib_ds.subset(picked), bar("loading calibration data"))
    names = calib_ds.label_names or label_names
    _check_label_text(names)
    phases.end("calibration_data")

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        built: list[Built] = []
        # target -> its manifest "build" entry; a route the source cannot take, skipped up front, says why too
        build: dict[str, dict] = {t: {"status": "refused", "error": src.unsupported(t), "log_tail": []}
                                  for t in (src.targets if targets is None else ()) if t not in wanted}
        failed: dict[str, str] = {}  # target -> full error text
        for target in wanted:
            say(f"[{target}] building float and INT8 artifacts for {TARGET_ENGINES[target]}")
            target_dir = work / target
            target_dir.mkdir()
            made, failed_with, tail = _build_target(target, src, calib_samples, target_dir, opts.quiet_toolchains, bar,
                                                    target_options.get(target, {}))
            built += made
            build[target] = {"status": "failed" if failed_with else "built", "error": _capped(failed_with),
                             "log_tail": tail, "seconds": round(phases.end("target", target=target), 2)}
            if failed_with:
                failed[target] = failed_with
                say(f"[{target}] FAILED, the other targets go on: {failed_with.splitlines()[0]}")
        if not built:
            raise TargetsFailed(f"no target could be built; nothing was written to {out}:\n{_failures(failed)}",
                                failed)

        say(f"validation: {len(val_ds)} samples ({val_origin})")
        checked = dict(max_drop=max_drop, error_cap=max_error_cap, task=task, metric=opts.metric,
                       output_names=[s.name for s in src.outputs], image_size=pre.size if pre is not None else None)
        reference = Reference(src, pre, task, say, calib_samples)
        reference.add_inputs(calib_samples)
        metrics, golden = validate(built, val_ds, progress=bar("validating"), observe=reference.observe, **checked)
        phases.end("validation")
        recoveries, budget = recover_bundle(
            built, metrics, opts.recover, src, calib_samples, target_options,
            lambda pair: validate(pair, val_ds, **checked)[0][pair[0].id], out.parent, GOLDEN_ORDER,
            opts.recover_time, say)
        if opts.recover != "off":
            phases.end("recovery")
        if any(r.status == "recovered" for r in recoveries.values()):  # artifacts replaced: judge the bundle again
            say(f"validation of the recovered artifacts: {len(val_ds)} samples")
            metrics, golden = validate(built, val_ds, progress=bar("validating"), **checked)
            phases.end("revalidation")
        for aid, rec in recoveries.items():
            if rec.after is None and rec.status == "recovered":
                rec.after = metrics[aid]
            next(b for b in built if b.id == aid).recovery = rec.as_dict()
        manifest = build_manifest(src, pre, names, built, work, calib_samples, calib_ds, picked, seed, metrics, golden,
                             val_origin, opts.name or _default_name(src), opts.version, opts.state, task)
        manifest["build"] = build
        monitoring = reference.section(softmax=not golden["probabilities"], calibration=len(calib_samples))
        if monitoring is not None:
            manifest["monitoring"] = monitoring
        phases.end("writing")
        manifest["timing"] = phases.as_dict() | ({"recovery_budget": budget.as_dict()} if budget else {})
        say("; ".join(line.strip() for line in timing_report(manifest)))
        write_manifest(work, manifest)
        publish_dir(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    Bundle.open(out)  # re-read what was written: checksums and schema
    failing = failing_artifacts(manifest)
    invalid = ""
    if failing:
        capped = [a for a in failing if manifest["validation"][a].get("max_abs_error_cap_exceeded")]
        why = f"max drop {_drop_text(manifest, failing)}" + (f"; {', '.join(capped)} off the float outputs by more than "
                                                f"max_error_cap={max_error_cap} of their range" if capped else "")
        invalid = (f"validation failed for {', '.join(failing)} ({why}); bundle written to {out} "
                   f"with passed=false\n{validation_table(manifest)}")
    if failed:
        kept = [t for t in wanted if t not in failed]
        raise TargetsFailed(
            f"{len(failed)} of {len(wanted)} targets failed ({', '.join(failed)}); bundle written to {out} with "
            f"{', '.join(kept)} only (its manifest's build section keeps each error):\n{_failures(failed)}"
            + (f"\n{invalid}" if invalid else ""),
            failed, str(out), failing,
        )
    if failing:
        raise ValidationFailed(invalid, failing, str(out))
    return QuantizeResult(out, manifest)


class Phases:
    """The seconds of each phase of a quantize run, one after the other from the run's start (the manifest's
    ``timing``): each phase ends where the next begins, so together they make the run's time up to the manifest."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.rows: list[dict] = []

    def end(self, phase: str, **about: str) -> float:
        """Close ``phase`` (``about``: which target) now; returns its seconds."""
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.rows.append({"phase": phase, **about, "seconds": round(seconds, 2)})
        return seconds

    def as_dict(self) -> dict:
        return {"seconds": round(self.last - self.started, 2), "phases": list(self.rows)}


def _build_target(target, src, calib_samples, target_dir: Path, quiet: bool, bar, options: dict
                  ) -> tuple[list[Built], str | None, list[str]]:
    """Build one target and check that each artifact opens in its engine (as validation and the device open it) and
    runs one calibration sample. Returns (artifacts, None, []) or, when anything failed, ([], the full error, the
    converter's last output lines): a failure is never raised, so the other targets are still built."""
    with captured(quiet) as console:
        try:
            made = builder(target)(src, calib_samples, target_dir, bar(f"[{target}] calibrating", console), **options)
            for b in made:
                engine = open_for_validation(b)
                try:
                    run_sample(engine, calib_samples[0])  # each input in its own dtype (int64 sr)
                finally:
                    engine.close()
        except Exception as exc:  # the converters raise every kind; the error is kept whole and raised at the end
            error, tail = _error_text(exc), _converter_tail() if quiet else []
        else:
            return made, None, []
    if tail:  # as captured() replays a failure's output: the cause may only be in the converter's own lines
        print(f"--- [{target}] last lines of the converter's output ---", *tail, "---", sep="\n", file=sys.stderr)
    shutil.rmtree(target_dir, ignore_errors=True)
    return [], error, tail


def _error_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, then each chained cause whose text it does not already hold: an engine error's
    one-line summary keeps the engine's whole message only in its cause."""
    lines = [f"{type(exc).__name__}: {str(exc).strip()}"]
    seen = {id(exc)}
    cause = _cause(exc)
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause).strip()
        if text and not any(text in line for line in lines):
            lines.append(f"caused by {type(cause).__name__}: {text}")
        cause = _cause(cause)
    return "\n".join(lines)


def _cause(exc: BaseException) -> BaseException | None:
    return exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)


def _converter_tail(lines: int = TAIL_LINES, window: int = 1 << 16) -> list[str]:
    """The last ``lines`` lines the converters printed, each at most :data:`MAX_LOG_LINE_CHARS` characters. Call it
    inside ``captured(True)``: fds 1 and 2 then point at the file that holds their output."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        info = os.fstat(1)
        if not stat.S_ISREG(info.st_mode):
            return []
        start = max(0, info.st_size - window)
        data = os.pread(1, info.st_size - start, start)
    except OSError:
        return []
    tail = data.decode("utf-8", "replace").splitlines()[-lines:]
    return [line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS] + " ..." for line in tail]


def _capped(error: str | None) -> str | None:
    if error is None or len(error) <= MAX_ERROR_CHARS:
        return error
    half = MAX_ERROR_CHARS // 2
    return f"{error[:half]}\n... ({len(error) - 2 * half} characters left out) ...\n{error[-half:]}"


def _failures(failed: dict[str, str]) -> str:
    return "\n".join(f"[{target}] {error}" for target, error in failed.items())


def _check_state_names(state: dict[str, str] | None, src) -> None:
    """Before any work: every ``state`` pair names an output and an input the source has."""
    if not state:
        return
    outs, ins = [s.name for s in src.outputs], [s.name for s in src.inputs]
    for out_name, in_name in state.items():
        if out_name not in outs:
            raise ConversionError(f"state names output {out_name!r}, which {src.name} does not have (outputs: "
                                  f"{', '.join(outs)})")
        if in_name not in ins:
            raise ConversionError(f"state feeds input {in_name!r}, which {src.name} does not have (inputs: "
                                  f"{', '.join(ins)})")


def _drop_text(manifest: dict, failing: list[str]) -> str:
    """The gate each failing artifact missed, in its metric's unit ("10.0 points of mask_iou")."""
    gates: dict[str, list[str]] = {}
    for entry in (manifest["validation"][a] for a in failing):
        limit = entry.get("max_drop", entry.get("max_drop_points"))
        metric = str(entry.get("metric") or entry.get("gate"))
        gates.setdefault(f"{limit} {entry.get('drop_unit') or 'points'}", [])
        if metric not in gates[f"{limit} {entry.get('drop_unit') or 'points'}"]:
            gates[f"{limit} {entry.get('drop_unit') or 'points'}"].append(metric)
    return "; ".join(f"{limit} of {', '.join(metrics)}" for limit, metrics in gates.items())


def _check_output(out: Path, overwrite: bool, inputs: list) -> Path:
    """Refuse an output that would destroy anything but an old bundle (``--force`` replaces only bundles)."""
    out = out.resolve()
    for item in inputs:
        if isinstance(item, (str, Path)) and Path(item).resolve().is_relative_to(out):
            raise ConversionError(f"output {out} holds the input {item}; write the bundle elsewhere")
    check_replaceable(out, overwrite, MANIFEST, "a bundle", "pass overwrite=True / --force")
    return out


def _default_name(src) -> str:
    return Path(src.name).stem if src.path else src.name


def _preprocess(pre) -> Preprocess | None:
    if pre is None or isinstance(pre, Preprocess):
        return pre
    if isinstance(pre, dict):
        return Preprocess.from_dict(pre)
    return Preprocess.from_toml(pre)


def _labels(labels) -> list[str] | None:
    if labels is None or isinstance(labels, list):
        return labels
    from edgesdk.settings_file import read_text

    try:  # a regular file (a FIFO would block), its size capped
        text = read_text(labels, "labels")
    except InputError as exc:
        raise CalibrationError(str(exc)) from exc
    return [line.strip() for line in text.splitlines() if line.strip()]


def _check_label_text(names: list[str] | None) -> None:
    """Labels are written into the manifest and printed by devices: one line of printable text each (the bundle
    reader refuses anything else, so a bundle with such a label would be written and then refused)."""
    for i, name in enumerate(names or []):
        if not isinstance(name, str) or not name.isprintable():
            raise CalibrationError(f"label {i} {name!r} must be one line of printable text (no control characters "
                                   "or line breaks): labels are written into the manifest and shown on devices")


def _progress_bar(enabled: bool):
    """``bar(desc, stream)`` -> a function wrapping an iterable so that each pass over it shows a bar."""

    def make(desc: str, stream=None):
        if not enabled:
            return lambda it: it
        from tqdm import tqdm

        class Progress:
            # Re-iterable: toolchains may pass over the calibration data more than once.
            def __init__(self, items):
                self.items = items

            def __len__(self):
                return len(self.items)

            def __iter__(self):
                # position=0: the toolchains run hidden bars of their own, which would push ours down a line
                return iter(tqdm(self.items, desc=desc, unit="sample", file=stream or sys.stderr, leave=False,
                                 position=0))

        return Progress

    return make
