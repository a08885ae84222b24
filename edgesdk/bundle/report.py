"""Plain-text rendering of a bundle's manifest: the summary and the validation table.

Every value taken from a manifest goes through :func:`printable` on its way to the terminal: the schema refuses
control characters in names, ids and labels, but free-text fields (a source name, a calibration source) and
bundles checked by an older edgesdk may still hold them.
"""

from __future__ import annotations

from typing import Any, Callable

from ..cpu import describe


def printable(text: Any) -> str:
    """``text`` (made a str) with every character a terminal would act on or cannot print (control characters,
    line breaks, bidi overrides, lone surrogates) written as a Python escape (``\\x1b``, ``\\u202e``, ``\\udcff``).
    One line of output: call it on a value or a line, not on text whose line breaks should stay."""
    text = str(text)
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def outputs_over_cap(manifest: dict[str, Any], entry: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(output name, max |error|, cap) of each output an artifact's validation ``entry`` records above its own cap
    (quantize's per-output INT8 check); tolerant of a hand-edited manifest."""
    names = [o.get("name") if isinstance(o, dict) else None for o in manifest.get("outputs") or []]
    return [(names[j] if j < len(names) and names[j] else f"output {j}", e["max_abs_error"], e["cap"])
            for j, e in enumerate(entry.get("output_errors") or []) if isinstance(e, dict)
            and all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
                    for k in ("max_abs_error", "cap")) and e["max_abs_error"] > e["cap"]]


def failing_artifacts(manifest: dict[str, Any]) -> list[str]:
    """Artifacts whose validation entry does not say ``passed: true`` (artifacts without an entry are not listed)."""
    validation = manifest.get("validation") or {}
    return [a["id"] for a in manifest.get("artifacts", [])
            if isinstance(validation.get(a["id"]), dict) and validation[a["id"]].get("passed") is not True]


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


# metrics that are shares in [0, 1] (shown as percentages); the others say their unit in the name
_SHARES = ("accuracy", "top1_agreement", "golden_agreement", "box_f1", "mask_iou", "exact_string_agreement",
           "map50", "miou", "text_accuracy")


def _metric(m: dict[str, Any]) -> tuple[str, Any, Any]:
    """(metric name, its value, the reference's value) of a validation entry; an entry written before tasks is a
    classifier's."""
    if isinstance(m.get("metric"), str):
        return m["metric"], m.get("metric_value"), m.get("reference_metric_value")
    if m.get("accuracy") is not None and m.get("golden_agreement") is None:
        return "accuracy", m.get("accuracy"), m.get("reference_accuracy")
    name = "golden_agreement" if m.get("golden_agreement") is not None else "top1_agreement"
    return name, m.get(name), None


def _shown(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name in _SHARES or ":" in name:  # a plug-in's score is a share too
        return _pct(value)
    if name.endswith("_px"):
        return f"{value:.3g}px"
    if name.startswith("relative_"):
        return f"{value:.2f}%"
    return f"{value:.5f}" if name == "cosine" else f"{value:.4g}"


def _drop(m: dict[str, Any]) -> tuple[Any, Any, str]:
    """(the gate's drop, its limit, its unit) of an entry: the value under its ``gate`` key first (what older
    readers and hand edits see), then ``drop``."""
    gate = m.get("gate")
    drop = m.get(gate) if isinstance(gate, str) and isinstance(m.get(gate), (int, float)) else m.get("drop")
    if drop is None:
        drop = m.get("accuracy_drop_points", m.get("agreement_drop_points", m.get("golden_agreement_drop_points")))
    unit = m.get("drop_unit") if isinstance(m.get("drop_unit"), str) else "points"
    limit = m.get("max_drop_points") if unit == "points" and m.get("max_drop_points") is not None else m.get("max_drop")
    return drop, limit, unit


def _drop_cell(drop: Any, unit: str) -> str:
    if drop is None:
        return "-"
    return f"{drop:+.2f}" if unit == "points" else f"{drop:.3g}{unit}"


def _notes(manifest: dict[str, Any], art: dict[str, Any], m: dict[str, Any]) -> list[str]:
    """Why an artifact failed (each reason), and what it should be known for (slower than float, off by more than
    the INT8 cap where its task's metric judges instead)."""
    aid, notes = art["id"], []
    if m.get("slower_than_float"):
        notes.append(f"warning: {aid} is slower than its float reference "
                     f"({_num(m.get('latency_ms'), '.3f')} ms vs {_num(m.get('reference_latency_ms'), '.3f')} ms)"
                     + (f": {m['slower_because']}" if m.get("slower_because") else ""))
    over = outputs_over_cap(manifest, m)
    if m.get("max_abs_error_cap_exceeded") and over:
        notes.append(f"FAILED: {aid} is off the float output(s) " + ", ".join(
            f"{name} by {_num(error, '.4g')} (cap {_num(cap, '.4g')}, a share of that output's range)"
            for name, error, cap in over) + ": an output INT8 flattens or breaks")
    elif m.get("max_abs_error_cap_exceeded"):
        notes.append(f"FAILED: {aid} is off the float outputs by {_num(m.get('max_abs_error_golden'), '.4g')}"
                     f", more than INT8 may be (cap {_num(m.get('max_abs_error_cap'), '.4g')}, a share of the "
                     f"outputs' range): saturating integer kernels on this CPU, or a broken conversion")
    elif m.get("max_abs_error_over_cap"):
        notes.append(f"note: {aid} is off the float outputs by {_num(m.get('max_abs_error_golden'), '.4g')}, over the "
                     f"INT8 cap (reported: its gate is {m.get('metric') or 'its task metric'}, on decoded outputs)")
    notes += _dead_notes(manifest, aid, m)
    if isinstance(m.get("task_failure"), str):
        notes.append(f"FAILED: {aid}: {m['task_failure']}")
    drop, limit, unit = _drop(m)
    name, value, ref_value = _metric(m)
    if m.get("passed") is not True and drop is not None and (limit is None or drop > limit + 1e-9):
        if unit == "points":
            said = f"{name} {_shown(name, value)}" + (f", reference {_shown(name, ref_value)}" if ref_value is not None
                                                      else "")
            notes.append(f"FAILED: {aid} dropped {_num(drop, '.2f')} points ({m.get('gate')}); allowed {limit}"
                         + (f" ({said})" if isinstance(m.get("metric"), str) else ""))
        else:
            notes.append(f"FAILED: {aid} {name} {_drop_cell(drop, unit)}, over the {_drop_cell(limit, unit)} allowed")
    if m.get("passed") is not True and not any(n.startswith(f"FAILED: {aid}") for n in notes):
        notes.append(f"FAILED: {aid} did not pass its gate ({m.get('gate') or 'not recorded'})")
    return notes


def _dead_notes(manifest: dict[str, Any], aid: str, m: dict[str, Any]) -> list[str]:
    """One line per output the dead-output check found flattened, with the two standard deviations."""
    dead = m.get("dead_output")
    if not isinstance(dead, list) or not dead:
        return []
    names = [o.get("name") if isinstance(o, dict) else None for o in manifest.get("outputs") or []]
    stds, ref_stds = m.get("output_std") or [], m.get("reference_output_std") or []
    int8 = m.get("reference") is not None
    whose, how = ("float's", "INT8 flattened it") if int8 else ("the golden float's", "the conversion flattened it")
    notes = []
    for name in dead:
        j = names.index(name) if name in names else None
        own = stds[j] if j is not None and j < len(stds) else None
        ref = ref_stds[j] if j is not None and j < len(ref_stds) else None
        notes.append(f"FAILED: {aid} output {name!r} barely varies (std {_num(own, '.2g')} vs {whose} "
                     f"{_num(ref, '.2g')}): {how}")
    return notes


def validation_table(manifest: dict[str, Any]) -> str:
    """The validation entries as a table, one row per artifact (its task's metric and value, the reference's, the
    gate's drop in its unit), then a line for each failure and warning."""
    validation = manifest.get("validation") or {}
    head = ("artifact", "prec", "eff.prec", "metric", "value", "ref", "drop", "agree", "cosine", "max|err|",
            "ms", "int8/fp32", "passed")
    rows = [head]
    notes = []
    for art in manifest.get("artifacts", []):
        m = validation.get(art["id"])
        if not isinstance(m, dict):
            continue
        name, value, ref_value = _metric(m)
        drop, _, unit = _drop(m)
        rows.append(tuple(printable(cell) for cell in (
            art["id"], art["precision"], str(m.get("effective_precision") or "-"), name or "-",
            _shown(name, value), _shown(name, ref_value), _drop_cell(drop, unit),
            _pct(m.get("top1_agreement", m.get("golden_agreement"))), _num(m.get("cosine_similarity"), ".5f"),
            _num(m.get("max_abs_error"), ".4g"), _num(m.get("latency_ms"), ".3f"),
            _num(m.get("latency_ratio"), ".2f"), "yes" if m.get("passed") else "NO",
        )))
        notes += _notes(manifest, art, m)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    data = manifest.get("validation_data")
    machine = validation.get("machine")
    where = f"measured on {describe(machine)}" if isinstance(machine, dict) else None
    if data:
        lines.insert(0, f"validation on {data}{', ' + where if where else ''}; drop = what each artifact loses "
                        f"against its reference in its gate metric (points; px for points' error); ms = p50 at batch 1")
    elif where:
        lines.insert(0, where)
    return "\n".join(printable(line) for line in lines + notes)


def summary(manifest: dict[str, Any]) -> str:
    lines = [f"bundle {manifest['name']} v{manifest['version']} (format {manifest['format_version']})"]
    src = manifest.get("source") or {}
    if src:
        lines.append(f"source: {src.get('name')} ({src.get('kind')})")
    for key in ("inputs", "outputs"):
        for t in manifest.get(key, []):
            lines.append(f"{key[:-1]}: {t.get('name')} {t.get('dtype')} {t.get('shape')}")
    if manifest.get("preprocess"):
        lines.append(f"preprocess: {manifest['preprocess']}")
    task = manifest.get("task")
    if isinstance(task, dict):
        roles = ", ".join(f"{role} = {name}" for role, name in (task.get("outputs") or {}).items())
        params = {k: v for k, v in task.items() if k not in ("type", "outputs", "charset")}
        charset = f", charset of {len(task['charset'])}" if isinstance(task.get("charset"), list) else ""
        lines.append(f"task: {task.get('type')}{' (' + roles + ')' if roles else ''}{charset}")
        if params:
            lines.append(f"  decoding: {params}")
    elif manifest.get("postprocess"):
        lines.append(f"postprocess: {manifest['postprocess']}")
    labels = manifest.get("labels")
    if labels:
        lines.append(f"labels ({len(labels)}): {', '.join(labels[:10])}{' ...' if len(labels) > 10 else ''}")
    cal = manifest.get("calibration")
    if cal:
        lines.append(f"calibration: {cal.get('samples')} samples from {cal.get('source')}, "
                     f"fingerprint {str(cal.get('fingerprint'))[:16]}...")
    lines.append("artifacts:")
    for art in manifest["artifacts"]:
        size = sum(f["bytes"] for f in art["files"])
        lines.append(f"  {art['id']:<18} {art['engine']:<12} {art['precision']:<5} {size / 1024:9.1f} KiB  "
                     f"{', '.join(f['path'] for f in art['files'])}")
        lines += recovery_report(art.get("recovery"))
    lines += build_report(manifest)
    lines += timing_report(manifest)
    return "\n".join(printable(line) for line in lines)


def recovery_report(rec: Any, shown: int = 12) -> list[str]:
    """The lines saying what accuracy recovery did to an artifact: the layers kept in float and why, the gate's
    metric and latency before and after, the share of multiply-accumulates still in INT8."""
    if not isinstance(rec, dict):
        return []

    def num(key: str, fmt: str = "{:.4g}") -> str:
        value = rec.get(key)
        return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"

    kept = rec.get("kept_float") or []
    ranged = rec.get("layer_ranges") or []
    took = num("seconds", "{:.0f}") + (f" of its {num('budget_seconds', '{:.0f}')}" if "budget_seconds" in rec else "")
    lines = [f"    recovery: {rec.get('status')} ({rec.get('mechanism', '')}), {len(kept)} layer(s) kept in float, "
             + (f"{len(ranged)} in INT8 with the other range choice, " if ranged else "") +
             f"{rec.get('metric') or 'metric'} {num('metric_before')} -> {num('metric_after')} "
             f"(drop {num('drop_before')} -> {num('drop_after')}), INT8 MACs {num('int8_mac_share_before', '{:.1%}')}"
             f" -> {num('int8_mac_share', '{:.1%}')}, p50 {num('latency_ms_before', '{:.3g}')} -> "
             f"{num('latency_ms_after', '{:.3g}')} ms, {len(rec.get('trials') or [])} trial(s) in {took} s"]
    if rec.get("note"):
        lines.append(f"      {rec['note']}")
    lines += _layer_lines(kept, shown, lambda layer: "float", "")
    lines += _layer_lines(ranged, shown, lambda layer: f"INT8, {layer.get('ranges', 'other')} ranges",
                          " in INT8 with the other ranges")
    return lines


def _layer_lines(layers: list, shown: int, label: Callable[[dict], str], what: str) -> list[str]:
    """One line per recorded layer (``label``: how it runs), the first ``shown``, then how many more."""
    lines = []
    for layer in layers[:shown]:
        if isinstance(layer, dict):
            macs = layer.get("macs") or 0
            size = f"{macs / 1e6:.2f} MMAC" if macs >= 1e5 else f"{macs} MACs"
            lines.append(f"      {label(layer)}: {layer.get('layer')} ({layer.get('op')}, {size}): "
                         f"{layer.get('reason', '')}")
    if len(layers) > shown:
        lines.append(f"      ... and {len(layers) - shown} more{what} (edgesdk inspect --json)")
    return lines


def build_report(manifest: dict[str, Any]) -> list[str]:
    """The lines saying which targets quantize built and, for each one it dropped, why: its full error and the
    converter's last output lines, one manifest line per output line (the caller escapes each)."""
    build = manifest.get("build")
    if not isinstance(build, dict) or not build:
        return []
    lines = ["build: " + ", ".join(f"{target} {entry.get('status')}" for target, entry in build.items())]
    for target, entry in build.items():
        if entry.get("status") == "refused":  # skipped before any work: the source cannot go there
            lines.append(f"  {target} refused before any work: {entry.get('error') or '(no reason recorded)'}")
            continue
        if entry.get("status") != "failed":
            continue
        lines.append(f"  {target} FAILED, left out of this bundle:")
        lines += [f"    {line}" for line in str(entry.get("error") or "(no error recorded)").splitlines()]
        tail = entry.get("log_tail") or []
        if tail:
            lines.append(f"    last {len(tail)} lines of the converter's output:")
            lines += [f"      | {line}" for line in tail]
    return lines


PHASES = {"calibration_data": "calibration data", "revalidation": "validation after recovery"}


def timing_report(manifest: dict[str, Any]) -> list[str]:
    """The lines saying how long quantize took to write the bundle, phase by phase (a target's phase: its
    conversion, calibration and load check), and what recovery's budget was."""
    timing = manifest.get("timing")
    if not isinstance(timing, dict):
        return []
    parts = []
    for row in timing.get("phases") or []:
        name = f"target {row['target']}" if row.get("target") else PHASES.get(row["phase"], row["phase"])
        parts.append(f"{name} {_num(row.get('seconds'), '.1f')}")
    lines = [f"time: {_num(timing.get('seconds'), '.1f')} s to build ({', '.join(parts)})"]
    budget = timing.get("recovery_budget")
    if isinstance(budget, dict):
        lines.append(f"  recovery budget: {_num(budget.get('seconds'), '.0f')} s ({budget.get('derived')}), "
                     f"{_num(budget.get('spent'), '.0f')} s spent")
    return lines
