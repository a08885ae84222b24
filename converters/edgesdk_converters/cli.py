"""The workstation's ``edgesdk`` commands: ``quantize``, ``debug`` (layer-by-layer INT8 error, :mod:`.layers`),
``demo`` (the samples, :mod:`.demo`), ``calibrate-escalation``.

The ``edgesdk`` command finds this module through the ``edgesdk.cli`` entry point of this distribution
(``edgesdk-converters``) and imports it only to run or list one of its commands. It imports the converters
(torch, nncf, litert-torch) inside each command, never at import time, so ``edgesdk --help`` stays fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from edgesdk.errors import ConversionError, TargetsFailed

app = typer.Typer(help="The workstation: quantize a float model into a validated bundle.")


def _targets(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]


def _input_shapes(values: Optional[List[str]]) -> dict[str, tuple[int, ...]]:
    """``name:1x3x48x192`` (repeatable) -> {name: (1, 3, 48, 192)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values or []:
        name, sep, dims = value.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape:
            raise typer.BadParameter(f"{value!r}: write NAME:DIMS, e.g. input:1x3x224x224", param_hint="--input-shape")
        if name in shapes:
            raise typer.BadParameter(f"input {name!r} is given twice", param_hint="--input-shape")
        shapes[name] = shape
    return shapes


def _state(values: Optional[List[str]]) -> Optional[dict[str, str]]:
    """``stateN:state`` (repeatable) -> {"stateN": "state"}: the output fed back into the input on the next call."""
    if not values:
        return None
    pairs: dict[str, str] = {}
    for value in values:
        out, sep, inp = value.partition(":")
        if not sep or not out or not inp or ":" in inp:
            raise typer.BadParameter(f"{value!r}: write OUTPUT:INPUT, e.g. stateN:state", param_hint="--state")
        if out in pairs:
            raise typer.BadParameter(f"output {out!r} is given twice", param_hint="--state")
        pairs[out] = inp
    return pairs


def _fixed_inputs(values: Optional[List[str]]) -> Optional[dict[str, float | int | bool]]:
    """``sr=16000`` (repeatable) -> {"sr": 16000}: an input the ONNX model is specialized for."""
    if not values:
        return None
    fixed: dict[str, float | int | bool] = {}
    for value in values:
        name, sep, text = value.partition("=")
        number: float | int | bool | None = {"true": True, "false": False}.get(text.lower())
        for kind in (int, float):
            if number is None:
                try:
                    number = kind(text)
                except ValueError:
                    pass
        if not sep or not name or number is None:
            raise typer.BadParameter(f"{value!r}: write NAME=VALUE, e.g. sr=16000", param_hint="--fixed-input")
        if name in fixed:
            raise typer.BadParameter(f"input {name!r} is given twice", param_hint="--fixed-input")
        fixed[name] = number
    return fixed


def _converters():
    """The workstation quantizer, imported only by the commands that need it."""
    import importlib.util

    # Fail here, with the fix, rather than mid-conversion (find_spec does not import: torch is slow to load).
    missing = [m for m in ("edgesdk_converters", "torch", "onnx", "nncf", "ai_edge_quantizer")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ConversionError(f"this command runs on the workstation and needs {', '.join(missing)} "
                              "(pip install torch==2.13.0, then pip install edgesdk-converters)")
    from edgesdk_converters.quantize import quantize

    return quantize


def _task(kind: str | None, config: Path | None, charset: Path | None) -> dict | None:
    """The task table from --task, --task-config and --charset (--task overrides the file's type)."""
    table: dict = {}
    if config is not None:  # a regular file, its size and nesting capped (edgesdk.settings_file)
        from edgesdk.settings_file import read_json
        from edgesdk.tomlfile import read_toml

        table = read_json(config, "task") if config.suffix.lower() == ".json" else read_toml(config, "task")
        table = table.get("task", table) if isinstance(table, dict) else table
        if not isinstance(table, dict):
            raise typer.BadParameter(f"{config} must hold a task table", param_hint="--task-config")
    if kind is not None:
        table = {**table, "type": kind}
    if charset is not None:
        from .task_choice import read_charset

        table = {"type": "text", **table, "charset": read_charset(charset)}
    if table and "type" not in table:
        raise typer.BadParameter("the task table has no type (set --task or type = ...)", param_hint="--task-config")
    return table or None


@app.command()
def quantize(
    source: Path = typer.Argument(..., help="Float model: .pt2 (torch.export.save), .onnx or .tflite."),
    calib: Path = typer.Option(..., "--calib", help="Calibration data: image folder (flat or one sub-folder per "
                               "class), .npy of preprocessed inputs, .npz with x (and optional y labels) or with one "
                               "array per input name (first axis: the sample), or a folder of such .npz files."),
    out: Path = typer.Option(None, "--out", "-o", help="Bundle directory to write (default: SOURCE stem + .bundle)."),
    targets: Optional[str] = typer.Option(None, "--targets", help="Comma list of tflite, openvino, onnx "
                                          "(default: every target the source allows)."),
    val: Optional[Path] = typer.Option(None, "--val", help="Validation data, same forms as --calib "
                                       "(default: a held-out split of the calibration data)."),
    preprocess: Optional[Path] = typer.Option(None, "--preprocess", help="TOML with size, color, layout, scale, "
                                              "mean, std; required for image folders."),
    labels: Optional[Path] = typer.Option(None, "--labels", help="Text file with one label per line (class index order)."),
    samples: int = typer.Option(300, "--samples", help="Calibration samples, drawn with a fixed seed, stratified by class."),
    val_samples: Optional[int] = typer.Option(None, "--val-samples", help="Cap on validation samples (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed for drawing samples."),
    max_drop: Optional[float] = typer.Option(None, "--max-drop", help="What an artifact may lose, in points of the "
                                             "gate's own metric (accuracy or top-1 agreement for classification, F1 "
                                             "for detection, mask IoU for segmentation, exact strings for text...; "
                                             "default: the task's); exit 1 when an artifact exceeds it."),
    task: Optional[str] = typer.Option(None, "--task", help="What the outputs mean: classification, detection, "
                                       "segmentation, text, landmarks, regression, probability, embedding, raw "
                                       "(default: classification for one 2-D float output, else raw). Its decoding "
                                       "parameters and output roles go in --task-config."),
    task_config: Optional[Path] = typer.Option(None, "--task-config", help="TOML or JSON file with the task table "
                                               "(type, outputs = {role = output name}, parameters; README \"Tasks\")."),
    charset: Optional[Path] = typer.Option(None, "--charset", help="Text task: file with one character per line, in "
                                           "class order after the CTC blank (default: the ONNX metadata's)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="A metric of your own, module:function, called per "
                                         "validation sample as function(outputs, reference, label, task) -> score "
                                         "in [0, 1]; its mean gates instead of the task's."),
    max_error_cap: float = typer.Option(0.10, "--max-error-cap", help="Largest max-abs error of an INT8 artifact "
                                        "against the float outputs, as a share of their range (saturating kernels "
                                        "exceed it); exit 1 beyond it. It also caps the device's golden tolerance."),
    name: Optional[str] = typer.Option(None, "--name", help="Bundle name (default: source stem)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output directory."),
    tflite_io: str = typer.Option("float", "--tflite-io", help="Input/output tensors of the INT8 tflite: 'float' "
                                  "(int8 inside, fastest on CPU/GPU/most NPUs) or 'int8' (integer-only: Coral, MCUs)."),
    input_shape: Optional[List[str]] = typer.Option(None, "--input-shape", help="Fix an ONNX input's dynamic "
                                                    "dimensions, NAME:DIMS (e.g. images:1x3x640x640); repeatable. "
                                                    "Default: the first calibration sample's shape."),
    state: Optional[List[str]] = typer.Option(None, "--state", help="A stateful model's output fed back into an "
                                              "input on the next call, OUTPUT:INPUT (e.g. stateN:state); "
                                              "repeatable. Recorded in the manifest; model.stream() carries it."),
    fixed_input: Optional[List[str]] = typer.Option(None, "--fixed-input", help="Specialize an ONNX model for one "
                                                    "input value, NAME=VALUE (e.g. sr=16000): the If branches it "
                                                    "decides are folded; the bundle keeps the input and refuses "
                                                    "another value. Repeatable."),
    recover: Optional[str] = typer.Option(None, "--recover", help="Accuracy recovery: auto (an INT8 artifact that "
                                          "fails its gate is quantized again with its most sensitive layers kept in "
                                          "float, the fewest that pass), on (also record that a passing one needed "
                                          "nothing) or off. Default: $EDGESDK_RECOVER, else auto. What was kept, "
                                          "why, and what it cost: edgesdk inspect."),
    recover_time: Optional[float] = typer.Option(None, "--recover-time", help="Seconds for all of recovery, shared "
                                                 "by the artifacts that fail (default: derived from the model, 60 s "
                                                 "under 10 MB, 60 s per GMAC above)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON instead of the table."),
) -> None:
    """Quantize a float model to INT8 for LiteRT, OpenVINO and ONNX Runtime, validate, and write a bundle.

    A target that fails is left out and the others are still built: the bundle is written with them and the command
    exits 1 naming each failed target with its full error (``edgesdk inspect`` shows it again). Exits 2 when no
    target could be built (nothing is written)."""
    run_quantize = _converters()

    out = out or source.with_name(source.stem + ".bundle")
    try:
        result = run_quantize(
            source, calib, out, targets=_targets(targets), val=val, preprocess=preprocess, labels=labels,
            samples=samples, val_samples=val_samples, seed=seed, max_drop=max_drop, max_error_cap=max_error_cap,
            name=name, overwrite=force,
            tflite_io=tflite_io, input_shapes=_input_shapes(input_shape), state=_state(state),
            fixed_inputs=_fixed_inputs(fixed_input), progress=not quiet,
            task=_task(task, task_config, charset), metric=metric, recover=recover, recover_time=recover_time,
        )
    except TargetsFailed as exc:
        if exc.bundle is None:
            raise  # nothing written: an error like any other (exit 2)
        from edgesdk.bundle.reader import Bundle
        from edgesdk.bundle.report import printable, validation_table

        print(validation_table(Bundle.open(exc.bundle).manifest))
        print(f"\nbundle written to {printable(exc.bundle)} without {', '.join(exc.failed)}")
        print("\n".join(printable(line) for line in f"error: TargetsFailed: {exc}".split("\n")), file=sys.stderr)
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(result.manifest, indent=2))
    else:
        print(result.table())
        print(f"\nbundle written to {result.bundle}")


@app.command()
def debug(
    bundle: Path = typer.Argument(..., help="A bundle written by edgesdk quantize."),
    artifact: Optional[List[str]] = typer.Option(None, "--artifact", "-a", help="An INT8 artifact id to debug "
                                                 "(repeatable; default: every INT8 artifact)."),
    val: Optional[Path] = typer.Option(None, "--val", help="Inputs to compare on, same forms as quantize --calib "
                                       "(default: the bundle's golden inputs)."),
    samples: int = typer.Option(4, "--samples", help="How many inputs to compare on."),
    top: int = typer.Option(10, "--top", help="How many of the worst layers to print per artifact."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG (or .svg, .pdf; without a suffix .png "
                                        "is added) of SNR along the network, every artifact on one chart (needs "
                                        "matplotlib). Checked before any work; the report is printed first."),
    as_json: bool = typer.Option(False, "--json", help="Print every layer's numbers as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Find where INT8 loses accuracy, layer by layer, on every engine.

    Each INT8 artifact against its engine's float artifact, its layers named by the source model's nodes so the
    engines' reports line up. Per layer: the error it adds (run alone on float inputs) and the error accumulated up
    to it (SNR in dB, cosine, max/mean |error|); the worst layers first."""
    if samples < 1 or top < 1:
        raise typer.BadParameter("--samples and --top must be at least 1")
    from .layers.debug import check_plotting, debug_bundle, plot as draw, text

    if plot is not None:  # before the (slow) work: a name that is no image, or no matplotlib, fails fast
        from edgesdk.cli.monitoring import plot_target

        plot = plot_target(plot)
        check_plotting()
    say = (lambda line: None) if quiet or as_json else (lambda line: print(line, file=sys.stderr))
    report = debug_bundle(bundle, artifact or None, val, samples, say)
    print(json.dumps(report.as_dict(top), indent=1) if as_json else text(report, top), flush=True)
    if plot is not None:  # after the report: a plot that cannot be written loses nothing else
        say(f"plot written to {draw(report, plot)}")


@app.command()
def demo(
    workdir: Path = typer.Option(Path("build/demo"), "--workdir", help="Where the samples' images and bundles go."),
    sample: str = typer.Option("all", "--sample", help="digits (a classifier), shapes (a detector: boxes drawn on "
                               "its demo images) or all, in that order."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Quantize the bundled samples to all three targets, offline, and print their validation tables: the digits
    classifier, then the shapes detector, whose demo images are predicted and drawn with their boxes."""
    from .demo import SAMPLES

    if sample != "all" and sample not in SAMPLES:
        raise typer.BadParameter(f"{sample!r}: choose {', '.join(SAMPLES)} or all", param_hint="--sample")
    _converters()  # the workstation's packages are there, or the fix is named before any work
    from .demo import run_demo

    run_demo(workdir, sample, quiet)


@app.command("calibrate-escalation")
def calibrate_escalation(
    bundle: Path = typer.Argument(..., help="The device bundle whose hybrid threshold is chosen."),
    val: Path = typer.Option(..., "--val", help="Validation data: for a classifier labelled (image folder with one "
                             "sub-folder per class, or .npz with x and y); for another task any form of --calib's, "
                             "no labels needed."),
    cloud: Optional[str] = typer.Option(None, "--cloud", help="The cloud endpoint (V2 server URL) to compare with."),
    cloud_bundle: Optional[Path] = typer.Option(None, "--cloud-bundle", help="Or: a bundle run here in the cloud's "
                                                "place."),
    target_escalation: Optional[float] = typer.Option(None, "--target-escalation", help="Best accuracy escalating "
                                                      "at most this share of inputs (e.g. 0.25)."),
    target_accuracy: Optional[float] = typer.Option(None, "--target-accuracy", help="Fewest escalations reaching "
                                                    "this hybrid accuracy (e.g. 0.99)."),
    signal: Optional[str] = typer.Option(None, "--signal", help="A classifier's max_prob, margin or entropy; a "
                                         "detector's uncertain_share or min_kept_score; a segmenter's "
                                         "uncertain_pixel_share; a text model's min_char_confidence or mean_margin; "
                                         "a regression's or probability's threshold_distance (default: the task's "
                                         "usual one)."),
    token_env: Optional[str] = typer.Option(None, "--token-env", help="Environment variable holding the cloud's "
                                            "bearer token."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Measure and print; do not write the manifest."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest entry (with the curve) as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Sweep the escalation threshold on labelled validation data against the cloud and store the chosen one (and
    the curve escalation rate -> hybrid accuracy) in the bundle's manifest. Default goal: within 0.3 points of
    cloud-only accuracy with the fewest escalations. Runs where the labels are (a workstation). A bundle of another
    task (detection, segmentation, text...) needs no labels: its "accuracy" is agreement with the cloud's answer under
    the task's own gate."""
    import importlib.util

    if importlib.util.find_spec("edgesdk_converters") is None or importlib.util.find_spec("tqdm") is None:
        raise ConversionError("calibrate-escalation runs on the workstation and needs the converters "
                              "(pip install edgesdk-converters)")
    from edgesdk_converters.escalation import calibrate_escalation as run_calibration

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr)

    entry = run_calibration(bundle, val, cloud=cloud, cloud_bundle=cloud_bundle, target_escalation=target_escalation,
                            target_accuracy=target_accuracy, signal=signal, token_env=token_env, write=not dry_run,
                            progress=not quiet, say=say)
    if as_json:
        print(json.dumps(entry, indent=2))
        return
    print(f"{'escalated':>10} {'hybrid accuracy':>16}")
    step = max(1, len(entry["curve"]) // 20)
    for p in entry["curve"][::step]:
        print(f"{p['escalation_rate']:>10.1%} {p['accuracy']:>16.2%}")
    from edgesdk.hybrid.model import HIGH_IS_HARD

    device = "device agrees with cloud" if entry.get("agreement_with") == "cloud" else "device-only"
    print(f"{device} {entry['device_accuracy']:.2%}, cloud-only {entry['cloud_accuracy']:.2%}; "
          f"{entry['signal']} {'>' if entry['signal'] in HIGH_IS_HARD else '<'} {entry['threshold']:.4f} escalates "
          f"{entry['escalation_rate']:.1%} for "
          f"{entry['hybrid_accuracy']:.2%} ({entry['chosen_by']})")
