"""Bundle signatures with OpenSSF model signing (the ``model_signing`` package), key mode.

A signed bundle holds ``signature.sig`` at its root: a standard model-signing signature (a Sigstore
bundle with a DSSE envelope) over every file of the bundle directory except ``signature.sig`` itself,
made with an ECDSA private key (P-256/384/521, PEM). The library's own CLI verifies it too::

    model_signing verify key BUNDLE --signature BUNDLE/signature.sig --public_key pub.pem

``manifest.json`` is among the signed files and it carries every model file's sha256, so a verified
signature plus :meth:`~edgesdk.bundle.reader.Bundle.open` trusts the whole bundle.

``model_signing`` (and ``cryptography``) are imported only when a function here needs them; without
them these functions raise :class:`~edgesdk.errors.EdgeSDKError` naming ``pip install 'edgesdk[trust]'``.
Failures of the bundle (unsigned, tampered, signed by another key) are
:class:`~edgesdk.errors.BundleError`; failures of the setup (no package, unreadable key) are
:class:`~edgesdk.errors.EdgeSDKError`.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundle.reader import MANIFEST, Bundle
from ..errors import BundleError, EdgeSDKError

SIGNATURE = "signature.sig"
_INSTALL = "pip install 'edgesdk[trust]'"


@dataclass(frozen=True)
class Trust:
    """Which bundles a load accepts: those signed with the private key paired with ``public_key``.

    With ``require_signature=False`` an unsigned bundle is accepted, but a signed one must still verify
    (for the time while a fleet moves to signed bundles). It gives no protection against tampering: whoever can
    alter a bundle can delete its signature.
    """

    public_key: str | Path
    require_signature: bool = True

    def check(self, bundle_dir: str | Path) -> None:
        """Verify ``bundle_dir`` per this policy; raises :class:`BundleError` when it is not trusted.

        Reads the bundle's files (to hash them) but loads nothing; call it before any engine opens a file.
        """
        if not self.require_signature and not os.path.lexists(Path(bundle_dir) / SIGNATURE):
            return
        verify_bundle(bundle_dir, self.public_key)


def sign_bundle(bundle_dir: str | Path, private_key_path: str | Path) -> Path:
    """Sign the bundle at ``bundle_dir`` with an EC private key (PEM); return the path of ``signature.sig``.

    The bundle is opened (and its files checked against the manifest) first, so a directory that is not
    a bundle, or a bundle already altered, is refused. An existing signature is replaced atomically.
    """
    root = Path(bundle_dir)
    Bundle.open(root)
    ms = _model_signing()
    key = _key_file(private_key_path, "private")
    try:
        config = ms.signing.Config().use_elliptic_key_signer(private_key=key)
    except Exception as exc:  # cryptography's ValueError/TypeError/UnsupportedAlgorithm for a bad or encrypted key
        raise EdgeSDKError(f"cannot sign with {key}: not an unencrypted EC private key in PEM ({exc})") from exc
    config.set_hashing_config(_hashing_config(ms))
    # The library writes the signature after hashing the folder, so this name does not exist (and is not
    # hashed) while it hashes; the rename then replaces the old signature in one step.
    tmp = root / f".{SIGNATURE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        config.sign(root, tmp)
        os.replace(tmp, root / SIGNATURE)
    except ValueError as exc:  # model_signing refuses symlinks and special files in the folder
        raise BundleError(f"cannot sign bundle {root}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return root / SIGNATURE


def verify_bundle(bundle_dir: str | Path, public_key_path: str | Path) -> None:
    """Check that ``signature.sig`` verifies with the public key and that the bundle's files are the signed ones.

    Raises :class:`BundleError` saying why not: unsigned, signed with another key, a forged or corrupt
    signature, a file altered / added / removed since signing (named), or the signature of another bundle.
    """
    root = Path(bundle_dir)
    if not root.is_dir():
        raise BundleError(f"bundle not found: {root} is not a directory")
    if not (root / MANIFEST).is_file():
        raise BundleError(f"{root} is not a bundle: it has no {MANIFEST}")
    sig = root / SIGNATURE
    if sig.is_symlink() or not sig.is_file():
        raise BundleError(f"bundle {root} is unsigned: it has no {SIGNATURE} (sign it with `edgesdk sign`)")
    ms = _model_signing()
    key = _key_file(public_key_path, "public")
    try:
        config = ms.verifying.Config().use_elliptic_key_verifier(public_key=key)
    except Exception as exc:
        raise EdgeSDKError(f"cannot verify with {key}: not an EC public key in PEM ({exc})") from exc
    config.set_hashing_config(_hashing_config(ms))
    try:
        config.verify(root, sig)
    except Exception as exc:  # the library raises ValueError, cryptography's InvalidSignature, KeyError...
        raise _refusal(root, exc, ms) from exc
    try:
        signed = _signed_payload(sig)
    except Exception as exc:  # e.g. the pre-1.0 payload layout, which lists no resources
        raise BundleError(f"bundle {root}: cannot read which files {SIGNATURE} covers ({type(exc).__name__}: "
                          f"{exc}); re-sign it with `edgesdk sign`") from exc
    if MANIFEST not in signed["digests"]:
        raise BundleError(f"bundle {root}: {SIGNATURE} does not cover {MANIFEST} (it was signed with it ignored), "
                          "so it vouches for none of the model files")


def generate_keypair(private_path: str | Path, public_path: str | Path) -> tuple[Path, Path]:
    """Write a new ECDSA P-256 key pair as PEM: the private key unencrypted with mode 0600, the public key
    as SubjectPublicKeyInfo. Refuses to overwrite an existing file (a replaced private key cannot be undone)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise EdgeSDKError(f"generating keys needs the cryptography package: {_INSTALL}") from exc
    private, public = Path(private_path), Path(public_path)
    for path in (private, public):
        if os.path.lexists(path):
            raise EdgeSDKError(f"{path} already exists; refusing to overwrite a key")
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_pem)
    public.write_bytes(public_pem)
    return private, public


