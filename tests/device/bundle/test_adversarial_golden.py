"""Adversarial golden data (issue 15): ``golden.npz`` is read member by member, only the members the manifest names,
each checked from its ``.npy`` header (dtype, shape, bytes) before its data is read; the numerics check never
reports "checked" on zero samples."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bounded_child import run_bounded
from edgesdk import Bundle
from edgesdk.errors import BundleError
from support import rehash


def _npy(shape: tuple[int, ...], dtype: str = "<f4", data: bytes | None = None) -> bytes:
    """A .npy file: its header declares ``shape`` and ``dtype``; ``data`` (default: zeros of that size) follows."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    if data is None:
        data = bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return buf.getvalue() + data


def _golden(bundle: Path, members: dict[str, bytes], compress: bool = False) -> None:
    """Replace the bundle's golden.npz with ``members`` (name -> .npy bytes) and make the checksums match again."""
    with zipfile.ZipFile(bundle / "golden.npz", "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(f"{name}.npy", data)
    rehash(bundle)


def _good_members(bundle: Path) -> dict[str, bytes]:
    with np.load(bundle / "golden.npz") as data:
        return {k: _npy(data[k].shape, data[k].dtype.str, data[k].tobytes()) for k in data.files}


def _refused(bundle: Path, match: str) -> None:
    b = Bundle.open(bundle)
    with pytest.raises(BundleError, match=match) as info:
        b.golden()
    assert "golden file 'golden.npz'" in str(info.value)


def test_golden_reads_what_np_load_reads(digits_bundle):
    arrays = Bundle.open(digits_bundle.bundle).golden()
    with np.load(digits_bundle.bundle / "golden.npz") as data:
        assert sorted(arrays) == sorted(data.files) == ["input_0", "output_0"]
        for name in data.files:
            np.testing.assert_array_equal(arrays[name], data[name])
            assert arrays[name].dtype == data[name].dtype and arrays[name].flags.writeable


def test_missing_member_is_named(bundle_copy):
    members = _good_members(bundle_copy)
    del members["input_0"]
    _golden(bundle_copy, members)
    _refused(bundle_copy, r"it has no member 'input_0' \(the manifest's tensor \".*\"\); it holds \"output_0.npy\"")


def test_golden_that_is_not_a_zip(bundle_copy):
    (bundle_copy / "golden.npz").write_bytes(b"PK\x03\x04" + bytes(200))
    rehash(bundle_copy)
    _refused(bundle_copy, r"is unreadable: BadZipFile")


@pytest.mark.parametrize(("name", "npy", "match"), [
    ("input_0", _npy((8, 1, 8, 8), "<f8"), r"member 'input_0' is float64; the manifest says 'float32'"),
    ("input_0", _npy((8, 1, 9, 9)), r"member 'input_0' has shape \[8, 1, 9, 9\]; the manifest's tensor is "
                                    r"\[1, 1, 8, 8\]"),
    ("input_0", _npy((8, 64)), r"member 'input_0' has shape \[8, 64\]"),
    ("output_0", _npy((8, 10), "<c8"), r"member 'output_0' has dtype complex64, not a number type"),
    ("output_0", _npy((8, 10), "|S4"), r"member 'output_0' has dtype \|S4, not a number type"),
    ("output_0", _npy((7, 10)), r"its members must hold the same number of samples, at least one; they hold "
                                r"input_0 8, output_0 7"),
], ids=["dtype", "shape", "rank", "complex", "bytes", "counts"])
def test_member_not_matching_the_manifest_is_refused(bundle_copy, name, npy, match):
    members = _good_members(bundle_copy)
    members[name] = npy
    _golden(bundle_copy, members)
    _refused(bundle_copy, match)


def test_zero_samples_are_refused_and_never_checked(bundle_copy):
    from edgesdk.runtime import numerics

    _golden(bundle_copy, {"input_0": _npy((0, 1, 8, 8)), "output_0": _npy((0, 10))})
    _refused(bundle_copy, r"same number of samples, at least one; they hold input_0 0, output_0 0")
    bundle = Bundle.open(bundle_copy)
    with bundle.artifact("onnxruntime-fp32").open() as engine, pytest.raises(BundleError, match="at least one"):
        numerics.check(engine, bundle, "onnxruntime-fp32")


def test_golden_count_zero_is_refused(bundle_copy):
    m = json.loads((bundle_copy / "manifest.json").read_text())
    m["golden"]["count"] = 0
    (bundle_copy / "manifest.json").write_text(json.dumps(m))
    _refused(bundle_copy, r"golden.count is 0, so nothing would be checked")


def test_byte_limit(bundle_copy, monkeypatch):
    bundle = Bundle.open(bundle_copy)
    with pytest.raises(BundleError, match=r"the members the manifest names hold 2368 bytes, over the limit of 1000 "
                                          r"\(\$EDGESDK_MAX_GOLDEN_BYTES raises it\)"):
        bundle.golden(max_bytes=1000)
    monkeypatch.setenv("EDGESDK_MAX_GOLDEN_BYTES", "1000")
    with pytest.raises(BundleError, match="over the limit of 1000"):
        bundle.golden()
    monkeypatch.setenv("EDGESDK_MAX_GOLDEN_BYTES", "2368")
    assert len(bundle.golden()["input_0"]) == 8


# The memory-risky cases run in a child with a capped address space: a regression fails, it does not swap.
def _in_child(bundle: Path) -> dict:
    return run_bounded(f"edgesdk.Bundle.open({str(bundle)!r}).golden()", headroom_mb=300)


def test_header_declaring_2_to_the_40_elements_is_refused_from_the_header(bundle_copy):
    rows = 1 << 34  # input_0: 2^40 floats declared, 4 KiB present
    _golden(bundle_copy, {"input_0": _npy((rows, 1, 8, 8), data=bytes(4096)), "output_0": _npy((rows, 10), data=b"")})
    answer = _in_child(bundle_copy)
    assert answer.get("error") == "BundleError", answer
    assert f"hold {rows * (64 + 10) * 4} bytes, over the limit of 268435456" in answer["message"]


def test_member_the_manifest_does_not_name_is_never_read(bundle_copy):
    """A 2 GiB array squeezed into a few MB beside the real members: not read, whatever it declares."""
    members = _good_members(bundle_copy)
    members["padding"] = _npy((1 << 28,), "<f8", data=bytes(8 << 20))  # 2 GiB declared, 8 MiB of zeros present
    _golden(bundle_copy, members, compress=True)
    assert (bundle_copy / "golden.npz").stat().st_size < 1 << 20
    answer = run_bounded(f"""
        golden = edgesdk.Bundle.open({str(bundle_copy)!r}).golden()
        if sorted(golden) != ["input_0", "output_0"]:
            raise SystemExit(f"read {{sorted(golden)}}")
    """, headroom_mb=300)
    assert answer == {"ok": True}


def test_object_arrays_are_refused_from_the_header(bundle_copy):
    members = _good_members(bundle_copy)
    members["output_0"] = _npy((8, 10), "|O", data=b"\x80\x04N.")  # a pickle, never loaded
    _golden(bundle_copy, members)
    _refused(bundle_copy, r"member 'output_0' holds Python objects, which edgesdk never unpickles "
                          r"\(allow_pickle=False\)")


def test_member_cut_short_is_named(bundle_copy):
    members = _good_members(bundle_copy)
    members["output_0"] = _npy((8, 10), data=bytes(100))
    _golden(bundle_copy, members)
    _refused(bundle_copy, r"member 'output_0' is cut short: 100 of 320 bytes")


def test_malformed_header_is_named(bundle_copy):
    members = _good_members(bundle_copy)
    members["input_0"] = b"\x93NUMPY\x01\x00\x10\x00{'descr': 'bad'}"
    _golden(bundle_copy, members)
    _refused(bundle_copy, r"is unreadable: ValueError")
