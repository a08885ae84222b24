"""Fuzz the bundle readers with atheris: a bundle's manifest, an ``.edgebundle`` archive, an ONNX file's references.

    python tests/fuzz/fuzz_bundle.py manifest -atheris_runs=10000
    python tests/fuzz/fuzz_bundle.py archive -atheris_runs=10000 [corpus dir ...]
    python tests/fuzz/fuzz_bundle.py onnx -atheris_runs=10000

``manifest``: the input is ``manifest.json`` of a small bundle whose files are there, opened (and verified) with
:meth:`Bundle.open <edgesdk.bundle.reader.Bundle.open>`. ``archive``: the input is an ``.edgebundle`` file, extracted by
:func:`edgesdk.trust.open_archive` into a fresh cache dir. ``onnx``: the input is a model file whose external data
locations are read. Refusing an input with an :class:`~edgesdk.errors.EdgeSDKError` is the expected outcome; any
other exception is a crash. Each target starts from seeds made here (a valid bundle and its archive), to which
libFuzzer's corpus directories may add. The file is not named ``test_*``: pytest does not collect it, and
``tests/device/bundle/test_bundle_schema.py`` runs each target's one-input function on the seeds.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

WEIGHTS = bytes(range(16))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def onnx_with_external_data(location: str | bytes, value_first: bool = False) -> bytes:
    """The wire bytes of a ModelProto whose graph has one initializer kept in the file ``location``
    (``value_first``: the entry's value is written before its key, which protobuf allows)."""
    key = _field(1, b"location")
    value = _field(2, location.encode() if isinstance(location, str) else location)
    entry = value + key if value_first else key + value
    tensor = _field(8, b"W") + _field(13, entry) + bytes([0x70, 0x01])  # name, external_data, data_location=1
    return _field(7, _field(5, tensor))  # ModelProto.graph -> GraphProto.initializer


def _entry(name: str, data: bytes) -> dict:
    return {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def seed_files() -> dict[str, bytes]:
    """A small valid bundle: an ONNX model with external data, its weights, and a manifest listing both."""
    model = onnx_with_external_data("weights.bin")
    manifest = {
        "format_version": 1, "name": "seed", "version": "1", "created_with": {"edgesdk": "fuzz"},
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [1, 4], "dtype": "float32"}],
        "preprocess": None, "postprocess": {"type": "classification", "softmax": True, "top_k": 2},
        "labels": ["a", "b", "c", "d"],
        "artifacts": [{"id": "onnxruntime-fp32", "engine": "onnxruntime", "precision": "fp32",
                       "files": [_entry("onnx/model.onnx", model), _entry("onnx/weights.bin", WEIGHTS)],
                       "runtime": {"num_threads": 1}}],
        "calibration": {"samples": 1, "input_ranges": [{"name": "x", "min": -1.0, "max": 1.0}]},
        "validation": {"data": "seed", "onnxruntime-fp32": {"accuracy": 1.0, "passed": True}},
        "hybrid": {"signal": "max_prob", "threshold": 0.5, "curve": [{"escalation_rate": 0.1, "accuracy": 0.9}]},
    }
    return {"onnx/model.onnx": model, "onnx/weights.bin": WEIGHTS,
            "manifest.json": json.dumps(manifest, indent=1).encode()}


def write_bundle(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def seed_archive(work: Path) -> bytes:
    from edgesdk.trust import pack_bundle

    bundle = write_bundle(work / "seed.bundle", seed_files())
    return pack_bundle(bundle, work / "seed.edgebundle").read_bytes()


class Target:
    """One fuzz target: a scratch folder, seeds, and ``one_input(bytes)``."""

    def __init__(self, kind: str):
        if kind not in ("manifest", "archive", "onnx"):
            raise SystemExit(f"unknown target {kind!r}: manifest, archive or onnx")
        self.kind = kind
        self.work = Path(tempfile.mkdtemp(prefix=f"edgesdk-fuzz-{kind}-"))
        self.bundle = write_bundle(self.work / "bundle", seed_files())

    def seeds(self) -> list[bytes]:
        files = seed_files()
        if self.kind == "manifest":
            return [files["manifest.json"], b"{}", b"[]", b'{"format_version": 1}']
        if self.kind == "onnx":
            return [files["onnx/model.onnx"], onnx_with_external_data("../../etc/passwd", value_first=True), b""]
        return [seed_archive(self.work / "seed"), b"", b"\x1f\x8b"]

    def one_input(self, data: bytes) -> None:
        from edgesdk.errors import EdgeSDKError

        try:
            getattr(self, f"_{self.kind}")(data)
        except EdgeSDKError:
            pass  # refused: the expected outcome for a bad input

    def _manifest(self, data: bytes) -> None:
        from edgesdk.bundle.reader import Bundle

        (self.bundle / "manifest.json").write_bytes(data)
        bundle = Bundle.open(self.bundle)
        # What the device reads from an accepted manifest must read without surprises.
        from edgesdk.bundle.tensors import BundleIO
        from edgesdk.hybrid.model import EscalationPolicy
        from edgesdk.bundle.report import summary, validation_table

        for art in bundle.artifacts:
            art.engine_options()
        BundleIO(bundle)
        summary(bundle.manifest)
        validation_table(bundle.manifest)
        EscalationPolicy().resolved(bundle.manifest)

    def _archive(self, data: bytes) -> None:
        from edgesdk.trust import open_archive

        src = self.work / "in.edgebundle"
        src.write_bytes(data)
        cache = self.work / "cache"
        try:
            open_archive(src, cache_dir=cache)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    def _onnx(self, data: bytes) -> None:
        from edgesdk.engines.model_files import external_data_locations, location_problem

        path = self.bundle / "onnx" / "fuzzed.onnx"
        path.write_bytes(data)
        for location in external_data_locations(path):
            location_problem(path, location)

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def main(argv: list[str]) -> None:
    import atheris

    kind = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else "manifest"
    args = [argv[0]] + [a for a in argv[1:] if a != kind]
    with atheris.instrument_imports(include=["edgesdk"]):  # our code; numpy and the stdlib are not the target
        for module in ("edgesdk.bundle.reader", "edgesdk.bundle.schema", "edgesdk.bundle.tensors", "edgesdk.bundle.preprocess",
                       "edgesdk.bundle.report", "edgesdk.hybrid.model", "edgesdk.trust.archive"):
            importlib.import_module(module)
    target = Target(kind)
    for seed in target.seeds():  # libFuzzer starts from an empty input; these are run (and counted) first
        target.one_input(seed)
    corpus = target.work / "seeds"
    corpus.mkdir()
    for i, seed in enumerate(target.seeds()):
        (corpus / f"seed{i}").write_bytes(seed)
    if not any(not a.startswith("-") for a in args[1:]):
        args.append(str(corpus))  # no corpus dir given: start from the seeds
    try:
        atheris.Setup(args, target.one_input)
        atheris.Fuzz()
    finally:
        target.close()


if __name__ == "__main__":
    main(sys.argv)
