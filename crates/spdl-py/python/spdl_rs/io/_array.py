"""SPDL's array names: NumPy's NPY/NPZ formats read from memory without a copy (:py:func:`load_npy`,
:py:func:`load_npz`, :py:class:`NpzFile`), the array-interface protocols (:py:class:`ArrayInterface`,
:py:class:`CUDAArrayInterface`) and conversions (:py:func:`convert_array`, :py:func:`to_jax`,
:py:func:`to_numba`).

The readers check every declared size against the data before they build a view or allocate: a truncated header,
a shape larger than the payload, a bad magic string, an object dtype (a pickle) or an entry outside the archive is
a :py:class:`FormatError` (a ``ValueError``, and a ``RuntimeError`` as in SPDL) that names the cause.
"""

from __future__ import annotations

import ast
import functools
import io
import math
import re
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._native import Buffer as _Buffer
from .._views import SliceSource
from ._tar import FormatError

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
_MAGIC = b"\x93NUMPY"
# NPY headers are a short Python dict literal (numpy writes ~120 bytes; a wide structured dtype a few KiB). The
# bound keeps `ast.literal_eval` away from megabytes of hostile text.
_MAX_HEADER_BYTES = 1 << 20


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


################################################################################
# NPY
################################################################################


class _HeaderError(Exception):
    """A malformed NPY header dict (the caller names the input)."""


# numpy's own header layout for a plain dtype, e.g. "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }":
# read without `ast.literal_eval` (which costs tens of microseconds); anything else takes the general path.
_PLAIN_HEADER = re.compile(
    r"\{'descr': '([^'\\]+)', 'fortran_order': (True|False), 'shape': \(((?:\d+, )*\d*,?)\), \}\s*\Z"
)


def _header_fields(raw: bytes, encoding: str) -> tuple[Any, tuple[int, ...], bool]:
    """``(dtype, shape, fortran_order)`` of an NPY header dict, every field checked. Headers of up to 4 KiB are
    cached (datasets repeat a few headers; dtypes are immutable)."""
    if len(raw) <= 4096:
        return _cached_header_fields(raw, encoding)
    return _read_header_fields(raw, encoding)


def _read_header_fields(raw: bytes, encoding: str) -> tuple[Any, tuple[int, ...], bool]:
    np = _numpy()
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise _HeaderError(f"failed to parse header ({e})") from None
    plain = _PLAIN_HEADER.match(text)
    if plain is not None:
        descr: Any = plain.group(1)
        fortran: Any = plain.group(2) == "True"
        try:
            shape: Any = tuple(int(d) for d in plain.group(3).replace(" ", "").split(",") if d)
        except ValueError as e:  # e.g. more digits than `int` reads
            raise _HeaderError(f"invalid shape in header ({e})") from None
    else:
        try:
            header = ast.literal_eval(text)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
            raise _HeaderError(f"failed to parse header ({type(e).__name__}: {e})") from None
        if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
            raise _HeaderError(
                f"failed to parse header: expected a dict with keys descr, fortran_order and shape, got {header!r:.200}"
            )
        descr, shape, fortran = header["descr"], header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise _HeaderError(f"invalid shape in header: {shape!r:.200}")
    if any(d < 0 for d in shape):
        raise _HeaderError(f"negative dimension in header shape {shape!r:.200}")
    if not isinstance(fortran, bool):
        raise _HeaderError(f"invalid fortran_order in header: {fortran!r:.100}")
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except Exception as e:  # numpy raises TypeError/ValueError/KeyError for malformed descriptions
        raise _HeaderError(f"invalid dtype in header: {descr!r:.200} ({e})") from None
    if dtype.hasobject:
        raise _HeaderError("object NPY dtypes are not supported (the payload is a pickle, which is never loaded)")
    return dtype, shape, fortran


_cached_header_fields = functools.lru_cache(maxsize=256)(_read_header_fields)


