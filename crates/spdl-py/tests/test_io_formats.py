"""SPDL's array, WAV, TAR and filter-description names in ``spdl_rs.io``: NPY/NPZ read in place
(``load_npy``, ``load_npz``, ``NpzFile``), ``ArrayInterface``/``CUDAArrayInterface``, ``convert_array``,
``to_jax``/``to_numba``, ``parse_wav``/``load_wav``/``WAVHeader``, ``iter_tarfile`` and the
``get_*_filter_desc``/``get_*buffer_desc`` strings. Every input is made at test time (numpy, ``wave``,
``tarfile``, ``zipfile`` and the ``ffmpeg`` CLI); hostile inputs must give a clear ``ValueError``."""

from __future__ import annotations

import gc
import io
import math
import shutil
import struct
import subprocess
import sys
import tarfile
import wave
import zipfile
import zlib

import pytest

np = pytest.importorskip("numpy")

import spdl_rs  # noqa: E402
import spdl_rs.io as sio  # noqa: E402

inf = math.inf


def npy_bytes(array, version=None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=True)
    else:
        np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


def npy_with_header(header: str, payload: bytes = b"") -> bytes:
    """NPY v1 bytes with a hand-written header dict (padded as numpy pads it)."""
    text = header.encode("latin1")
    pad = (64 - (10 + len(text) + 1) % 64) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + payload


def assert_format_error(excinfo, *words: str) -> None:
    """The error is a ValueError (spdl_rs's class) and a RuntimeError (SPDL's), naming the cause."""
    err = excinfo.value
    assert isinstance(err, ValueError) and isinstance(err, RuntimeError), type(err)
    for word in words:
        assert word in str(err), (word, str(err))


################################################################################
# NPY
################################################################################

NPY_CASES = [
    np.arange(24, dtype=np.int64).reshape(2, 3, 4),
    np.linspace(-1, 1, 7, dtype=np.float32),
    np.array([True, False, True]),
    np.array([1 + 2j, -3.5j]),
    np.arange(5, dtype=">i4"),
    np.array(["ab", "ç", ""]),
    np.array([b"ab", b"c"]),
    np.array(["2020-01-01", "2024-02-29"], dtype="M8[D]"),
    np.array([1.5, -2.25], dtype=np.float16),
    np.array(7),
    np.zeros((0, 3)),
    np.array([(1, 2.5, b"x"), (3, -1.0, b"yz")], dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S2")]),
    np.zeros(2, dtype=np.dtype({"names": ["p", "q"], "formats": ["u1", "<u8"], "offsets": [0, 8], "itemsize": 24})),
]


@pytest.mark.parametrize("ref", NPY_CASES, ids=lambda a: f"{a.dtype}{a.shape}")
def test_load_npy_matches_numpy_and_views_the_bytes(ref):
    data = npy_bytes(ref)
    got = sio.load_npy(data)
    expected = np.load(io.BytesIO(data))
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tolist() == expected.tolist()
    if got.nbytes:
        assert np.shares_memory(got, np.frombuffer(data, dtype=np.uint8))
    assert not got.flags.writeable  # bytes are immutable


def test_load_npy_fortran_order_keeps_column_major_strides():
    ref = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    data = npy_bytes(ref)
    got = sio.load_npy(data)
    assert got.flags.f_contiguous and not got.flags.c_contiguous
    assert got.strides == ref.strides
    np.testing.assert_array_equal(got, ref)
    assert np.shares_memory(got, np.frombuffer(data, dtype=np.uint8))


def test_load_npy_format_versions_2_and_3():
    ref = np.arange(6, dtype=np.uint16)
    for version in [(1, 0), (2, 0), (3, 0)]:
        np.testing.assert_array_equal(sio.load_npy(npy_bytes(ref, version)), ref)
    unicode_fields = np.zeros(2, dtype=[("größe", "<i4")])
    got = sio.load_npy(npy_bytes(unicode_fields, (3, 0)))
    assert got.dtype.names == ("größe",)


def test_load_npy_writability_copy_and_lifetime():
    ref = np.arange(10, dtype=np.float64)
    source = bytearray(npy_bytes(ref))
    view = sio.load_npy(source)
    assert view.flags.writeable  # a bytearray source is mutable: the view is too
    view[0] = 42.0
    assert sio.load_npy(bytes(source))[0] == 42.0  # the write went into the source
    with pytest.raises(BufferError):
        source.extend(b"x")  # a live view blocks resizing the source
    copied = sio.load_npy(source, copy=True)
    assert copied.flags.writeable and copied.flags.owndata
    assert not np.shares_memory(copied, view)
    copied[1] = -1
    assert view[1] == 1.0

    readonly_copy = sio.load_npy(npy_bytes(ref), copy=True)
    assert readonly_copy.flags.writeable

    del view, source
    data = npy_bytes(ref)
    kept = sio.load_npy(data)
    del data
    gc.collect()
    np.testing.assert_array_equal(kept, ref)  # the array keeps its bytes alive


def test_load_npy_offset_views_and_other_buffers():
    ref = np.arange(4.0)
    data = npy_bytes(ref)
    unaligned = memoryview(b"x" + data)[1:]
    got = sio.load_npy(unaligned)
    np.testing.assert_array_equal(got, ref)
    as_array = np.frombuffer(data, dtype=np.uint8)
    np.testing.assert_array_equal(sio.load_npy(as_array), ref)
    with pytest.raises(TypeError, match="bytes-like"):
        sio.load_npy("not bytes")  # type: ignore[arg-type]


def test_load_npy_hostile_inputs_are_clear_errors():
    data = npy_bytes(np.arange(3))
    with pytest.raises(ValueError) as e:
        sio.load_npy(data[:-1])
    assert_format_error(e, "shorter than its declared shape", "24 bytes", "23")
    with pytest.raises(ValueError) as e:
        sio.load_npy(data[:20])
    assert_format_error(e, "header", "truncated")
    with pytest.raises(ValueError) as e:
        sio.load_npy(b"X" + data[1:])
    assert_format_error(e, "\\x93NUMPY")
    for short in (b"", b"\x93NUM"):
        with pytest.raises(ValueError) as e:
            sio.load_npy(short)
        assert_format_error(e, "magic", "too short")
    with pytest.raises(ValueError) as e:
        sio.load_npy(b"\x93NUMPY\x09\x00" + data[8:])
    assert_format_error(e, "version 9.0")
    with pytest.raises(ValueError) as e:  # a v2 header length of 4 GiB on 100 bytes
        sio.load_npy(b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + b" " * 100)
    assert_format_error(e, "4294967295 bytes", "truncated")

    big_header = b"\x93NUMPY\x02\x00" + struct.pack("<I", 2 << 20) + b" " * (2 << 20)
    with pytest.raises(ValueError) as e:  # present, but more header text than any array needs
        sio.load_npy(big_header)
    assert_format_error(e, "2097152 bytes", "more than 1048576")

    # A header that declares ~8 TB on 24 bytes: refused before any allocation.
    huge = npy_with_header("{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }", bytes(24))
    with pytest.raises(ValueError) as e:
        sio.load_npy(huge)
    assert_format_error(e, "8000000000000 bytes", "24 are present")
    # Zero-size items need no bytes, whatever the shape: nothing is allocated.
    empty_items = npy_with_header("{'descr': '|V0', 'fortran_order': False, 'shape': (4611686018427387904,), }")
    got = sio.load_npy(empty_items)
    assert got.shape == (4611686018427387904,) and got.nbytes == 0 and not got.flags.writeable

    # Object arrays are pickles: refused without unpickling.
    pickled = npy_bytes(np.array([1, "a", None], dtype=object))
    with pytest.raises(ValueError) as e:
        sio.load_npy(pickled)
    assert_format_error(e, "object", "pickle")
    nested = npy_bytes(np.zeros(2, dtype=[("a", "<i4"), ("o", "O")]))
    with pytest.raises(ValueError) as e:
        sio.load_npy(nested)
    assert_format_error(e, "object")

    bad_headers = {
        "[1, 2, 3]": "expected a dict",
        "{'descr': '<i8', 'shape': (3,), }": "expected a dict",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (-3,), }": "negative dimension",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (3.0,), }": "invalid shape",
        "{'descr': '<i8', 'fortran_order': 'yes', 'shape': (3,), }": "invalid fortran_order",
        "{'descr': 'not-a-dtype', 'fortran_order': False, 'shape': (3,), }": "invalid dtype",
        "{'descr': '<i8', 'fortran_order': False, 'shape': __import__('os'), }": "failed to parse header",
        "{" * 500: "failed to parse header",
    }
    for header, words in bad_headers.items():
        with pytest.raises(ValueError) as e:
            sio.load_npy(npy_with_header(header, bytes(24)))
        assert_format_error(e, words)


