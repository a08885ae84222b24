"""Autotune: time the viable candidates on the golden inputs and remember the winner.

The decision is cached per (bundle fingerprint, machine, engine versions, load options) in the user cache dir
(:mod:`edgesdk.user_cache`), so the next load skips the timing; any change of the three gives a new key.
"""

from __future__ import annotations

import hashlib
import json
import platform

from ..bundle.reader import Bundle
from ..cpu import cpu_class
from ..engines import backend_names, engine_version
from ..user_cache import lookup, store

CACHE_FILE = "autotune.json"
WARMUP = 5  # what autotune times each candidate with (:func:`edgesdk.runtime.timing.run_times`): untimed runs first,
RUNS = 30  # then this many timed; the median counts


def machine_id() -> str:
    """The machine a decision was measured on: OS, CPU model and count, and the CPU's integer-kernel flags and ISA
    caps (:func:`edgesdk.cpu.cpu_class`). Whether INT8 beats float depends on those flags, and a VM's model name
    ("Intel(R) Xeon(R) Processor") does not tell CPU generations apart."""
    cls = cpu_class()
    flags = ",".join(f for f, on in cls["flags"].items() if on) or "none"
    caps = "".join(f"-{k}={v}" for k, v in sorted(cls["isa_caps"].items()))
    return f"{platform.system()}-{cls['arch']}-{cls['model']}-{cls['cpus']}cpu-{flags}{caps}"


def cache_key(bundle: Bundle, options: dict[str, str] | None = None) -> str:
    """Bundle fingerprint, machine, engine versions, and the load options that limit the choice."""
    fingerprint = sorted(f["sha256"] for f in bundle.file_entries())
    versions = {name: engine_version(name) for name in backend_names()}
    blob = json.dumps({"bundle": fingerprint, "machine": machine_id(), "engines": versions,
                       "options": options or {}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# -- probes ------------------------------------------------------------------------------------------------
# Some devices can only be found by loading a model on them (LiteRT GPU/NPU). A probe that failed is
# remembered per (machine, engine, engine version, device), so `auto` does not pay it on every load;
# a new engine version (a driver or delegate installed with it) probes again.

def _probe_key(engine: str, device: str) -> str:
    return f"{machine_id()}|{engine}|{engine_version(engine)}|{device}"


def failed_probe(engine: str, device: str) -> str | None:
    return lookup(_probe_key(engine, device), "probes.json")


def remember_failed_probe(engine: str, device: str, detail: str) -> None:
    store(_probe_key(engine, device), detail, "probes.json")
