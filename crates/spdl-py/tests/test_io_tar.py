"""``spdl_rs.io.iter_tarfile`` over its native reader: members before a fault, buffers of every kind, streams that
return short or odd chunks, and reading no further than the member yielded. Archives are made at test time with
``tarfile``; the shared cases (formats, hostile headers) are in test_io_formats.py."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

import spdl_rs.io as sio
from spdl_rs.io import FormatError


def make_tar(members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


MEMBERS = [("a.txt", b"hello"), ("big.bin", bytes(range(256)) * 300), ("c", b"xyz")]  # big.bin: 75 KiB


class Trickle:
    """A raw stream: ``read(n)`` returns at most ``step`` bytes, as ``bytearray`` if asked."""

    def __init__(self, data: bytes, step: int, as_bytearray: bool = False) -> None:
        self.data, self.step, self.pos, self.as_bytearray = data, step, 0, as_bytearray

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.pos : self.pos + min(n, self.step)]
        self.pos += len(chunk)
        return bytearray(chunk) if self.as_bytearray else chunk  # type: ignore[return-value]


def test_every_source_kind_gives_the_same_members():
    data = make_tar(MEMBERS)
    for src in (data, bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8),
                np.frombuffer(data, dtype=np.uint8).reshape(-1, 512)):
        got = [(n, bytes(c)) for n, c in sio.iter_tarfile(src)]  # type: ignore[call-overload]
        assert got == MEMBERS, type(src)
    for stream in (io.BytesIO(data), Trickle(data, 100), Trickle(data, 4096, as_bytearray=True)):
        got = list(sio.iter_tarfile(stream))
        assert got == MEMBERS and all(type(c) is bytes for _, c in got)

    # Views keep the source alive and alias it.
    array = bytearray(data)
    views = dict(sio.iter_tarfile(array))
    array[512] = ord("J")
    assert bytes(views["a.txt"]) == b"Jello"

    with pytest.raises(ValueError, match="C-contiguous"):
        list(sio.iter_tarfile(np.frombuffer(data + b"\0", dtype=np.uint8)[::2]))


def test_members_before_a_fault_are_yielded_then_the_error():
    data = make_tar(MEMBERS)
    cut = data[: 1024 + 512 + 1000]  # inside big.bin's data
    for src in (cut, io.BytesIO(cut)):
        it = iter(sio.iter_tarfile(src))
        name, contents = next(it)
        assert (name, bytes(contents)) == ("a.txt", b"hello")
        with pytest.raises(FormatError, match="truncated.*'big.bin'"):
            next(it)
        with pytest.raises(StopIteration):  # exhausted after the error, like a generator
            next(it)


def test_stream_reads_no_further_than_the_member_it_yields():
    data = make_tar(MEMBERS)
    f = io.BytesIO(data)
    it = iter(sio.iter_tarfile(f))
    assert f.tell() == 0  # nothing is read before the first next()
    next(it)
    assert f.tell() == 1024  # a.txt's header and its padded data block
    next(it)
    assert f.tell() == 1024 + 512 + 75 * 1024


def test_stream_read_contract():
    class NotBytes:
        def read(self, n: int = -1) -> str:
            return "x" * n

    with pytest.raises(TypeError, match="read\\(\\) must return bytes, got str"):
        list(sio.iter_tarfile(NotBytes()))  # type: ignore[call-overload]

    class TooMuch:
        def read(self, n: int = -1) -> bytes:
            return bytes(n + 1)

    with pytest.raises(FormatError, match="more than the 512 requested"):
        list(sio.iter_tarfile(TooMuch()))

    class Failing:
        def read(self, n: int = -1) -> bytes:
            raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        list(sio.iter_tarfile(Failing()))


def test_names_that_are_not_utf8_use_surrogateescape():
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    data = make_tar([(name, b"x")], fmt=tarfile.GNU_FORMAT)
    assert [n for n, _ in sio.iter_tarfile(data)] == [name]
    assert [n for n, _ in sio.iter_tarfile(io.BytesIO(data))] == [name]


def test_hostile_sizes_fail_without_allocating():
    data = bytearray(make_tar([("a.txt", b"hello")]))
    # A base-256 size of 2**60 bytes on a 10 KiB archive.
    data[124:136] = bytes([0x80]) + (1 << 60).to_bytes(11, "big")
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    for src in (bytes(data), io.BytesIO(bytes(data))):
        with pytest.raises(FormatError, match=f"'a.txt'.*{1 << 60}"):
            list(sio.iter_tarfile(src))
