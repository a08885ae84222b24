"""Running edgesdk code in a fresh Python process: the one harness behind ``load(isolate=True)``'s probes
(:mod:`edgesdk.runtime.isolate`) and the benchmarks' fresh processes (:mod:`edgesdk.bench.warm`, :mod:`edgesdk.bench.cold`).

Every child gets the same hygiene:

- it runs in isolated mode (``python -I``: no current directory or script directory on its path, no ``PYTHON*``
  variables, so a planted ``json.py`` in the working directory is not imported), and is handed this process's
  ``sys.path`` (this edgesdk's own folder first) explicitly, so it imports the same code;
- its environment lacks the variables whose names look like secrets (:data:`SECRET_WORDS`);
- its one answer is a JSON file it creates, exclusively and once, in a temporary directory of this process, never a
  line on stdout: an engine or a model that prints cannot forge or garble it (stdout goes nowhere);
- stdin is closed; stderr is kept for the error messages (:meth:`ChildRun.stderr_tail`).

The child's code starts after :data:`PRELUDE`, which imports ``json`` and ``sys`` only (a cold-start measurement
times the rest of the imports itself) and defines ``ARGS`` (the arguments, from JSON) and ``answer(obj)``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")  # env names with these are not passed on

PRELUDE = r"""
import json, sys
ARGS = json.loads(sys.argv[1])
sys.path[:0] = [_p for _p in ARGS["sys_path"] if _p not in sys.path]

def answer(obj):
    # "x": created once; if anything else made the file first, this raises and the child's status says so
    with open(ARGS["answer"], "x", encoding="utf-8") as f:
        json.dump(obj, f)
"""


@dataclass(frozen=True)
class ChildRun:
    """How a child ended: its exit status, its answer (None when it wrote none), its stderr, its wall time."""

    returncode: int
    answer: Any
    stderr: str
    elapsed_ms: float

    def how_it_ended(self) -> str:
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"was killed by {name}"
        if self.returncode == 0:
            return "exited without an answer" if self.answer is None else "exited normally"
        return f"exited with status {self.returncode}"

    def stderr_tail(self, lines: int = 12) -> str:
        return tail(self.stderr, lines)


def tail(text: str | bytes | None, lines: int = 12) -> str:
    """The last non-empty ``lines`` of a child's output, joined with `` | `` (at most 2000 characters)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    kept = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])[-2000:] if kept else "(empty)"


def child_env() -> dict[str, str]:
    """This process's environment without the variables whose names look like secrets."""
    return {k: v for k, v in os.environ.items() if not any(w in k.upper() for w in SECRET_WORDS)}


def run_child(code: str, args: dict[str, Any], *, timeout: float) -> ChildRun:
    """Run :data:`PRELUDE` + ``code`` in a fresh interpreter with ``args`` (JSON-able) as ``ARGS``.

    Raises :class:`subprocess.TimeoutExpired` (the child is killed; ``stderr`` holds what it wrote) and
    :class:`OSError` (the interpreter could not start): the caller says what they mean for its task.
    """
    package_root = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="edgesdk-child-") as tmp:
        answer_path = Path(tmp) / "answer.json"
        full = {**args, "answer": str(answer_path),
                "sys_path": [package_root] + [p for p in sys.path if isinstance(p, str) and p]}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-I", "-c", PRELUDE + code, json.dumps(full)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              errors="replace", timeout=timeout, env=child_env())
        elapsed_ms = (time.perf_counter() - start) * 1e3
        try:
            answer = json.loads(answer_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = None
    return ChildRun(proc.returncode, answer, proc.stderr or "", elapsed_ms)
