"""SPDL's array names: NumPy's NPY/NPZ formats read from memory without a copy (:py:func:`load_npy`,
:py:func:`load_npz`, :py:class:`NpzFile`), the array-interface protocols (:py:class:`ArrayInterface`,
:py:class:`CUDAArrayInterface`) and conversions (:py:func:`convert_array`, :py:func:`to_jax`,
:py:func:`to_numba`).

The bytes are parsed natively (``spdl_rs._native.io``: ``npy_header``, ``zip_directory``, ``npz_entries``,
``npz_inflate``), every declared size checked against the data before a view is built or memory allocated: a
truncated header, a shape larger than the payload, a bad magic string, an object dtype (a pickle) or an entry
outside the archive is a :py:class:`FormatError` (a ``ValueError``, and a ``RuntimeError`` as in SPDL) that names
the cause. This module builds the NumPy dtype from the checked description and the array over the caller's buffer.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._native import Buffer as _Buffer
from .._views import SliceSource
from ._tar import FormatError, _native_attr

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Buffer as _BufferLike

    from .._native import Buffer

    _Data = bytes | bytearray | memoryview | _BufferLike

__all__ = [
    "ArrayInterface",
    "CUDAArrayInterface",
    "FormatError",
    "NpzFile",
    "convert_array",
    "load_npy",
    "load_npz",
    "to_jax",
    "to_numba",
]

_NpzEntry = tuple[int, int, int, int] | tuple[int, int, int, int, int | None]
_DEFAULT_MAX_UNCOMPRESSED_BYTES = 1 << 30


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:
        raise ModuleNotFoundError(
            "spdl_rs.io's array functions need the `numpy` package (pip install numpy)", name="numpy"
        ) from e
    return numpy


def _byte_view(data: _Data, func: str) -> memoryview:
    """``data`` as a flat, C-contiguous memoryview of bytes (no copy)."""
    if type(data) is memoryview and data.ndim == 1 and data.format == "B":
        return data  # no second view on the caller's buffer
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{func}: data must be a bytes-like object, got {type(data).__name__}") from None
    if mv.ndim == 1 and mv.format in ("B", "b", "c"):
        return mv if mv.format == "B" else mv.cast("B")
    if not mv.c_contiguous:
        raise ValueError(f"{func}: expected a C-contiguous byte buffer")
    return mv.cast("B")


def _readable(mv: memoryview) -> bytes | memoryview:
    """What the native parsers read: the ``bytes`` object ``mv`` views all of (read in place), else ``mv``."""
    obj = mv.obj
    return obj if type(obj) is bytes and len(obj) == mv.nbytes else mv


################################################################################
# NPY
################################################################################


@functools.lru_cache(maxsize=256)
def _typestr_dtype(descr: str) -> Any:
    return _numpy().dtype(descr)


def _npy_array(mv: memoryview, what: str) -> NDArray[Any]:
    """A view of the NPY data in ``mv`` (it keeps ``mv`` alive and inherits its writability)."""
    np = _numpy()
    descr, shape, fortran, offset = _native_attr("npy_header")(_readable(mv), what)
    try:  # the description is checked natively (never an object dtype); NumPy makes the dtype
        dtype = _typestr_dtype(descr) if type(descr) is str else np.lib.format.descr_to_dtype(descr)
    except Exception as e:  # numpy raises TypeError/ValueError/KeyError for malformed descriptions
        raise FormatError(f"{what}: invalid dtype in header: {descr!r:.200} ({e})") from None
    try:
        if dtype.itemsize == 0:  # no bytes to view (numpy cannot view a buffer as zero-size items)
            array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
            array.flags.writeable = not mv.readonly
            return array
        # `frombuffer` holds a buffer export of `mv` (so a bytearray source cannot be resized under the array);
        # `np.ndarray(buffer=...)` would not.
        flat = np.frombuffer(mv, dtype=dtype, count=math.prod(shape), offset=offset)
        return flat.reshape(shape, order="F" if fortran else "C")
    except (ValueError, TypeError, OverflowError, MemoryError) as e:  # e.g. an absurd shape of empty items
        raise FormatError(f"{what}: cannot make an array of shape {shape} and dtype {dtype}: {e}") from None


def load_npy(data: _Data, *, copy: bool = False) -> NDArray[Any]:
    """Loads a NumPy array from the bytes that :py:func:`numpy.save` writes, as ``numpy.load`` of a
    ``BytesIO`` would, without copying the data.

    All dtypes are read except ``object`` (whose payload is a pickle, never loaded): numbers, booleans, strings,
    datetimes, non-native byte order and structured dtypes; Fortran-ordered arrays keep their column-major
    strides. NPY format versions 1.0, 2.0 and 3.0.

    Args:
        data: The NPY bytes (``bytes``, ``bytearray``, ``memoryview`` or any C-contiguous buffer).
        copy: ``False`` (default): the array is a view of ``data``; it keeps ``data`` alive, is read-only when
            ``data`` is (``bytes``) and blocks resizing a ``bytearray`` while it lives. ``True``: an independent,
            writable copy.

    Returns:
        The array.

    Raises:
        ValueError: The data is not NPY data, its header is malformed or truncated, the payload is shorter than
            the declared shape, or the dtype is ``object``. It is a :py:class:`FormatError`, also a
            ``RuntimeError`` (SPDL's class for these errors).

    Example:
        >>> import io, numpy as np
        >>> buf = io.BytesIO(); np.save(buf, np.arange(4))
        >>> load_npy(buf.getvalue())
        array([0, 1, 2, 3])
    """
    array = _npy_array(_byte_view(data, "load_npy"), "load_npy")
    return array.copy(order="K") if copy else array


################################################################################
# NPZ
################################################################################


class NpzFile(Mapping[str, "NDArray[Any]"]):
    """A NumPy ``.npz`` archive in memory, read like :py:class:`numpy.lib.npyio.NpzFile`: a read-only mapping
    from array names (with or without the ``.npy`` suffix) to arrays, each loaded on access. Made by
    :py:func:`load_npz`.

    Arrays of stored (uncompressed) entries are views of the archive's memory (no copy; read-only when the
    archive is ``bytes``); arrays of DEFLATE-compressed entries own their inflated, writable memory. Each
    entry's CRC-32 is checked when it is loaded.

    Args:
        data: The archive bytes (kept alive while this object or an array viewing it lives).
        meta: ``{entry name: (payload offset, compressed size, uncompressed size, compression method[, crc32])}``
            (``0``: stored, ``8``: DEFLATE), checked against ``data``.
        max_uncompressed_bytes: The most that all compressed entries together may declare (default 1 GiB).

    Raises:
        ValueError: An entry lies outside ``data``, has a negative size, an unsupported compression method,
            mismatched stored sizes, or the compressed entries declare more than ``max_uncompressed_bytes``.
    """

    def __init__(
        self,
        data: _Data,
        meta: Mapping[str, _NpzEntry],
        *,
        max_uncompressed_bytes: int = _DEFAULT_MAX_UNCOMPRESSED_BYTES,
    ) -> None:
        buf = _byte_view(data, "NpzFile")
        # Arrays are loaded (and dropped) on any thread: each entry is a slice with a buffer of its own.
        self._buf = SliceSource(data, buf)
        self._meta: dict[str, tuple[int, int, int, int, int | None]] = _native_attr("npz_entries")(
            buf.nbytes, meta, max_uncompressed_bytes
        )
        self.files: list[str] = [name.removesuffix(".npy") for name in self._meta]
        """The array names (entry names without the ``.npy`` suffix), in archive order."""

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __contains__(self, key: object) -> bool:
        return key in self._meta or key in self.files

    def __getitem__(self, key: str) -> NDArray[Any]:
        """The array of entry ``key`` (``"x"`` or ``"x.npy"``).

        Raises:
            KeyError: No such entry.
            ValueError: The entry's data fails its CRC-32, does not inflate to its declared size, or is not
                valid NPY data.
        """
        if key not in self._meta:
            if key in self.files:
                key = f"{key}.npy"
            else:
                raise KeyError(f"{key} is not a file in the archive")
        offset, compressed, uncompressed, method, crc = self._meta[key]
        payload = self._buf.slice(offset, offset + compressed)
        what = f"NPZ entry {key!r}"
        if method == 8:
            payload = memoryview(_native_attr("npz_inflate")(_readable(payload), key, uncompressed))
        if crc is not None and zlib.crc32(payload) != crc:
            raise FormatError(f"{what}: ZIP entry failed CRC-32 validation.")
        return _npy_array(payload, what)

    def __repr__(self) -> str:
        return f"NpzFile object with {len(self)} entries."


def load_npz(data: _Data, *, max_uncompressed_bytes: int = _DEFAULT_MAX_UNCOMPRESSED_BYTES) -> NpzFile:
    """Opens a NumPy ``.npz`` archive (:py:func:`numpy.savez` or :py:func:`numpy.savez_compressed`) in memory.

    The zip directory is read now; each array is loaded when it is accessed (see :py:class:`NpzFile`).

    Args:
        data: The archive bytes.
        max_uncompressed_bytes: The most that all DEFLATE-compressed entries together may declare (default
            1 GiB); raise it only for trusted archives.

    Raises:
        ValueError: The data is not a zip archive, an entry is encrypted or lies outside the data, or the
            compressed entries declare more than ``max_uncompressed_bytes``.

    Example:
        >>> import io, numpy as np
        >>> buf = io.BytesIO(); np.savez(buf, x=np.arange(3), y=np.ones(2))
        >>> npz = load_npz(buf.getvalue())
        >>> npz.files, npz["x"]
        (['x', 'y'], array([0, 1, 2]))
    """
    mv = _byte_view(data, "load_npz")
    return NpzFile(mv, _native_attr("zip_directory")(_readable(mv)), max_uncompressed_bytes=max_uncompressed_bytes)


################################################################################
# Array interfaces and conversions
################################################################################


@runtime_checkable
class ArrayInterface(Protocol):
    """An object that exposes host memory through NumPy's array interface (``__array_interface__``, a dict
    with ``version`` 3, ``shape``, ``typestr``, ``data`` as ``(pointer, read_only)``, and optionally ``strides``
    and ``descr``), so that ``numpy.asarray`` views it without a copy. :py:class:`spdl_rs.Buffer` and
    :py:func:`~spdl_rs.io.load_wav`'s result are ones; ``isinstance`` checks the attribute.

    See https://numpy.org/doc/stable/reference/arrays.interface.html
    """

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """The array interface dict."""
        ...


@runtime_checkable
class CUDAArrayInterface(Protocol):
    """An object that exposes device memory through the CUDA array interface (``__cuda_array_interface__``:
    ``version``, ``shape``, ``typestr``, ``data`` as ``(pointer, read_only)``, optionally ``strides``,
    ``descr``, ``mask`` and ``stream``), understood by PyTorch, CuPy and Numba; ``isinstance`` checks the
    attribute.

    See https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html
    """

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface dict."""
        ...


