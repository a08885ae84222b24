"""What ``edgesdk monitor FILE`` makes of a monitor's telemetry file (:mod:`edgesdk.monitor.sink`): the version
identity, the operational figures, each signal's level, drift per feature against the bundle's reference and the
alerts in time order, as plain data (:func:`summarize`, the ``--json`` output) and as text (:func:`render`); the
per-snapshot series for ``--plot`` (:func:`series`).

The sink appends, so one file may hold several runs (a run is one model's monitor, told apart by its ``started``
time): the figures are the latest snapshot's, the alerts are every run's. The file is data from outside: each value
is checked for its type as it is read (a field of the wrong type shows as missing, never as a traceback), and the
text is escaped by the command when printed.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..monitor.monitor import MIN_AGGREGATE

TOP = 5  # drift features shown per group without --all
LAST_ALERTS = 50  # alerts shown without --all (the latest)
STAGES = ("preprocess", "inference", "total")
SIGNALS = ("input_drift", "output_drift", "error_rate")
DEFAULT_MIN_WINDOW = 300  # MonitorOptions().min_window: fewer predictions than this make noisy drift figures


def summarize(records: list[dict[str, Any]], file: str | Path, show_all: bool = False) -> dict[str, Any]:
    """The report on ``records`` (from :func:`edgesdk.monitor.sink.read_records`): the latest snapshot's figures,
    the ``TOP`` most drifted features per group and the ``LAST_ALERTS`` latest alerts (every one with
    ``show_all``). Raises :class:`InputError` when no record is a monitor's."""
    snapshots = [r for r in records if r.get("type") == "snapshot" and _is_snapshot(r)]
    alerts = [_alert(r) for r in records if r.get("type") == "alert" and isinstance(r.get("signal"), str)]
    if not records:
        raise InputError(f"telemetry file {file} is empty: the monitor has written nothing to it yet")
    if not snapshots and not alerts:
        raise InputError(f"telemetry file {file} holds no monitor record (a JSON object with \"type\": \"snapshot\" "
                         f"or \"alert\", as MonitorOptions(sink=...) writes); it holds {len(records)} other record(s)")
    identities: list[dict[str, Any]] = []
    for r in [*snapshots, *alerts]:
        identity = _identity(r.get("identity"))
        if identity and identity not in identities:
            identities.append(identity)
    last = snapshots[-1] if snapshots else None
    identity = _identity(last.get("identity")) if last is not None else None
    identity = identity or (alerts[-1]["identity"] if alerts else None)
    alerts = _in_time_order(alerts)
    shown = alerts if show_all else alerts[-LAST_ALERTS:]
    report = {
        "file": str(file),
        "records": {"snapshots": len(snapshots), "alerts": len(alerts),
                    "runs": len({r.get("started") for r in snapshots if isinstance(r.get("started"), str)})},
        "identity": identity,
        "other_identities": [i for i in identities if i != identity],
        "latest": None if last is None else _operational(last),
        "signals": None if last is None else _signals(last),
        "drift": None if last is None else _drift(last, show_all),
        "alerts": [a if len(identities) > 1 else {k: v for k, v in a.items() if k != "identity"} for a in shown],
        "alerts_left_out": len(alerts) - len(shown),
    }
    return report


def render(report: dict[str, Any]) -> list[str]:
    """``report`` (:func:`summarize`) as lines of text, unescaped (the caller escapes them)."""
    rec = report["records"]
    lines = [f"telemetry: {report['file']} ({_count(rec['snapshots'], 'snapshot')}, {_count(rec['alerts'], 'alert')}"
             f", {_count(rec['runs'], 'run')})"]
    lines += _identity_lines(report["identity"])
    for other in report["other_identities"]:
        lines.append(f"  also in this file: {_identity_label(other)}")
    latest = report["latest"]
    if latest is None:
        lines.append("no snapshot yet: the monitor writes one at an evaluation (every sink_every_s seconds) and "
                     "at close")
    else:
        lines += _operational_lines(latest)
        lines += _signal_lines(report["signals"], latest["window"], report["drift"].get("floors", False))
        lines += _drift_lines(report["drift"])
    alerts = report["alerts"]
    left_out = report["alerts_left_out"]
    if not alerts:
        lines.append("alerts: none")
    else:
        lines.append(f"alerts ({len(alerts) + left_out}, in time order"
                     f"{f'; the latest {len(alerts)}, --all for every one' if left_out else ''}):")
        several = bool(report["other_identities"])
        for a in alerts:
            value = "-" if a["value"] is None else _g(a["value"])
            text = (f"  {a['time'] or '(no time)'}  {a['signal']} {a['previous'] or '?'} -> {a['level'] or '?'}  "
                    f"{a['statistic'] or ''} {value} (threshold {_g(a['threshold'])}"
                    f"{'; most: ' + a['feature'] if a['feature'] else ''})")
            if a["predictions"] is not None:
                text += f" after {a['predictions']} predictions"
            if several and a.get("identity"):
                text += f"  [{_identity_label(a['identity'])}]"
            lines.append(text)
    return lines