################################################################################
# NPZ
################################################################################


def npz_bytes(compressed: bool = False, **arrays) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


ARRAYS = {
    "x": np.arange(10, dtype=np.int64),
    "y": np.sin(np.arange(6, dtype=np.float32)).reshape(2, 3),
    "f": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "s": np.array([(1, b"a")], dtype=[("i", "<u2"), ("b", "S1")]),
}


@pytest.mark.parametrize("compressed", [False, True])
def test_load_npz_matches_numpy(compressed):
    data = npz_bytes(compressed, **ARRAYS)
    npz = sio.load_npz(data)
    assert isinstance(npz, sio.NpzFile)
    assert npz.files == list(ARRAYS) and list(npz) == list(ARRAYS) and len(npz) == 4
    assert "x" in npz and "x.npy" in npz and "z" not in npz
    assert repr(npz) == "NpzFile object with 4 entries."
    with np.load(io.BytesIO(data)) as ref:
        for name in ARRAYS:
            got = npz[name]
            assert got.dtype == ref[name].dtype and got.strides == ref[name].strides
            np.testing.assert_array_equal(got, ref[name])
            np.testing.assert_array_equal(npz[f"{name}.npy"], ref[name])
            source = np.frombuffer(data, dtype=np.uint8)
            if compressed:  # inflated into memory of its own, writable
                assert got.flags.writeable and not np.shares_memory(got, source)
            else:  # a view of the archive, read-only like its bytes
                assert not got.flags.writeable and np.shares_memory(got, source)
    with pytest.raises(KeyError, match="z is not a file in the archive"):
        npz["z"]
    assert dict(npz.items()).keys() == ARRAYS.keys()


def test_load_npz_stored_entries_follow_a_mutable_source_and_keep_it_alive():
    data = bytearray(npz_bytes(x=np.arange(4)))
    npz = sio.load_npz(data)
    x = npz["x"]
    assert x.flags.writeable
    del npz, data
    gc.collect()
    np.testing.assert_array_equal(x, np.arange(4))


def test_load_npz_zip_variants():
    # Entries written to a non-seekable stream carry their sizes in data descriptors.
    class Unseekable:
        def __init__(self):
            self.buf = io.BytesIO()

        def write(self, b):
            return self.buf.write(b)

        def flush(self):
            pass

    out = Unseekable()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("a.npy", "w") as f:
            f.write(npy_bytes(np.arange(5)))
        zf.writestr("dir/b.npy", npy_bytes(np.ones(2)), compress_type=zipfile.ZIP_STORED)
    npz = sio.load_npz(out.buf.getvalue())
    assert npz.files == ["a", "dir/b"]
    np.testing.assert_array_equal(npz["a"], np.arange(5))
    np.testing.assert_array_equal(npz["dir/b"], np.ones(2))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_BZIP2) as zf:
        zf.writestr("a.npy", npy_bytes(np.arange(3)))
    with pytest.raises(ValueError, match="unsupported compression method 12"):
        sio.load_npz(buf.getvalue())

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("notes.txt", b"hello")
    with pytest.raises(ValueError) as e:
        sio.load_npz(buf.getvalue())["notes.txt"]
    assert_format_error(e, "'notes.txt'", "magic prefix")


