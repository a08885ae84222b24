"""Platform profiles: what to try on a device family, in what order, and its thermal and memory defaults.

A profile is a TOML file in the repository's ``platforms/`` folder, shipped in the wheel as
``edgesdk/_platforms``; its keys are documented in ``platforms/README.md``. :func:`load_profile` takes one
by name or path and :func:`detect_profile` picks the one for this machine from the device tree,
``/proc/cpuinfo``, Android's ``build.prop`` and the installed packages. Detection never imports an
engine: a caller that has asked the engines passes their ONNX Runtime providers and OpenVINO devices,
and match keys that need them are otherwise unsatisfied.

Every field is checked when a file is read; a bad one raises :class:`~edgesdk.errors.InputError` naming
the file and the key.
"""

from __future__ import annotations

import copy
import importlib.metadata as md
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ..bundle.reader import ENGINES, PRECISIONS
from ..engines.base import KINDS
from ..errors import InputError
from ..tomlfile import read_toml

_PACKAGE = Path(__file__).resolve().parent.parent  # edgesdk/, which holds _platforms
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")

_REQUIRED = ("name", "description", "engines", "devices", "precisions")
_TOP_KEYS = (*_REQUIRED, "threads", "match", "thermal", "memory")
# Match conditions, in the order reasons are reported. A list holds when any one entry does; a profile
# matches when every condition it sets holds.
_CONDITIONS = ("device_tree_model", "cpuinfo", "android", "arch", "python_packages", "ort_providers",
               "openvino_devices")
_MATCH_KEYS = (*_CONDITIONS, "any_of", "priority")
_THERMAL_KEYS = ("warm_c", "hot_c", "critical_c")
_MEMORY_KEYS = ("budget_mb",)
# platform.machine() spells the same architecture differently per OS (Windows AMD64/ARM64, macOS arm64).
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_GENERIC = {"x86_64": "generic-x86_64-linux", "aarch64": "generic-arm64-linux"}


@dataclass(frozen=True)
class Profile:
    """One device family's preferences and defaults, as read from its TOML file.

    ``engines``, ``devices`` and ``precisions`` are what to try, most preferred first; ``threads`` is
    the CPU threads per inference (None: the engine's default). ``thermal`` holds ``warm_c``, ``hot_c``
    and ``critical_c`` in degrees C, ``memory`` holds ``budget_mb``; either is empty when the file
    leaves it out. ``match`` is the file's ``[match]`` table without ``priority``.
    """

    name: str
    description: str
    engines: tuple[str, ...]
    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    threads: int | None
    thermal: dict
    memory: dict
    match: dict
    priority: int
    source: Path

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "engines": list(self.engines),
                "devices": list(self.devices), "precisions": list(self.precisions), "threads": self.threads,
                "thermal": dict(self.thermal), "memory": dict(self.memory), "match": copy.deepcopy(self.match),
                "priority": self.priority, "source": str(self.source)}


def profiles_dir() -> Path:
    """Where the shipped profiles are: ``edgesdk/_platforms`` in a wheel, else the checkout's ``platforms/``."""
    shipped = _PACKAGE / "_platforms"  # in a checkout, a symlink to ../platforms
    return shipped.resolve() if shipped.is_dir() else _PACKAGE.parent / "platforms"


def list_profiles() -> list[Profile]:
    """Every shipped profile, by name; a broken file raises :class:`InputError` rather than being skipped."""
    return [_read(path) for path in sorted(profiles_dir().glob("*.toml"))]


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (``"raspberry-pi-5"``), or any profile file by path."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(name_or_path)
        if not path.is_file():
            raise InputError(f"platform profile file {path} does not exist")
        return _read(path)
    path = profiles_dir() / f"{text}.toml"
    if not _NAME.fullmatch(text) or not path.is_file():
        known = ", ".join(p.stem for p in sorted(profiles_dir().glob("*.toml"))) or "none"
        raise InputError(f"unknown platform profile {text!r} (known: {known})")
    return _read(path)


# -- reading and checking a file -----------------------------------------------------------------------

def _read(path: Path) -> Profile:
    return _parse(path, read_toml(path, "platform profile"))


