"""policy="autotune": measure the viable candidates once, reuse the decision, measure again when its inputs change."""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgesdk
from edgesdk.engines import register_backend, unregister_backend
from fakes import NAME as FAKE, FakeNPUEngine
from support import rehash


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(path))
    return path


def _autotune(path, **kw):
    with edgesdk.load(path, policy="autotune", **kw) as model:
        return model.placement


def _label(pl) -> str:
    return f"{pl.engine}:{pl.device}:{pl.artifact}"


def test_first_load_measures_second_reuses(digits_bundle, cache_dir):
    first = _autotune(digits_bundle.bundle)
    decision = first.autotune
    assert decision["cached"] is False
    # every engine's fp32 and int8 artifact on this CPU was timed
    assert len(decision["timings_ms"]) >= 6
    assert {label.split(":")[0] for label in decision["timings_ms"]} == {"litert", "openvino", "onnxruntime"}
    assert all(v > 0 for v in decision["timings_ms"].values())
    assert decision["candidate"] == min(decision["timings_ms"], key=decision["timings_ms"].get)
    assert decision["candidate"] == _label(first)
    assert "median of" in decision["method"]
    assert (cache_dir / "autotune.json").is_file()

    second = _autotune(digits_bundle.bundle)
    assert second.autotune["cached"] is True
    assert second.autotune["candidate"] == decision["candidate"] == _label(second)
    assert second.autotune["timings_ms"] == decision["timings_ms"]
    assert second.numerics["checked"] is True  # a cached winner is still checked


def test_changed_bundle_measures_again(digits_bundle, bundle_copy):
    assert _autotune(digits_bundle.bundle).autotune["cached"] is False
    assert _autotune(bundle_copy).autotune["cached"] is True  # an identical copy has the same fingerprint
    golden = dict(np.load(bundle_copy / "golden.npz"))
    np.savez(bundle_copy / "golden.npz", **golden, note=np.array([1]))
    rehash(bundle_copy)
    assert _autotune(bundle_copy).autotune["cached"] is False


def test_new_engine_measures_again(digits_bundle):
    assert _autotune(digits_bundle.bundle).autotune["cached"] is False
    register_backend(FAKE, FakeNPUEngine)
    try:
        decision = _autotune(digits_bundle.bundle).autotune
    finally:
        unregister_backend(FAKE)
    assert decision["cached"] is False
    assert any(label.startswith(FAKE + ":") for label in decision["timings_ms"])


def test_unreadable_cache_measures_again(digits_bundle, cache_dir):
    cache_dir.mkdir()
    (cache_dir / "autotune.json").write_text("{not json")
    assert _autotune(digits_bundle.bundle).autotune["cached"] is False
    assert json.loads((cache_dir / "autotune.json").read_text())  # replaced by a good one


def test_restricted_decision_is_not_reused_unrestricted(digits_bundle):
    restricted = _autotune(digits_bundle.bundle, require="onnxruntime").autotune
    assert {label.split(":")[0] for label in restricted["timings_ms"]} == {"onnxruntime"}
    full = _autotune(digits_bundle.bundle)
    assert {label.split(":")[0] for label in full.autotune["timings_ms"]} == {"litert", "openvino", "onnxruntime"}
    assert full.autotune["candidate"] == _label(full)
