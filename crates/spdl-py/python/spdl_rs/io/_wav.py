"""SPDL's WAV names: :py:func:`parse_wav` reads the header, :py:func:`load_wav` views the samples of
uncompressed PCM / IEEE-float WAV data in place (no copy, no decoding). Every chunk size is checked against the
data before it is used: a hostile header is a ``ValueError`` that names the cause, never an over-read.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

from ._array import ArrayInterface, _numpy

if TYPE_CHECKING:
    from typing_extensions import Buffer as _BufferLike

    _Data = bytes | bytearray | memoryview | _BufferLike

__all__ = ["WAVHeader", "load_wav", "parse_wav"]

_MIN_SIZE = 44  # RIFF header (12) + a 16-byte fmt chunk (24) + a data chunk header (8)
_PCM = 1
_IEEE_FLOAT = 3
_EXTENSIBLE = 0xFFFE
# The tail of the KSDATAFORMAT_SUBTYPE_* GUIDs; the first two bytes are the format code (PCM, IEEE float).
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_PCM_TYPES = {8: "|u1", 16: "<i2", 32: "<i4"}
_FLOAT_TYPES = {32: "<f4", 64: "<f8"}


class WAVHeader:
    """The header of WAV data, from :py:func:`parse_wav`. Read-only attributes."""

    __slots__ = (
        "_audio_format",
        "_num_channels",
        "_sample_rate",
        "_byte_rate",
        "_block_align",
        "_bits_per_sample",
        "_data_size",
        "_subformat",
        "_data_offset",
    )

    def __init__(
        self,
        *,
        audio_format: int,
        num_channels: int,
        sample_rate: int,
        byte_rate: int,
        block_align: int,
        bits_per_sample: int,
        data_size: int,
        subformat: int | None = None,
        data_offset: int = 0,
    ) -> None:
        self._audio_format = audio_format
        self._num_channels = num_channels
        self._sample_rate = sample_rate
        self._byte_rate = byte_rate
        self._block_align = block_align
        self._bits_per_sample = bits_per_sample
        self._data_size = data_size
        self._subformat = subformat
        self._data_offset = data_offset

    @property
    def audio_format(self) -> int:
        """The format code of the fmt chunk (1: PCM, 3: IEEE float, 65534: WAVE_FORMAT_EXTENSIBLE, ...)."""
        return self._audio_format

    @property
    def num_channels(self) -> int:
        """Number of channels."""
        return self._num_channels

    @property
    def sample_rate(self) -> int:
        """Sample rate in Hz."""
        return self._sample_rate

    @property
    def byte_rate(self) -> int:
        """Bytes per second, as the header states (``sample_rate * block_align`` in valid data)."""
        return self._byte_rate

    @property
    def block_align(self) -> int:
        """Bytes per sample frame, as the header states (``num_channels * bits_per_sample / 8`` in valid data)."""
        return self._block_align

    @property
    def bits_per_sample(self) -> int:
        """Bits per sample."""
        return self._bits_per_sample

    @property
    def data_size(self) -> int:
        """Size of the sample data (the ``data`` chunk) in bytes."""
        return self._data_size

    def __repr__(self) -> str:
        return (
            f"WAVHeader(audio_format={self._audio_format}, num_channels={self._num_channels}, "
            f"sample_rate={self._sample_rate}, byte_rate={self._byte_rate}, block_align={self._block_align}, "
            f"bits_per_sample={self._bits_per_sample}, data_size={self._data_size})"
        )


def _byte_view(data: _Data) -> memoryview:
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"memoryview: a bytes-like object is required, not {type(data).__name__!r}") from None
    if mv.ndim != 1 or mv.format not in ("B", "b", "c") or not mv.c_contiguous:
        raise ValueError("Expected a one-dimensional, C-contiguous byte buffer.")
    return mv if mv.format == "B" else mv.cast("B")


_CHUNK_HEADER = struct.Struct("<4sI")
_FMT_FIELDS = struct.Struct("<HHIIHH")  # format, channels, rate, byte rate, block align, bits per sample


def _u16(mv: memoryview, at: int) -> int:
    return int.from_bytes(mv[at : at + 2], "little")


def _parse(mv: memoryview) -> WAVHeader:
    n = mv.nbytes
    if n < _MIN_SIZE:
        raise ValueError(f"WAV data too small to contain valid header ({n} bytes, at least {_MIN_SIZE} needed)")
    if bytes(mv[0:4]) != b"RIFF":
        raise ValueError("Missing RIFF header")
    if bytes(mv[8:12]) != b"WAVE":
        raise ValueError("Missing WAVE format identifier")

    # The fmt chunk: the first one, wherever it is.
    pos = 12
    fmt_at = fmt_size = -1
    while pos + 8 <= n:
        tag, size = _CHUNK_HEADER.unpack_from(mv, pos)
        body = pos + 8
        if tag == b"fmt ":
            if size < 16:
                raise ValueError(f"fmt chunk too small ({size} bytes, at least 16 needed)")
            if size > n - body:
                raise ValueError(f"fmt chunk extends beyond file size ({size} bytes at offset {body}, data {n})")
            fmt_at, fmt_size = body, size
            pos = body + size + (size & 1)
            break
        if size > n - body:
            raise ValueError(
                f"WAV chunk extends beyond file size (chunk {tag!r}: {size} bytes at offset {body}, data {n})"
            )
        pos = body + size + (size & 1)
    if fmt_at < 0:
        raise ValueError("fmt chunk not found")

    audio_format, num_channels, sample_rate, byte_rate, block_align, bits = _FMT_FIELDS.unpack_from(mv, fmt_at)
    subformat = None
    if audio_format == _EXTENSIBLE and fmt_size >= 40 and _u16(mv, fmt_at + 16) >= 22:
        if bytes(mv[fmt_at + 26 : fmt_at + 40]) == _GUID_TAIL:
            subformat = _u16(mv, fmt_at + 24)

    # The data chunk: the first one after fmt.
    while pos + 8 <= n:
        tag, size = _CHUNK_HEADER.unpack_from(mv, pos)
        body = pos + 8
        if tag == b"data":
            if size > n - body:
                raise ValueError(
                    f"WAV data chunk extends beyond the input buffer ({size} bytes at offset {body}, "
                    f"{n - body} present)"
                )
            return WAVHeader(
                audio_format=audio_format,
                num_channels=num_channels,
                sample_rate=sample_rate,
                byte_rate=byte_rate,
                block_align=block_align,
                bits_per_sample=bits,
                data_size=size,
                subformat=subformat,
                data_offset=body,
            )
        if size > n - body:
            raise ValueError(
                f"WAV chunk extends beyond file size (chunk {tag!r}: {size} bytes at offset {body}, data {n})"
            )
        pos = body + size + (size & 1)
    raise ValueError("data chunk not found")


def parse_wav(data: _Data) -> WAVHeader:
    """Parses the header of WAV data (no copy of ``data``).

    Args:
        data: The WAV bytes (``bytes``, ``bytearray``, ``memoryview``: one-dimensional, C-contiguous bytes).

    Returns:
        The :py:class:`WAVHeader` (the fmt chunk's fields and the size of the data chunk).

    Raises:
        ValueError: The data is not RIFF/WAVE, is shorter than a header, lacks a fmt or data chunk, or a chunk
            declares more bytes than the data holds.

    Example:
        >>> import io, wave
        >>> buf = io.BytesIO()
        >>> with wave.open(buf, "wb") as w:
        ...     w.setnchannels(1); w.setsampwidth(2); w.setframerate(8000); w.writeframes(bytes(8))
        >>> parse_wav(buf.getvalue()).data_size
        8
    """
    return _parse(_byte_view(data))


class _WAVArrayInterface(ArrayInterface):
    """The samples of WAV data as an :py:class:`ArrayInterface`: ``numpy.asarray`` views them in place. Holds a
    memoryview of the source, which keeps it alive and blocks resizing a ``bytearray`` source meanwhile."""

    __slots__ = ("_interface", "_owner")

    def __init__(self, interface: dict[str, Any], owner: memoryview) -> None:
        self._interface = interface
        self._owner = owner

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """``version``, ``shape`` ``(num_frames, num_channels)``, ``typestr``, ``data`` and ``owner``."""
        return self._interface


def _frame_index(seconds: float, sample_rate: int) -> int:
    return math.floor(seconds * sample_rate)


def load_wav(
    data: _Data,
    time_offset_seconds: float | None = None,
    duration_seconds: float | None = None,
) -> ArrayInterface:
    """The samples of uncompressed WAV data, viewed in place (no copy, no decoding).

    Args:
        data: The WAV bytes (``bytes``, ``bytearray``, ``memoryview``).
        time_offset_seconds: Start of the window in seconds (default 0); the first frame is
            ``floor(time_offset_seconds * sample_rate)``.
        duration_seconds: Length of the window in seconds (default: to the end), ``floor(duration_seconds *
            sample_rate)`` frames, fewer if the data ends first.

    Returns:
        An :py:class:`ArrayInterface` of shape ``(num_frames, num_channels)`` (interleaved, as stored):
        ``numpy.asarray(result)`` views ``data`` without a copy, read-only when ``data`` is. The dtype follows
        the format: PCM 8-bit ``uint8``, 16-bit ``int16``, 32-bit ``int32``; IEEE float 32-bit ``float32``,
        64-bit ``float64``. WAVE_FORMAT_EXTENSIBLE data with a PCM or IEEE-float subformat reads the same way.

    Raises:
        ValueError: The header is invalid (see :py:func:`parse_wav`), has zero channels or a zero sample rate,
            an unsupported format or sample width (e.g. 24-bit), a block align or byte rate that does not match
            the format, a data chunk that is not a whole number of frames, or a window that is not finite, is
            negative, or starts at or after the end.
    """
    mv = _byte_view(data)
    header = _parse(mv)
    channels, rate, bits = header.num_channels, header.sample_rate, header.bits_per_sample
    if channels == 0:
        raise ValueError("Invalid number of channels: 0")
    if rate == 0:
        raise ValueError("Invalid sample rate: 0")
    fmt = header.audio_format
    if fmt == _EXTENSIBLE and header._subformat is not None:
        fmt = header._subformat
    if fmt == _PCM:
        typestr = _PCM_TYPES.get(bits)
        if typestr is None:
            raise ValueError(f"Unsupported PCM bits per sample: {bits}")
    elif fmt == _IEEE_FLOAT:
        typestr = _FLOAT_TYPES.get(bits)
        if typestr is None:
            raise ValueError(f"Unsupported IEEE float bits per sample: {bits}")
    else:
        raise ValueError(f"Unsupported WAV audio format: {header.audio_format}")
    block_align = channels * bits // 8
    if header.block_align != block_align:
        raise ValueError(f"Invalid block align: expected {block_align}, found {header.block_align}")
    if header.byte_rate != rate * block_align:
        raise ValueError(f"Invalid byte rate: expected {rate * block_align}, found {header.byte_rate}")
    if header.data_size % block_align:
        raise ValueError(
            f"WAV data chunk does not contain a whole number of sample frames ({header.data_size} bytes, "
            f"{block_align} per frame)"
        )
    num_frames = header.data_size // block_align

    start, count = 0, num_frames
    if time_offset_seconds is not None or duration_seconds is not None:
        offset = 0.0 if time_offset_seconds is None else float(time_offset_seconds)
        if not math.isfinite(offset):
            raise ValueError(f"Time offset must be finite, got {offset}")
        if offset < 0:
            raise ValueError(f"Time offset cannot be negative, got {offset}")
        start = _frame_index(offset, rate)
        if start >= num_frames:
            raise ValueError(
                f"Time offset exceeds audio duration ({offset} s, the audio has {num_frames} frames at {rate} Hz)"
            )
        count = num_frames - start
        if duration_seconds is not None:
            duration = float(duration_seconds)
            if not math.isfinite(duration):
                raise ValueError(f"Duration must be finite, got {duration}")
            if duration < 0:
                raise ValueError(f"Duration cannot be negative, got {duration}")
            count = min(count, _frame_index(duration, rate))

    np = _numpy()
    base = np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0]
    interface = {
        "version": 3,
        "shape": (count, channels),
        "typestr": typestr,
        "data": (base + header._data_offset + start * block_align, mv.readonly),
        "owner": mv,
    }
    return _WAVArrayInterface(interface, memoryview(mv))
