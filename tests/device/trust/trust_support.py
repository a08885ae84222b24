"""Helpers of the trust tests: a small fake bundle that Bundle.open accepts, and a byte flipper."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support import file_entry, write_manifest

pytestmark = pytest.mark.trust  # model-signing: run in .venv-device (see the Makefile)
MODEL_SIGNING_CLI = Path(sys.executable).parent / "model_signing"


def make_bundle(root: Path, name: str = "fake") -> Path:
    """A bundle Bundle.open accepts: one artifact of two files (one in a sub-folder), random bytes."""
    root.mkdir(parents=True)
    (root / "model.onnx").write_bytes(os.urandom(2048))
    (root / "golden").mkdir()
    (root / "golden" / "golden.npz").write_bytes(os.urandom(512))
    manifest = {
        "format_version": 1, "name": name, "version": "1.0", "created_with": "tests",
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [1, 2], "dtype": "float32"}],
        "artifacts": [{"id": "onnx-int8", "engine": "onnxruntime", "precision": "int8",
                       "files": [file_entry(root, root / "model.onnx")]}],
        "golden": {"files": [file_entry(root, root / "golden" / "golden.npz")]},
    }
    write_manifest(root, manifest)
    return root


def flip_byte(path: Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