def test_load_npz_hostile_archives():
    data = npz_bytes(x=np.arange(100), y=np.ones(3))
    for bad in (b"", b"hello" * 20, data[: len(data) // 2], data[:-10]):
        with pytest.raises(ValueError) as e:
            sio.load_npz(bad)
        assert_format_error(e, "not a valid zip file")

    npz = sio.load_npz(data)
    offset = npz._meta["x.npy"][0]
    corrupt = bytearray(data)
    corrupt[offset + 200] ^= 0xFF
    npz = sio.load_npz(bytes(corrupt))
    with pytest.raises(ValueError) as e:
        npz["x"]
    assert_format_error(e, "'x.npy'", "CRC-32")
    np.testing.assert_array_equal(npz["y"], np.ones(3))  # the other entry is intact

    compressed = npz_bytes(True, x=np.arange(1000))
    offset = sio.load_npz(compressed)._meta["x.npy"][0]
    corrupt = bytearray(compressed)
    corrupt[offset + 40] ^= 0xFF
    with pytest.raises(ValueError) as e:
        sio.load_npz(bytes(corrupt))["x"]
    assert_format_error(e, "'x.npy'")

    with pytest.raises(ValueError, match=r"exceed max_uncompressed_bytes \(100\)"):
        sio.load_npz(compressed, max_uncompressed_bytes=100)
    with pytest.raises(ValueError, match="must be non-negative"):
        sio.load_npz(compressed, max_uncompressed_bytes=-1)
    np.testing.assert_array_equal(sio.load_npz(compressed, max_uncompressed_bytes=9000)["x"], np.arange(1000))


def test_load_npz_hostile_directories():
    data = npz_bytes(x=np.arange(3))
    eocd = data.rfind(b"PK\x05\x06")
    central = data.find(b"PK\x01\x02")
    cases = [
        (eocd + 12, "<I", 0xFFFFFFF0, "not a valid zip file"),  # a 4 GiB central directory on 300 bytes
        (eocd + 16, "<I", 0xFFFFFFF0, "outside the archive"),
        (central + 42, "<I", 0xFFFFFFF0, "local header of entry 'x.npy' is outside the archive"),
        (central + 20, "<I", 0xFFFFFFF0, "payload is outside the archive buffer"),
    ]
    for at, fmt, value, message in cases:
        bad = bytearray(data)
        struct.pack_into(fmt, bad, at, value)
        with pytest.raises(ValueError, match=message):
            sio.load_npz(bytes(bad))
    local = bytearray(data)
    local[0:4] = b"PK\x09\x09"
    with pytest.raises(ValueError, match="bad local header signature"):
        sio.load_npz(bytes(local))


def _archive_inputs(data: bytes) -> dict[str, object]:
    padded = b"\0" * 16 + data + b"\0" * 16
    return {
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "memoryview of part": memoryview(padded)[16 : 16 + len(data)],
    }


def _on_threads(work, args) -> list[BaseException]:
    import threading

    failures: list[BaseException] = []

    def run(arg):
        try:
            work(arg)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            failures.append(e)

    threads = [threading.Thread(target=run, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflate"])
def test_npz_entries_load_concurrently(compressed):
    # Free-threaded CPython's memoryview slices of one shared view race on its export count (the views end up
    # "released"); each entry must come out as a view with its own buffer, whatever the input type.
    arrays = {f"a{i}": np.arange(i, i + 500, dtype=np.int32) for i in range(8)}
    for kind, data in _archive_inputs(npz_bytes(compressed, **arrays)).items():
        for _ in range(10):
            npz = sio.load_npz(data)

            def read(name, npz=npz):
                for _ in range(50):
                    np.testing.assert_array_equal(npz[name], arrays[name])

            assert _on_threads(read, list(arrays)) == [], kind
        # The caller's buffer is still usable.
        assert bytes(memoryview(data)[:2]) == b"PK", kind


def test_tar_members_are_used_and_dropped_on_other_threads():
    import queue

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(200):
            payload = np.arange(i, i + 64, dtype=np.int64).tobytes()
            info = tarfile.TarInfo(f"m{i}.bin")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    for kind, data in _archive_inputs(buf.getvalue()).items():
        for _ in range(5):
            members: queue.Queue = queue.Queue(maxsize=16)

            def consume(_, members=members):
                error = None
                while (item := members.get()) is not None:
                    name, view = item
                    try:
                        for _ in range(4):
                            assert np.frombuffer(view[:], dtype=np.int64)[0] == int(name[1:-4])
                    except BaseException as e:  # noqa: BLE001 - keep draining, report at the end
                        error = e
                    del item, view
                if error is not None:
                    raise error

            import threading

            workers = threading.Thread(target=lambda: failures.extend(_on_threads(consume, range(8))))
            failures: list[BaseException] = []
            workers.start()
            count = 0
            for member in sio.iter_tarfile(data):
                members.put(member)
                count += 1
            for _ in range(8):
                members.put(None)
            workers.join()
            assert failures == [], kind
            assert count == 200, kind


def test_npz_file_checks_its_metadata_and_inflated_sizes():
    payload = npy_bytes(np.arange(1000))
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    packed = deflater.compress(payload) + deflater.flush()
    data = b"junk" + packed

    good = sio.NpzFile(data, {"x.npy": (4, len(packed), len(payload), 8, zlib.crc32(payload))})
    np.testing.assert_array_equal(good["x"], np.arange(1000))
    # A declared size smaller than the inflated data (a zip bomb's lie): stops at the declared size.
    with pytest.raises(ValueError) as e:
        sio.NpzFile(data, {"x.npy": (4, len(packed), 100, 8)})["x"]
    assert_format_error(e, "more than its declared 100 bytes")
    with pytest.raises(ValueError) as e:
        sio.NpzFile(data, {"x.npy": (4, len(packed), len(payload) + 5, 8)})["x"]
    assert_format_error(e, f"{len(payload)} bytes, {len(payload) + 5} declared")
    with pytest.raises(ValueError) as e:
        sio.NpzFile(data, {"x.npy": (4, len(packed), 0, 8)})["x"]
    assert_format_error(e, "more than its declared 0 bytes")

    bad_meta = {
        (0, 10, 10): "4 or 5 fields",
        (-1, 10, 10, 0): "negative payload region",
        (4, len(data), len(data), 0): "outside the archive buffer",
        (4, 10, -1, 8): "negative uncompressed size",
        (4, 10, 12, 0): "matching compressed and uncompressed sizes",
        (4, 10, 10, 14): "unsupported compression method 14",
        (4, 10, 2**40, 8): "exceed max_uncompressed_bytes",
    }
    for entry, message in bad_meta.items():
        with pytest.raises(ValueError, match=message):
            sio.NpzFile(data, {"x.npy": entry})  # type: ignore[dict-item]


################################################################################
# Array interfaces and conversions
################################################################################


def test_array_interface_protocols():
    buf = spdl_rs.Buffer.zeros([2, 3], "float32")
    assert isinstance(buf, sio.ArrayInterface)
    assert isinstance(np.arange(3), sio.ArrayInterface)
    assert not isinstance(b"bytes", sio.ArrayInterface)

    class Device:
        __cuda_array_interface__ = {"version": 3, "shape": (1,), "typestr": "<f4", "data": (0, False)}

    assert isinstance(Device(), sio.CUDAArrayInterface)
    assert not isinstance(buf, sio.CUDAArrayInterface)


def test_convert_array_copies_into_an_int64_buffer():
    cases = [
        (np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(6).reshape(2, 3)),
        (np.array([1, 2, 255], dtype=np.uint8), np.array([1, 2, 255])),
        (np.array([True, False]), np.array([1, 0])),
        (np.array([2.7, -1.5], dtype=np.float32), np.array([2, -1])),
        (np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2], np.array([[0, 2], [4, 6], [8, 10]])),
        (np.array(5), np.array(5)),
        (memoryview(np.arange(3, dtype=np.int16)), np.arange(3)),
        (spdl_rs.Buffer.from_bytes(np.arange(4, dtype=np.int32).tobytes(), [4], "int32"), np.arange(4)),
    ]
    for vals, expected in cases:
        out = sio.convert_array(vals)
        assert isinstance(out, spdl_rs.Buffer) and out.dtype == "int64" and out.shape == expected.shape
        got = np.asarray(out)
        np.testing.assert_array_equal(got, expected)
        if isinstance(vals, np.ndarray):
            assert not np.shares_memory(got, vals)
    labels = np.array([3, 1, 4])
    out = sio.convert_array(labels)
    labels[0] = 99
    assert np.asarray(out)[0] == 3  # a copy

    with pytest.raises(RuntimeError, match="empty"):
        sio.convert_array(np.zeros((2, 0), dtype=np.int64))
    for bad in ([1, 2, 3], b"abc", "123"):
        with pytest.raises(TypeError, match="must be an array"):
            sio.convert_array(bad)
    for bad in (np.array([1j]), np.array(["1"]), np.array([1, None], dtype=object)):
        with pytest.raises(TypeError, match="must hold numbers"):
            sio.convert_array(bad)
    with pytest.raises(ValueError, match="NaN or infinity"):
        sio.convert_array(np.array([1.0, np.nan]))

    class PinnedStorage:
        is_pinned = True

    with pytest.raises(ValueError, match="pinned storage"):
        sio.convert_array(np.arange(3), storage=PinnedStorage())

    class Storage:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.is_pinned = False

    with pytest.raises(RuntimeError, match=r"does not have enough capacity. \(8 < 800\)"):
        sio.convert_array(np.arange(100), storage=Storage(8))
    np.testing.assert_array_equal(np.asarray(sio.convert_array(np.arange(100), storage=Storage(800))), np.arange(100))


def test_to_jax_and_to_numba(monkeypatch):
    array = np.arange(6, dtype=np.float32)
    buf = spdl_rs.Buffer.from_bytes(array.tobytes(), [2, 3], "float32")
    view = sio.to_numba(buf)  # host memory: a NumPy view, no numba needed
    assert view.shape == (2, 3) and np.shares_memory(view, np.asarray(buf))

    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "jax.numpy", None)
    with pytest.raises(ImportError, match="`jax`") as e:
        sio.to_jax(buf)
    assert e.value.name == "jax"

    class Device:
        __cuda_array_interface__ = {"version": 3, "shape": (1,), "typestr": "<f4", "data": (0, False)}

    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.setitem(sys.modules, "numba.cuda", None)
    with pytest.raises(ImportError, match="`numba`") as e:
        sio.to_numba(Device())
    assert e.value.name == "numba"


################################################################################
# WAV
################################################################################


def wav_bytes(sampwidth: int, channels: int = 2, rate: int = 8000, frames: int = 100) -> tuple[bytes, bytes]:
    """WAV bytes made by the ``wave`` module, and the raw frames written into it."""
    raw = (np.arange(frames * channels * sampwidth) % 251).astype(np.uint8).tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        w.writeframes(raw)
    return buf.getvalue(), raw


def chunk(tag: bytes, body: bytes, size: int | None = None) -> bytes:
    size = len(body) if size is None else size
    return tag + struct.pack("<I", size) + body + (b"\0" if len(body) % 2 else b"")


def fmt_chunk(fmt=1, channels=1, rate=8000, bits=16, block_align=None, byte_rate=None, extra=b"") -> bytes:
    block_align = channels * bits // 8 if block_align is None else block_align
    byte_rate = rate * block_align if byte_rate is None else byte_rate
    return chunk(b"fmt ", struct.pack("<HHIIHH", fmt, channels, rate, byte_rate, block_align, bits) + extra)


def riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("sampwidth,dtype", [(1, np.uint8), (2, np.int16), (4, np.int32)])
def test_load_wav_pcm_from_the_wave_module(sampwidth, dtype):
    data, raw = wav_bytes(sampwidth, channels=2, rate=8000, frames=100)
    header = sio.parse_wav(data)
    assert isinstance(header, sio.WAVHeader)
    assert (header.audio_format, header.num_channels, header.sample_rate, header.bits_per_sample) == (
        1, 2, 8000, 8 * sampwidth,
    )
    assert header.block_align == 2 * sampwidth and header.byte_rate == 8000 * 2 * sampwidth
    assert header.data_size == len(raw)
    assert "num_channels=2" in repr(header)

    result = sio.load_wav(data)
    assert isinstance(result, sio.ArrayInterface)
    samples = np.asarray(result)
    expected = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(100, 2)
    assert samples.dtype == expected.dtype and samples.shape == (100, 2)
    np.testing.assert_array_equal(samples, expected)
    assert np.shares_memory(samples, np.frombuffer(data, dtype=np.uint8))
    assert not samples.flags.writeable


def test_load_wav_float_formats_hand_made():
    values = np.linspace(-1, 1, 8, dtype="<f4")
    data = riff(fmt_chunk(3, 2, 8000, 32), chunk(b"LIST", b"odd"), chunk(b"data", values.tobytes()))
    samples = np.asarray(sio.load_wav(data))
    assert samples.dtype == np.float32 and samples.shape == (4, 2)
    np.testing.assert_array_equal(samples.ravel(), values)

    doubles = np.linspace(-1, 1, 5, dtype="<f8")
    samples = np.asarray(sio.load_wav(riff(fmt_chunk(3, 1, 16000, 64), chunk(b"data", doubles.tobytes()))))
    assert samples.dtype == np.float64
    np.testing.assert_array_equal(samples[:, 0], doubles)


def data_chunk_of(data: bytes) -> bytes:
    """The bytes of the first ``data`` chunk, found by a plain chunk walk."""
    pos = 12
    while True:
        tag, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        if tag == b"data":
            return data[pos + 8 : pos + 8 + size]
        pos += 8 + size + (size & 1)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg CLI")
def test_load_wav_ffmpeg_extensible_formats(tmp_path):
    def make(codec: str, channels: int) -> bytes:
        path = tmp_path / f"{codec}_{channels}.wav"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000:duration=0.05",
             "-ac", str(channels), "-c:a", codec, str(path)],
            check=True, timeout=60,
        )
        return path.read_bytes()

    for codec, channels, dtype in [("pcm_f32le", 2, "<f4"), ("pcm_f64le", 1, "<f8"), ("pcm_s32le", 2, "<i4"),
                                   ("pcm_s16le", 3, "<i2")]:
        data = make(codec, channels)
        header = sio.parse_wav(data)
        assert header.audio_format == 0xFFFE and header.num_channels == channels  # WAVE_FORMAT_EXTENSIBLE
        samples = np.asarray(sio.load_wav(data))
        expected = np.frombuffer(data_chunk_of(data), dtype=dtype).reshape(-1, channels)
        assert samples.dtype == expected.dtype and samples.shape == (400, channels)
        np.testing.assert_array_equal(samples, expected)
        assert np.abs(samples.astype(np.float64)).max() > 0
    with pytest.raises(ValueError, match="Unsupported PCM bits per sample: 24"):
        sio.load_wav(make("pcm_s24le", 2))


