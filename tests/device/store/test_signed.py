"""A store that requires signatures installs a bundle signed with its key (from a folder and from an archive) and
refuses one signed with another key or changed since signing; the active version stays.

Signatures need model-signing, which cannot share .venv with litert-torch: the check runs in the device venv
(``EDGESDK_DEVICE_VENV``, set by ``make test``) on a release of the real digits bundle built here. The refusal of an
unsigned bundle, which needs no model-signing, is in test_store.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

DEVICE_VENV = os.environ.get("EDGESDK_DEVICE_VENV")

CHILD = """
import json, shutil, sys
from pathlib import Path
from edgesdk import BundleError, BundleStore, RuntimeOptions, StoreOptions, Trust
from edgesdk.trust import generate_keypair, pack_bundle, sign_bundle

src, work = Path(sys.argv[1]), Path(sys.argv[2])
generate_keypair(work / "ours.pem", work / "ours.pub")
generate_keypair(work / "theirs.pem", work / "theirs.pub")

def release(name, version, key):
    out = shutil.copytree(src, work / name)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["version"] = version
    (out / "manifest.json").write_text(json.dumps(manifest))
    sign_bundle(out, work / key)
    return out

signed = release("signed", "s1", "ours.pem")
archive = pack_bundle(release("signed2", "s2", "ours.pem"), work / "s2.edgebundle")
theirs = release("theirs", "t1", "theirs.pem")
changed = release("changed", "c1", "ours.pem")
manifest = json.loads((changed / "manifest.json").read_text())
manifest["version"] = "c2"  # after signing
(changed / "manifest.json").write_text(json.dumps(manifest))

check = RuntimeOptions(engine="onnxruntime", speed_check="off", monitor=False)
store = BundleStore(work / "store", StoreOptions(self_check=check, trust=Trust(public_key=work / "ours.pub")))
report = {"signed": store.install(signed).to_dict(), "archive": store.install(archive).to_dict()}
for name, bundle in (("theirs", theirs), ("changed", changed)):
    try:
        store.install(bundle)
        report[name] = "installed"
    except BundleError as exc:
        report[name] = str(exc)
report["active"] = store.active().to_dict()
print("REPORT " + json.dumps(report))
"""


@pytest.mark.skipif(not DEVICE_VENV, reason="bundle signatures need model-signing, installed only in the device venv "
                                            "(make test sets EDGESDK_DEVICE_VENV)")
def test_a_store_that_requires_signatures(versions, tmp_path):
    python = str(Path(DEVICE_VENV) / "bin" / "python")
    proc = subprocess.run([python, "-c", CHILD, str(versions[0]), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "EDGESDK_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert report["signed"]["state"] == "active" and report["signed"]["signed"] is True
    assert report["archive"]["state"] == "active" and report["archive"]["bundle_version"] == "s2"
    assert "was made with another key than the trusted public key" in report["theirs"]
    assert "does not match its signature: file 'manifest.json' was altered since signing" in report["changed"]
    assert report["active"]["id"] == report["archive"]["id"]