def _parse_header(mv: memoryview, what: str) -> tuple[Any, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, payload offset)`` of the NPY data in ``mv``, every field checked."""
    np = _numpy()
    n = mv.nbytes
    if n < len(_MAGIC) + 2:
        raise FormatError(f"{what}: failed to parse the magic prefix (data too short: {n} bytes)")
    if bytes(mv[: len(_MAGIC)]) != _MAGIC:
        raise FormatError(f"{what}: the data must start with the prefix '\\x93NUMPY' (not NPY data)")
    major, minor = mv[6], mv[7]
    if major == 1:
        len_bytes, encoding = 2, "latin1"
    elif major in (2, 3):
        len_bytes, encoding = 4, ("latin1" if major == 2 else "utf8")
    else:
        raise FormatError(f"{what}: unsupported NPY format version {major}.{minor}")
    start = 8 + len_bytes
    if n < start:
        raise FormatError(f"{what}: failed to parse header (data too short for its length field)")
    header_len = int.from_bytes(mv[8:start], "little")
    if header_len > n - start:
        raise FormatError(
            f"{what}: failed to parse header: it declares {header_len} bytes, {n - start} are present (truncated)"
        )
    if header_len > _MAX_HEADER_BYTES:
        raise FormatError(f"{what}: failed to parse header: {header_len} bytes (more than {_MAX_HEADER_BYTES})")
    try:
        dtype, shape, fortran = _header_fields(bytes(mv[start : start + header_len]), encoding)
    except _HeaderError as e:
        raise FormatError(f"{what}: {e}") from None
    return dtype, shape, fortran, start + header_len


def _npy_array(mv: memoryview, what: str) -> NDArray[Any]:
    """A view of the NPY data in ``mv`` (it keeps ``mv`` alive and inherits its writability)."""
    np = _numpy()
    dtype, shape, fortran, offset = _parse_header(mv, what)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes > mv.nbytes - offset:
        raise FormatError(
            f"{what}: NPY payload is shorter than its declared shape: shape {shape} of {dtype} needs {nbytes} "
            f"bytes, {mv.nbytes - offset} are present"
        )
    try:
        if dtype.itemsize == 0:  # no bytes to view (numpy cannot view a buffer as zero-size items)
            array = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
            array.flags.writeable = not mv.readonly
            return array
        # `frombuffer` holds a buffer export of `mv` (so a bytearray source cannot be resized under the array);
        # `np.ndarray(buffer=...)` would not.
        flat = np.frombuffer(mv, dtype=dtype, count=count, offset=offset)
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


class _MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview, for :py:mod:`zipfile` (``io.BytesIO`` would copy it)."""

    def __init__(self, mv: memoryview) -> None:
        super().__init__()
        self._mv = mv
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._mv.nbytes}[whence]
        if base + offset < 0:
            raise OSError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1, /) -> bytes:
        # Never more than the data holds, whatever `size` a (hostile) directory entry asks for: the default
        # `RawIOBase.read` would allocate `size` bytes first.
        end = self._mv.nbytes if size is None or size < 0 else min(self._mv.nbytes, self._pos + size)
        chunk = bytes(self._mv[self._pos : max(end, self._pos)])
        self._pos += len(chunk)
        return chunk

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        chunk = self._mv[self._pos : self._pos + out.nbytes]
        out[: chunk.nbytes] = chunk
        self._pos += chunk.nbytes
        return chunk.nbytes


def _parse_zip(mv: memoryview) -> dict[str, tuple[int, int, int, int, int]]:
    """``{name: (payload offset, compressed size, uncompressed size, method, crc32)}`` from the central
    directory, each payload offset found from the entry's local header."""
    # SPDL's words for the two ways a buffer is not a zip: too short for an end-of-central-directory record
    # (22 bytes), or no record's signature in it.
    if mv.nbytes < 22:
        raise FormatError(f"The data is not a valid zip file. (load_npz: {mv.nbytes} bytes, shorter than a zip's "
                          "end-of-central-directory record)")
    if b"PK\x05\x06" not in bytes(mv[-(65535 + 22):]):
        raise FormatError("Failed to locate the end of the central directory. (load_npz: the data is not a valid "
                          "zip file)")
    try:
        with zipfile.ZipFile(_MemoryFile(mv)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, struct.error) as e:
        raise FormatError(f"The data is not a valid zip file. (load_npz: {e})") from None
    meta: dict[str, tuple[int, int, int, int, int]] = {}
    for info in infos:
        local = info.header_offset
        if local < 0 or local + 30 > mv.nbytes:
            raise FormatError(f"load_npz: the local header of entry {info.filename!r} is outside the archive")
        header = mv[local : local + 30]
        if bytes(header[:4]) != b"PK\x03\x04":
            raise FormatError(f"load_npz: entry {info.filename!r} has a bad local header signature")
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        offset = local + 30 + name_len + extra_len
        if info.flag_bits & 0x1:
            raise FormatError(f"load_npz: entry {info.filename!r} is encrypted")
        meta[info.filename] = (offset, info.compress_size, info.file_size, info.compress_type, info.CRC)
    return meta