def test_load_wav_windows():
    data, raw = wav_bytes(2, channels=2, rate=8000, frames=100)
    full = np.asarray(sio.load_wav(data))
    cases = [
        ((0.001, 0.002), slice(8, 24)),
        ((0.001, None), slice(8, 100)),
        ((None, 0.002), slice(0, 16)),
        ((0.0001249, None), slice(0, 100)),  # 0.999 frames: floor
        ((0.0001251, None), slice(1, 100)),
        ((0.01, 1.0), slice(80, 100)),  # the window ends with the data
        ((0.0, 0.0), slice(0, 0)),
        ((0, 0.0001), slice(0, 0)),
        ((0.0124, None), slice(99, 100)),
    ]
    for (offset, duration), expected in cases:
        got = np.asarray(sio.load_wav(data, time_offset_seconds=offset, duration_seconds=duration))
        np.testing.assert_array_equal(got, full[expected])
        if got.size:
            assert np.shares_memory(got, full)
    np.testing.assert_array_equal(np.asarray(sio.load_wav(data, 0.0, 0.0005)), full[:4])  # positional, as SPDL
    errors = [
        ((1.0, None), "Time offset exceeds audio duration"),
        ((0.0125, None), "Time offset exceeds audio duration"),
        ((1e300, None), "Time offset exceeds audio duration"),
        ((-1.0, None), "Time offset cannot be negative"),
        ((None, -1.0), "Duration cannot be negative"),
        ((inf, None), "Time offset must be finite"),
        ((0.0, math.nan), "Duration must be finite"),
        ((0.0, inf), "Duration must be finite"),
    ]
    for (offset, duration), message in errors:
        with pytest.raises(ValueError, match=message):
            sio.load_wav(data, time_offset_seconds=offset, duration_seconds=duration)
    empty = riff(fmt_chunk(), chunk(b"data", b""))
    assert np.asarray(sio.load_wav(empty)).shape == (0, 1)
    with pytest.raises(ValueError, match="Time offset exceeds audio duration"):
        sio.load_wav(empty, duration_seconds=0.1)


