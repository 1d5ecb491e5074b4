"""spdl_rs.source against hostile input: links between class folders and out of a store's root, FIFOs and
devices, huge sampler arguments, misbehaving HTTP servers, Ctrl-C during a store call. Every call ends in
bounded time with a result or a typed Python exception (never a PanicException, an abort or a hang)."""

import os
import signal
import threading
import time

import pytest
from conftest import HostileServer

import spdl_rs

pytestmark = pytest.mark.skipif(not spdl_rs._native.HAS_SOURCE, reason="built without the source feature")


def _write(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_link_to_another_class_keeps_every_real_class(tmp_path, watchdog):
    from spdl_rs.source import list_dataset

    for cls in "abcd":
        _write(tmp_path / cls / f"{cls}1.jpg")
    # `a/also_c` sorts before `c`: it must not take c's place (nor shift d's label).
    os.symlink("../c", tmp_path / "a" / "also_c")
    os.symlink("..", tmp_path / "b" / "up")
    keys, labels, classes = list_dataset(tmp_path, extensions=["jpg"])
    assert classes == ["a", "b", "c", "d"]
    assert keys == ["a/a1.jpg", "b/b1.jpg", "c/c1.jpg", "d/d1.jpg"]
    assert labels == [0, 1, 2, 3]


def test_list_dataset_of_a_non_directory_is_an_error(tmp_path, watchdog):
    from spdl_rs.source import list_dataset

    with pytest.raises(NotADirectoryError, match="/dev/null"):
        list_dataset("/dev/null")
    _write(tmp_path / "file.txt")
    with pytest.raises(NotADirectoryError, match="file.txt"):
        list_dataset(tmp_path / "file.txt", layout="flat")
    with pytest.raises(FileNotFoundError):
        list_dataset(tmp_path / "missing")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads unreadable directories")
def test_unreadable_directories_raise_permission_error(tmp_path, watchdog):
    from spdl_rs.source import Store, list_dataset

    _write(tmp_path / "a" / "1.jpg")
    locked = tmp_path / "b"
    _write(locked / "2.jpg")
    locked.chmod(0)
    try:
        with pytest.raises(PermissionError):
            list_dataset(tmp_path)
        with pytest.raises(PermissionError):
            Store.open(str(tmp_path)).get("b/2.jpg")
    finally:
        locked.chmod(0o755)


def test_local_store_stays_in_its_root_and_refuses_special_files(tmp_path, watchdog):
    from spdl_rs.source import Store

    root, outside = tmp_path / "root", tmp_path / "outside"
    _write(root / "ok.bin", b"ok")
    _write(outside / "secret.txt", b"secret")
    os.symlink(outside / "secret.txt", root / "leak")
    os.symlink("/dev/zero", root / "zero")
    os.mkfifo(root / "pipe")

    store = Store.open(str(root))
    with pytest.raises(PermissionError, match="outside the store's root"):
        store.get("leak")
    start = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        store.get("pipe")
    assert time.monotonic() - start < 2.0
    assert [k for k, _ in store.list()] == ["ok.bin"]

    store = Store.open(str(root), follow_symlinks_outside_root=True)
    assert store.get("leak") == b"secret"
    with pytest.raises(OSError, match="character device"):
        store.get("zero")

    store = Store.open(str(root), follow_symlinks_outside_root=True, special_file_limit=4096, read_timeout=0.3)
    with pytest.raises(OSError, match="4096"):
        store.get("zero")
    assert store.get_range("zero", 0, 10) == bytes(10)
    assert store.get("pipe") == b""  # no writer: the FIFO ends at once

    store = Store.open(str(root), max_object_size=1)
    with pytest.raises(OSError, match="max_object_size"):
        store.get("ok.bin")

    with pytest.raises(ValueError, match="local directories only"):
        Store.open("http://127.0.0.1:9/x", follow_symlinks_outside_root=True)
    with pytest.raises(ValueError):
        Store.open(str(root), attempt_timeout=0.0)


def test_huge_sampler_arguments_raise_instead_of_aborting(watchdog):
    from spdl_rs.source import Sampler

    with pytest.raises(ValueError, match="limit"):
        Sampler.shuffled(10**10, 1).order(0)
    with pytest.raises(ValueError, match="limit"):
        Sampler.weighted([1.0, 2.0], 10**12, 0).order(0)
    with pytest.raises(ValueError, match="limit"):
        Sampler.sequential(2**62).order(0)
    # A 2-item share of a 2**40-item order costs 2 items.
    share = Sampler.sequential(2**40).sharded(0, 2**39)
    assert len(share) == 2
    assert share.order(0) == [0, 2**39]
    with pytest.raises(ValueError, match="limit"):
        Sampler.shuffled(2**40, 1).sharded(0, 2**39).order(0)
    with pytest.raises(ValueError, match="^n must be between 0 and"):
        Sampler.sequential(-1)
    # Ordinary sizes are unchanged.
    assert sorted(Sampler.shuffled(1000, 3).order(2)) == list(range(1000))


@pytest.fixture
def hostile_server():
    server = HostileServer()
    yield server
    server.close()


def _open_http(url, **kwargs):
    from spdl_rs.source import Store

    try:
        return Store.open(url, **kwargs)
    except Exception as e:  # a build without the `http` feature says so
        assert "http" in str(e)
        pytest.skip(f"built without the http feature: {e}")


def test_http_drips_and_endless_bodies_end_in_bounded_time(hostile_server, watchdog):
    store = _open_http(
        hostile_server.url, read_timeout=0.5, attempt_timeout=1.0, max_attempts=1, max_object_size=1 << 20
    )
    start = time.monotonic()
    with pytest.raises(OSError, match="attempt timed out"):
        store.get("drip")
    assert 0.9 < time.monotonic() - start < 4.0
    start = time.monotonic()
    with pytest.raises(OSError, match="max_object_size"):
        store.get("endless")
    assert time.monotonic() - start < 4.0
    with pytest.raises(FileNotFoundError):
        store.get("missing")


def test_ctrl_c_interrupts_a_store_call(hostile_server, watchdog):
    store = _open_http(hostile_server.url, read_timeout=30.0, attempt_timeout=None, max_attempts=1)
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            store.get("stall")
    finally:
        timer.cancel()
    elapsed = time.monotonic() - start
    assert elapsed < 2.0, elapsed
    # The store still works after the interrupted call.
    with pytest.raises(FileNotFoundError):
        store.get("missing")