class _Fields:
    """Checks the keys of one table of one file; every failure names the file and the key."""

    def __init__(self, path: Path, table: dict, prefix: str = ""):
        self.path, self.table, self.prefix = path, table, prefix

    def fail(self, key: str, problem: str) -> NoReturn:
        raise InputError(f"platform profile {self.path}: key '{self.prefix}{key}': {problem}")

    def only(self, known: tuple[str, ...]) -> None:
        for key in self.table:
            if key not in known:
                self.fail(key, f"unknown key (known: {', '.join(known)})")

    def require(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key not in self.table:
                self.fail(key, "missing")

    def table_at(self, key: str) -> "_Fields":
        value = self.table.get(key, {})
        if not isinstance(value, dict):
            self.fail(key, f"must be a table ([{self.prefix}{key}]), got {_type(value)}")
        return _Fields(self.path, value, f"{self.prefix}{key}.")

    def text(self, key: str) -> str:
        value = self.table[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"must be a non-empty string, got {_type(value)}")
        return value

    def names(self, key: str, known: tuple[str, ...] | None = None, what: str = "value",
              empty: bool = False) -> tuple[str, ...]:
        value = self.table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(key, f"must be a list of non-empty strings, got {value!r}")
        if not value and not empty:
            self.fail(key, "must not be empty")
        for v in value:
            if known is not None and v not in known:
                self.fail(key, f"unknown {what} {v!r} (known: {', '.join(known)})")
            if value.count(v) > 1:
                self.fail(key, f"{v!r} is listed twice")
        return tuple(value)

    def integer(self, key: str, minimum: int | None = None) -> int | None:
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, got {_type(value)} {value!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def number(self, key: str) -> float:
        value = self.table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"must be a number, got {_type(value)} {value!r}")
        return float(value)


def _type(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value), type(value).__name__)


def _parse(path: Path, data: dict) -> Profile:
    top = _Fields(path, data)
    top.only(_TOP_KEYS)
    top.require(_REQUIRED)
    name = top.text("name")
    if name != path.stem:
        top.fail("name", f"{name!r} must be the file's name without .toml ({path.stem!r})")
    if not _NAME.fullmatch(name):
        top.fail("name", f"{name!r} must be lowercase letters, digits, '.', '_' and '-'")

    thermal_fields = top.table_at("thermal")
    thermal_fields.only(_THERMAL_KEYS)
    thermal = {}
    if thermal_fields.table:
        thermal_fields.require(_THERMAL_KEYS)
        thermal = {key: thermal_fields.number(key) for key in _THERMAL_KEYS}
        if not thermal["warm_c"] < thermal["hot_c"] < thermal["critical_c"]:
            thermal_fields.fail("warm_c", "thermal limits must rise: warm_c < hot_c < critical_c, got "
                                f"{thermal['warm_c']} / {thermal['hot_c']} / {thermal['critical_c']}")

    memory_fields = top.table_at("memory")
    memory_fields.only(_MEMORY_KEYS)
    memory = {}
    if memory_fields.table:
        memory_fields.require(_MEMORY_KEYS)
        memory = {"budget_mb": memory_fields.integer("budget_mb", minimum=1)}

    match_fields = top.table_at("match")
    match_fields.only(_MATCH_KEYS)
    priority = match_fields.integer("priority") or 0
    match = _conditions(match_fields)
    alternatives = match_fields.table.get("any_of", [])
    if not isinstance(alternatives, list) or not all(isinstance(a, dict) for a in alternatives):
        match_fields.fail("any_of", "must be an array of tables ([[match.any_of]])")
    if alternatives:
        match["any_of"] = []
        for i, alternative in enumerate(alternatives):
            fields = _Fields(path, alternative, f"match.any_of[{i}].")
            fields.only(_CONDITIONS)
            conditions = _conditions(fields)
            if not conditions:
                match_fields.fail(f"any_of[{i}]", f"sets no condition (conditions: {', '.join(_CONDITIONS)})")
            match["any_of"].append(conditions)

    return Profile(name=name, description=top.text("description"),
                   engines=top.names("engines", ENGINES, "engine"),
                   devices=top.names("devices", KINDS, "device kind"),
                   precisions=top.names("precisions", PRECISIONS, "precision"),
                   threads=top.integer("threads", minimum=1), thermal=thermal, memory=memory, match=match,
                   priority=priority, source=path)


def _conditions(fields: _Fields) -> dict:
    """The conditions one table sets; empty lists count as unset."""
    found: dict[str, Any] = {}
    for key in _CONDITIONS:
        if key == "android":
            if key in fields.table:
                if not isinstance(fields.table[key], bool):
                    fields.fail(key, f"must be true or false, got {_type(fields.table[key])}")
                found[key] = fields.table[key]
            continue
        if key == "openvino_devices":
            values = fields.names(key, KINDS, "OpenVINO device kind", empty=True)
        else:
            values = fields.names(key, empty=True)
        if key == "ort_providers":
            for v in values:
                if not v.endswith("ExecutionProvider"):
                    fields.fail(key, f"{v!r} is not an ONNX Runtime provider name (they end in 'ExecutionProvider')")
        if values:
            found[key] = list(values)
    return found


# -- detection -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Machine:
    """What detection reads about the machine, once."""

    arch: str
    device_tree_model: str | None
    cpuinfo: str
    android: bool
    ort_providers: frozenset[str] | None
    openvino_kinds: frozenset[str] | None