# -- internals -------------------------------------------------------------------
def _model_signing():
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as exc:
        raise EdgeSDKError(f"bundle signatures need the model_signing package, which is not installed: {_INSTALL}"
                           f" ({exc})") from exc
    return model_signing


def _hashing_config(ms):
    # Only the signature itself is left out. Git files are signed like any other (ignore_git_paths=False):
    # a bundle is not a checkout, and nothing in it may change unseen.
    return ms.hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False)


def _key_file(path: str | Path, kind: str) -> Path:
    key = Path(path)
    if not key.is_file():
        raise EdgeSDKError(f"{kind} key not found: {key} is not a file")
    return key


def _signed_payload(sig: Path) -> dict[str, Any]:
    """The signed file digests (``name -> hex``) and subject name read from the signature's DSSE envelope.

    Used only after the library has checked the envelope's signature, to explain or to check coverage."""
    envelope = json.loads(sig.read_text(encoding="utf-8"))["dsseEnvelope"]
    statement = json.loads(base64.b64decode(envelope["payload"]))
    resources = statement["predicate"]["resources"]
    return {"digests": {r["name"]: r["digest"] for r in resources},
            "name": statement["subject"][0]["name"],
            "ignore_paths": statement["predicate"]["serialization"].get("ignore_paths", [])}


def _refusal(root: Path, exc: Exception, ms) -> BundleError:
    """Translate a model_signing failure into a BundleError that says which rule the bundle broke."""
    text = str(exc)
    if type(exc).__name__ == "InvalidSignature":
        return BundleError(f"bundle {root}: {SIGNATURE} does not match the public key (forged, corrupt, or made "
                           "with another key)")
    if text.startswith("Key mismatch"):
        return BundleError(f"bundle {root}: {SIGNATURE} was made with another key than the trusted public key")
    if text.startswith("Signature mismatch"):
        return BundleError(f"bundle {root} does not match its signature: {_difference(root, ms)}")
    if "symlink" in text or "special file" in text:
        return BundleError(f"bundle {root} holds a symlink or special file, which a signed bundle may not: {text}")
    return BundleError(f"bundle {root}: {SIGNATURE} is not a valid model-signing signature: "
                       f"{type(exc).__name__}: {text}")


def _difference(root: Path, ms) -> str:
    """Name what changed between the signed files and the folder (the signature itself is authentic here)."""
    try:
        signed = _signed_payload(root / SIGNATURE)
        hashing = ms.hashing.Config().set_ignored_paths(paths=[SIGNATURE, *signed["ignore_paths"]],
                                                        ignore_git_paths=False)
        actual = {rd.identifier: rd.digest.digest_hex for rd in hashing.hash(root).resource_descriptors()}
    except Exception as exc:  # explaining must not hide the refusal itself
        return f"the files differ from the signed ones ({type(exc).__name__}: {exc})"
    expected = signed["digests"]
    added = sorted(actual.keys() - expected.keys())
    removed = sorted(expected.keys() - actual.keys())
    altered = sorted(k for k in actual.keys() & expected.keys() if actual[k] != expected[k])
    unchanged = len(actual.keys() & expected.keys()) - len(altered)
    if expected and not unchanged:
        return (f"{SIGNATURE} is the signature of another bundle ({signed['name']!r}): none of the "
                f"{len(expected)} file(s) it signs match this bundle")
    parts = [f"file {name!r} was altered" for name in altered]
    parts += [f"file {name!r} was added" for name in added]
    parts += [f"file {name!r} was removed" for name in removed]
    return "; ".join(parts) + " since signing" if parts else "the files differ from the signed ones"
