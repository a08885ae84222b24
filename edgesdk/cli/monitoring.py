"""``edgesdk monitor FILE``: a monitor's telemetry file (:mod:`edgesdk.monitor.sink`) read back and shown, as text,
JSON (``--json``) or a plot of its series (``--plot``, matplotlib: the ``edgesdk[plot]`` extra); and what
``edgesdk run --monitor FILE`` needs: the file opened before the model loads (:func:`open_run_sink`), the options
that write a snapshot at every evaluation (:func:`run_options`), and one evaluation at the end of a run
(:func:`finish_run`).

A file that cannot be read (missing, a directory or a FIFO, not JSON, larger than ``--max-mb``) is an
:class:`~edgesdk.errors.InputError`: one line and exit 2, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from ..choices import HybridMode
from ..errors import InputError
from ._app import app

MAX_FILE_MB = 64  # --max-mb's default: a JSON-lines file is parsed whole (a few KB per snapshot)
PLOT_FORMATS = (".png", ".svg", ".pdf")  # what --plot writes, by OUT's suffix (none: .png is added)


@app.command()
def monitor(
    file: Path = typer.Argument(..., help="A telemetry file: JSON lines written by MonitorOptions(sink=FILE) or "
                                "`edgesdk run --monitor FILE`, or one snapshot saved as JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print the same report as JSON."),
    show_all: bool = typer.Option(False, "--all", help="Every feature's drift and every alert (default: the 5 "
                                  "most drifted features per group and the 50 latest alerts)."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Also draw the latency (p50, p95) and drift "
                                            "series, one point per snapshot, into this .png (or .svg, .pdf; "
                                            "without a suffix .png is added). Needs matplotlib: edgesdk[plot]."),
    max_mb: float = typer.Option(MAX_FILE_MB, "--max-mb", help="Refuse a file larger than this (MB): it is read "
                                 "whole."),
) -> None:
    """Show a monitor's telemetry: the version identity, predictions, errors by reason, latency p50/p95/p99 per
    stage, memory, each signal's level and value, drift per feature against the bundle's reference (largest
    first, reference mean vs window mean), and the alerts in time order. The figures are the latest snapshot's;
    the alerts are every run's in the file."""
    from ..bundle.report import printable
    from .telemetry import render, summarize

    if not 0 < max_mb < float("inf"):
        raise InputError(f"--max-mb must be a positive number, got {max_mb}")
    out = plot_target(plot_out) if plot_out is not None else None
    figure_class = _figure_class() if out is not None else None  # before reading: a missing extra fails fast
    records = read_telemetry(file, int(max_mb * (1 << 20)))
    report = summarize(records, file, show_all)
    if out is not None:
        report["plot"] = str(plot(records, out, figure_class))
    if as_json:
        print(json.dumps(report, indent=2))
        return
    lines = render(report)
    if out is not None:
        lines.append(f"plot: {out}")
    print("\n".join(printable(line) for line in lines))


def read_telemetry(file: Path, max_bytes: int) -> list[dict[str, Any]]:
    """:func:`edgesdk.monitor.sink.read_records`, with the errors of reading a file from outside (unreadable,
    a number beyond Python's limits, nesting too deep) as :class:`InputError`."""
    from ..monitor.sink import read_records

    if file.is_dir():
        raise InputError(f"telemetry file {file} is a directory; give the JSON-lines file the sink writes")
    try:
        return read_records(file, max_bytes=max_bytes)
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"telemetry file {file} cannot be read: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:  # int digits over the limit; nesting deeper than the parser goes
        raise InputError(f"telemetry file {file} is not a monitor's JSON: {exc}") from exc


# -- --plot -----------------------------------------------------------------------------------------------------------

def plot_target(out: Path) -> Path:
    """The file ``--plot OUT`` writes: OUT when it ends in .png, .svg or .pdf (the format follows the suffix), OUT
    with ``.png`` added when it has no suffix; refused (:class:`InputError`) for another suffix, a directory or
    something that is not a regular file, or a folder that does not exist."""
    if out.is_dir():
        raise InputError(f"--plot {out} is a directory; give a file name such as {out / 'monitor.png'}")
    if not out.suffix:
        out = out.with_name(out.name + ".png")
    elif out.suffix.lower() not in PLOT_FORMATS:
        raise InputError(f"--plot writes {', '.join(PLOT_FORMATS)} files; {out} ends in {out.suffix} (name it "
                         f"{out.name}.png for a PNG)")
    if out.exists() and not out.is_file():
        raise InputError(f"--plot {out} exists and is not a regular file")
    if not out.parent.is_dir():
        raise InputError(f"--plot {out}: the folder {out.parent} does not exist")
    return out


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend, no display needed
    except ImportError as exc:
        raise InputError("--plot needs matplotlib, which is not installed here: pip install 'edgesdk[plot]'") from exc
    return Figure