def detect_profile(*, root: Path = Path("/"), ort_providers: set[str] | None = None,
                   openvino_devices: set[str] | None = None) -> tuple[Profile, list[str]]:
    """The shipped profile that fits this machine best, and why it matched.

    ``root`` is where ``proc/device-tree/model``, ``proc/cpuinfo`` and ``system/build.prop`` are read
    (tests point it at a fake tree; ``arch`` is ``platform.machine()``, or a fake tree's
    ``proc/sys/kernel/arch``). ``ort_providers`` are ONNX Runtime's available providers and
    ``openvino_devices`` OpenVINO's available devices (``"GPU.0"`` counts as ``GPU``); when None, match
    keys that need them are not satisfied. A profile matches when every condition it sets holds
    (profiles with no condition are only used by name); the highest ``priority`` wins, ties by name.
    When none matches, the generic profile of this architecture is returned.
    """
    machine = _survey(Path(root), ort_providers, openvino_devices)
    profiles = list_profiles()
    matches = []
    for profile in profiles:
        reasons = _matches(profile.match, machine) if profile.match else None
        if reasons is not None:
            matches.append((-profile.priority, profile.name, profile, reasons))
    if matches:
        _, _, profile, reasons = min(matches, key=lambda m: m[:2])
        return profile, reasons
    fallback = _GENERIC.get(machine.arch, _GENERIC["x86_64"])
    return load_profile(fallback), [f"no platform profile matches this machine (arch {machine.arch}); "
                                    f"{fallback} is the fallback"]


def _survey(root: Path, ort_providers, openvino_devices) -> _Machine:
    arch = platform.machine()
    if root != Path("/"):
        arch = _read_text(root / "proc/sys/kernel/arch") or arch
    model = _read_text(root / "proc/device-tree/model")
    return _Machine(
        arch=_ARCH_ALIASES.get(arch.strip().lower(), arch.strip().lower()),
        device_tree_model=model.replace("\x00", "").strip() if model else None,
        cpuinfo=_read_text(root / "proc/cpuinfo") or "",
        android=(root / "system/build.prop").is_file(),
        ort_providers=None if ort_providers is None else frozenset(ort_providers),
        openvino_kinds=None if openvino_devices is None else frozenset(d.split(".", 1)[0] for d in openvino_devices),
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _matches(match: dict, machine: _Machine) -> list[str] | None:
    """The reasons every condition of ``match`` holds, or None when one does not."""
    reasons = []
    for key, wanted in match.items():
        if key == "any_of":
            reason = next((r for r in (_matches(a, machine) for a in wanted) if r is not None), None)
        else:
            reason = _condition(key, wanted, machine)
        if reason is None:
            return None
        reasons.extend(reason)
    return reasons


def _condition(key: str, wanted, machine: _Machine) -> list[str] | None:
    """Why one condition holds (a one-item list), or None."""
    if key == "android":
        if machine.android != wanted:
            return None
        return ["Android (system/build.prop present)" if wanted else "not Android"]
    if key == "arch":
        arches = {_ARCH_ALIASES.get(a.lower(), a.lower()) for a in wanted}
        return [f"arch {machine.arch}"] if machine.arch in arches else None
    if key == "device_tree_model":
        hit = _substring(machine.device_tree_model or "", wanted)
        return [f"device-tree model {machine.device_tree_model!r} contains {hit!r}"] if hit else None
    if key == "cpuinfo":
        hit = _substring(machine.cpuinfo, wanted)
        return [f"cpuinfo contains {hit!r}"] if hit else None
    if key == "python_packages":
        hit = next((name for name in wanted if _installed(name)), None)
        return [f"python package {hit!r} installed"] if hit else None
    if key == "ort_providers":
        hits = [p for p in wanted if machine.ort_providers and p in machine.ort_providers]
        return [f"ONNX Runtime has {', '.join(hits)}"] if hits else None
    if key == "openvino_devices":
        hits = [d for d in wanted if machine.openvino_kinds and d in machine.openvino_kinds]
        return [f"OpenVINO has device {', '.join(hits)}"] if hits else None
    raise AssertionError(f"unchecked match key {key!r}")  # _parse only lets known keys through


def _substring(text: str, wanted: list[str]) -> str | None:
    """The first of ``wanted`` found in ``text``, ignoring case."""
    folded = text.casefold()
    return next((w for w in wanted if w.casefold() in folded), None)


def _installed(distribution: str) -> bool:
    try:
        md.distribution(distribution)
    except md.PackageNotFoundError:
        return False
    return True


__all__ = ["Profile", "profiles_dir", "list_profiles", "load_profile", "detect_profile"]
