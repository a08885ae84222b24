"""Keys and a signed bundle, shared by the trust tests (which run in .venv-device: see the Makefile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.trust import (generate_keypair, sign_bundle)
from trust_support import make_bundle



@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d / "a.pem", d / "a.pub")
    generate_keypair(d / "b.pem", d / "b.pub")
    return {"private": d / "a.pem", "public": d / "a.pub", "other_private": d / "b.pem", "other_public": d / "b.pub"}


@pytest.fixture
def signed(tmp_path, keys) -> Path:
    bundle = make_bundle(tmp_path / "signed.bundle")
    sign_bundle(bundle, keys["private"])
    return bundle
