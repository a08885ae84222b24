"""``edgesdk run`` read by an adversary (hardening issue 29): array files that declare more than they hold or more
samples than anyone meant, and ``--draw`` targets that cannot or must not be written. The console script in a
subprocess on the digits bundle (real engines); the memory findings measure the command's peak RSS."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SCRIPT = Path(sys.executable).parent / "edgesdk"
PEAK_RSS_MB = 200  # the done-when for the two memory findings
# Runs a command, its stdout to a file (a long run's answers are not held by the test either), and prints its exit
# code and the peak RSS of it and its children in KB: measured in a process of its own, so that the children of
# earlier tests (a quantize with torch) do not count.
MEASURE = """
import resource, subprocess, sys
with open(sys.argv[1], "wb") as out:
    proc = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.PIPE, timeout=600)
sys.stderr.buffer.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.fixture
def env(tmp_path) -> dict:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "EDGESDK_CACHE_DIR": str(tmp_path / "c")}


@pytest.fixture
def run_cli(env):
    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)

    return run


@pytest.fixture
def measured(env, tmp_path):
    """``measured(*args) -> (exit code, stdout text, stderr text, peak RSS in MB)`` of ``edgesdk *args``."""
    def run(*args):
        out = tmp_path / "stdout.txt"
        proc = subprocess.run([sys.executable, "-c", MEASURE, str(out), str(SCRIPT), *map(str, args)],
                              capture_output=True, text=True, env=env, timeout=700)
        code, rss_kb = proc.stdout.split()
        return int(code), out.read_text(), proc.stderr, int(rss_kb) / 1024

    return run


@pytest.fixture(scope="module")
def images(digits_images) -> list[Path]:
    return [sorted((digits_images / "val" / d).glob("*.png"))[0] for d in ("3", "8")]


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header declaring ``descr`` and ``shape`` (what np.save writes)."""
    text = ("{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)).encode()
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


def deflated_npz(path: Path, members: dict[str, tuple[str, tuple[int, ...]]]) -> Path:
    """An .npz whose every member is a header declaring (descr, shape) and that many zero bytes, deflated: a few MB
    on disk for GBs declared."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as npz:
        for name, (descr, shape) in members.items():
            with npz.open(name, "w", force_zip64=True) as member:
                member.write(npy_header(descr, shape))
                left = int(np.prod(shape)) * np.dtype(descr).itemsize
                zeros = bytes(1 << 24)
                while left:
                    member.write(zeros[:min(left, len(zeros))])
                    left -= min(left, len(zeros))
    return path


# -- finding 1: an .npz deflate bomb --------------------------------------------------------------------------------

def test_an_npz_bomb_of_complex128_is_refused_from_its_header(measured, digits_bundle, images, tmp_path):
    """1.55 MB on disk declaring complex128 (1, 10^8), 1.6 GB: no model input takes complex, so it is refused from
    the member's header, before a byte of data is decompressed; the image beside it is answered."""
    bomb = deflated_npz(tmp_path / "bomb.npz", {"image.npy": ("<c16", (1, 10**8))})
    assert bomb.stat().st_size < 2 << 20
    code, out, err, rss_mb = measured("run", digits_bundle.bundle, bomb, images[0], "--json", "--speed-check", "off")
    assert rss_mb < PEAK_RSS_MB, (rss_mb, err[-300:])
    assert code == 2, err[-2000:]
    rows = json.loads(out)["results"]
    assert rows[0]["input"] == str(bomb) and "holds complex128" in rows[0]["error"]["detail"], rows[0]
    assert rows[1]["top"][0]["label"] == "3"


def test_an_npz_member_larger_than_the_input_is_refused_from_its_header(measured, digits_bundle, tmp_path):
    """A float32 member of (1, 10^8), a dtype the input takes, is 400 MB declared for an input of 64 values: refused
    from its header by the input's shape, alone on the command line (so an error, exit 2)."""
    bomb = deflated_npz(tmp_path / "big.npz", {"image.npy": ("<f4", (1, 10**8))})
    code, out, err, rss_mb = measured("run", digits_bundle.bundle, bomb, "--speed-check", "off")
    assert rss_mb < PEAK_RSS_MB, (rss_mb, err[-300:])
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert f"{bomb}:image.npy holds samples of shape [100000000]; input 'x' takes [1, 1, 8, 8]" in err, err


