""".edgebundle archives, the good path and hostile ones (traversal, links, bombs, header bombs), the extraction cache
and property tests of the archive reader. Fake bundles of random bytes; no engine or torch.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk.bundle.reader import Bundle
from edgesdk.file_digest import sha256_file
from support import file_entry, write_manifest
from edgesdk.errors import BundleError
from edgesdk.trust import (SIGNATURE, ArchiveLimits, open_archive, pack_bundle, verify_bundle)
from edgesdk.trust import archive as archive_module
from trust_support import flip_byte, make_bundle

pytestmark = pytest.mark.trust  # model-signing: run in .venv-device (see the Makefile)



# -- archives: the good path -----------------------------------------------------------
def listing(root: Path, cache: Path) -> set[Path]:
    """Every path under ``root`` outside ``cache``: what an extraction must never change."""
    return {p for p in root.rglob("*") if not p.is_relative_to(cache)}


def test_archive_round_trip_keeps_the_signature_and_hits_the_cache(signed, tmp_path, keys, monkeypatch):
    archive = pack_bundle(signed, tmp_path / "signed.edgebundle")
    cache = tmp_path / "cache"
    first = open_archive(archive, cache)
    assert first.parent == cache and len(first.name) == 64
    assert sorted(p.relative_to(first) for p in first.rglob("*")) == sorted(p.relative_to(signed)
                                                                              for p in signed.rglob("*"))
    verify_bundle(first, keys["public"])

    def no_extraction(*args):
        raise AssertionError("a cache hit must not extract again")

    monkeypatch.setattr(archive_module, "_extract", no_extraction)
    assert open_archive(archive, cache) == first
    assert sorted(p.name for p in cache.iterdir()) == [first.name, first.name + ".record"]
    assert (cache.stat().st_mode & 0o777) == 0o700


def test_packing_is_deterministic_and_manifest_comes_first(signed, tmp_path):
    a = pack_bundle(signed, tmp_path / "a.edgebundle")
    b = pack_bundle(signed, tmp_path / "b.edgebundle")
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:
        names = tar.getnames()
        assert names == ["manifest.json", "golden", "golden/golden.npz", "model.onnx", SIGNATURE]
        assert {m.mtime for m in tar.getmembers()} == {0}


def test_default_cache_dir_is_bundles_in_the_edgesdk_cache(signed, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE_DIR", str(tmp_path / "edgesdk-cache"))
    out = open_archive(pack_bundle(signed, tmp_path / "x.edgebundle"))
    assert out.parent == tmp_path / "edgesdk-cache" / "bundles"


def test_pack_refuses_a_non_bundle_and_a_path_inside_the_bundle(signed, tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(BundleError, match="is not a bundle"):
        pack_bundle(tmp_path / "plain", tmp_path / "x.edgebundle")
    with pytest.raises(BundleError, match="inside the bundle it packs"):
        pack_bundle(signed, signed / "self.edgebundle")
    assert not (tmp_path / "x.edgebundle").exists()


def test_pack_refuses_a_bundle_holding_a_symlink(signed, tmp_path):
    (signed / "link").symlink_to("/etc/hostname")
    with pytest.raises(BundleError, match="'link' is not a regular file"):
        pack_bundle(signed, tmp_path / "x.edgebundle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signed.bundle"]


# -- archives: hostile ones -------------------------------------------------------------
def member(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, **attrs) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if data is not None and kind in (tarfile.REGTYPE, tarfile.CONTTYPE) else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def write_tar(path: Path, members: list[tuple], mode: str = "w:gz", prefix: Path | None = None) -> Path:
    """A tar of ``members`` ((TarInfo, bytes) pairs), after the files of the bundle ``prefix`` if given."""
    with tarfile.open(path, mode) as tar:
        if prefix is not None:
            for p in sorted(prefix.rglob("*"), key=lambda p: (p.name != "manifest.json", p)):
                tar.add(p, arcname=p.relative_to(prefix).as_posix(), recursive=False)
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return path


def assert_refused(archive: Path, tmp_path: Path, match: str, limits: ArchiveLimits = ArchiveLimits()) -> None:
    cache = tmp_path / "cache"
    before = listing(tmp_path, cache)
    with pytest.raises(BundleError, match=match):
        open_archive(archive, cache, limits)
    assert listing(tmp_path, cache) == before, "the extraction wrote outside the cache dir"
    assert not cache.exists() or not any(cache.iterdir()), "a failed extraction was left in the cache"


@pytest.mark.parametrize("name", ["../escape.txt", "../../escape.txt", "golden/../../../escape.txt",
                                  "./../../escape.txt"])
def test_dotdot_member_is_refused(signed, tmp_path, name):
    archive = write_tar(tmp_path / "evil.edgebundle", [member(name, b"pwned")], prefix=signed)
    assert_refused(archive, tmp_path, match=f"member '{name}' escapes the bundle with '..'")


def test_absolute_member_is_refused(signed, tmp_path):
    target = str(tmp_path / "abs-escape.txt")
    archive = write_tar(tmp_path / "evil.edgebundle", [member(target, b"pwned")], prefix=signed)
    assert_refused(archive, tmp_path, match="has an absolute path")
    assert not Path(target).exists()


def test_symlink_members_are_refused(signed, tmp_path):
    archive = write_tar(tmp_path / "evil.edgebundle",
                        [member("out", kind=tarfile.SYMTYPE, linkname=str(tmp_path)),
                         member("out/escape.txt", b"pwned")], prefix=signed)
    assert_refused(archive, tmp_path, match="member 'out' is a symbolic link")


def test_relative_symlink_member_is_refused(signed, tmp_path):
    archive = write_tar(tmp_path / "evil.edgebundle", [member("model2.onnx", kind=tarfile.SYMTYPE,
                                                              linkname="model.onnx")], prefix=signed)
    assert_refused(archive, tmp_path, match="member 'model2.onnx' is a symbolic link")


def test_hard_link_member_is_refused(signed, tmp_path):
    archive = write_tar(tmp_path / "evil.edgebundle",
                        [member("passwd", kind=tarfile.LNKTYPE, linkname="/etc/passwd")], prefix=signed)
    assert_refused(archive, tmp_path, match="member 'passwd' is a hard link")


@pytest.mark.parametrize("kind, what", [(tarfile.CHRTYPE, "a device node"), (tarfile.BLKTYPE, "a device node"),
                                        (tarfile.FIFOTYPE, "a fifo")])
def test_device_and_fifo_members_are_refused(signed, tmp_path, kind, what):
    archive = write_tar(tmp_path / "evil.edgebundle", [member("dev", kind=kind, devmajor=1, devminor=3)],
                        prefix=signed)
    assert_refused(archive, tmp_path, match=f"member 'dev' is {what}")


def test_duplicate_member_is_refused(signed, tmp_path):
    archive = write_tar(tmp_path / "evil.edgebundle", [member("model.onnx", b"replaced")], prefix=signed)
    assert_refused(archive, tmp_path, match="member 'model.onnx' appears twice")


def zero_bomb(path: Path, files: list[tuple[str, int]], block: int = 16 << 20) -> Path:
    """A gzip tar of files of zeros, written by streaming: gzip allows concatenated members, so one compressed
    block of zeros is written again and again and nothing of the unpacked size is ever in memory or on disk."""
    zeros = gzip.compress(bytes(block), compresslevel=9, mtime=0)
    with open(path, "wb") as fh:
        for name, size in files:
            info = tarfile.TarInfo(name)
            info.size = size
            fh.write(gzip.compress(info.tobuf(tarfile.PAX_FORMAT), mtime=0))
            for _ in range(size // block):
                fh.write(zeros)
        fh.write(gzip.compress(bytes(2 * tarfile.BLOCKSIZE), mtime=0))
    return path


def test_two_gigabyte_zero_bomb_is_refused_before_writing(tmp_path):
    archive = zero_bomb(tmp_path / "bomb.edgebundle", [("zeros.bin", 2 << 30)])
    assert archive.stat().st_size < 4 << 20
    with tarfile.open(archive, "r:gz") as tar:  # a well-formed tar.gz, as the standard reader sees it
        assert tar.next().size == 2 << 30
    assert_refused(archive, tmp_path, match="member 'zeros.bin' brings the unpacked size .* decompression bomb")


def test_bomb_of_many_members_is_refused_once_the_written_bytes_pass_the_ratio(tmp_path):
    """Each 4 MiB member is harmless; together they would unpack to 640 MiB, over 200x the archive."""
    archive = zero_bomb(tmp_path / "bomb.edgebundle", [(f"z{i:03d}", 4 << 20) for i in range(160)], block=4 << 20)
    assert_refused(archive, tmp_path, match="member 'z0[0-9][0-9]' brings .* decompression bomb")


def test_member_and_total_size_limits(signed, tmp_path):
    big = write_tar(tmp_path / "big.edgebundle", [member("big.bin", os.urandom(300_000))], prefix=signed)
    assert_refused(big, tmp_path, match="member 'big.bin' is 300000 bytes, over the limit of 100000",
                   limits=ArchiveLimits(max_member_bytes=100_000))
    assert_refused(big, tmp_path, match="member 'big.bin' brings the unpacked size .* over the limit of 200000",
                   limits=ArchiveLimits(max_total_bytes=200_000))


def test_a_hundred_thousand_tiny_files_are_refused_at_the_file_limit(tmp_path):
    # Headers are stamped from one template (tarfile.addfile would take seconds): only the name and checksum change.
    template = bytearray(tarfile.TarInfo("f000000").tobuf(tarfile.USTAR_FORMAT))
    template[148:156] = b" " * 8
    base = sum(template) - sum(b"f000000")
    headers = []
    for i in range(100_000):
        name = b"f%06d" % i
        template[0:7] = name
        template[148:156] = b"%06o\0 " % (base + sum(name))
        headers.append(bytes(template))
    archive = tmp_path / "many.edgebundle"
    archive.write_bytes(b"".join(headers) + bytes(2 * tarfile.BLOCKSIZE))
    with tarfile.open(archive) as tar:
        assert tar.next().name == "f000000"
    assert_refused(archive, tmp_path, match="has more than 10000 members \\(refused at 'f010000'\\)")


def test_truncated_archive_is_refused(signed, tmp_path):
    good = pack_bundle(signed, tmp_path / "good.edgebundle").read_bytes()
    cut = tmp_path / "cut.edgebundle"
    cut.write_bytes(good[: len(good) // 2])
    assert_refused(cut, tmp_path, match="is corrupt or truncated")


def test_plain_tar_cut_at_a_member_boundary_is_refused(signed, tmp_path):
    whole = write_tar(tmp_path / "whole.tar", [], mode="w", prefix=signed)
    with tarfile.open(whole) as tar:
        first = tar.getmembers()[0]
    assert first.name == "manifest.json"
    end = first.offset_data + -(-first.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    cut = tmp_path / "cut.edgebundle"
    cut.write_bytes(whole.read_bytes()[:end])  # manifest.json whole, then nothing: tar sees a clean end
    assert_refused(cut, tmp_path, match="does not hold a valid bundle: bundle file '.*' is missing from cut.edgebundle")
    cut.write_bytes(whole.read_bytes()[:end - 100])
    assert_refused(cut, tmp_path, match="is corrupt or truncated")


def test_archive_of_an_altered_bundle_is_refused(signed, tmp_path):
    flip_byte(signed / "model.onnx")
    archive = write_tar(tmp_path / "altered.edgebundle", [], prefix=signed)
    assert_refused(archive, tmp_path, match="does not hold a valid bundle: bundle file 'model.onnx' was altered")


def test_not_an_archive_is_refused(tmp_path):
    junk = tmp_path / "junk.edgebundle"
    junk.write_bytes(b"this is not a tar" * 100)
    assert_refused(junk, tmp_path, match="is corrupt or truncated")
    with pytest.raises(BundleError, match="bundle archive not found"):
        open_archive(tmp_path / "missing.edgebundle", tmp_path / "cache")


# -- archives: the cache is checked, not trusted by name ---------------------------------------
def bundle_name(root: Path) -> str:
    return json.loads((root / "manifest.json").read_text())["name"]


def test_archive_swapped_after_hashing_is_cached_under_what_was_extracted(tmp_path, monkeypatch):
    """The attack: replace the file between the hash and the extraction. The archive is read once into a private
    copy, so the entry is named after the bytes it holds and the genuine archive still opens as itself."""
    a = pack_bundle(make_bundle(tmp_path / "a", name="genuine"), tmp_path / "a.edgebundle")
    b = pack_bundle(make_bundle(tmp_path / "b", name="attacker"), tmp_path / "b.edgebundle")
    victim = tmp_path / "download.edgebundle"
    victim.write_bytes(a.read_bytes())
    real_hash = archive_module.sha256_file

    def hash_then_swap(path):
        digest = real_hash(path)
        victim.write_bytes(b.read_bytes())
        return digest

    monkeypatch.setattr(archive_module, "sha256_file", hash_then_swap)
    cache = tmp_path / "cache"
    out = open_archive(victim, cache)
    monkeypatch.setattr(archive_module, "sha256_file", real_hash)
    assert out.name == real_hash(b) and bundle_name(out) == "attacker"
    assert bundle_name(open_archive(a, cache)) == "genuine"


def test_bytes_after_the_tar_end_are_part_of_the_archive_hash(signed, tmp_path):
    archive = pack_bundle(signed, tmp_path / "a.edgebundle")
    padded = tmp_path / "padded.edgebundle"
    padded.write_bytes(archive.read_bytes() + b"trailing bytes after the gzip stream")
    assert open_archive(padded, tmp_path / "cache").name == sha256_file(padded) != sha256_file(archive)


def plant_other_bundle(entry: Path, tmp_path: Path) -> None:
    shutil.rmtree(entry)
    shutil.copytree(make_bundle(tmp_path / "planted", name="planted"), entry)


def plant_symlink(entry: Path, tmp_path: Path) -> None:
    shutil.rmtree(entry)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "notes.txt").write_text("precious")
    entry.symlink_to(tmp_path / "victim")


def plant_file(entry: Path, tmp_path: Path) -> None:
    shutil.rmtree(entry)
    entry.write_text("not a directory")


def rot_a_bit(entry: Path, tmp_path: Path) -> None:  # same size: only the sha256 tells
    flip_byte(entry / "model.onnx", at=-5)


def half_clean(entry: Path, tmp_path: Path) -> None:
    (entry / "golden" / "golden.npz").unlink()


def drop_record(entry: Path, tmp_path: Path) -> None:
    entry.with_name(entry.name + ".record").unlink()


def add_a_file(entry: Path, tmp_path: Path) -> None:
    (entry / "extra.bin").write_bytes(b"planted")


def forge_the_manifest(entry: Path, tmp_path: Path) -> None:
    """Another model with a manifest rewritten to match: Bundle.open passes, the record does not."""
    (entry / "model.onnx").write_bytes(os.urandom(2048))
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["artifacts"][0]["files"] = [file_entry(entry, entry / "model.onnx")]
    write_manifest(entry, manifest)


def give_away(entry: Path, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(entry, 65534, 65534)


@pytest.mark.parametrize("damage", [plant_other_bundle, plant_symlink, plant_file, rot_a_bit, half_clean,
                                    drop_record, add_a_file, forge_the_manifest, give_away])
def test_a_damaged_or_substituted_cache_entry_is_replaced(tmp_path, damage):
    archive = pack_bundle(make_bundle(tmp_path / "a", name="genuine"), tmp_path / "a.edgebundle")
    cache = tmp_path / "cache"
    entry = open_archive(archive, cache)
    damage(entry, tmp_path)
    for _ in range(2):
        out = open_archive(archive, cache)
        assert out == entry and not out.is_symlink() and out.is_dir() and bundle_name(out) == "genuine"
        assert not (out / "extra.bin").exists() and out.stat().st_uid == os.getuid()
        Bundle.open(out)
    assert sorted(p.name for p in cache.iterdir()) == [entry.name, entry.name + ".record"]
    if damage is plant_symlink:
        assert [p.name for p in (tmp_path / "victim").iterdir()] == ["notes.txt"]


def test_cache_dirs_are_created_private(signed, tmp_path):
    cache = tmp_path / "deep" / "er" / "cache"
    open_archive(pack_bundle(signed, tmp_path / "a.edgebundle"), cache)
    for d in (tmp_path / "deep", tmp_path / "deep" / "er", cache):
        assert d.stat().st_mode & 0o777 == 0o700, d


# -- archives: headers are bounded too ------------------------------------------------------
def header_bomb(path: Path, kind: bytes, size: int, block: int = 16 << 20) -> Path:
    """A gzip tar whose first header announces ``size`` bytes of long name (or PAX records), streamed as repeated
    gzip members of one compressed block, so it is small on disk and never whole in memory here."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = kind, size
    chunk = gzip.compress(b"a" * block, compresslevel=9, mtime=0)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(info.tobuf(tarfile.GNU_FORMAT), mtime=0))
        for _ in range(size // block):
            fh.write(chunk)
        fh.write(gzip.compress(tarfile.TarInfo("manifest.json").tobuf(tarfile.GNU_FORMAT) + bytes(1024), mtime=0))
    return path


@pytest.mark.parametrize("kind, what", [(tarfile.GNUTYPE_LONGNAME, "GNU long-name"), (tarfile.XHDTYPE, "PAX")])
def test_a_gigabyte_header_is_refused_from_its_header_block(tmp_path, kind, what):
    """tarfile reads such a header whole inside next(): 1 GiB of RAM for a 1 MB archive, unless refused first.
    A child process, so its peak RSS is this test's alone."""
    archive = header_bomb(tmp_path / "bomb.edgebundle", kind, 1 << 30)
    assert archive.stat().st_size < 4 << 20
    script = (f"import resource, sys\nfrom edgesdk.trust import open_archive\nfrom edgesdk.errors import BundleError\n"
              f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
              f"try:\n    open_archive({str(archive)!r}, {str(tmp_path / 'cache')!r})\n"
              f"except BundleError as exc:\n    print(exc)\n"
              f"print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    message, grown_mib = done.stdout.strip().rsplit("\n", 1)
    assert f"a {what} header of {1 << 30} bytes is over the limit of 65536" in message
    assert int(grown_mib) < 64, f"RSS grew by {grown_mib} MiB"


def test_the_tar_stream_is_counted_headers_included(signed, tmp_path):
    """Long names under 64 KiB each, for empty files: no member data to count, yet the stream is read in full."""
    long = [member("./" * 30_000 + f"f{i:03d}", b"") for i in range(40)]
    archive = write_tar(tmp_path / "names.edgebundle", long, mode="w:gz", prefix=signed)
    assert_refused(archive, tmp_path, match="tar stream goes on past [0-9]+ bytes \\(headers included\\)",
                   limits=ArchiveLimits(max_files=50, max_total_bytes=100_000))


# -- archives: properties ---------------------------------------------------------------
@lru_cache(maxsize=None)
def good_archive_bytes(mode: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        bundle = make_bundle(Path(d) / "b")
        return write_tar(Path(d) / "b.tar", [], mode=mode, prefix=bundle).read_bytes()


def open_bytes(data: bytes) -> None:
    """open_archive on ``data``: it may succeed or raise BundleError, nothing else, and writes only to the cache."""
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        (base / "a.edgebundle").write_bytes(data)
        cache = base / "cache"
        try:
            open_archive(base / "a.edgebundle", cache, ArchiveLimits(max_files=50, max_member_bytes=1 << 20))
        except BundleError:
            assert not cache.exists() or not any(cache.iterdir())
        assert listing(base, cache) == {base / "a.edgebundle"}


PROPERTY = settings(max_examples=60, deadline=None, database=None,  # no .hypothesis/ folder in the checkout
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.binary(max_size=4096) | st.binary(max_size=2048).map(gzip.compress))
def test_random_bytes_only_ever_raise_bundle_error(data):
    open_bytes(data)


names = st.sampled_from(["manifest.json", "model.onnx", "a", "a/b", "../x", "../../x", "/abs", "a/../../x", ".",
                         "./", "", "a\\b", "ok/" * 3, "x" * 120]) | st.text("ab./", max_size=10)
kinds = st.sampled_from([tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                         tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.CONTTYPE, b"Z"])
members = st.lists(st.tuples(names, kinds, st.binary(max_size=64), names), max_size=8)


@PROPERTY
@given(members, st.sampled_from(["w", "w:gz"]), st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
def test_random_tar_members_only_ever_raise_bundle_error(entries, mode, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=fmt) as tar:
        for name, kind, data, linkname in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, linkname
            info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    open_bytes(buf.getvalue())


@PROPERTY
@given(st.sampled_from(["w", "w:gz"]), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6),
       st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_damaged_good_archives_only_ever_raise_bundle_error(mode, edits, cut):
    data = bytearray(good_archive_bytes(mode))
    for at, value in edits:
        data[at % len(data)] = value
    open_bytes(bytes(data[: cut % len(data)] if cut is not None else data))
