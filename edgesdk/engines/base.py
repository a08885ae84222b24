"""The small interface every engine backend implements."""

from __future__ import annotations

import hashlib
import platform
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..choices import BackendReason, CacheState, Performance
from ..errors import BackendUnavailable, InputError
from ..lifecycle import Closeable

PERFORMANCE = tuple(Performance)

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


KINDS = ("NPU", "GPU", "CPU")


def cache_key(*parts: object) -> str:
    """A file-name-safe digest of everything a cached compile depends on (model digests, versions, options)."""
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def host_cpu() -> str:
    """This CPU's model and feature flags: optimized graphs and compiled blobs may use its instructions. (The exact
    text of the raw lines is part of the compile-cache keys: change it and every cached blob misses once.)"""
    from ..cpu import cpuinfo_lines

    lines = cpuinfo_lines(("model name", "flags", "Features", "CPU implementer", "CPU part"))
    if not lines:
        return f"{platform.system()} {platform.machine()}"
    return platform.machine() + " " + " ".join(sorted(lines.values()))


@dataclass(frozen=True)
class Device:
    """A device an engine reports: ``name`` is what the engine's ``device`` option takes."""

    engine: str
    kind: str  # NPU, GPU or CPU
    name: str  # OpenVINO "GPU.0", ORT "CUDAExecutionProvider", LiteRT "CPU"/"GPU"/"NPU"
    full_name: str = ""
    precisions: tuple[str, ...] = ()
    # False when the engine cannot list the device and only a model load can tell (LiteRT GPU/NPU).
    verified: bool = True

    def to_dict(self) -> dict:
        return {"engine": self.engine, "kind": self.kind, "name": self.name, "full_name": self.full_name,
                "precisions": list(self.precisions), "verified": self.verified}


@dataclass
class Discovery:
    """What one engine reports about this machine; ``notes`` say why an expected device is missing."""

    engine: str
    version: str | None
    devices: list[Device]
    notes: list[str]

    def to_dict(self) -> dict:
        return {"engine": self.engine, "version": self.version, "devices": [d.to_dict() for d in self.devices],
                "notes": self.notes}


class Engine(Closeable, ABC):
    """A loaded model on one engine and device.

    ``run`` takes and returns float32 arrays in the model's input/output order;
    engines whose artifact has integer I/O (fully-int8 TFLite) quantize and
    dequantize at the boundary. Not thread-safe: use one Engine per thread.
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    # Artifact engines (manifest "engine" values) this backend can run; by default its own name.
    formats: tuple[str, ...] = ()
    # Whether performance="throughput" changes anything on this engine (it overlaps inferences in run_many).
    throughput_mode: bool = False
    # How many inferences run_many keeps in flight at once (OpenVINO's optimal number of requests).
    parallel_requests: int = 1

    @classmethod
    def accepts(cls, artifact_engine: str) -> bool:
        return artifact_engine in (cls.formats or (cls.name,))

    @classmethod
    def discover(cls) -> Discovery:
        """The devices this engine can use here (no model needed)."""
        return Discovery(cls.name, None, [Device(cls.name, "CPU", "CPU")], [])

    @classmethod
    def compile_cache(cls, device: str = "CPU") -> str | None:
        """The compile cache kept in ``cache_dir`` on ``device``: "CACHE_DIR", "optimized model", or None."""
        return None

    def __init__(self, model_path: str | Path, *, device: str = "CPU", precision_hint: str | None = None,
                 num_threads: int | None = None, cache_dir: str | Path | None = None,
                 performance: str = "latency", digests: Sequence[str] = ()):
        self.model_path = Path(model_path)
        if self.suffixes and self.model_path.suffix.lower() not in self.suffixes:
            raise BackendUnavailable(BackendReason.UNSUPPORTED_ARTIFACT,
                                     f"{self.name} runs {', '.join(self.suffixes)} files, "
                                     f"not {self.model_path.name}")
        if performance not in PERFORMANCE:
            raise InputError(f"performance must be one of {', '.join(PERFORMANCE)}, got {performance!r}")
        self.device = device
        self.precision_hint = precision_hint
        self.num_threads = num_threads
        # "latency": one inference at a time as fast as it goes; "throughput": the engine may split the
        # device into parallel streams (OpenVINO's PERFORMANCE_HINT) that run_many keeps busy.
        self.performance = performance
        # The sha256 of the artifact's files, in order, already verified against the bundle's manifest.
        self.digests = tuple(digests)
        # Where the engine may keep compiled or optimized models between processes (None: no cache).
        # A cache only saves load time: a missing, stale or damaged entry is rebuilt, never served.
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # What this load did with the cache (a CacheState): None (no cache here), "hit", "stored" (built and
        # saved), "rebuilt" (a damaged entry was discarded and replaced) or "unavailable" (loaded without caching).
        self.cache_state: CacheState | None = None
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; ``feeds`` in input order (checked and converted to float32 first)."""
        return self.run_prepared(self.check_feeds(feeds))

    @abstractmethod
    def run_prepared(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        """Run one inference on feeds already checked: C-contiguous float32 of the input shapes.

        The hot path for callers that validated the input themselves (``Model.predict``).
        """

    def run_many(self, batch: Sequence[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run several inferences on feeds already checked (as for :meth:`run_prepared`), results in order.

        One after the other here; an engine that can overlap them (OpenVINO with ``performance="throughput"``)
        overrides this.
        """
        return [self.run_prepared(feeds) for feeds in batch]

    def close(self) -> None:
        """Release engine resources. Safe to call twice."""

    @property
    def effective_precision(self) -> str | None:
        """The precision the engine computes in, where it tells (e.g. OpenVINO's bf16 on AMX)."""
        return None

    @property
    def cache(self) -> str | None:
        """The compile cache this load used (see :meth:`compile_cache`); None without ``cache_dir``."""
        return self.compile_cache(self.device) if self.cache_dir is not None else None

    @property
    def executing(self) -> list[str]:
        """The devices the engine says it actually runs on (the placement proof)."""
        return [self.device]

    @property
    def fully_accelerated(self) -> bool | None:
        """Whether every op runs on the requested accelerator, where the engine tells."""
        return None

    def check_feeds(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(feeds) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InputError(f"{self.name} model takes {len(self.inputs)} input(s) ({names}); got {len(feeds)}")
        checked = []
        for spec, arr in zip(self.inputs, feeds):
            arr = np.asarray(arr)
            # -1 marks a dynamic dimension, which accepts any size
            if arr.ndim != len(spec.shape) or any(d not in (-1, a) for d, a in zip(spec.shape, arr.shape)):
                raise InputError(
                    f"{self.name} model input {spec.name!r} has shape {list(spec.shape)}; got {list(arr.shape)}"
                )
            checked.append(_as_feed(arr, spec.dtype))
        return checked


def _as_feed(arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` as the engine takes it, C-ordered (a 0-d scalar stays 0-d): integer and bool data for an int32/int64/
    bool input keeps that kind, in the input's own dtype (an int64 ``sr``, a bool mask); float16 inputs get float16;
    everything else is float32, as before (an int8/uint8/int16 input is a quantized one: it takes float data, which
    the engine quantizes)."""
    try:
        want = np.dtype(dtype)
    except (TypeError, ValueError):
        want = None
    if want in _WHOLE_INPUTS and arr.dtype.kind in "iub":
        return np.asarray(arr, dtype=want, order="C")
    if want == np.float16:
        return np.asarray(arr, dtype=np.float16, order="C")
    return np.asarray(arr, dtype=np.float32, order="C")


_WHOLE_INPUTS = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint32), np.dtype(np.uint64), np.dtype(np.bool_))