def plot(records: list[dict[str, Any]], out: Path, figure_class: Any) -> Path:
    """Two panels, one point per snapshot: the total latency's p50 and p95, and the input and output drift signals
    with the warn and alert levels as lines; written to ``out`` (see :func:`plot_target`). Returns ``out``. Values
    matplotlib cannot draw (times at the ends of the calendar in a hand-made file) are an :class:`InputError`."""
    try:
        return _plot(records, out, figure_class)
    except InputError:
        raise
    except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
        raise InputError(f"--plot cannot draw this file's series: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # matplotlib's own (units.ConversionError...)
        if type(exc).__module__.startswith("matplotlib"):
            raise InputError(f"--plot cannot draw this file's series: {type(exc).__name__}: {exc}") from exc
        raise


def _plot(records: list[dict[str, Any]], out: Path, figure_class: Any) -> Path:
    from .telemetry import series

    s = series(records)
    if not s["x"]:
        raise InputError("--plot draws one point per snapshot; the file holds none")
    fig = figure_class(figsize=(9, 6.5))
    latency, drift = fig.subplots(2, 1, sharex=True)
    marker = "o" if len(s["x"]) < 60 else None
    latency.plot(s["x"], s["p50"], marker=marker, markersize=3, label="p50")
    latency.plot(s["x"], s["p95"], marker=marker, markersize=3, label="p95")
    latency.set_ylabel("latency per prediction (ms, total)")
    latency.set_ylim(bottom=0)
    latency.legend(fontsize=8, loc="best")
    latency.grid(True, alpha=0.3)
    drift.plot(s["x"], s["input_drift"], marker=marker, markersize=3, label="input_drift")
    drift.plot(s["x"], s["output_drift"], marker=marker, markersize=3, label="output_drift")
    for level, colour in (("warn", "orange"), ("alert", "red")):
        if s[level] is not None:
            drift.axhline(s[level], color=colour, linestyle="--", linewidth=1, label=f"{level} ({s[level]:g})")
    values = [v for v in s["input_drift"] + s["output_drift"] if v == v]
    if values and s["alert"] and max(values) > 20 * s["alert"]:  # a large shift would flatten the levels' lines
        drift.set_yscale("symlog", linthresh=s["warn"] or s["alert"])
    drift.set_ylabel(f"drift signal ({s['statistic'] or 'psi'}, most drifted feature)")
    drift.set_xlabel("snapshot time (UTC)" if s["is_time"] else "snapshot")
    drift.legend(fontsize=8, loc="best")
    drift.grid(True, alpha=0.3)
    if s["is_time"]:
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        locator = AutoDateLocator()
        drift.xaxis.set_major_locator(locator)
        drift.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    fig.suptitle("edgesdk monitor")
    try:
        fig.savefig(out, dpi=110, bbox_inches="tight", format=out.suffix[1:].lower())
    except OSError as exc:
        raise InputError(f"--plot {out} cannot be written: {exc.strerror or exc}") from exc
    return out


# -- edgesdk run --monitor ----------------------------------------------------------------------------------------

class RunSink:
    """The sink of ``run --monitor PATH``: a :class:`~edgesdk.monitor.sink.JsonLinesSink` that remembers why a write
    failed (the monitor then turns it off and the run goes on), so the run can say the file is incomplete."""

    def __init__(self, path: Path):
        from ..monitor.sink import JsonLinesSink

        self.path = path
        self.failure: str | None = None
        self._sink = JsonLinesSink(path)  # refuses a directory, a FIFO (which would block), a folder it cannot write

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._sink.write(record)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            raise

    def close(self) -> None:
        self._sink.close()


def open_run_sink(path: Path, mode: str) -> RunSink:
    """The sink of ``run --monitor PATH``, opened (for appending, its folder made) before the model loads and before
    any prediction: a path that cannot be written is refused here (:class:`InputError`, exit 2), not found out
    after the answers."""
    if mode == HybridMode.CLOUD_ONLY:
        raise InputError("--monitor watches the device model; --mode cloud-only loads none")
    return RunSink(path)


def run_options(sink: Any) -> Any:
    """MonitorOptions for a CLI run: the defaults, with a snapshot written at every evaluation (every 50 predictions
    once 300 are in) rather than once a minute, so that even a run of seconds leaves its series."""
    from ..monitor import MonitorOptions

    return MonitorOptions(sink=sink, sink_every_s=0)


def finish_run(watched: Any) -> dict[str, Any]:
    """At the end of a run, before the model closes (which writes the last snapshot): evaluate once more unless the
    last prediction was just evaluated, so that a run shorter than ``min_window`` still has its drift figures and the
    last predictions of a longer one count. One evaluation does not move a level (``rise`` in a row do). Returns the
    signals (``{name: {"level", "value", "feature"}}``); monitoring never fails a run, so an error here is said on
    stderr and the answers still print."""
    import logging

    try:
        opts = watched.options
        seen = watched.snapshot()["predictions"]
        if seen and not (seen >= opts.min_window and seen % opts.every == 0):
            watched.evaluate()
        return {name: {k: s[k] for k in ("level", "value", "feature")}
                for name, s in watched.snapshot()["signals"].items()}
    except Exception:  # the answers matter more than the telemetry
        logging.getLogger("edgesdk.monitor").exception("monitor: the run's last evaluation failed")
        return {}


def run_summary(sink: RunSink, signals: dict[str, Any]) -> dict[str, Any]:
    """``run --json``'s ``monitor`` entry: the file, the signals at the end, and why writing failed (None: it
    did not)."""
    return {"file": str(sink.path), "signals": signals, "error": sink.failure}


def run_line(sink: RunSink, signals: dict[str, Any]) -> str:
    """The last line of a ``run --monitor``: the signals at the end and where the telemetry went."""
    levels = ", ".join(f"{name} {s['level']}" + (f" ({s['value']:.4g})" if s["value"] is not None else "")
                       for name, s in signals.items())
    where = (f"writing {sink.path} failed ({sink.failure}); it holds the telemetry up to then" if sink.failure else
             f"telemetry appended to {sink.path} (edgesdk monitor {sink.path})")
    return f"monitor: {levels or 'no signal'}; {where}"


__all__ = ["monitor", "read_telemetry", "plot_target", "plot", "RunSink", "open_run_sink", "run_options",
           "finish_run", "run_summary", "run_line", "MAX_FILE_MB", "PLOT_FORMATS"]
