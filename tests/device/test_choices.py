"""Typed choices and reasons (edgesdk.choices): options refused where they are built, the enums still read as their
plain strings, the README's lists pinned to the enums (both ways), and no reason written as a bare string that is not
a member (or compared as one) anywhere in the packages."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from edgesdk import BackendUnavailable, BudgetExceeded, InputError, RuntimeOptions
from edgesdk.budgets.thermal import LEVELS
from edgesdk.choices import (BackendReason, BudgetAction, BudgetReason, CacheState, CloudReason, CriticalMode,
                             EscalationReason, EscalationSkip, HybridMode, InstallStep, Performance, Policy,
                             ResultSource, SpeedCheck, StoreReason, TaskType, ThermalLevel, VersionState)
from edgesdk.errors import CloudError
from edgesdk.hybrid.model import HybridOptions
from edgesdk.runtime.placement import Candidate, Placement, Skip

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CARRIERS = {"BackendUnavailable": BackendReason, "BudgetExceeded": BudgetReason, "CloudError": CloudReason,
            "escalation_reason": EscalationReason, "escalation_skipped": EscalationSkip, "StoreError": StoreReason}


# -- misuse is refused where the options are built ------------------------------------------------------------------

def test_unknown_policy_is_refused_at_construction():
    with pytest.raises(InputError, match=r"unknown policy 'fast' \(policies: auto, prefer-npu, prefer-gpu, cpu-only, "
                                         r"max-efficiency, autotune\)"):
        RuntimeOptions(policy="fast")


def test_unknown_performance_is_refused_at_construction():
    with pytest.raises(InputError, match=r"performance must be one of latency, throughput, got 'fastest'"):
        RuntimeOptions(performance="fastest")


def test_unknown_speed_check_is_refused_at_construction():
    with pytest.raises(InputError, match=r"speed_check must be one of full, precision, off, got 'quick'"):
        RuntimeOptions(speed_check="quick")


@pytest.mark.parametrize("threads", [0, 257, -1, "4", 2.0, True])
def test_bad_threads_are_refused_at_construction(threads):
    with pytest.raises(InputError, match=rf"threads must be an integer from 1 to 256, got {re.escape(repr(threads))}"):
        RuntimeOptions(threads=threads)


def test_unknown_hybrid_mode_is_refused_at_construction():
    with pytest.raises(InputError, match=r"hybrid mode must be one of device-only, cloud-only, prefer-device, "
                                         r"prefer-cloud, got 'hybrid'"):
        HybridOptions(mode="hybrid")


def test_replace_checks_again():
    """RuntimeOptions is frozen: dataclasses.replace (and so load(**overrides)) builds a new one, checked the same."""
    opts = RuntimeOptions(threads=2)
    with pytest.raises(InputError, match="unknown policy 'fast'"):
        dataclasses.replace(opts, policy="fast")
    with pytest.raises(InputError, match="threads must be"):
        dataclasses.replace(opts, threads=0)


def test_options_hold_the_members():
    opts = RuntimeOptions(policy="cpu-only", performance="throughput", speed_check="off", threads=256)
    assert opts.policy is Policy.CPU_ONLY and opts.performance is Performance.THROUGHPUT
    assert opts.speed_check is SpeedCheck.OFF
    assert RuntimeOptions(policy=Policy.AUTOTUNE).policy is Policy.AUTOTUNE
    assert RuntimeOptions().policy is Policy.AUTO and RuntimeOptions().speed_check is SpeedCheck.FULL
    assert HybridOptions(mode="prefer-cloud", cloud="http://127.0.0.1:1").mode is HybridMode.PREFER_CLOUD


# -- members read as their plain strings ----------------------------------------------------------------------------

def test_members_are_their_strings():
    reason = BackendReason.NUMERICS_MISMATCH
    assert reason == "numerics_mismatch" and "numerics_mismatch" == reason
    assert hash(reason) == hash("numerics_mismatch") and {"numerics_mismatch": 1} == {reason: 1}
    assert str(reason) == f"{reason}" == "%s" % reason == "numerics_mismatch"
    assert f"{reason:>20}" == f"{'numerics_mismatch':>20}"
    assert json.dumps({"reason": reason, reason: 1}) == '{"reason": "numerics_mismatch", "numerics_mismatch": 1}'
    assert ", ".join(Policy) == "auto, prefer-npu, prefer-gpu, cpu-only, max-efficiency, autotune"
    assert BudgetReason.MEMORY == EscalationReason.MEMORY == "memory"


def test_skip_and_placement_serialize_plain_strings():
    cand = Candidate("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-int8", "int8")
    skip = Skip(cand, "memory", "does not fit")
    assert skip.reason is BudgetReason.MEMORY
    assert json.loads(json.dumps(skip.to_dict()))["reason"] == "memory"
    placement = Placement("onnxruntime", "CPUExecutionProvider", "CPU", "onnxruntime-int8", "int8", ["CPU"], None,
                          None, {"checked": False}, RuntimeOptions().policy, None,
                          skipped=[Skip(cand, "device_missing", "no such device")])
    text = json.dumps(placement.to_dict())
    assert '"policy": "auto"' in text and '"reason": "device_missing"' in text


def test_errors_carry_members():
    assert BackendUnavailable("device_missing", "x").reason is BackendReason.DEVICE_MISSING
    assert BudgetExceeded("thermal", "x").reason is BudgetReason.THERMAL
    assert CloudError("transport_error", "x").reason is CloudReason.TRANSPORT_ERROR
    assert str(BackendUnavailable(BackendReason.RUN_FAILED, "boom")) == "run_failed: boom"
    # Choice.coerce keeps an unknown string rather than lose it, but no code path passes one: the child harnesses
    # map a child's non-member reason to their own member (see test_a_child_error_that_is_not_a_backend_reason...)
    assert BackendUnavailable("ValueError", "x").reason == "ValueError"


# -- the README's lists are the enums -------------------------------------------------------------------------------

def _section(start: str, end: str) -> str:
    begin = README.index(start)
    return README[begin:README.index(end, begin + len(start))]


def test_readme_reason_table_matches_the_enums():
    table = _section("### Reason codes", "\n## ")
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", table, re.M)
    documented = {code: set(re.findall(r"`(\w+)`", carriers)) for code, carriers in rows}
    assert len(documented) == len(rows), "a reason is listed twice"
    expected = {}
    for carrier, enum in CARRIERS.items():
        for code in enum.values():
            expected.setdefault(code, set()).add(carrier)
    assert set(documented) - set(expected) == set(), "documented reasons that are in no enum"
    assert set(expected) - set(documented) == set(), "enum reasons missing from the README table"
    assert documented == expected, "a reason's 'carried by' column differs from the enums that hold it"


def test_readme_policy_table_matches_the_enum():
    table = _section("| policy | order |", "\n\n")
    documented = [p for row in re.findall(r"^\| ([^|]+) \|", table, re.M)[2:] for p in re.findall(r"`([a-z-]+)`", row)]
    assert sorted(documented) == sorted(Policy.values())


def test_readme_hybrid_modes_and_escalation_reasons_match_the_enums():
    bullet = _section("- Modes: ", "\n- ")
    assert re.findall(r"`([a-z]+-[a-z]+)` \(", bullet) == list(HybridMode.values())
    escalations = bullet[bullet.index("`prefer-device` ("):bullet.index("; when the cloud fails")]
    assert re.findall(r"`([a-z_]+)`", escalations) == list(EscalationReason.values())


def test_readme_speed_checks_match_the_enum():
    section = _section("(`speed_check=`, CLI `--speed-check`):", "\n\n")
    assert re.findall(r'^- `"([a-z]+)"`', section, re.M) == list(SpeedCheck.values())
    assert "--speed-check " + "|".join(SpeedCheck.values()) in README
    assert "performance must be one of latency, throughput" in str(_refusal(performance="x"))


def _refusal(**options) -> InputError:
    with pytest.raises(InputError) as info:
        RuntimeOptions(**options)
    return info.value


# -- no bare reason strings in the code -----------------------------------------------------------------------------

_ERRORS = {"BackendUnavailable": (0, BackendReason), "BudgetExceeded": (0, BudgetReason),
           "CloudError": (0, CloudReason), "CloudTimeout": (0, CloudReason), "CloudUnavailable": (0, CloudReason),
           "CloudRejected": (0, CloudReason), "Skip": (1, (BackendReason, BudgetReason)),
           "StoreError": (0, StoreReason)}
_SOURCES = [ROOT / "edgesdk", ROOT / "converters" / "edgesdk_converters", ROOT / "cloud" / "edgesdk_cloud"]


def _python_files():
    for root in _SOURCES:
        if root.is_dir():
            yield from sorted(root.rglob("*.py"))


def _known(value: str, enums) -> bool:
    enums = enums if isinstance(enums, tuple) else (enums,)
    return any(e.lookup(value) is not None for e in enums)


def test_every_reason_written_in_the_code_is_a_member():
    """A reason passed as a plain string must at least be a member (a typo would otherwise ship as a new code)."""
    strays = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name not in _ERRORS:
                continue
            index, enums = _ERRORS[name]
            arg = node.args[index] if len(node.args) > index else \
                next((k.value for k in node.keywords if k.arg == "reason"), None)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not _known(arg.value, enums):
                strays.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}({arg.value!r})")
    assert strays == []


def test_no_branch_compares_a_reason_with_a_bare_string():
    """Control flow on reasons names the members (``exc.reason == BackendReason.DEVICE_MISSING``)."""
    strays = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            on_reason = any(isinstance(s, ast.Attribute) and s.attr in ("reason", "escalation_reason", "mode",
                                                                          "policy", "speed_check", "performance",
                                                                          "cache_state") for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) or
                          isinstance(s, (ast.Tuple, ast.List, ast.Set)) and
                          any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)
                          for s in sides)
            if on_reason and literal:
                strays.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert strays == []


def test_enum_module_imports_nothing_from_edgesdk():
    tree = ast.parse((ROOT / "edgesdk" / "choices.py").read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("edgesdk") or m == ""], imported


def test_every_enum_has_distinct_plain_values():
    for enum in (Policy, Performance, SpeedCheck, HybridMode, CriticalMode, BackendReason, BudgetReason, CloudReason,
                 EscalationReason, CacheState, InstallStep, VersionState, StoreReason, ThermalLevel, TaskType,
                 ResultSource, BudgetAction):
        values = enum.values()
        assert len(set(values)) == len(values) and all(v == v.strip() and v for v in values)


def test_thermal_levels_are_the_enum_in_rising_order():
    """``LEVELS`` (public, plain strings) is the enum's values, so the governor's comparisons with members hold."""
    assert LEVELS == ThermalLevel.values() == ("nominal", "warm", "hot", "critical")
    assert all(type(level) is str for level in LEVELS)