def _import(module: str, func: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        raise ModuleNotFoundError(
            f"{func} needs the `{package}` package, which is not installed (pip install {package})", name=package
        ) from e


def to_jax(buffer: ArrayInterface) -> Any:
    """A JAX array of ``buffer`` (any object with ``__array_interface__``: a :py:class:`spdl_rs.Buffer`, a
    NumPy array, ...), as ``jax.numpy.array(buffer, copy=False)``.

    Raises:
        ImportError: ``jax`` is not installed (the message names it).
    """
    jnp = _import("jax.numpy", "to_jax")
    return jnp.array(buffer, copy=False)


def to_numba(buffer: ArrayInterface | CUDAArrayInterface) -> Any:
    """A Numba ``DeviceNDArray`` of a buffer with ``__cuda_array_interface__`` (``numba.cuda.as_cuda_array``,
    no copy), else a NumPy array viewing a buffer with ``__array_interface__`` (no copy; what Numba's CPU
    functions take).

    Raises:
        ImportError: The buffer is on a GPU and ``numba`` is not installed (the message names it).
        ValueError: A host buffer that NumPy cannot view without a copy.
    """
    if hasattr(buffer, "__cuda_array_interface__"):
        cuda = _import("numba.cuda", "to_numba")
        return cuda.as_cuda_array(buffer)
    return _numpy().array(buffer, copy=False)


def convert_array(vals: Any, storage: Any = None) -> Buffer:
    """Copies an integer array (e.g. class labels) into a new ``int64`` :py:class:`spdl_rs.Buffer` of the same
    shape, as SPDL's ``convert_array``: the buffer is what a later host-to-device transfer sends.

    Args:
        vals: A non-empty array: a NumPy array, a :py:class:`spdl_rs.Buffer`, a ``torch.Tensor`` or any object
            with ``__array_interface__``, ``__dlpack__`` or the buffer protocol (``memoryview``). Its values are
            converted to ``int64`` (booleans and unsigned integers as numbers, floats truncated toward zero);
            plain lists, ``bytes``, strings, complex numbers and objects are refused.
        storage: SPDL's storage (``cpu_storage``) to copy into. spdl_rs buffers own their memory, so the values
            go into a new buffer; a storage is still checked as SPDL checks it: one that states its size
            (``nbytes`` or ``size``) must hold the values, and a page-locked one (``is_pinned`` true) is refused,
            as page-locked buffers come from spdl-cuda.

    Returns:
        A new buffer holding the values (a copy: changing ``vals`` later does not change it).

    Raises:
        TypeError: ``vals`` is not an array, or its dtype is not a number.
        ValueError: ``vals`` holds NaN or infinity, or ``storage`` is pinned.
        RuntimeError: ``vals`` is empty, or ``storage`` is too small (SPDL's errors).
    """
    np = _numpy()
    if storage is not None and bool(getattr(storage, "is_pinned", False)):
        raise ValueError(
            "convert_array: a pinned storage is not supported; spdl_rs buffers are allocated by spdl_rs "
            "(copy to the GPU with torch.from_dlpack(buf).cuda(non_blocking=True))"
        )
    if isinstance(vals, (bytes, bytearray, str, list, tuple)) or not (
        isinstance(vals, np.ndarray)
        or hasattr(vals, "__array_interface__")
        or hasattr(vals, "__dlpack__")
        or isinstance(vals, memoryview)
    ):
        raise TypeError(
            "convert_array: vals must be an array (numpy.ndarray, spdl_rs.Buffer, a tensor or a memoryview), "
            f"got {type(vals).__name__}"
        )
    if isinstance(vals, np.ndarray):
        array = vals
    elif hasattr(vals, "__array_interface__") or isinstance(vals, memoryview):
        array = np.asarray(vals)
    else:
        array = np.from_dlpack(vals)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"convert_array: vals must hold numbers (converted to int64), got dtype {array.dtype}")
    if array.size == 0:
        raise RuntimeError(f"The array must not be empty (convert_array got shape {array.shape}).")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError("convert_array: vals holds NaN or infinity, which have no int64 value")
    if storage is not None:
        capacity = getattr(storage, "nbytes", getattr(storage, "size", None))
        needed = array.size * 8
        if isinstance(capacity, int) and capacity < needed:
            raise RuntimeError(f"The provided storage does not have enough capacity. ({capacity} < {needed})")
    converted = np.array(array, dtype=np.int64, order="C")
    return _Buffer.from_bytes(converted.tobytes(), list(converted.shape), "int64")
