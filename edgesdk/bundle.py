"""The bundle: a directory with ``manifest.json`` at its root and the files it lists.

Opening a bundle checks every listed file's sha256 before any engine sees it; a
missing or altered file, or a path that escapes the bundle directory, raises a
:class:`~edgesdk.errors.BundleError` naming the file. The manifest keys are
documented in README.md ("Bundle format").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np

from .errors import BundleError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ENGINES = ("litert", "openvino", "onnxruntime")
PRECISIONS = ("int8", "fp32")
RUNTIME_OPTIONS = {"precision_hint", "num_threads"}  # engine options an artifact may record
_REQUIRED = ("format_version", "name", "version", "created_with", "inputs", "outputs", "artifacts")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_entry(root: Path, path: Path) -> dict[str, Any]:
    """The manifest entry of a file already placed inside the bundle ``root``."""
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


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
    verified: bool = False  # the bundle checked every file against the manifest's sha256 when opened

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
        if self.verified:
            merged.setdefault("digests", tuple(f["sha256"] for f in self.entry["files"]))
        return merged

    def open(self, **options):
        """Load this artifact on its engine with the recorded runtime options (``options`` override them)."""
        from .engines import open_engine

        return open_engine(self.engine, self.model_path, **self.engine_options(**options))


class Bundle:
    """A verified bundle on disk. Use :meth:`open`; construction does no I/O."""

    def __init__(self, root: Path, manifest: dict[str, Any]):
        self.root = root
        self.manifest = manifest
        self.verified = False

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Bundle":
        root = Path(path)
        manifest_path = root / MANIFEST
        if not root.is_dir():
            raise BundleError(f"bundle not found: {root} is not a directory")
        if not manifest_path.is_file():
            raise BundleError(f"{root} is not a bundle: it has no {MANIFEST}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleError(f"{manifest_path} is not valid JSON: {exc}") from exc
        _check_manifest(manifest, manifest_path)
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
            if sha256_file(full) != entry.get("sha256"):
                raise BundleError(f"bundle file {rel!r} was altered: its sha256 does not match the manifest")
        self.verified = True

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

    def _artifact(self, entry: dict[str, Any]) -> Artifact:
        files = tuple(safe_member(self.root, f["path"]) for f in entry["files"])
        return Artifact(entry["id"], entry["engine"], entry["precision"], files, entry, self.verified)

    @property
    def preprocess(self):
        from .errors import InputError
        from .preprocess import Preprocess

        data = self.manifest.get("preprocess")
        try:
            return Preprocess.from_dict(data) if data else None
        except InputError as exc:
            raise BundleError(f"bundle {self.name!r} has a bad preprocess spec: {exc}") from exc

    @property
    def labels(self) -> list[str] | None:
        return self.manifest.get("labels")

    def golden(self) -> dict[str, np.ndarray]:
        """The golden inputs and float reference outputs (never unpickled)."""
        golden = self.manifest.get("golden")
        if not golden:
            raise BundleError(f"bundle {self.name!r} has no golden data")
        path = safe_member(self.root, golden["files"][0]["path"])
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        except (OSError, ValueError) as exc:
            raise BundleError(f"golden file {golden['files'][0]['path']!r} is unreadable: {exc}") from exc


def _check_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: the manifest must be a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise BundleError(f"{where}: manifest is missing key(s) {', '.join(missing)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise BundleError(
            f"{where}: unknown format_version {manifest['format_version']!r} (this edgesdk reads {FORMAT_VERSION})"
        )
    for key in ("inputs", "outputs", "artifacts"):
        if not isinstance(manifest[key], list) or not manifest[key]:
            raise BundleError(f"{where}: '{key}' must be a non-empty list")
    for key in ("inputs", "outputs"):
        for t in manifest[key]:
            if not isinstance(t, dict) or not {"name", "shape", "dtype"} <= t.keys():
                raise BundleError(f"{where}: every entry of '{key}' needs name, shape and dtype")
    ids = [a.get("id") if isinstance(a, dict) else None for a in manifest["artifacts"]]
    if len(set(map(str, ids))) != len(ids):
        raise BundleError(f"{where}: artifact ids must be unique, got {ids}")
    for i, art in enumerate(manifest["artifacts"]):
        if not isinstance(art, dict) or not {"id", "engine", "precision", "files"} <= art.keys():
            raise BundleError(f"{where}: artifact #{i} needs id, engine, precision and files")
        if not isinstance(art["id"], str) or not art["id"]:
            raise BundleError(f"{where}: artifact #{i} needs a string id")
        if art["engine"] not in ENGINES:
            raise BundleError(f"{where}: artifact {art['id']!r} has unknown engine {art['engine']!r}")
        if art["precision"] not in PRECISIONS:
            raise BundleError(f"{where}: artifact {art['id']!r} has unknown precision {art['precision']!r}")
        _check_files(art["files"], f"artifact {art['id']!r}", where)
        runtime = art.get("runtime", {})
        if not isinstance(runtime, dict) or not set(runtime) <= RUNTIME_OPTIONS:
            raise BundleError(
                f"{where}: artifact {art['id']!r} has runtime options {runtime!r}; known: {', '.join(sorted(RUNTIME_OPTIONS))}"
            )
    golden = manifest.get("golden")
    if golden is not None:
        if not isinstance(golden, dict) or "files" not in golden:
            raise BundleError(f"{where}: 'golden' must be a table with 'files'")
        _check_files(golden["files"], "golden", where)
        tol = golden.get("tolerance", {})
        if not isinstance(tol, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                                                for v in tol.values()):
            raise BundleError(f"{where}: 'golden.tolerance' must map artifact ids to non-negative numbers")
    post = manifest.get("postprocess") or {}
    if not isinstance(post, dict):
        raise BundleError(f"{where}: 'postprocess' must be a table")
    top_k = post.get("top_k", 1)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise BundleError(f"{where}: 'postprocess.top_k' must be a positive integer, got {top_k!r}")


def _check_files(files: Any, owner: str, where: Path) -> None:
    if not isinstance(files, list) or not files:
        raise BundleError(f"{where}: {owner} lists no files")
    for f in files:
        if not isinstance(f, dict) or not {"path", "sha256", "bytes"} <= f.keys():
            raise BundleError(f"{where}: {owner} has a file entry without path/sha256/bytes")


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def publish_dir(work: Path, out: Path) -> None:
    """Move a finished directory ``work`` (made with mkdtemp beside ``out``) into place as ``out``: an empty ``out``
    (maybe the current folder) is filled, not replaced; an old ``out`` is removed only once the new one is there.
    Files get the usual permissions (mkdtemp made the folder 0700; docker COPY keeps modes)."""
    import os
    import shutil

    mask = os.umask(0)
    os.umask(mask)
    for path in [work, *work.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
    if out.is_dir() and not any(out.iterdir()):
        for child in work.iterdir():
            child.rename(out / child.name)
        work.rmdir()
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    work.rename(out)
    shutil.rmtree(old, ignore_errors=True)
