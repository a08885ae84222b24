"""Installs from an http URL, with a real HTTP server on loopback: the download resumes with Range after the
connection drops (within one install, and in the next install after one gave up), the size cap holds against the
announced length and against the bytes counted, only http(s) is fetched, and a silent server times out."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import replace

import pytest

from edgesdk import BundleStore, StoreError, VersionState
from edgesdk.choices import StoreReason
from store_support import FAST, listing, version_files


@pytest.fixture
def archive_url(server, archives) -> tuple[str, int]:
    data = archives[0].read_bytes()
    return server.serve("digits.edgebundle", data), len(data)


def test_install_from_a_url(server, archive_url, tmp_path):
    url, size = archive_url
    store = BundleStore(tmp_path / "s", FAST)
    sizes = []
    version = store.install(url + "?token=secret", progress=lambda s, d: s == "download" and sizes.append(d["bytes"]))
    assert version.state is VersionState.ACTIVE and version.bundle_version == "1"
    assert sizes[-1] == size and sizes == sorted(sizes)
    assert server.behaviour.requests == [{"path": "digits.edgebundle", "range": None, "if_range": None}]
    # a URL's query may hold a token: never written to the store's files
    assert not [p for p in store.root.rglob("*") if p.is_file() and b"secret" in p.read_bytes()]
    assert listing(store.root)["downloads"] == [] and listing(store.root)["staging"] == []


def test_a_dropped_download_resumes_with_range_in_the_same_install(server, archive_url, tmp_path):
    url, size = archive_url
    server.behaviour.drop_after, server.behaviour.drops = size // 2, 1
    version = BundleStore(tmp_path / "s", FAST).install(url)
    assert version.state is VersionState.ACTIVE
    first, second = server.behaviour.requests
    assert first["range"] is None and second["range"] == f"bytes={size // 2}-" and second["if_range"]
    assert server.behaviour.sent == size  # nothing fetched twice


def test_a_download_that_gave_up_is_resumed_by_the_next_install(server, archive_url, tmp_path):
    url, size = archive_url
    server.behaviour.drop_after = size // 3  # every answer drops after a third of the file
    store = BundleStore(tmp_path / "s", replace(FAST, retries=1))
    with pytest.raises(StoreError, match=r"the connection ended at \d+ bytes; gave up after 2 attempt\(s\) with "
                                         rf"\d+ of {size} bytes, kept in .*downloads.*the next install of this URL "
                                         "resumes from there") as info:
        store.install(url)
    assert info.value.reason is StoreReason.DOWNLOAD_FAILED and store.active() is None
    part = [p for p in (store.root / "downloads").iterdir() if p.suffix == ".part"][0]
    have = part.stat().st_size
    assert have == 2 * (size // 3)
    server.behaviour.drop_after = None
    assert BundleStore(store.root, FAST).install(url).state is VersionState.ACTIVE
    assert server.behaviour.requests[-1]["range"] == f"bytes={have}-"
    assert server.behaviour.sent == size
    assert listing(store.root)["downloads"] == []


def test_the_size_cap_holds_against_the_announced_length(server, archive_url, tmp_path):
    url, size = archive_url
    store = BundleStore(tmp_path / "s", replace(FAST, max_bytes=size - 1))
    with pytest.raises(StoreError, match=f"is {size} bytes, over the store's limit of {size - 1}") as info:
        store.install(url)
    assert info.value.reason is StoreReason.TOO_LARGE
    assert listing(store.root)["downloads"] == []


def test_the_size_cap_holds_against_the_bytes_when_no_length_is_announced(server, archive_url, tmp_path):
    url, size = archive_url
    server.behaviour.no_length = True
    with pytest.raises(StoreError, match=f"sent more than the store's limit of {size // 2} bytes"):
        BundleStore(tmp_path / "s", replace(FAST, max_bytes=size // 2)).install(url)
    assert BundleStore(tmp_path / "t", FAST).install(url).state is VersionState.ACTIVE  # no length, under the cap


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/digits.edgebundle"])
def test_only_http_and_https_are_fetched(tmp_path, url):
    with pytest.raises(StoreError, match="only http and https URLs are downloaded") as info:
        BundleStore(tmp_path / "s", FAST).install(url)
    assert info.value.reason is StoreReason.BAD_SOURCE


@pytest.mark.parametrize("target,message", [
    ("ftp://127.0.0.1/x.edgebundle", "redirects to a URL of scheme 'ftp', which is not followed"),
    ("file:///etc/passwd", "Redirection to url 'file:///etc/passwd' is not allowed"),  # urllib's own refusal
])
def test_a_redirect_to_another_scheme_is_not_followed(server, tmp_path, target, message):
    server.behaviour.redirect = target
    with pytest.raises(StoreError, match=message) as info:
        BundleStore(tmp_path / "s", FAST).install(server.base + "/digits.edgebundle")
    assert info.value.reason is StoreReason.DOWNLOAD_FAILED


def test_a_missing_file_is_a_download_failure_at_once(server, tmp_path):
    with pytest.raises(StoreError, match="HTTP 404") as info:
        BundleStore(tmp_path / "s", FAST).install(server.base + "/nothing.edgebundle")
    assert info.value.reason is StoreReason.DOWNLOAD_FAILED and len(server.behaviour.requests) == 1


def test_a_server_that_never_answers_times_out(server, tmp_path):
    server.behaviour.hang = True
    started = time.monotonic()
    with pytest.raises(StoreError, match="attempt 1: TimeoutError"):
        BundleStore(tmp_path / "s", replace(FAST, timeout_s=0.5, retries=0)).install(server.base + "/x.edgebundle")
    assert time.monotonic() - started < 5


def test_a_server_error_is_retried(server, archive_url, tmp_path):
    url, _ = archive_url
    server.behaviour.status = 503
    with pytest.raises(StoreError, match="attempt 3: HTTP 503"):
        BundleStore(tmp_path / "s", replace(FAST, retries=2)).install(url)
    assert len(server.behaviour.requests) == 3


def test_a_url_install_keeps_only_the_bundle_and_its_record(server, archive_url, tmp_path):
    url, _ = archive_url
    store = BundleStore(tmp_path / "s", FAST)
    version = store.install(url)
    assert version_files(store.root) == {version.id: ["version.json"]}  # no archive, no extraction record


@pytest.fixture
def slow_drip():
    """A server that announces 12 bytes and sends one every 0.5 s (each read returns within the socket timeout)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\nETag: "x"\r\n\r\n')
                for _ in range(12):
                    if stop.wait(0.5):
                        return
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/slow.edgebundle"
    stop.set()
    listener.close()