def test_an_npz_member_shorter_than_its_header_declares_is_refused_before_reading(run_cli, digits_bundle,
                                                                                 images, tmp_path):
    """The archive says how many bytes a member holds once inflated: fewer than the header declares is refused
    before any is read (never read past what was declared, whatever the stream inflates to)."""
    x = np.zeros((1, 1, 8, 8), np.float32)
    short = tmp_path / "short.npz"
    with zipfile.ZipFile(short, "w", zipfile.ZIP_DEFLATED) as npz:
        npz.writestr("image.npy", npy_header("<f4", x.shape) + x.tobytes()[:-4])
    proc = run_cli("run", digits_bundle.bundle, short, images[0], "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["results"]
    assert "is cut short: 252 of the 256 bytes its header declares" in rows[0]["error"]["detail"], rows[0]
    assert rows[1]["top"][0]["label"] == "3"


@pytest.mark.filterwarnings("ignore:Duplicate name")  # zipfile warns as it writes the second
def test_a_duplicated_npz_member_is_refused_naming_it(run_cli, digits_bundle, images, tmp_path):
    """Two members named image.npy: which one counts depends on the reader (zipfile's last, another's first)."""
    dup = tmp_path / "dup.npz"
    with zipfile.ZipFile(dup, "w") as npz:
        for value in (0.0, 1.0):
            with npz.open("image.npy", "w") as member:
                np.lib.format.write_array(member, np.full((1, 1, 8, 8), value, np.float32))
    proc = run_cli("run", digits_bundle.bundle, dup, images[0], "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["results"]
    assert f"{dup} holds the member 'image.npy' twice" in rows[0]["error"]["detail"], rows[0]
    assert rows[1]["top"][0]["label"] == "3"


# -- finding 2: a long first axis -----------------------------------------------------------------------------------

def test_more_samples_than_the_cap_are_refused_from_the_header(measured, digits_bundle, images, tmp_path):
    """10^5 samples in a 25 KB .npz, or in a .npy: over the 10,000 samples a file may hold by default, refused from
    the header (naming the option that raises it), before any is read or answered."""
    npz, npy = tmp_path / "long.npz", tmp_path / "long.npy"
    np.savez_compressed(npz, image=np.zeros((10**5, 1, 8, 8), np.float32))
    np.save(npy, np.zeros((10**5, 1, 8, 8), np.float32))
    code, out, err, rss_mb = measured("run", digits_bundle.bundle, npz, npy, images[0], "--json", "--speed-check",
                                      "off")
    assert rss_mb < PEAK_RSS_MB, (rss_mb, err[-300:])
    assert code == 2, err[-2000:]
    rows = json.loads(out)["results"]
    assert [r["input"] for r in rows] == [str(npz), str(npy), str(images[0])]
    for row in rows[:2]:
        assert "holds 100000 samples; more than 10000 in one file is refused (--max-samples N raises it)" in \
            row["error"]["detail"], row
    assert rows[2]["top"][0]["label"] == "3"


def test_a_long_file_is_answered_sample_by_sample_in_bounded_memory(measured, digits_bundle, digits_arrays,
                                                                     tmp_path):
    """With the cap raised, 10^5 samples are read one at a time and each answer printed as it comes: the peak RSS
    stays that of one sample (it grew ~2.6 KB per sample when every row and result was held to the end)."""
    x = np.repeat(digits_arrays[0][:4].astype(np.float32), 25_000, axis=0)  # 10^5 samples, [3, 8, 0, 5] repeated
    npz = tmp_path / "long.npz"
    np.savez_compressed(npz, image=x)
    code, out, err, rss_mb = measured("run", digits_bundle.bundle, npz, "--max-samples", 100_000, "--speed-check",
                                      "off")
    assert rss_mb < PEAK_RSS_MB, (rss_mb, err[-300:])
    assert code == 0, err[-2000:]
    answers = [line for line in out.splitlines() if line.startswith(f"{npz}[")]
    assert len(answers) == 10**5
    assert answers[0].startswith(f"{npz}[0]: ") and answers[-1].startswith(f"{npz}[99999]: ")
    first = [line.split(": ")[1] for line in answers[:4]]
    assert [line.split(": ")[1] for line in answers[-4:]] == first  # the same four digits at the end


def test_max_samples_below_one_is_refused(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--max-samples", 0)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--max-samples must be at least 1, got 0" in proc.stderr


# -- finding 5: --draw ----------------------------------------------------------------------------------------------

def _answered(stdout: str, images: list[Path]) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(tuple(f"{p}: " for p in images))]


@pytest.mark.parametrize("target", ["directory", "/dev/full", "/proc/edgesdk-drawn.png", "file"])
def test_a_draw_that_fails_prints_every_answer_and_exits_2(run_cli, digits_bundle, images, tmp_path, target):
    """--draw into a directory that cannot hold it, a device, /proc, or an existing file given several inputs: every
    answer is still printed, each input says on stderr why it was not drawn, and the command exits 2 at the end."""
    out = {"directory": tmp_path / "no" / "such" / "dir" / "x.png", "file": tmp_path / "exists.png"}.get(
        target, Path(target))
    if target == "directory":
        (tmp_path / "no").write_text("a file where the folder would go")
    if target == "file":
        out.write_bytes(b"keep me")
    proc = run_cli("run", digits_bundle.bundle, *images, "--draw", out)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    answers = _answered(proc.stdout, images)
    assert [a.split(": ")[1] for a in answers] == ["3", "8"], proc.stdout
    not_drawn = [line for line in proc.stderr.splitlines() if ": not drawn: " in line]
    assert [line.split(": not drawn: ")[0] for line in not_drawn] == [str(p) for p in images], proc.stderr
    if target == "file":
        assert out.read_bytes() == b"keep me"


def test_draw_into_an_existing_directory_with_one_input(run_cli, digits_bundle, images, tmp_path):
    folder = tmp_path / "drawings"
    folder.mkdir()
    proc = run_cli("run", digits_bundle.bundle, images[0], "--draw", folder, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)["results"]
    assert row["drawn"] == str(folder / f"{images[0].stem}.drawn.png")
    assert Image.open(row["drawn"]).size == Image.open(images[0]).size


def test_draw_refuses_to_replace_a_file_or_follow_a_link_without_force(run_cli, digits_bundle, images, tmp_path):
    """An existing file, or a symlink to one, is neither overwritten nor written through: refused for that input
    (exit 2, the answer printed); --force replaces the file, and the link itself (never what it points to)."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    link, existing = tmp_path / "link.png", tmp_path / "existing.png"
    link.symlink_to(victim)
    existing.write_bytes(b"old drawing")
    for out in (existing, link):
        proc = run_cli("run", digits_bundle.bundle, images[0], "--draw", out)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert _answered(proc.stdout, images)[0].split(": ")[1] == "3"
        assert f"{images[0]}: not drawn: {out} exists; --force replaces it" in proc.stderr, proc.stderr
    assert victim.read_bytes() == b"precious" and existing.read_bytes() == b"old drawing"
    for out in (existing, link):
        proc = run_cli("run", digits_bundle.bundle, images[0], "--draw", out, "--force")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not out.is_symlink() and Image.open(out).size == Image.open(images[0]).size
    assert victim.read_bytes() == b"precious"


def test_draw_never_writes_into_a_device_even_with_force(run_cli, digits_bundle, images):
    proc = run_cli("run", digits_bundle.bundle, images[0], "--draw", "/dev/full", "--force", "--json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)["results"]
    assert row["top"][0]["label"] == "3" and "drawn" not in row
    assert row["draw_error"] == "/dev/full exists and is not a regular file; it is not replaced"


def test_draw_gives_inputs_with_the_same_name_a_drawing_each(run_cli, digits_bundle, images, tmp_path):
    """a/x.png and b/x.png, and the two samples of x.npz (uint8 images): one PNG each, none written over another."""
    inputs = []
    for folder, image in zip("ab", images):
        (tmp_path / folder).mkdir()
        inputs.append(tmp_path / folder / "x.png")
        inputs[-1].write_bytes(image.read_bytes())
    batch = tmp_path / "x.npz"
    np.savez(batch, image=np.stack([np.asarray(Image.open(p)) for p in images]))  # uint8 [2, 8, 8]: 2 images
    out = tmp_path / "drawn"
    proc = run_cli("run", digits_bundle.bundle, *inputs, batch, "--draw", out, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["results"]
    drawn = [r.get("drawn") for r in rows]
    assert len(set(drawn)) == 4 and None not in drawn, (rows, proc.stderr)
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(d).name for d in drawn)
    assert Path(drawn[0]).name == "x.drawn.png"
