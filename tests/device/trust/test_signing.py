"""edgesdk.trust signatures (real model_signing, real keys) and edgesdk.load(..., trust=...).

The bundles here are small fakes made in tmp: a manifest that passes Bundle.open over files of random bytes.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from support import file_entry, write_manifest
from edgesdk.errors import BundleError, EdgeSDKError
from edgesdk.trust import (SIGNATURE, Trust, generate_keypair, pack_bundle, sign_bundle, verify_bundle)
from trust_support import MODEL_SIGNING_CLI, flip_byte, make_bundle

pytestmark = pytest.mark.trust  # model-signing: run in .venv-device (see the Makefile)



# -- signing ---------------------------------------------------------------------
def test_sign_then_verify(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b")
    sig = sign_bundle(bundle, keys["private"])
    assert sig == bundle / SIGNATURE and sig.is_file()
    assert not [p for p in bundle.iterdir() if p.name.endswith(".tmp")]
    verify_bundle(bundle, keys["public"])
    Trust(public_key=keys["public"]).check(bundle)


def test_resigning_replaces_the_signature(signed, keys):
    sign_bundle(signed, keys["other_private"])
    verify_bundle(signed, keys["other_public"])
    with pytest.raises(BundleError, match="made with another key"):
        verify_bundle(signed, keys["public"])


@pytest.mark.parametrize("rel", ["manifest.json", "model.onnx", "golden/golden.npz"])
def test_one_flipped_byte_is_refused_naming_the_file(signed, keys, rel):
    flip_byte(signed / rel)
    with pytest.raises(BundleError, match=f"file '{rel}' was altered since signing"):
        verify_bundle(signed, keys["public"])


def test_added_file_is_refused(signed, keys):
    (signed / "golden" / "extra.bin").write_bytes(b"not signed")
    with pytest.raises(BundleError, match="file 'golden/extra.bin' was added"):
        verify_bundle(signed, keys["public"])


def test_removed_file_is_refused(signed, keys):
    (signed / "golden" / "golden.npz").unlink()
    with pytest.raises(BundleError, match="file 'golden/golden.npz' was removed"):
        verify_bundle(signed, keys["public"])


def test_altered_model_with_rewritten_manifest_is_refused(signed, keys):
    """The realistic attack: change the model and fix up manifest.json so Bundle.open alone would pass."""
    (signed / "model.onnx").write_bytes(os.urandom(2048))
    manifest = json.loads((signed / "manifest.json").read_text())
    manifest["artifacts"][0]["files"] = [file_entry(signed, signed / "model.onnx")]
    write_manifest(signed, manifest)
    with pytest.raises(BundleError, match="file 'manifest.json' was altered; file 'model.onnx' was altered"):
        verify_bundle(signed, keys["public"])


def test_signature_of_another_bundle_is_refused(signed, tmp_path, keys):
    other = make_bundle(tmp_path / "other.bundle", name="other")
    sign_bundle(other, keys["private"])
    (signed / SIGNATURE).write_bytes((other / SIGNATURE).read_bytes())
    with pytest.raises(BundleError, match="signature of another bundle \\('other.bundle'\\)"):
        verify_bundle(signed, keys["public"])


def test_wrong_public_key_is_refused(signed, keys):
    with pytest.raises(BundleError, match="made with another key than the trusted public key"):
        verify_bundle(signed, keys["other_public"])
    with pytest.raises(BundleError, match="another key"):
        Trust(public_key=keys["other_public"]).check(signed)


def test_rewritten_signed_payload_is_refused(signed, keys):
    """Editing the digests inside the signature (to cover a swapped file) breaks the ECDSA signature."""
    sig = json.loads((signed / SIGNATURE).read_text())
    statement = json.loads(base64.b64decode(sig["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    sig["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (signed / SIGNATURE).write_text(json.dumps(sig))
    with pytest.raises(BundleError, match="does not match the public key"):
        verify_bundle(signed, keys["public"])


def test_garbage_signature_is_refused(signed, keys):
    (signed / SIGNATURE).write_text("{not json")
    with pytest.raises(BundleError, match="not a valid model-signing signature"):
        verify_bundle(signed, keys["public"])


def test_unsigned_bundle_is_refused(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b")
    with pytest.raises(BundleError, match="is unsigned: it has no signature.sig"):
        verify_bundle(bundle, keys["public"])
    with pytest.raises(BundleError, match="unsigned"):
        Trust(public_key=keys["public"]).check(bundle)


def test_trust_without_required_signature_accepts_unsigned_but_checks_signed(tmp_path, signed, keys):
    lenient = Trust(public_key=keys["public"], require_signature=False)
    lenient.check(make_bundle(tmp_path / "unsigned"))
    flip_byte(signed / "model.onnx")
    with pytest.raises(BundleError, match="'model.onnx' was altered"):
        lenient.check(signed)


def test_symlink_added_to_a_signed_bundle_is_refused(signed, keys):
    (signed / "link").symlink_to(signed / "model.onnx")
    with pytest.raises(BundleError, match="symlink"):
        verify_bundle(signed, keys["public"])


def test_signature_that_ignores_the_manifest_is_refused(tmp_path, keys):
    """A valid signature made with manifest.json ignored vouches for nothing that Bundle.open checks."""
    import model_signing

    bundle = make_bundle(tmp_path / "b")
    model_signing.signing.Config().use_elliptic_key_signer(private_key=keys["private"]).set_hashing_config(
        model_signing.hashing.Config().set_ignored_paths(paths=[SIGNATURE, "manifest.json"])
    ).sign(bundle, bundle / SIGNATURE)
    with pytest.raises(BundleError, match="does not cover manifest.json"):
        verify_bundle(bundle, keys["public"])


def test_sign_refuses_a_folder_that_is_not_a_bundle(tmp_path, keys):
    (tmp_path / "plain").mkdir()
    with pytest.raises(BundleError, match="is not a bundle: it has no manifest.json"):
        sign_bundle(tmp_path / "plain", keys["private"])
    assert not (tmp_path / "plain" / SIGNATURE).exists()


def test_sign_refuses_an_altered_bundle(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b")
    flip_byte(bundle / "model.onnx")
    with pytest.raises(BundleError, match="'model.onnx' was altered"):
        sign_bundle(bundle, keys["private"])


def test_sign_refuses_a_key_that_is_not_a_private_key(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b")
    with pytest.raises(EdgeSDKError, match="not an unencrypted EC private key"):
        sign_bundle(bundle, keys["public"])
    with pytest.raises(EdgeSDKError, match="private key not found"):
        sign_bundle(bundle, tmp_path / "missing.pem")


def test_missing_public_key_is_a_setup_error(signed, tmp_path):
    with pytest.raises(EdgeSDKError, match="public key not found") as info:
        verify_bundle(signed, tmp_path / "nope.pub")
    assert not isinstance(info.value, BundleError)


def test_without_model_signing_the_error_says_what_to_install(signed, keys, monkeypatch):
    for name in [m for m in sys.modules if m == "model_signing" or m.startswith("model_signing.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "model_signing", None)  # import model_signing -> ImportError
    with pytest.raises(EdgeSDKError, match=r"pip install 'edgesdk\[trust\]'"):
        verify_bundle(signed, keys["public"])
    with pytest.raises(EdgeSDKError, match=r"pip install 'edgesdk\[trust\]'"):
        sign_bundle(signed, keys["private"])


def test_generate_keypair_writes_a_private_key_only_the_owner_reads_and_never_overwrites(tmp_path):
    private, public = generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    assert private.stat().st_mode & 0o777 == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    before = private.read_bytes()
    with pytest.raises(EdgeSDKError, match="already exists"):
        generate_keypair(private, tmp_path / "other.pub")
    assert private.read_bytes() == before and not (tmp_path / "other.pub").exists()


def run_model_signing_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MODEL_SIGNING_CLI), *args], capture_output=True, text=True, timeout=60)


def test_model_signing_cli_verifies_our_signature_and_refuses_tampering(signed, keys):
    args = ["verify", "key", str(signed), "--signature", str(signed / SIGNATURE), "--public_key", str(keys["public"])]
    good = run_model_signing_cli(*args)
    assert good.returncode == 0, good.stderr
    assert "Verification succeeded" in good.stdout
    flip_byte(signed / "golden" / "golden.npz")
    bad = run_model_signing_cli(*args)
    assert bad.returncode != 0
    assert "golden/golden.npz" in bad.stderr


def test_we_verify_a_bundle_signed_by_the_model_signing_cli(tmp_path, keys):
    bundle = make_bundle(tmp_path / "b")
    done = run_model_signing_cli("sign", "key", str(bundle), "--signature", str(bundle / SIGNATURE),
                                 "--private_key", str(keys["private"]))
    assert done.returncode == 0, done.stderr
    verify_bundle(bundle, keys["public"])



# -- edgesdk.load(..., trust=...) ------------------------------------------------------------------------------
def test_load_refuses_an_untrusted_bundle_before_any_engine_reads_it(signed, tmp_path, keys):
    """The fake bundle's model is random bytes: an engine that got to it would fail with BackendUnavailable. A
    BundleError therefore shows the signature check came first."""
    import edgesdk
    from edgesdk import BackendUnavailable, Trust

    trust = Trust(public_key=keys["public"])
    with pytest.raises(BackendUnavailable):  # trusted: the load goes on to the engine, which refuses random bytes
        edgesdk.load(signed, trust=trust, check_numerics=False)
    flip_byte(signed / "model.onnx")
    with pytest.raises(BundleError, match="model.onnx"):
        edgesdk.load(signed, trust=trust)
    unsigned = make_bundle(tmp_path / "unsigned.bundle")
    with pytest.raises(BundleError, match="unsigned"):
        edgesdk.load(unsigned, trust=trust)
    with pytest.raises(BackendUnavailable):  # without trust, only the checksums are checked
        edgesdk.load(unsigned, check_numerics=False)


def test_load_opens_a_signed_archive_and_checks_its_signature(signed, tmp_path, keys, monkeypatch):
    import edgesdk
    from edgesdk import BackendUnavailable, Trust

    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "cache"))
    archive = pack_bundle(signed, tmp_path / "fake.edgebundle")
    with pytest.raises(BackendUnavailable):
        edgesdk.load(archive, trust=Trust(public_key=keys["public"]), check_numerics=False)
    with pytest.raises(BundleError, match="another key"):
        edgesdk.load(archive, trust=Trust(public_key=keys["other_public"]))


def test_cli_keygen_sign_verify_pack(tmp_path):
    cli = [sys.executable, "-c", "from edgesdk.cli import main; main()"]
    run = lambda *a: subprocess.run([*cli, *map(str, a)], capture_output=True, text=True)  # noqa: E731
    bundle = make_bundle(tmp_path / "b.bundle")
    assert run("keygen", tmp_path / "k.pem", tmp_path / "k.pub").returncode == 0
    assert run("keygen", tmp_path / "k.pem", tmp_path / "k2.pub").returncode == 2  # never overwrites a key
    assert run("sign", bundle, "--key", tmp_path / "k.pem").returncode == 0
    ok = run("verify", bundle, "--pub", tmp_path / "k.pub")
    assert ok.returncode == 0 and "verified" in ok.stdout, ok.stderr
    assert run("pack", bundle, tmp_path / "b.edgebundle").returncode == 0
    assert run("verify", tmp_path / "b.edgebundle", "--pub", tmp_path / "k.pub").returncode == 0
    flip_byte(bundle / "golden" / "golden.npz")
    bad = run("verify", bundle, "--pub", tmp_path / "k.pub")
    assert bad.returncode == 2 and "golden/golden.npz" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