def test_load_wav_writability_and_lifetime():
    data, raw = wav_bytes(2, channels=1, frames=10)
    source = bytearray(data)
    samples = np.asarray(sio.load_wav(source))
    assert samples.flags.writeable
    samples[0, 0] = 1234
    assert np.asarray(sio.load_wav(bytes(source)))[0, 0] == 1234
    with pytest.raises(BufferError):
        source.extend(b"\0")
    result = sio.load_wav(bytes(data))
    samples = np.asarray(result)
    del result, data
    gc.collect()
    np.testing.assert_array_equal(samples.ravel(), np.frombuffer(raw, dtype="<i2"))
    with pytest.raises(ValueError, match="one-dimensional, C-contiguous byte buffer"):
        sio.parse_wav(np.zeros(40, dtype=np.int16))
    with pytest.raises(TypeError):
        sio.parse_wav("RIFF")  # type: ignore[arg-type]


def test_wav_hostile_headers():
    good, _ = wav_bytes(2, channels=2, frames=100)

    def patched(at: int, fmt: str, value: int) -> bytes:
        out = bytearray(good)
        struct.pack_into(fmt, out, at, value)
        return bytes(out)

    data = np.arange(16, dtype="<i2").tobytes()
    parse_errors = [
        (b"", "WAV data too small to contain valid header"),
        (good[:43], "too small"),
        (b"RIFX" + good[4:], "Missing RIFF header"),
        (good[:8] + b"WAVX" + good[12:], "Missing WAVE format identifier"),
        (good[:-10], "WAV data chunk extends beyond the input buffer"),
        (patched(40, "<I", 0xFFFFFFFF), "WAV data chunk extends beyond the input buffer"),
        (patched(16, "<I", 0xFFFFFFF0), "fmt chunk extends beyond file size"),
        (riff(chunk(b"fmt ", b"\1\0\1\0"), chunk(b"data", data)), "fmt chunk too small"),
        (riff(chunk(b"data", data), fmt_chunk()), "data chunk not found"),
        (riff(chunk(b"data", data), chunk(b"LIST", data)), "fmt chunk not found"),
        (riff(fmt_chunk(), chunk(b"junk", b"", size=0xFFFFFFF0), chunk(b"data", data)),
         "WAV chunk extends beyond file size"),
    ]
    for bad, message in parse_errors:
        with pytest.raises(ValueError, match=message):
            sio.parse_wav(bad)
        with pytest.raises(ValueError, match=message):
            sio.load_wav(bad)

    load_errors = [
        (patched(22, "<H", 0), "Invalid number of channels: 0"),
        (patched(24, "<I", 0), "Invalid sample rate: 0"),
        (patched(20, "<H", 7), "Unsupported WAV audio format: 7"),
        (patched(34, "<H", 12), "Unsupported PCM bits per sample: 12"),
        (riff(fmt_chunk(3, 1, 8000, 16), chunk(b"data", data)), "Unsupported IEEE float bits per sample: 16"),
        (riff(fmt_chunk(1, 1, 8000, 64), chunk(b"data", data)), "Unsupported PCM bits per sample: 64"),
        (patched(32, "<H", 3), "Invalid block align: expected 4, found 3"),
        (patched(28, "<I", 12345), "Invalid byte rate: expected 32000, found 12345"),
        (riff(fmt_chunk(1, 65535, 8000, 16, block_align=2, byte_rate=16000), chunk(b"data", data)),
         "Invalid block align: expected 131070, found 2"),
        (riff(fmt_chunk(1, 3, 8000, 16), chunk(b"data", data)), "whole number of sample frames"),
        (riff(fmt_chunk(1, 1, 8000, 16), chunk(b"data", data[:7])), "whole number of sample frames"),
    ]
    for bad, message in load_errors:
        sio.parse_wav(bad)  # the header itself is readable
        with pytest.raises(ValueError, match=message):
            sio.load_wav(bad)

    # The first fmt and data chunks are used; trailing bytes and later chunks are ignored.
    twice = riff(fmt_chunk(), fmt_chunk(3, 1, 8000, 32), chunk(b"data", data), chunk(b"data", data + data)) + b"xx"
    assert np.asarray(sio.load_wav(twice)).shape == (16, 1)


