"""This machine's CPU class: vendor, model and the instruction-set flags that change integer kernels.

INT8 results and speed depend on them: ONNX Runtime's U8S8 kernels saturate on x86 without VNNI (AVX2, AVX-512F),
VNNI and AMX change which int8 and bf16 kernels OpenVINO runs, and whether INT8 beats float at all differs from one
class to the next. The quantizer records :func:`cpu_class` with its validation numbers; the runtime keys its
per-machine decisions on it.

Read from ``/proc/cpuinfo`` (Linux, Android); elsewhere only what :mod:`platform` says. ``/proc/cpuinfo`` describes
the host, not always this process: under emulation (qemu-user) CPUID says less than it does. numpy reads CPUID,
so where numpy's view of AVX2 / AVX-512F / AVX-512 VNNI differs, numpy's view wins and the flags numpy cannot see
(AVX-VNNI, AMX) are taken as absent. An engine may be told to use less than the CPU has (OpenVINO honours
``ONEDNN_MAX_CPU_ISA``); :func:`cpu_class` lists such caps as they are set.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

# x86 flags (as /proc/cpuinfo spells them) that decide which integer kernels an engine runs.
INTEGER_KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")
# ARM features (/proc/cpuinfo "Features") with the same role: dot product and 8-bit matrix multiply.
ARM_INTEGER_FLAGS = ("asimddp", "i8mm", "sve", "sve2")
# /proc/cpuinfo flag -> numpy's CPUID feature name (what this process can really execute).
_NUMPY_NAMES = {"avx2": "AVX2", "avx512f": "AVX512F", "avx512_vnni": "AVX512VNNI"}
# Environment variables that cap an engine's instruction set below the CPU's (recorded when set).
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA",)


@lru_cache(maxsize=4)
def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def cpuinfo_lines(wanted: tuple[str, ...], path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The raw ``key : value`` lines of ``/proc/cpuinfo`` for the ``wanted`` keys, as written (the last core's where
    cores differ), {} where the file is absent. Compile-cache keys are built from these exact lines."""
    lines: dict[str, str] = {}
    for line in _read(path).splitlines():
        key = line.split(":", 1)[0].strip()
        if key in wanted:
            lines[key] = line
    return lines


def cpuinfo_fields(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first value of each ``key : value`` line of ``/proc/cpuinfo`` (the first core's), {} where it is absent."""
    fields: dict[str, str] = {}
    for line in _read(path).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def model_name(path: str = "/proc/cpuinfo") -> str:
    fields = cpuinfo_fields(path)
    return fields.get("model name") or fields.get("Hardware") or platform.processor() or platform.machine()


def isa_class(flags: set[str], arch: str) -> str:
    """A short name for the integer-kernel class: ``x86-64 AMX``, ``x86-64 AVX-512 VNNI``, ``x86-64 AVX2+VNNI``,
    ``x86-64 AVX-512 (no VNNI)``, ``x86-64 AVX2 (no VNNI)``, ``x86-64 SSE``, ``arm64 dotprod`` ..."""
    if arch in ("x86_64", "AMD64", "i686", "x86"):
        if "amx_int8" in flags:
            return "x86-64 AMX"
        if "avx512_vnni" in flags:
            return "x86-64 AVX-512 VNNI"
        if "avx_vnni" in flags:
            return "x86-64 AVX2+VNNI"
        if "avx512f" in flags:
            return "x86-64 AVX-512 (no VNNI)"
        if "avx2" in flags:
            return "x86-64 AVX2 (no VNNI)"
        return "x86-64 SSE"
    if arch in ("aarch64", "arm64"):
        if "i8mm" in flags:
            return "arm64 i8mm"
        return "arm64 dotprod" if "asimddp" in flags else "arm64 NEON"
    return arch


def _cpuid_view(present: set[str]) -> set[str]:
    """``present`` (host flags) as this process sees the CPU: numpy's CPUID reading wins where they differ."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as seen
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as seen
        except ImportError:
            return present
    if all(bool(seen.get(name, flag in present)) == (flag in present) for flag, name in _NUMPY_NAMES.items()):
        return present
    kept = {f for f in present if f not in INTEGER_KERNEL_FLAGS}
    return kept | {flag for flag, name in _NUMPY_NAMES.items() if seen.get(name)}


def cpu_class(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """``{"arch", "vendor", "model", "cpus", "flags": {flag: bool}, "isa_class", "isa_caps"}`` for this machine."""
    fields = cpuinfo_fields(path)
    arch = platform.machine()
    present = set((fields.get("flags") or fields.get("Features") or "").split())
    if arch in ("x86_64", "AMD64") and path == "/proc/cpuinfo":
        present = _cpuid_view(present)
    wanted = ARM_INTEGER_FLAGS if arch in ("aarch64", "arm64") else INTEGER_KERNEL_FLAGS
    return {
        "arch": arch,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer") or None,
        "model": model_name(path),
        "cpus": os.cpu_count(),
        "flags": {f: f in present for f in wanted},
        "isa_class": isa_class(present, arch),
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)},
    }


def describe(cls: dict[str, Any]) -> str:
    """One line for people: ``x86-64 AVX2 (no VNNI): AMD EPYC 7B13 (2 cpus)``, with any ISA cap."""
    caps = ", ".join(f"{k}={v}" for k, v in (cls.get("isa_caps") or {}).items())
    return f"{cls.get('isa_class')}: {cls.get('model')} ({cls.get('cpus')} cpus)" + (f", capped {caps}" if caps else "")