def series(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per snapshot, in file order: ``x`` (its time, or its number when a time does not parse), the total latency's
    p50 and p95, each drift signal's value; and the warn and alert levels of the latest snapshot."""
    snapshots = [r for r in records if r.get("type") == "snapshot" and _is_snapshot(r)]
    times = [_time(r.get("time")) for r in snapshots]
    x: list[Any] = times if all(t is not None for t in times) else list(range(1, len(snapshots) + 1))
    out: dict[str, Any] = {"x": x, "is_time": x is times, "p50": [], "p95": [], "input_drift": [],
                           "output_drift": [], "warn": None, "alert": None, "statistic": None}
    for r in snapshots:
        total = _dict(_dict(r.get("latency_ms")).get("total"))
        out["p50"].append(_nan(total.get("p50")))
        out["p95"].append(_nan(total.get("p95")))
        signals = _dict(r.get("signals"))
        for name in ("input_drift", "output_drift"):
            out[name].append(_nan(_dict(signals.get(name)).get("value")))
    if snapshots:
        drift_signal = _signals(snapshots[-1])["input_drift"]
        out.update(warn=drift_signal["warn"], alert=drift_signal["alert"], statistic=drift_signal["statistic"])
    return out


# -- reading one record ---------------------------------------------------------------------------------------------

def _is_snapshot(r: dict[str, Any]) -> bool:
    return any(k in r for k in ("predictions", "signals", "latency_ms"))


def _operational(s: dict[str, Any]) -> dict[str, Any]:
    latency = _dict(s.get("latency_ms"))
    errors = {str(k): v for k, v in _dict(s.get("errors")).items() if _int(v) is not None}
    return {
        "time": _str(s.get("time")), "started": _str(s.get("started")),
        "predictions": _int(s.get("predictions")), "calls": _int(s.get("calls")), "errors": errors,
        "window": _int(s.get("window")), "window_calls": _int(s.get("window_calls")),
        "window_errors": _int(s.get("window_errors")),
        "latency_ms": {stage: {p: _num(_dict(latency.get(stage)).get(p)) for p in ("p50", "p95", "p99")}
                       for stage in STAGES},
        "memory_mb": _num(s.get("memory_mb")),
        "placement": _str(s.get("placement")), "placement_switches": _int(s.get("placement_switches")),
        "placements_used": {str(k): v for k, v in _dict(s.get("placements_used")).items() if _int(v) is not None},
        "hybrid": {str(k): v for k, v in _dict(s.get("hybrid")).items() if _int(v) is not None},
        "escalation": _escalation(_dict(s.get("escalation"))),
        "monitor_errors": _int(s.get("monitor_errors")),
        "reference": s.get("reference") if isinstance(s.get("reference"), bool) else None,
    }


def _escalation(e: dict[str, Any]) -> dict[str, Any] | None:
    """A hybrid model's escalation budget (``snapshot()["escalation"]``, :mod:`edgesdk.hybrid.budget`)."""
    if not e:
        return None
    return {"signal": _str(e.get("signal")), "threshold": _num(e.get("threshold")),
            "target_rate": _num(e.get("target_rate")), "rate": _num(e.get("rate")), "window": _int(e.get("window")),
            "escalations": _int(e.get("escalations")), "skipped": _int(e.get("skipped"))}


def _signals(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    signals = _dict(s.get("signals"))
    return {name: {"level": _str(sig.get("level")), "value": _num(sig.get("value")),
                   "feature": _str(sig.get("feature")), "statistic": _str(sig.get("statistic")),
                   "warn": _num(sig.get("warn")), "alert": _num(sig.get("alert"))}
            for name, sig in ((n, _dict(signals.get(n))) for n in SIGNALS)}


def _drift(s: dict[str, Any], show_all: bool) -> dict[str, Any]:
    """Per group, the features by the signals' statistic above its sampling floor (``psi_floor``: what a window of
    that size drawn from the reference itself gives; 0 where the record has none), largest first (``TOP`` of them
    unless ``show_all``); each marked with the level that excess reaches (``warn``/``alert``, None below both), as the
    monitor judges a signal, though one figure is not the signal's level (that takes ``rise`` in a row)."""
    signals = _signals(s)
    stat = signals["input_drift"]["statistic"] or "psi"
    drift = _dict(s.get("drift"))
    out: dict[str, Any] = {"statistic": stat, "reference": s.get("reference") is not False, "features": {}}
    for group, signal in (("inputs", "input_drift"), ("outputs", "output_drift")):
        warn, alert = signals[signal]["warn"], signals[signal]["alert"]
        rows = []
        for feature, entry in _dict(drift.get(group)).items():
            entry = _dict(entry)
            row = {"feature": str(feature), **{k: _num(entry.get(k)) for k in ("psi", "psi_floor", "js", "js_floor")},
                   "reference_mean": _num(entry.get("reference_mean")), "mean": _num(entry.get("mean")),
                   "n": _int(entry.get("n"))}
            value = row.get(stat) if stat in ("psi", "js") else None
            row["excess"] = None if value is None else round(max(0.0, value - (row.get(f"{stat}_floor") or 0.0)), 6)
            excess = row["excess"]
            row["reaches"] = (None if excess is None else "alert" if alert is not None and excess >= alert else
                              "warn" if warn is not None and excess >= warn else None)
            rows.append(row)
        rows.sort(key=lambda r: -(r["excess"] if r["excess"] is not None else -math.inf))
        out["floors"] = out.get("floors", False) or any(r.get(f"{stat}_floor") is not None for r in rows)
        out["features"][group] = len(rows)
        out[group] = rows if show_all else rows[:TOP]
    return out


def _alert(r: dict[str, Any]) -> dict[str, Any]:
    return {"time": _str(r.get("time")), "signal": str(r.get("signal")), "level": _str(r.get("level")),
            "previous": _str(r.get("previous")), "value": _num(r.get("value")),
            "threshold": _num(r.get("threshold")), "statistic": _str(r.get("statistic")),
            "feature": _str(r.get("feature")), "predictions": _int(r.get("predictions")),
            "identity": _identity(r.get("identity"))}


def _identity(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    kept = {str(k): v for k, v in value.items() if v is None or isinstance(v, (str, int, float, bool))}
    return kept or None


def _in_time_order(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By time (stable: ties keep file order); in file order when a time does not parse."""
    times = [_time(a["time"]) for a in alerts]
    if any(t is None for t in times):
        return alerts
    return [a for _, _, a in sorted(zip(times, range(len(alerts)), alerts), key=lambda t: (t[0], t[1]))]


def _time(value: Any) -> _dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=_dt.timezone.utc)  # the monitor writes UTC


# -- text -----------------------------------------------------------------------------------------------------------

def _identity_lines(identity: dict[str, Any] | None) -> list[str]:
    if not identity:
        return ["model: unknown (the records carry no identity)"]
    i = identity
    where = ", ".join(str(v) for v in (f"{i.get('engine') or '?'} {i.get('engine_version') or ''}".strip(),
                                       i.get("device"), i.get("precision")) if v)
    return [f"model: {i.get('bundle')} version {i.get('version')} (fingerprint {i.get('fingerprint')})",
            f"  artifact {i.get('artifact')} on {where}; CPU class {i.get('cpu_class')}; edgesdk {i.get('edgesdk')}"]


def _identity_label(i: dict[str, Any]) -> str:
    return f"{i.get('bundle')} {i.get('version')} ({i.get('fingerprint')}) {i.get('artifact')}"


def _operational_lines(o: dict[str, Any]) -> list[str]:
    lines = [f"latest snapshot: {o['time'] or '(no time)'} (run started {o['started'] or '?'})"]
    window = f"; window: the last {o['window']}" if o["window"] is not None else ""
    lines.append(f"predictions: {_opt(o['predictions'])} ({_opt(o['calls'])} calls){window}")
    errors = o["errors"]
    if errors:
        by_reason = ", ".join(f"{reason} {count}" for reason, count in sorted(errors.items(), key=lambda kv: -kv[1]))
        lines.append(f"errors: {sum(errors.values())} ({by_reason}); {_opt(o['window_errors'])} of "
                     f"{_opt(o['window_calls'])} calls in the window")
    else:
        lines.append("errors: none")
    lines.append(f"latency (ms, over the window):  {'p50':>9} {'p95':>9} {'p99':>9}")
    for stage in STAGES:
        p = o["latency_ms"][stage]
        lines.append(f"  {stage:<29} {_g(p['p50']):>9} {_g(p['p95']):>9} {_g(p['p99']):>9}")
    lines.append(f"memory: {_g(o['memory_mb'])} MB (the process's resident set)")
    used = o["placements_used"]
    switches = o["placement_switches"]
    moved = (f"; {_count(switches, 'switch', 'switches')}, used: "
             + ", ".join(f"{k} {v}" for k, v in used.items())) if switches else ""
    lines.append(f"placement: {o['placement'] or '?'}{moved}")
    if o["hybrid"]:
        lines.append("hybrid: " + ", ".join(f"{k} {v}" for k, v in sorted(o["hybrid"].items())))
    e = o["escalation"]
    if e:
        target = f" (target {_g(e['target_rate'])})" if e["target_rate"] is not None else ""
        lines.append(f"escalation budget: {e['signal'] or '-'} threshold {_g(e['threshold'])}, rate {_g(e['rate'])} "
                     f"over the last {_opt(e['window'])} inputs{target}; {_opt(e['escalations'])} escalated, "
                     f"{_opt(e['skipped'])} skipped (budget)")
    if o["monitor_errors"]:
        lines.append(f"monitor: {o['monitor_errors']} predictions could not be summarized (left out of drift)")
    return lines


def _signal_lines(signals: dict[str, dict[str, Any]], window: int | None, floors: bool) -> list[str]:
    lines = ["signals (as of the last evaluation):"]
    for name, s in signals.items():
        if s["value"] is None:
            lines.append(f"  {name:<13} {s['level'] or '?':<6} not evaluated yet")
            continue
        most = f", most: {s['feature']}" if s["feature"] else ""
        above = " above its floor" if floors and name != "error_rate" else ""
        lines.append(f"  {name:<13} {s['level'] or '?':<6} {_g(s['value']):>9}  {s['statistic'] or ''}{above} "
                     f"(warn {_g(s['warn'])}, alert {_g(s['alert'])}{most})")
    if window is not None and 0 < window < DEFAULT_MIN_WINDOW and any(s["value"] is not None for s in signals.values()):
        lines.append(f"  note: the window holds {window} predictions (the monitor evaluates from "
                     f"{DEFAULT_MIN_WINDOW} by default): rough figures, and a level moves only after several "
                     "evaluations in a row")
    return lines


def _drift_lines(drift: dict[str, Any]) -> list[str]:
    if not drift["reference"]:
        return ["drift: not measured: the bundle has no reference (the manifest's monitoring section, written by "
                "quantize)"]
    if not any(drift["features"].values()):
        return [f"drift: not shown: per-feature figures come from {MIN_AGGREGATE} predictions on (fewer would "
                "describe single inputs), or no evaluation yet"]
    stat, lines = drift["statistic"], []
    for group in ("inputs", "outputs"):
        rows, total = drift[group], drift["features"][group]
        if not total:
            continue
        more = f"; the {len(rows)} largest of {total}, --all for every one" if len(rows) < total else ""
        lines.append(f"{group[:-1]} drift (against the bundle's reference, by {stat} above its sampling floor, "
                     f"largest first{more}):")
        width = max(12, *(len(r["feature"]) for r in rows))
        lines.append(f"  {'feature':<{width}} {stat:>9} {'floor':>9} {'psi' if stat == 'js' else 'js':>9} "
                     f"{'reference mean':>15} -> {'window mean':<11} {'n':>6}")
        for r in rows:
            mark = f"  {r['reaches']}" if r["reaches"] else ""
            other = r["psi" if stat == "js" else "js"]
            lines.append(f"  {r['feature']:<{width}} {_g(r[stat]):>9} {_g(r[f'{stat}_floor']):>9} {_g(other):>9} "
                         f"{_g(r['reference_mean']):>15} -> {_g(r['mean']):<11} {_opt(r['n']):>6}{mark}")
    return lines


# -- values ---------------------------------------------------------------------------------------------------------

def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return number if math.isfinite(number) else None


def _nan(value: Any) -> float:
    number = _num(value)
    return math.nan if number is None else number


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _opt(value: Any) -> str:
    return "?" if value is None else str(value)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


__all__ = ["summarize", "render", "series", "TOP", "LAST_ALERTS"]
