"""SPDL's ``iter_tarfile``: the regular files of a TAR archive as ``(name, contents)`` pairs.

The archive is parsed natively (``spdl_source::tar_index`` through ``spdl_rs._native``): the POSIX ustar layout with
GNU (``././@LongLink``) and PAX (``path``/``size`` records) extensions. From bytes, one call indexes every member
(with the GIL released) and the contents are ``memoryview`` slices of the input (no copy); from a file-like object,
a native iterator reads header by header and member by member, in bounded chunks, so a header that declares a huge
size on a short stream fails when the stream ends instead of allocating the declared size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast, overload

from .. import _native
from .._views import SliceSource

if TYPE_CHECKING:
    from typing_extensions import Buffer as _BufferLike

__all__ = ["iter_tarfile"]


class FormatError(ValueError, RuntimeError):
    """Malformed archive or array data (NPY, NPZ, TAR).

    A ``ValueError`` (invalid data) that is also a ``RuntimeError``, the class SPDL raises for the same inputs, so
    that ``except`` clauses written for either catch it.
    """


class SupportsRead(Protocol):
    """A file-like object: only ``read(n) -> bytes`` is used."""

    def read(self, n: int = -1, /) -> bytes: ...


def _native_attr(name: str) -> Any:
    value = getattr(_native.io, name, None)
    if value is None:
        if getattr(_native, "HAS_IO", False):
            raise RuntimeError(f"spdl_rs._native.io has no `{name}`: the native module is older than spdl_rs (rebuild it)")
        raise RuntimeError("spdl_rs was built without the `io` feature")
    return value


def _iter_buffer(src: Any, mv: memoryview, data: bytes | memoryview) -> Iterator[tuple[str, memoryview]]:
    """The members of the archive in ``data`` (``mv``'s bytes, ``mv`` a view of ``src``), as slices of ``mv``
    that the consumer may use and drop on any thread."""
    members, error = _native_attr("tar_index")(data)
    slices = SliceSource(src, mv)
    for name, offset, size in members:
        yield name, slices.slice(offset, offset + size)
    if error is not None:
        raise FormatError(error)


@overload
def iter_tarfile(src: SupportsRead) -> Iterator[tuple[str, bytes]]: ...


@overload
def iter_tarfile(src: bytes | memoryview | bytearray) -> Iterator[tuple[str, memoryview]]: ...


def iter_tarfile(
    src: bytes | memoryview | bytearray | _BufferLike | SupportsRead,
) -> Iterator[tuple[str, memoryview]] | Iterator[tuple[str, bytes]]:
    """Parses a TAR archive and yields ``(path, contents)`` for each regular file, in archive order.

    Directories, symbolic and hard links, devices and FIFOs are skipped. Long paths written by GNU tar
    (``././@LongLink``) or as PAX ``path`` records, and the ustar ``prefix`` field, give the full path; a PAX
    ``size`` record overrides the header's size.

    Args:
        src: The archive: bytes-like (``bytes``, ``bytearray``, ``memoryview``, ...) or a file-like object
            (only ``read(n) -> bytes`` is used).

    Yields:
        From bytes-like data, ``(path, memoryview)`` with each view a slice of ``src`` (no copy; it keeps
        ``src`` alive). From a file-like object, ``(path, bytes)``.

    Raises:
        ValueError: The data is not a TAR archive or is truncated (a header with a bad checksum, a member whose
            data runs past the end); the message names the offset or the member. It is also a
            ``RuntimeError``, as SPDL raises there.

    Example:
        >>> import io, tarfile
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as tf:
        ...     info = tarfile.TarInfo("a.txt"); info.size = 2
        ...     tf.addfile(info, io.BytesIO(b"hi"))
        >>> [(name, bytes(data)) for name, data in iter_tarfile(buf.getvalue())]
        [('a.txt', b'hi')]
    """
    if hasattr(src, "read"):
        return cast(Iterator[tuple[str, bytes]], _native_attr("TarStream")(src, FormatError))
    try:
        mv = memoryview(src)
    except TypeError:
        raise TypeError(
            f"iter_tarfile: src must be bytes-like or a file-like object with read(), got {type(src).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise ValueError("iter_tarfile: the data must be a C-contiguous buffer")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    # `bytes` is read in place by every build; other buffers through the buffer protocol.
    return _iter_buffer(src, mv, src if type(src) is bytes else mv)
