"""How ``edgesdk run`` prints its answers: each as soon as it comes, so that a file of many samples never has its
answers held to the end, and an answer printed is never lost to a later failure. A line of text per input
(:func:`answer_line`), or one JSON document whose ``results`` rows are written one by one (:class:`JsonAnswers`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ..choices import ResultSource
from ..errors import BackendUnavailable, BudgetExceeded, CloudError, EdgeSDKError, InputError


def _backend(placement: Any) -> str:
    return f"{placement.engine}:{placement.device}:{placement.artifact}"


def answer_line(label: str, result: Any, output_names: list[str], placement: Any, drawn: str | None) -> str:
    """The text line of one input: its answer (the task's, a classifier's top 3, or each output described) and
    where and how it ran; or why it was refused or unusable."""
    from .inputs import describe_output
    from .show import describe

    if isinstance(result, InputError):
        return f"{label}: error: {result}"
    if isinstance(result, (BudgetExceeded, CloudError, BackendUnavailable)):
        return f"{label}: refused ({result.reason}): {result.detail}"
    task_line = describe(result.decoded)
    if task_line is not None:
        answer = task_line
    elif result.top:
        answer = ", ".join(f"{t.label if t.label is not None else t.index}: {t.score:.3f}" for t in result.top[:3])
    else:  # not a classifier: say what came out (--json gives the values)
        answer = "; ".join(describe_output(name, o) for name, o in zip(output_names, result.outputs))
    if drawn is not None:
        answer += f"  (drawn: {drawn})"
    action = result.budget.get("action")
    notes = [f"{result.timings_ms.get('inference', result.timings_ms.get('cloud', 0.0)):.3f} ms"]
    if action:
        notes.append(action)
    if result.source == ResultSource.DEVICE and placement is not None \
            and _backend(result.placement) != _backend(placement):
        notes.append(f"on {_backend(result.placement)}")
    if result.escalation_reason:
        notes.append(f"escalated: {result.escalation_reason}")
    if result.degraded:
        notes.append(f"degraded: cloud {result.cloud_error}")
    return f"{label}: {answer}  [{result.source}, {', '.join(notes)}]"


def json_row(label: str, result: Any, cloud: str | None, drawn: str | None, draw_error: str | None) -> dict:
    """The ``results`` row of one input: ``Result.to_dict()`` with the input, or the refusal or error as data."""
    if isinstance(result, BudgetExceeded):
        return {"input": label, "source": None, "top": [],
                "budget": {"action": "refused", "reason": result.reason, "detail": result.detail}}
    if isinstance(result, EdgeSDKError):
        return {"input": label, "source": None, "top": [], "error": result.to_dict()}
    row = {"input": label, **result.to_dict()}
    if result.source == ResultSource.CLOUD:
        row["backend"] = cloud
    if drawn is not None:
        row["drawn"] = drawn
    if draw_error is not None:
        row["draw_error"] = draw_error
    return row


class Stdout:
    """Standard output for answers: written as they come and flushed at least every :data:`FLUSH_EVERY_S` (a pipe
    or file sees each answer within that, without a write per line when there are thousands)."""

    FLUSH_EVERY_S = 0.2

    def __init__(self) -> None:
        self._flushed = time.monotonic()

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        if time.monotonic() - self._flushed >= self.FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        sys.stdout.flush()
        self._flushed = time.monotonic()


class JsonAnswers:
    """One JSON document (indented as ``json.dumps(indent=2)``) written in three steps: the fields known before any
    answer (:meth:`__init__`), each row of ``results`` as it comes (:meth:`add`), the fields known at the end
    (:meth:`finish`)."""

    def __init__(self, head: dict[str, Any]):
        self._out, self._rows = Stdout(), 0
        self._out.write("{" + "".join(f"\n  {json.dumps(k)}: {_dumps(v, 2)}," for k, v in head.items())
                        + '\n  "results": [')

    def add(self, row: dict[str, Any]) -> None:
        self._out.write(("," if self._rows else "") + "\n    " + _dumps(row, 4))
        self._rows += 1

    def finish(self, tail: dict[str, Any]) -> None:
        self._out.write(("\n  ]" if self._rows else "]")
                        + "".join(f",\n  {json.dumps(k)}: {_dumps(v, 2)}" for k, v in tail.items()) + "\n}\n")
        self._out.flush()


def _dumps(value: Any, indent: int) -> str:
    """``value`` as indented JSON whose lines after the first are shifted right by ``indent`` spaces."""
    return json.dumps(value, indent=2, default=str).replace("\n", "\n" + " " * indent)


__all__ = ["answer_line", "json_row", "JsonAnswers", "Stdout"]