################################################################################
# TAR
################################################################################

LONG = "deep/" * 30 + "name.txt"


def make_tar(fmt: int, members, **kwargs) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, **kwargs) as tf:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = payload
                tf.addfile(info)
    return buf.getvalue()


MEMBERS = [
    ("a.txt", "file", b"hello"),
    ("dir", "dir", None),
    ("dir/b.bin", "file", bytes(range(256)) * 3),
    ("link", "symlink", "a.txt"),
    ("hard", "hardlink", "a.txt"),
    ("empty", "file", b""),
    ("x" * 60 + "/" + "y" * 60 + "/ustar-prefix.txt", "file", b"prefix"),
]
LONG_MEMBERS = [(LONG, "file", b"long"), ("ünï.txt", "file", b"unicode"), ("l" * 120, "symlink", LONG)]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
def test_iter_tarfile_matches_tarfile(fmt):
    members = MEMBERS + (LONG_MEMBERS if fmt != tarfile.USTAR_FORMAT else [])
    data = make_tar(fmt, members, **({"pax_headers": {"comment": "global"}} if fmt == tarfile.PAX_FORMAT else {}))
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        expected = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isreg()]
    assert LONG in [n for n, _ in expected] or fmt == tarfile.USTAR_FORMAT

    from_bytes = list(sio.iter_tarfile(data))
    assert [(n, bytes(c)) for n, c in from_bytes] == expected
    source = np.frombuffer(data, dtype=np.uint8)
    for _, contents in from_bytes:
        assert isinstance(contents, memoryview) and contents.obj is data  # slices of the input, no copy
        if contents.nbytes:
            assert np.shares_memory(np.frombuffer(contents, dtype=np.uint8), source)

    from_file = list(sio.iter_tarfile(io.BytesIO(data)))
    assert from_file == expected and all(type(c) is bytes for _, c in from_file)
    assert [(n, bytes(c)) for n, c in sio.iter_tarfile(bytearray(data))] == expected
    assert [(n, bytes(c)) for n, c in sio.iter_tarfile(memoryview(data))] == expected


