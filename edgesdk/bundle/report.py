"""Plain-text rendering of a bundle's manifest: the summary and the validation table.

Every value taken from a manifest goes through :func:`printable` on its way to the terminal: the schema refuses
control characters in names, ids and labels, but free-text fields (a source name, a calibration source) and
bundles checked by an older edgesdk may still hold them.
"""

from __future__ import annotations

from typing import Any

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


def validation_table(manifest: dict[str, Any]) -> str:
    validation = manifest.get("validation") or {}
    head = ("artifact", "prec", "eff.prec", "acc", "ref acc", "drop pts", "agree", "cosine", "max|err|",
            "ms", "int8/fp32", "passed")
    rows = [head]
    notes = []
    for art in manifest.get("artifacts", []):
        m = validation.get(art["id"])
        if not isinstance(m, dict):
            continue
        drop = m.get("accuracy_drop_points", m.get("agreement_drop_points", m.get("golden_agreement_drop_points")))
        rows.append(tuple(printable(cell) for cell in (
            art["id"], art["precision"], str(m.get("effective_precision") or "-"),
            _pct(m.get("accuracy")), _pct(m.get("reference_accuracy")), _num(drop, "+.2f"),
            _pct(m.get("top1_agreement", m.get("golden_agreement"))), _num(m.get("cosine_similarity"), ".5f"),
            _num(m.get("max_abs_error"), ".4g"), _num(m.get("latency_ms"), ".3f"),
            _num(m.get("latency_ratio"), ".2f"), "yes" if m.get("passed") else "NO",
        )))
        if m.get("slower_than_float"):
            notes.append(f"warning: {art['id']} is slower than its float reference "
                         f"({_num(m.get('latency_ms'), '.3f')} ms vs {_num(m.get('reference_latency_ms'), '.3f')} ms)")
        over = outputs_over_cap(manifest, m)
        if m.get("max_abs_error_cap_exceeded") and over:
            notes.append(f"FAILED: {art['id']} is off the float output(s) " + ", ".join(
                f"{name} by {_num(error, '.4g')} (cap {_num(cap, '.4g')}, a share of that output's range)"
                for name, error, cap in over) + ": an output INT8 flattens or breaks")
        elif m.get("max_abs_error_cap_exceeded"):
            notes.append(f"FAILED: {art['id']} is off the float outputs by {_num(m.get('max_abs_error_golden'), '.4g')}"
                         f", more than INT8 may be (cap {_num(m.get('max_abs_error_cap'), '.4g')}, a share of the "
                         f"outputs' range): saturating integer kernels on this CPU, or a broken conversion")
        elif not m.get("passed"):
            notes.append(f"FAILED: {art['id']} dropped {_num(drop, '.2f')} points ({m.get('gate')}); "
                         f"allowed {m.get('max_drop_points')}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    data = manifest.get("validation_data")
    machine = validation.get("machine")
    where = f"measured on {describe(machine)}" if isinstance(machine, dict) else None
    if data:
        lines.insert(0, f"validation on {data}{', ' + where if where else ''}; drop = reference minus INT8, in points; "
                        f"ms = p50 at batch 1")
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
    if manifest.get("postprocess"):
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
    lines += build_report(manifest)
    return "\n".join(printable(line) for line in lines)


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
