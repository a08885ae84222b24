"""The bundle: a directory with ``manifest.json`` at its root and the files it lists.

Opening a bundle checks every listed file's sha256 before any engine sees it; a
missing or altered file, or a path that escapes the bundle directory (``manifest.json``
included), raises a :class:`~edgesdk.errors.BundleError` naming the file. The manifest keys are
documented in README.md ("Bundle format"). The golden file is read member by member, each
checked against the manifest from its ``.npy`` header before its data is read (:func:`read_golden`). It holds the
samples in one of two layouts (manifest ``golden.layout``): ``stacked`` (each member is ``(samples, *tensor shape)``,
exact for scalars and state tensors) or ``joined`` (the samples of batch-1 tensors joined on the batch axis: what
quantize writes when every tensor is batch-1, and what bundles from before layouts hold, with no ``layout`` key).
Both read as :class:`GoldenArrays`.
"""

from __future__ import annotations

import math
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np

from . import external_data
from . import schema as bundle_schema
from ..errors import BundleError, FailedArtifactWarning
from ..file_digest import sha256_file
from .arrays import read_exactly
from .report import outputs_over_cap

MANIFEST = "manifest.json"
MAX_GOLDEN_BYTES = 256 << 20  # the golden arrays the manifest names, decoded; a real bundle holds a few MiB at most
GOLDEN_BYTES_VAR = "EDGESDK_MAX_GOLDEN_BYTES"
# Defined with the schema; named here too: the quantizer writes FORMAT_VERSION, platform profiles check the rest.
FORMAT_VERSION, ENGINES, PRECISIONS = bundle_schema.FORMAT_VERSION, bundle_schema.ENGINES, bundle_schema.PRECISIONS


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def safe_member(root: Path, rel: str) -> Path:
    """Resolve ``rel`` inside ``root``, refusing absolute paths, ``..`` and links that lead outside."""
    if not isinstance(rel, str) or not rel:
        raise BundleError(f"bundle file entry has no usable path: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or "\\" in rel or any(part == ".." for part in pure.parts) or ":" in pure.parts[0]:
        raise BundleError(f"bundle file path {rel!r} escapes the bundle directory")
    full = (root / pure).resolve()
    if not full.is_relative_to(root.resolve()):
        raise BundleError(f"bundle file {rel!r} resolves outside the bundle directory (link?)")
    return full


@dataclass(frozen=True)
class Artifact:
    """One engine-ready model inside a bundle."""

    id: str
    engine: str
    precision: str
    files: tuple[Path, ...]
    entry: dict[str, Any]
    # Each file's (device, inode, size, mtime) when the bundle checked it against the manifest's sha256 (None:
    # not verified). The sha256 are handed to engines only while the files are still those that were checked.
    verified_stats: tuple[tuple[int, ...], ...] | None = None

    @property
    def model_path(self) -> Path:
        """The file the engine opens (``.tflite``, ``.xml`` or ``.onnx``): the first listed."""
        return self.files[0]

    @property
    def runtime(self) -> dict[str, Any]:
        """Engine options recorded at quantize time (e.g. OpenVINO ``precision_hint: f32`` for fp32)."""
        return dict(self.entry.get("runtime") or {})

    def engine_options(self, **options) -> dict[str, Any]:
        """The recorded runtime options overridden by ``options``, plus the files' sha256 from the manifest
        where the bundle verified them (an engine's compile cache then does not hash the model again)."""
        merged = {**self.runtime, **options}
        if self.verified_stats is not None and self.verified_stats == tuple(_stat(p) for p in self.files):
            merged.setdefault("digests", tuple(f["sha256"] for f in self.entry["files"]))
        return merged

    def open(self, **options):
        """Load this artifact on its engine with the recorded runtime options (``options`` override them)."""
        from ..engines import open_engine

        return open_engine(self.engine, self.model_path, **self.engine_options(**options))


class Bundle:
    """A verified bundle on disk. Use :meth:`open`; construction does no I/O."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest
        self._verified: dict[Path, tuple[int, ...]] = {}  # file -> its stat when its sha256 was checked

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Bundle":
        root = Path(path)
        manifest_path = root / MANIFEST
        if not root.is_dir():
            raise BundleError(f"bundle not found: {root} is not a directory")
        if not manifest_path.is_file():
            raise BundleError(f"{root} is not a bundle: it has no {MANIFEST}")
        safe_member(root, MANIFEST)  # a link to a manifest elsewhere would vouch for files it did not see
        manifest = bundle_schema.load_manifest(manifest_path)  # read and checked against the schema
        bundle = cls(root, manifest)
        if verify:
            bundle.verify()
        return bundle

    # -- integrity ----------------------------------------------------------
    def file_entries(self) -> Iterator[dict[str, Any]]:
        for art in self.manifest["artifacts"]:
            yield from art["files"]
        golden = self.manifest.get("golden")
        if golden:
            yield from golden["files"]

    def verify(self) -> None:
        """Check every listed file: inside the bundle, present, same size and sha256."""
        for entry in self.file_entries():
            rel = entry.get("path")
            full = safe_member(self.root, rel)
            if not full.is_file():
                raise BundleError(f"bundle file {rel!r} is missing from {self.root}")
            if full.stat().st_size != entry.get("bytes"):
                raise BundleError(
                    f"bundle file {rel!r} was altered: {full.stat().st_size} bytes, manifest says {entry.get('bytes')}"
                )
            before = _stat(full)
            if sha256_file(full) != entry.get("sha256"):
                raise BundleError(f"bundle file {rel!r} was altered: its sha256 does not match the manifest")
            if _stat(full) == before:  # not rewritten while it was hashed
                self._verified[full] = before
        external_data.check_external_data(self.root, self.manifest)  # an ONNX file may read only listed files

    # -- access -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def artifacts(self) -> list[Artifact]:
        return [self._artifact(entry) for entry in self.manifest["artifacts"]]

    def artifact(self, artifact_id: str) -> Artifact:
        for entry in self.manifest["artifacts"]:
            if entry["id"] == artifact_id:
                return self._artifact(entry)
        ids = ", ".join(a["id"] for a in self.manifest["artifacts"])
        raise BundleError(f"bundle {self.name!r} has no artifact {artifact_id!r} (artifacts: {ids})")

    def failed_gate(self, artifact_id: str) -> str | None:
        """How ``artifact_id`` failed its validation gate at quantize time (``validation.<id>.passed`` is false),
        e.g. ``"accuracy drop 1.48 points > max 0.5 at quantize time"``; None when it passed, or has no validation
        entry (a bundle written before validation was recorded)."""
        entry = (self.manifest.get("validation") or {}).get(artifact_id)
        if not isinstance(entry, dict) or entry.get("passed") is not False:
            return None

        def number(key: str) -> float | None:
            value = entry.get(key)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        gate, limit = entry.get("gate"), number("max_drop_points")
        drop = number(gate) if isinstance(gate, str) else None
        failures = []
        if drop is not None and limit is not None and drop > limit + 1e-9:
            words = gate.removesuffix("_points").replace("_", " ")  # "accuracy_drop_points" -> "accuracy drop"
            failures.append(f"{words} {drop:.2f} points > max {limit:g}")
        error, cap = number("max_abs_error_golden"), number("max_abs_error_cap")
        over = outputs_over_cap(self.manifest, entry)
        if entry.get("max_abs_error_cap_exceeded") is True and over:  # one output off by more than its own cap
            failures += [f"max |error| of output {name!r} against float {e:.4g} > its cap {c:.4g}" for name, e, c in over]
        elif entry.get("max_abs_error_cap_exceeded") is True:
            failures.append(f"max |error| against the float outputs {error:.4g} > cap {cap:.4g}"
                            if error is not None and cap is not None else "max |error| above its cap")
        dead = entry.get("dead_output")
        if isinstance(dead, list) and dead:  # an output INT8 flattened (its spread far under its reference's)
            failures.append(f"output(s) {', '.join(map(repr, map(str, dead)))} barely vary against the reference "
                            "(INT8 flattened them)")
        if isinstance(entry.get("task_failure"), str):
            failures.append(entry["task_failure"])
        if not failures:
            failures.append(f"validation.{artifact_id}.passed is false (gate {gate or 'not recorded'})")
        return "; ".join(failures) + " at quantize time"

    def servable_artifact(self, artifact_id: str, allow_failed: bool = False) -> Artifact:
        """The artifact ``artifact_id``, asked for by name to be served. One that failed its validation gate is
        refused with a :class:`BundleError` naming the gate, unless ``allow_failed`` (then whoever serves it
        calls :meth:`warn_if_failed`)."""
        art = self.artifact(artifact_id)
        gate = self.failed_gate(artifact_id)
        if gate is not None and not allow_failed:
            raise BundleError(f"artifact {artifact_id!r} of bundle {self.name!r} failed its validation gate ({gate}); "
                              "it is served only with allow_failed=True (CLI: --allow-failed), or re-quantize the "
                              "bundle")
        return art

    def warn_if_failed(self, artifact_id: str, stacklevel: int = 2) -> None:
        """Warn (:class:`~edgesdk.errors.FailedArtifactWarning`) when ``artifact_id`` failed its validation gate:
        called where such an artifact is about to be served, which only ``allow_failed`` lets happen."""
        gate = self.failed_gate(artifact_id)
        if gate is not None:
            warnings.warn(f"serving artifact {artifact_id!r} of bundle {self.name!r}, which failed its validation "
                          f"gate ({gate}), because allow_failed is set", FailedArtifactWarning,
                          stacklevel=stacklevel + 1)

    def _artifact(self, entry: dict[str, Any]) -> Artifact:
        files = tuple(safe_member(self.root, f["path"]) for f in entry["files"])
        stats = [self._verified.get(f) for f in files]
        return Artifact(entry["id"], entry["engine"], entry["precision"], files, entry,
                        None if None in stats else tuple(stats))

    @property
    def preprocess(self):
        from ..errors import InputError
        from .preprocess import Preprocess

        data = self.manifest.get("preprocess")
        try:
            return Preprocess.from_dict(data) if data else None
        except InputError as exc:
            raise BundleError(f"bundle {self.name!r} has a bad preprocess spec: {exc}") from exc

    @property
    def labels(self) -> list[str] | None:
        return self.manifest.get("labels")

    def golden(self, max_bytes: int | None = None) -> "GoldenArrays":
        """The golden inputs (``input_0``...) and float reference outputs (``output_0``...): see :func:`read_golden`
        and :class:`GoldenArrays` (``max_bytes`` None: ``$EDGESDK_MAX_GOLDEN_BYTES``, else 256 MiB)."""
        golden = self.manifest.get("golden")
        if not golden:
            raise BundleError(f"bundle {self.name!r} has no golden data")
        rel = golden["files"][0]["path"]
        if golden.get("count") == 0:
            raise BundleError(f"golden file {rel!r} is unusable: golden.count is 0, so nothing would be checked")
        return read_golden(safe_member(self.root, rel), self.manifest["inputs"], self.manifest["outputs"],
                           max_bytes, shown=rel, layout=golden.get("layout", "joined"))


class GoldenArrays(dict):
    """The golden members by name (``input_<j>``, ``output_<j>``), each with the samples joined on the tensor's first
    axis, as format-1 bundles always gave them (``golden()["input_0"][:1]`` is sample 0 of a batch-1 input; a scalar
    input's samples are an ``[N]`` array). ``samples`` holds the same data with a sample axis in front of the exact
    tensor shape: ``samples["input_1"][i]`` is input 1 of sample ``i`` whatever its shape (a ``[2, 1, 128]`` state,
    a scalar), which is what runs them (:func:`edgesdk.runtime.numerics.golden_feeds`)."""

    def __init__(self, samples: dict[str, np.ndarray]):
        super().__init__({name: a.reshape(-1, *a.shape[2:]) if a.ndim >= 2 else a for name, a in samples.items()})
        self.samples = samples

    @property
    def count(self) -> int:
        """How many golden samples there are."""
        return len(next(iter(self.samples.values())))


def read_golden(path: Path, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
                max_bytes: int | None = None, shown: str | None = None, layout: str | None = None) -> GoldenArrays:
    """The golden ``.npz`` at ``path``: one array per manifest input (``input_<j>``) and output (``output_<j>``),
    other members left unread. Each member's ``.npy`` header is checked before any data is read: numeric dtype
    (never unpickled), the tensor's dtype and rank (one more for the sample axis in the ``stacked`` layout), its fixed
    dimensions (past the first in the ``joined`` layout), the same number of samples (at least one) in every member,
    and ``max_bytes`` in all (None: ``$EDGESDK_MAX_GOLDEN_BYTES``, else 256 MiB). ``layout``: the manifest's
    ``golden.layout`` (``joined`` when it has none); None: told by the first member's rank (every member must agree).
    Every refusal is a :class:`BundleError` naming the file (``shown``) and the member."""
    cap = max_bytes if max_bytes is not None else bundle_schema.env_limit(GOLDEN_BYTES_VAR, MAX_GOLDEN_BYTES)
    shown = shown or path.name
    tensors = [(f"input_{j}", t) for j, t in enumerate(inputs)] + [(f"output_{j}", t) for j, t in enumerate(outputs)]

    def refused(why: str) -> BundleError:
        return BundleError(f"golden file {shown!r} is unreadable: {why}")

    try:
        if path.stat().st_size > cap + (1 << 20):  # zipfile reads the whole central directory
            raise refused(f"it is {path.stat().st_size} bytes, over the limit of {cap} (${GOLDEN_BYTES_VAR} raises it)")
        with zipfile.ZipFile(path) as npz:
            if layout is None:
                layout = _layout_of(npz, tensors[0], refused)
            stacked = layout == "stacked"
            headers = {name: _golden_header(npz, name, spec, refused, stacked) for name, spec in tensors}
            rows = {shape[0] for shape, _, _ in headers.values()}
            if len(rows) > 1 or 0 in rows:
                counts = ", ".join(f"{name} {shape[0]}" for name, (shape, _, _) in headers.items())
                raise refused(f"its members must hold the same number of samples, at least one; they hold {counts}")
            total = sum(math.prod(shape) * dtype.itemsize for shape, _, dtype in headers.values())
            if total > cap:
                raise refused(f"the members the manifest names hold {total} bytes, over the limit of {cap} "
                              f"(${GOLDEN_BYTES_VAR} raises it)")
            arrays = {name: _golden_data(npz, name, *headers[name], refused) for name, _ in tensors}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as exc:
        # not a zip, a damaged or encrypted member, a malformed .npy header
        raise refused(f"{type(exc).__name__}: {exc}") from exc
    # joined (format 1): each row was run as a sample of batch 1
    return GoldenArrays(arrays if stacked else {name: a[:, None] for name, a in arrays.items()})


def _layout_of(npz: zipfile.ZipFile, tensor: tuple[str, dict[str, Any]], refused) -> str:
    """The layout the first member's rank shows: one more than its tensor's is ``stacked``."""
    name, spec = tensor
    try:
        with npz.open(f"{name}.npy") as fh:
            shape = _npy_header(fh, name, refused)[0]
    except KeyError:
        return "stacked"  # the member is missing: _golden_header says so
    return "stacked" if len(shape) == len(spec["shape"]) + 1 else "joined"


_Header = tuple[tuple[int, ...], bool, np.dtype]  # shape, fortran_order, dtype: what a .npy header declares


def _golden_header(npz: zipfile.ZipFile, name: str, spec: dict[str, Any], refused, stacked: bool) -> _Header:
    """(shape, fortran_order, dtype) of member ``name`` from its .npy header, checked against the tensor ``spec``
    (``stacked``: a sample axis in front of the whole tensor shape; else the samples joined on its first axis)."""
    try:
        npz.getinfo(f"{name}.npy")
    except KeyError:
        held = ", ".join(bundle_schema._show(n) for n in npz.namelist()[:12])
        raise refused(f"it has no member {name!r} (the manifest's tensor {bundle_schema._show(spec['name'])}); "
                      f"it holds {held or 'nothing'}") from None
    with npz.open(f"{name}.npy") as fh:
        shape, fortran, dtype = _npy_header(fh, name, refused)
    if dtype.hasobject:
        raise refused(f"member {name!r} holds Python objects, which edgesdk never unpickles (allow_pickle=False)")
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "biuf":
        raise refused(f"member {name!r} has dtype {dtype}, not a number type")
    try:
        expected = np.dtype(spec["dtype"])
    except (TypeError, ValueError, SyntaxError):
        expected = None  # a name numpy does not know (bfloat16): the engine is the judge
    if expected is not None and (dtype.kind, dtype.itemsize) != (expected.kind, expected.itemsize):
        raise refused(f"member {name!r} is {dtype.name}; the manifest says {spec['dtype']!r}")
    want = spec["shape"]
    if stacked:
        if not shape or min(shape) < 0 or len(shape) != len(want) + 1 or any(-1 != w != s for w, s in
                                                                            zip(want, shape[1:])):
            raise refused(f"member {name!r} has shape {list(shape)}; the manifest's tensor is {want} (golden layout "
                          f"stacked: [samples, *{want}])")
    elif not shape or min(shape) < 0 or len(shape) != len(want) or any(-1 != w != s for w, s in zip(want[1:],
                                                                                                   shape[1:])):
        raise refused(f"member {name!r} has shape {list(shape)}; the manifest's tensor is {want} (any number of "
                      "samples on the first axis)")
    return shape, fortran, dtype


def _npy_header(fh, name: str, refused) -> _Header:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(fh)
    raise refused(f"member {name!r} is in .npy format version {version}, which edgesdk does not read")


def _golden_data(npz: zipfile.ZipFile, name: str, shape: tuple[int, ...], fortran: bool, dtype: np.dtype,
                 refused) -> np.ndarray:
    """Exactly the bytes the checked header declares, no more."""
    with npz.open(f"{name}.npy") as fh:
        _npy_header(fh, name, refused)
        data, got = read_exactly(fh, math.prod(shape) * dtype.itemsize)
    if got < len(data):
        raise refused(f"member {name!r} is cut short: {got} of {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