def test_iter_tarfile_empty_and_padding():
    assert list(sio.iter_tarfile(b"")) == []
    assert list(sio.iter_tarfile(b"\0" * 1024)) == []
    assert list(sio.iter_tarfile(io.BytesIO(b""))) == []
    single = make_tar(tarfile.USTAR_FORMAT, [("a", "file", b"x")])
    # A lone zero block is padding; two end the archive (what follows is not read).
    assert [n for n, _ in sio.iter_tarfile(b"\0" * 512 + single)] == ["a"]
    assert [n for n, _ in sio.iter_tarfile(single + b"garbage" * 100)] == ["a"]


def set_size(block: bytearray, size: int) -> None:
    """Rewrites the size field of a header block and its checksum."""
    block[124:136] = b"%011o\0" % size
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block[:512])


def test_iter_tarfile_pax_size_record_and_member_types():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "g"}) as tf:
        info = tarfile.TarInfo("a")
        info.size, info.pax_headers = 3, {"size": "3"}
        tf.addfile(info, io.BytesIO(b"abc"))
        info = tarfile.TarInfo("contiguous")
        info.type, info.size = tarfile.CONTTYPE, 2
        tf.addfile(info, io.BytesIO(b"cc"))
        info = tarfile.TarInfo("fifo")
        info.type = tarfile.FIFOTYPE
        tf.addfile(info)
        info = tarfile.TarInfo("b")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"xy"))
    data = bytearray(buf.getvalue())
    # "a"'s own header follows the global PAX header, its record block, the local PAX header and its block:
    # its size field says 0, the PAX record says 3, and the record wins (as in tarfile).
    at = data.index(b"a\0", 2048)
    assert at % 512 == 0
    header = data[at : at + 512]
    set_size(header, 0)
    data[at : at + 512] = header
    expected = [("a", b"abc"), ("contiguous", b"cc"), ("b", b"xy")]
    assert [(n, bytes(c)) for n, c in sio.iter_tarfile(bytes(data))] == expected
    assert list(sio.iter_tarfile(io.BytesIO(bytes(data)))) == expected


def test_iter_tarfile_hostile_archives():
    data = make_tar(tarfile.GNU_FORMAT, MEMBERS + LONG_MEMBERS)

    def errors(src, *words):
        for source in (src, io.BytesIO(src)):
            with pytest.raises(ValueError) as e:
                list(sio.iter_tarfile(source))
            assert_format_error(e, *words)

    errors(data[:1100], "truncated")  # cut inside b.bin's data
    errors(data[:100], "truncated")
    errors(data[:512], "truncated", "'a.txt'")
    errors(b"x" * 1024, "bad checksum", "not a TAR archive")
    flipped = bytearray(data)
    flipped[0] ^= 1
    errors(bytes(flipped), "bad checksum", "offset 0")
    flipped = bytearray(data)
    flipped[1024] ^= 1  # the second header (after a.txt's header and data block)
    errors(bytes(flipped), "bad checksum", "offset 1024")

    huge = bytearray(data)
    set_size(huge, 8**11 - 1)  # ~8 GiB declared on a few KiB
    errors(bytes(huge), "truncated", "'a.txt'", "8589934591")

    # A GNU long name that declares a megabyte-scale size is refused as metadata.
    long_header = bytearray(make_tar(tarfile.GNU_FORMAT, [(LONG, "file", b"x")]))
    set_size(long_header, 64 << 20)
    errors(bytes(long_header), "GNU long name", str(64 << 20))

    # PAX records whose lengths lie (zero, past the header, no newline) and one without '='.
    lying = [
        (b"0 path=x\n", "overruns"),
        (b"99 path=x\n", "overruns"),
        (b"x path=x\n", "invalid record length"),
        (b"8 pathx\n", "without '='"),
    ]
    for record, message in lying:
        pax = bytearray(make_tar(tarfile.PAX_FORMAT, [("ü", "file", b"u")]))
        body = record.ljust(512, b"\0")
        pax[512:1024] = body
        header = pax[0:512]
        set_size(header, len(record))
        pax[0:512] = header
        errors(bytes(pax), "PAX header at offset 0", message)

    with pytest.raises(TypeError, match="file-like"):
        sio.iter_tarfile(12345)  # type: ignore[call-overload]


################################################################################
# Filter descriptions (expected strings produced by SPDL 0.8.0 for the same arguments)
################################################################################

AUDIO_CASES = [
    ({}, "aformat=sample_fmts=fltp"),
    ({"sample_fmt": None}, None),
    ({"sample_rate": 16000}, "aresample=16000,aformat=sample_fmts=fltp"),
    ({"num_channels": 2, "sample_rate": 44100, "sample_fmt": "s16"},
     "aformat=channel_layouts=2c,aresample=44100,aformat=sample_fmts=s16"),
    ({"timestamp": (1.5, 3.25)}, "atrim=start=1.5:end=3.25,aformat=sample_fmts=fltp"),
    ({"timestamp": (0, inf)}, "atrim=start=0,aformat=sample_fmts=fltp"),
    ({"timestamp": (-inf, 2.0)}, "atrim=end=2.0,aformat=sample_fmts=fltp"),
    ({"timestamp": (-inf, inf), "sample_fmt": None}, None),
    ({"num_frames": 16000, "filter_desc": "volume=0.5"},
     "apad,atrim=end_sample=16000,volume=0.5,aformat=sample_fmts=fltp"),
    ({"sample_rate": 8000, "num_channels": 1, "timestamp": (0.5, 1.0), "num_frames": 4000, "filter_desc": "anull",
      "sample_fmt": "dblp"},
     "aformat=channel_layouts=1c,aresample=8000,atrim=start=0.5:end=1.0,apad,atrim=end_sample=4000,anull,"
     "aformat=sample_fmts=dblp"),
]

