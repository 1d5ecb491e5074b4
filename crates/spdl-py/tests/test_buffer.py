"""spdl_rs.Buffer: numpy and DLPack views without copies."""

import gc
import struct

import numpy as np
import pytest

from spdl_rs import Buffer


def test_numpy_view_shares_memory_and_keeps_the_buffer_alive():
    b = Buffer.zeros((4, 3), "float32")
    a = np.asarray(b)
    assert a.shape == (4, 3) and a.dtype == np.float32
    assert a.ctypes.data == b.data_ptr  # no copy
    a[1, 2] = 7.5
    assert np.asarray(b)[1, 2] == 7.5  # a second view sees the write
    assert b.numpy().ctypes.data == b.data_ptr
    del b
    gc.collect()
    a += 1  # the array keeps the Rust buffer alive
    assert a[1, 2] == 8.5 and a.sum() == pytest.approx(8.5 + 11)


@pytest.mark.parametrize(
    "dtype,fmt",
    [("uint8", "B"), ("int8", "b"), ("uint16", "H"), ("int16", "h"), ("uint32", "I"), ("int32", "i"),
     ("int64", "q"), ("float32", "f"), ("float64", "d")],
)
def test_dtypes_round_trip(dtype, fmt):
    values = [0, 1, 2, 3, 4, 5]
    b = Buffer.from_bytes(struct.pack(f"={len(values)}{fmt}", *values), (2, 3), dtype)
    assert b.dtype == dtype and b.shape == (2, 3) and b.nbytes == 6 * struct.calcsize(fmt)
    np.testing.assert_array_equal(np.asarray(b), np.array(values, dtype=dtype).reshape(2, 3))
    np.testing.assert_array_equal(np.from_dlpack(b), np.array(values, dtype=dtype).reshape(2, 3))


def test_dlpack_is_zero_copy():
    b = Buffer.zeros((2, 5), "int32")
    assert b.__dlpack_device__() == (1, 0)
    x = np.from_dlpack(b)
    assert x.ctypes.data == b.data_ptr
    x[0, 0] = 42
    assert np.asarray(b)[0, 0] == 42
    del b
    gc.collect()
    assert x[0, 0] == 42  # the capsule's reference keeps the memory


def test_dlpack_legacy_capsule_and_copy():
    b = Buffer.zeros((3,), "float64")

    class Legacy:
        """A producer that only speaks the pre-1.0 protocol (no max_version)."""

        def __dlpack__(self, stream=None):
            return b.__dlpack__()

        def __dlpack_device__(self):
            return b.__dlpack_device__()

    x = np.from_dlpack(Legacy())
    assert x.ctypes.data == b.data_ptr
    y = np.from_dlpack(b, copy=True)
    assert y.ctypes.data != b.data_ptr
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    capsule = b.__dlpack__(max_version=(1, 0))
    del capsule  # an unconsumed capsule frees its tensor
    gc.collect()


def test_buffer_protocol_where_the_abi_has_it():
    b = Buffer.from_bytes(bytes(range(6)), (2, 3), "uint8")
    try:
        m = memoryview(b)
    except TypeError:
        pytest.skip("this build targets the Python 3.10 stable ABI, which has no buffer protocol for classes")
    assert m.shape == (2, 3) and m.format == "B" and not m.readonly
    m[1, 2] = 99
    assert np.asarray(b)[1, 2] == 99


def test_bad_arguments():
    with pytest.raises(ValueError):
        Buffer.zeros((2,), "complex64")
    with pytest.raises(ValueError):
        Buffer.from_bytes(b"abc", (2, 2), "uint8")