def _inflate(payload: memoryview, size: int, name: str) -> bytearray:
    """Raw DEFLATE data of ``payload``, exactly ``size`` bytes (never more is allocated)."""
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        # `max_length=0` means "no limit" to zlib, so an empty entry asks for one byte and expects none.
        out = inflater.decompress(payload, size) if size else b""
        if not inflater.eof and inflater.decompress(inflater.unconsumed_tail if size else payload, 1):
            raise FormatError(f"NPZ entry {name!r} inflates to more than its declared {size} bytes")
    except zlib.error as e:
        raise FormatError(f"NPZ entry {name!r}: failed to decompress the data ({e})") from None
    if len(out) != size:
        raise FormatError(
            f"NPZ entry {name!r}: failed to decompress the data (it inflates to {len(out)} bytes, {size} declared)"
        )
    return bytearray(out)


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
        if max_uncompressed_bytes < 0:
            raise ValueError("max_uncompressed_bytes must be non-negative.")
        # Arrays are loaded (and dropped) on any thread: each entry is a slice with a buffer of its own.
        self._buf = SliceSource(data, buf)
        size = buf.nbytes
        checked: dict[str, tuple[int, int, int, int, int | None]] = {}
        total = 0
        for name, entry in meta.items():
            if len(entry) not in (4, 5):
                raise ValueError(f"NPZ entry {name!r} metadata must contain 4 or 5 fields.")
            offset, compressed, uncompressed, method = (int(v) for v in entry[:4])
            crc = entry[4] if len(entry) == 5 else None
            if offset < 0 or compressed < 0:
                raise ValueError(f"NPZ entry {name!r} has a negative payload region.")
            if offset > size or compressed > size - offset:
                raise ValueError(
                    f"NPZ entry {name!r} payload is outside the archive buffer "
                    f"(offset {offset}, {compressed} bytes, archive {size} bytes)."
                )
            if uncompressed < 0:
                raise ValueError(f"NPZ entry {name!r} has a negative uncompressed size.")
            if method == 0:
                if compressed != uncompressed:
                    raise ValueError(
                        f"NPZ stored entry {name!r} must have matching compressed and uncompressed sizes."
                    )
            elif method == 8:
                if uncompressed > max_uncompressed_bytes - total:
                    raise ValueError(
                        f"NPZ deflated entries exceed max_uncompressed_bytes ({max_uncompressed_bytes})."
                    )
                total += uncompressed
            else:
                raise ValueError(f"NPZ entry {name!r} uses unsupported compression method {method}.")
            checked[name] = (offset, compressed, uncompressed, method, None if crc is None else int(crc))
        self._meta = checked
        self.files: list[str] = [name.removesuffix(".npy") for name in checked]
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
        if method == 0:
            if crc is not None and zlib.crc32(payload) != crc:
                raise FormatError(f"{what}: ZIP entry failed CRC-32 validation.")
            return _npy_array(payload, what)
        inflated = _inflate(payload, uncompressed, key)
        if crc is not None and zlib.crc32(inflated) != crc:
            raise FormatError(f"{what}: ZIP entry failed CRC-32 validation.")
        return _npy_array(memoryview(inflated), what)

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
    if max_uncompressed_bytes < 0:
        raise ValueError("max_uncompressed_bytes must be non-negative.")
    mv = _byte_view(data, "load_npz")
    return NpzFile(mv, _parse_zip(mv), max_uncompressed_bytes=max_uncompressed_bytes)


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
