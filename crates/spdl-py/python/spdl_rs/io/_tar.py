"""SPDL's ``iter_tarfile``: the regular files of a TAR archive as ``(name, contents)`` pairs.

Pure Python over the 512-byte blocks of the POSIX ustar layout, with GNU (``././@LongLink``) and PAX
(``path``/``size`` records) extensions. From bytes the contents are ``memoryview`` slices of the input (no copy);
from a file-like object they are ``bytes`` read in bounded chunks, so a header that declares a huge size on a
short stream fails when the stream ends instead of allocating the declared size.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast, overload

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


_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
# Member types that are regular files: '0', the pre-POSIX NUL, and '7' (contiguous file, read as a regular one
# by every reader). Directories, links, devices and FIFOs are skipped, as SPDL does.
_REGULAR = frozenset(b"0\x007")
_GNU_LONGNAME = ord("L")
_GNU_LONGLINK = ord("K")
_PAX_LOCAL = ord("x")
_PAX_GLOBAL = ord("g")
# GNU long names and PAX headers are metadata: this bounds what a hostile header can make the reader hold.
_MAX_META_BYTES = 1 << 20
# File-like sources are read at most this much at a time (a truncated stream fails before a huge allocation).
_READ_CHUNK = 16 << 20
# Members up to this size are read with their padding in one call.
_SMALL_MEMBER = 1 << 16


def _octal(raw: bytes, what: str, offset: int) -> int:
    """A numeric header field: NUL/space-terminated octal, or GNU's base-256 (top bit of the first byte set)."""
    if raw and raw[0] & 0x80:
        if raw[0] == 0xFF:
            raise FormatError(f"TAR header at offset {offset}: negative {what}")
        value = raw[0] & 0x7F
        for byte in raw[1:]:
            value = (value << 8) | byte
        return value
    text = raw.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise FormatError(f"TAR header at offset {offset}: invalid {what} field {raw!r}") from None


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _octal(block[148:156], "checksum", 0)
    except FormatError:
        return False
    # The sum of the header's bytes with the checksum field read as eight spaces. The low half of Adler-32 is
    # 1 + the byte sum modulo 65521, exact for 256 bytes (at most 65280): two halves, summed in C.
    unsigned = (
        (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2 - sum(block[148:156]) + 8 * 0x20
    )
    if stored == unsigned:
        return True
    # Some old writers summed signed chars.
    return stored == unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b >= 0x80)


def _cstr(field: bytes) -> bytes:
    return field.split(b"\x00", 1)[0]


def _decode(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes, offset: int) -> dict[str, bytes]:
    """PAX extended header records: ``"<len> <key>=<value>\\n"``."""
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # NUL padding after the last record
            break
        space = data.find(b" ", pos)
        if space < 0:
            raise FormatError(f"TAR PAX header at offset {offset}: record without a length")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise FormatError(f"TAR PAX header at offset {offset}: invalid record length {data[pos:space]!r}") from None
        end = pos + length
        if length <= space - pos + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise FormatError(f"TAR PAX header at offset {offset}: a record overruns the header")
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep:
            raise FormatError(f"TAR PAX header at offset {offset}: record without '='")
        records[key.decode("utf-8", "surrogateescape")] = value
        pos = end
    return records


