"""Run a few lines in a child Python whose address space is capped just above what its imports took, with a timeout:
a regression that allocates without bound (or blocks) fails the test instead of taking the machine down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_TEMPLATE = """
import json, resource, sys
import numpy, PIL.Image, edgesdk
from edgesdk.errors import EdgeSDKError
status = open("/proc/self/status").read()
vm = int(status.split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + {headroom}, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
{body}
except EdgeSDKError as exc:
    print(json.dumps({{"error": type(exc).__name__, "message": str(exc)}}))
except BaseException as exc:
    print(json.dumps({{"crash": type(exc).__name__, "message": str(exc)[:500]}}))
else:
    print(json.dumps({{"ok": True}}))
"""


def run_bounded(body: str, headroom_mb: int = 400, timeout: float = 120.0) -> dict:
    """Run ``body`` (Python statements) in the capped child: ``{"error": type, "message"}`` for an edgesdk error,
    ``{"crash": type, "message"}`` for anything else (MemoryError...), ``{"ok": True}`` when it finished."""
    code = _TEMPLATE.format(headroom=headroom_mb << 20, body=textwrap.indent(textwrap.dedent(body).strip(), "    "))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"crash": "timeout", "message": f"no answer in {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"crash": f"exit {done.returncode}", "message": done.stderr[-2000:]}
    return json.loads(lines[-1])