VIDEO_CASES = [
    ({}, "format=pix_fmts=rgb24"),
    ({"pix_fmt": None}, None),
    ({"frame_rate": (30000, 1001)}, "fps=30000/1001,format=pix_fmts=rgb24"),
    ({"timestamp": (2.0, inf)}, "trim=start=2.0,format=pix_fmts=rgb24"),
    ({"timestamp": (-inf, inf)}, "format=pix_fmts=rgb24"),
    ({"scale_width": 224, "scale_height": 224},
     "scale=w=224:h=224:flags=bicubic:force_original_aspect_ratio=decrease,pad=w=224:h=224:x=-1:y=-1:color=black,"
     "format=pix_fmts=rgb24"),
    ({"scale_width": 320, "scale_mode": None, "scale_algo": "bilinear"},
     "scale=w=320:h=0:flags=bilinear,format=pix_fmts=rgb24"),
    ({"scale_height": -2, "scale_mode": "crop"},
     "scale=w=0:h=-2:flags=bicubic:force_original_aspect_ratio=increase,crop=w=0:h=-2,format=pix_fmts=rgb24"),
    ({"scale_width": 64, "scale_height": 48, "pad_mode": "white"},
     "scale=w=64:h=48:flags=bicubic:force_original_aspect_ratio=decrease,pad=w=64:h=48:x=-1:y=-1:color=white,"
     "format=pix_fmts=rgb24"),
    ({"crop_width": 100}, "crop=w=100:h=0,format=pix_fmts=rgb24"),
    ({"crop_width": 10, "crop_height": 20, "pix_fmt": "gray8"}, "crop=w=10:h=20,format=pix_fmts=gray8"),
    ({"num_frames": 8}, "tpad=stop=-1:stop_mode=clone,trim=end_frame=8,format=pix_fmts=rgb24"),
    ({"num_frames": 8, "pad_mode": "black"},
     "tpad=stop=-1:stop_mode=add:color=black,trim=end_frame=8,format=pix_fmts=rgb24"),
    ({"frame_rate": (5, 1), "timestamp": (0.0, 4.0), "scale_width": 128, "scale_height": 96, "scale_mode": "crop",
      "crop_width": 112, "crop_height": 80, "num_frames": 16, "pad_mode": "red", "filter_desc": "hflip",
      "pix_fmt": "yuv420p"},
     "fps=5/1,trim=start=0.0:end=4.0,scale=w=128:h=96:flags=bicubic:force_original_aspect_ratio=increase,"
     "crop=w=128:h=96,crop=w=112:h=80,tpad=stop=-1:stop_mode=add:color=red,trim=end_frame=16,hflip,"
     "format=pix_fmts=yuv420p"),
]


def test_filter_descriptions_match_spdl():
    for kwargs, expected in AUDIO_CASES:
        assert sio.get_audio_filter_desc(**kwargs) == expected, kwargs
    for kwargs, expected in VIDEO_CASES:
        assert sio.get_video_filter_desc(**kwargs) == expected, kwargs
    with pytest.raises(ValueError, match=r'Unexpected `scale_mode` value \(zoom\). Expected values are "pad"'):
        sio.get_video_filter_desc(scale_width=1, scale_mode="zoom")
    with pytest.raises(TypeError):
        sio.get_audio_filter_desc(16000)  # type: ignore[misc]  # keyword-only, as SPDL


def test_buffer_descriptions_match_spdl():
    from types import SimpleNamespace

    audio = SimpleNamespace(time_base=(1, 44100), sample_rate=44100, sample_fmt="fltp", channel_layout="stereo")
    assert sio.get_abuffer_desc(audio) == (
        "abuffer=time_base=1/44100:sample_rate=44100:sample_fmt=fltp:channel_layout=stereo"
    )
    assert sio.get_abuffer_desc(audio, label="in0", sample_fmt="s16") == (
        "abuffer@in0=time_base=1/44100:sample_rate=44100:sample_fmt=s16:channel_layout=stereo"
    )
    video = SimpleNamespace(width=640, height=360, pix_fmt="yuv420p", time_base=(1, 12800), sample_aspect_ratio=(1, 1))
    assert sio.get_buffer_desc(video) == "buffer=video_size=640x360:pix_fmt=yuv420p:time_base=1/12800:pixel_aspect=1/1"
    video.sample_aspect_ratio = (4, 3)
    assert sio.get_buffer_desc(video, "v", "rgb24") == (
        "buffer@v=video_size=640x360:pix_fmt=rgb24:time_base=1/12800:pixel_aspect=4/3"
    )


def test_get_filter_desc_dispatches_on_the_packets_type(tmp_path):
    with pytest.raises(TypeError, match="Unexpected type"):
        sio.get_filter_desc(object(), sample_rate=16000)
    if not sio.has_video() or shutil.which("ffmpeg") is None:
        return
    path = tmp_path / "clip.mp4"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=32x24:rate=10:duration=0.5",
         "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)],
        check=True, timeout=60,
    )
    packets = sio.demux_video(str(path))
    # Video packets are trimmed while decoding, so no `trim` filter even with a timestamp.
    assert sio.get_filter_desc(packets, scale_width=16, scale_height=12, scale_mode=None) == (
        "scale=w=16:h=12:flags=bicubic,format=pix_fmts=rgb24"
    )
