"""Fixtures of the store tests: versions of the real digits bundle (built once by the session's quantize), a bundle
that fails its self-check here, a store, and the loopback file server."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk import BundleStore
from edgesdk.trust import pack_bundle
from store_support import FAST, FileServer, fail_self_check, release


@pytest.fixture(scope="session")
def versions(digits_bundle, tmp_path_factory) -> list[Path]:
    """Three releases of the digits bundle (manifest version 1, 2, 3): the same model, three version ids."""
    out = tmp_path_factory.mktemp("releases")
    return [release(digits_bundle.bundle, out / f"v{n}", str(n)) for n in (1, 2, 3)]


@pytest.fixture(scope="session")
def five_versions(versions, digits_bundle, tmp_path_factory) -> list[Path]:
    """Five releases (manifest version 1 to 5): the three of ``versions`` and two more."""
    out = tmp_path_factory.mktemp("more-releases")
    return versions + [release(digits_bundle.bundle, out / f"v{n}", str(n)) for n in (4, 5)]


@pytest.fixture(scope="session")
def failing(digits_bundle, tmp_path_factory) -> Path:
    """A release whose golden outputs were moved and its checksums rewritten: it verifies, and fails its self-check."""
    return fail_self_check(release(digits_bundle.bundle, tmp_path_factory.mktemp("failing") / "bad", "bad"))


@pytest.fixture(scope="session")
def archives(versions, tmp_path_factory) -> list[Path]:
    """Each release as an .edgebundle file."""
    out = tmp_path_factory.mktemp("archives")
    return [pack_bundle(v, out / f"{v.name}.edgebundle") for v in versions]


@pytest.fixture
def store(tmp_path) -> BundleStore:
    return BundleStore(tmp_path / "store", FAST)


@pytest.fixture
def server():
    found = FileServer()
    yield found
    found.close()
