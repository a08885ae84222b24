"""Run Python code as on the lowest x86 class: AVX2 and FMA, no AVX-512, no VNNI, no AMX (Haswell .. AMD Zen 3).

That class multiplies u8 x s8 pairs with VPMADDUBSW, whose int16 pair sums saturate (ONNX Runtime's U8S8 kernels,
oneDNN's int8 convolutions), so an INT8 artifact exact on this VNNI/AMX machine can lose accuracy there. Tests reach
the class by emulation, one way per engine:

- ONNX Runtime (MLAS) and LiteRT (XNNPACK) choose kernels from CPUID and have no switch: the code runs under
  qemu-user with a Haswell CPU model (Debian package ``qemu-user``). TCG emulates AVX2 from QEMU 7.2; the CPU model
  ends in ``enforce``, so an older QEMU refuses to start instead of quietly running SSE kernels, and a probe checks
  that the guest sees AVX2 and no AVX-512. Integer kernels run fast enough under emulation (the digits INT8 model:
  540 inferences in under a second); float convolutions are ~50x slower, so compute float references natively.
  Only the emulated process itself runs emulated: subprocesses it starts run natively. CPUID is Haswell's but
  ``/proc/cpuinfo`` is the host's (qemu-user passes it through); ``edgesdk.cpu`` checks its flags against numpy's
  ``__cpu_features__`` (CPUID), so it reports the emulated class.
- OpenVINO's CPU plugin is built on oneDNN, which honours ``ONEDNN_MAX_CPU_ISA=AVX2``: no emulation needed, and the
  digits INT8 IR gives bit-identical outputs to a qemu Haswell run. The plugin's own checks still see the host, so on a
  host with AVX512-BF16/AMX it picks bf16 for float layers and then cannot compile them under the cap ("Supported
  primitive descriptors list is empty"): pass ``INFERENCE_PRECISION_HINT: f32`` when compiling there.

Timings taken under emulation mean nothing; only outputs do. ``benchmarks/int8_isa.py`` uses this module too.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ENGINES = ("onnxruntime", "litert", "openvino")
QEMU_NAMES = ("qemu-x86_64", "qemu-x86_64-static")  # Debian packages qemu-user, qemu-user-static
# Haswell minus the features TCG does not emulate (none of them matter to user code); enforce makes a QEMU
# without AVX2 emulation (< 7.2) fail at start.
QEMU_CPU = "Haswell,-pcid,-x2apic,-tsc-deadline,-hle,-rtm,-invpcid,enforce"
ONEDNN_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
# numpy's CPUID table: private to numpy, and the only reader of CPUID in the packages we have
_PROBE = ("from numpy._core._multiarray_umath import __cpu_features__ as f; "
          "print(int(f['AVX2']), int(f['FMA3']), int(f['AVX512F']), int(f['AVX512VNNI']))")


def unavailable(engine: str) -> str | None:
    """Why ``engine`` cannot run here as on the lowest x86 class, or None when it can."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the lowest x86 class is emulated on x86-64 hosts only (this host is {platform.machine()})"
    if engine == "openvino":
        return None
    return _qemu_unavailable()


@functools.cache
def _qemu_unavailable() -> str | None:
    qemu = _qemu()
    if qemu is None:
        return ("qemu-x86_64 is not on PATH (Debian/Ubuntu: apt-get install qemu-user); ONNX Runtime and XNNPACK have "
                "no ISA switch")
    try:
        proc = subprocess.run([qemu, "-cpu", QEMU_CPU, sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        return f"{qemu} -cpu Haswell did not start Python within 120 s"
    if proc.returncode != 0:
        version = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return (f"{version} cannot emulate a Haswell CPU (TCG has AVX2 from QEMU 7.2): "
                f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f'exit {proc.returncode}'}")
    if proc.stdout.split() != ["1", "1", "0", "0"]:
        return f"the emulated CPU does not look like Haswell (AVX2 FMA AVX512F AVX512VNNI = {proc.stdout.strip()})"
    return None


def _qemu() -> str | None:
    return next((path for path in map(shutil.which, QEMU_NAMES) if path), None)


def lowest_x86_command(engine: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` (a Python interpreter and its arguments) as on the class.

    Raises RuntimeError with the reason when this host cannot (see :func:`unavailable`).
    """
    reason = unavailable(engine)
    if reason:
        raise RuntimeError(reason)
    if engine == "openvino":
        return list(argv), {**os.environ, **ONEDNN_ISA}
    return [_qemu(), "-cpu", QEMU_CPU, *argv], dict(os.environ)


def run_lowest_x86(engine: str, code: str | None = None, *, script: str | Path | None = None, args: tuple = (),
                   timeout: float = 600, cwd: str | Path | None = None, env: dict[str, str] | None = None,
                   check: bool = True) -> subprocess.CompletedProcess:
    """Run Python ``code`` (or ``script`` with ``args``) for ``engine`` as on the lowest x86 class; text output.

    Called from a test, skips it (``pytest.skip``) with the reason when this host cannot emulate the class.
    With ``check``, a non-zero exit raises ``subprocess.CalledProcessError`` carrying stdout and stderr.
    """
    if (code is None) == (script is None):
        raise ValueError("give either code or script")
    reason = unavailable(engine)
    if reason:
        import pytest

        pytest.skip(reason)
    argv = [sys.executable, "-c", code] if code is not None else [sys.executable, str(script)]
    cmd, full_env = lowest_x86_command(engine, argv + [str(a) for a in args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**full_env, **(env or {})}, check=check)