def test_the_deadline_holds_against_a_server_that_drips(slow_drip, tmp_path):
    started = time.monotonic()
    with pytest.raises(StoreError, match="deadline of 1 s passed") as info:
        BundleStore(tmp_path / "s", replace(FAST, timeout_s=1.0, deadline_s=1.0, retries=0)).install(slow_drip)
    assert info.value.reason is StoreReason.DOWNLOAD_FAILED
    assert time.monotonic() - started < 3  # not 12 x 0.5 s: the deadline bounds every read


def test_a_part_replaced_while_its_lock_was_awaited_is_not_written(server, archive_url, tmp_path, monkeypatch):
    """Another install finishing meanwhile moves the part file away (into its staging) between this one's open and
    its lock: this install must not write into the file it moved."""
    from edgesdk.store import download as downloading

    url, size = archive_url
    store = BundleStore(tmp_path / "s", FAST)
    theirs = tmp_path / "theirs.edgebundle"
    real_lock = downloading._lock  # private: the lock is wrapped to move the part file at that exact moment
    moved = []

    def lock_after_another_install_moved_it(fd, url):
        if not moved:
            part = next((store.root / "downloads").glob("*.part"))
            os.replace(part, theirs)  # what the other install's os.replace(part, dest) does
            theirs.write_bytes(b"the other install's archive")
            moved.append(part)
        real_lock(fd, url)

    monkeypatch.setattr(downloading, "_lock", lock_after_another_install_moved_it)
    version = store.install(url)
    assert version.state is VersionState.ACTIVE
    assert theirs.read_bytes() == b"the other install's archive"