class _Reader:
    """Reads 512-byte blocks and member data from bytes (zero-copy) or a file-like object (chunked reads)."""

    def __init__(self, src: memoryview | SupportsRead) -> None:
        self._mv = src if isinstance(src, memoryview) else None
        self._file = None if isinstance(src, memoryview) else src
        self.offset = 0

    def block(self) -> bytes | None:
        """The next header block, ``None`` at the end of the data (on a block boundary)."""
        if self._mv is not None:
            rest = self._mv.nbytes - self.offset
            if rest == 0:
                return None
            if rest < _BLOCK:
                raise FormatError(
                    f"TAR archive is truncated: {rest} bytes at offset {self.offset}, a header needs {_BLOCK}"
                )
            data = bytes(self._mv[self.offset : self.offset + _BLOCK])
            self.offset += _BLOCK
            return data
        data = self._read_exact(_BLOCK, allow_empty=True)  # counts the offset itself
        return data if data else None

    def data(self, size: int, name: str) -> memoryview | bytes:
        """``size`` bytes of member data, then the padding to the next block boundary."""
        padded = -(-size // _BLOCK) * _BLOCK
        if self._mv is not None:
            rest = self._mv.nbytes - self.offset
            if size > rest:
                raise FormatError(
                    f"TAR archive is truncated: member {name!r} declares {size} bytes, {rest} remain "
                    f"(offset {self.offset})"
                )
            view = self._mv[self.offset : self.offset + size]
            self.offset += min(padded, rest)
            return view
        if 0 < size <= _SMALL_MEMBER and padded > size:
            # One read for the data and its padding; the slice copies less than a second call costs.
            data = self._read_exact(padded, name, allow_short=True)
            if len(data) < size:  # the padding may be missing at the very end, the data may not
                raise FormatError(
                    f"TAR archive is truncated: member {name!r} needs {size} bytes at offset "
                    f"{self.offset - len(data)}, the stream ended after {len(data)}"
                )
            return data[:size]
        data = self._read_exact(size, name)
        self._read_exact(padded - size, name, allow_short=True)
        return data

    def _read_exact(
        self, size: int, member: str | None = None, allow_empty: bool = False, allow_short: bool = False
    ) -> bytes:
        """``size`` bytes from the stream, read at most ``_READ_CHUNK`` at a time. ``member``: the member whose
        data this is (for the error), ``None`` for a header."""
        assert self._file is not None
        if size == 0:
            return b""
        chunk = self._file.read(min(size, _READ_CHUNK))
        if type(chunk) is bytes and len(chunk) == size:  # the common case: one complete read
            self.offset += size
            return chunk
        chunks: list[bytes] = []
        got = 0
        while True:
            if not isinstance(chunk, (bytes, bytearray)):
                raise TypeError(f"iter_tarfile: read() must return bytes, got {type(chunk).__name__}")
            if not chunk:
                break
            chunks.append(bytes(chunk))
            got += len(chunk)
            if got >= size:
                break
            chunk = self._file.read(min(size - got, _READ_CHUNK))
        self.offset += got
        if got < size and not (allow_short or (allow_empty and got == 0)):
            what = "a header" if member is None else f"member {member!r}"
            raise FormatError(
                f"TAR archive is truncated: {what} needs {size} bytes at offset {self.offset - got}, "
                f"the stream ended after {got}"
            )
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _meta(reader: _Reader, size: int, kind: str) -> bytes:
    if size > _MAX_META_BYTES:
        raise FormatError(
            f"TAR {kind} at offset {reader.offset - _BLOCK} declares {size} bytes (more than {_MAX_META_BYTES})"
        )
    return bytes(reader.data(size, kind))


def _iter(reader: _Reader) -> Iterator[tuple[str, Any]]:
    long_name: str | None = None
    pax: dict[str, bytes] = {}
    pax_global: dict[str, bytes] = {}
    while True:
        header_offset = reader.offset
        block = reader.block()
        if block is None:
            if long_name is not None or pax:
                raise FormatError("TAR archive is truncated: an extended header has no member after it")
            return
        if block == _ZERO_BLOCK:
            # One zero block may be padding; two in a row end the archive.
            nxt = reader.block()
            if nxt is None or nxt == _ZERO_BLOCK:
                return
            block, header_offset = nxt, reader.offset - _BLOCK
        if not _checksum_ok(block):
            raise FormatError(f"TAR header at offset {header_offset} has a bad checksum (not a TAR archive?)")
        typeflag = block[156]
        size = _octal(block[124:136], "size", header_offset)
        if typeflag == _GNU_LONGNAME:
            long_name = _decode(_cstr(_meta(reader, size, "GNU long name")))
            continue
        if typeflag == _GNU_LONGLINK:
            _meta(reader, size, "GNU long link name")
            continue
        if typeflag == _PAX_LOCAL:
            pax = _parse_pax(_meta(reader, size, "PAX header"), header_offset)
            continue
        if typeflag == _PAX_GLOBAL:
            pax_global.update(_parse_pax(_meta(reader, size, "PAX global header"), header_offset))
            continue
        records = {**pax_global, **pax}
        if "size" in records:
            try:
                size = int(records["size"])
            except ValueError:
                raise FormatError(
                    f"TAR PAX header before offset {header_offset}: invalid size {records['size']!r}"
                ) from None
            if size < 0:
                raise FormatError(f"TAR PAX header before offset {header_offset}: negative size")
        if "path" in records:
            name = _decode(records["path"])
        elif long_name is not None:
            name = long_name
        else:
            name = _decode(_cstr(block[0:100]))
            if block[257:262] == b"ustar" and block[345] != 0 and block[257:265] != b"ustar  \x00":
                name = _decode(_cstr(block[345:500])) + "/" + name
        long_name, pax = None, {}
        # Members whose data is not stored in the archive (links, devices, directories) still carry a size
        # field that some writers fill in; only regular files have data blocks.
        if typeflag in _REGULAR:
            yield name, reader.data(size, name)
        elif typeflag not in b"123456":
            # An unknown type (e.g. GNU sparse 'S') stores data blocks: skip them.
            reader.data(size, name)


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
        return _iter(_Reader(cast(SupportsRead, src)))
    try:
        mv = memoryview(src)
    except TypeError:
        raise TypeError(
            f"iter_tarfile: src must be bytes-like or a file-like object with read(), got {type(src).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise ValueError("iter_tarfile: the data must be a C-contiguous buffer")
    return _iter(_Reader(mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")))
