"""SPDL's WAV names: :py:func:`parse_wav` reads the header, :py:func:`load_wav` views the samples of
uncompressed PCM / IEEE-float WAV data in place (no copy, no decoding). The chunks are parsed natively
(``spdl_rs._native.io``: ``WAVHeader``, ``wav_header``, ``wav_samples``), every chunk size checked against the
data before it is used: a hostile header is a ``ValueError`` that names the cause, never an over-read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._array import ArrayInterface, _numpy, _readable
from ._tar import _native_attr

if TYPE_CHECKING:
    from typing_extensions import Buffer as _BufferLike

    from .._native.io import WAVHeader

    _Data = bytes | bytearray | memoryview | _BufferLike
else:
    WAVHeader = _native_attr("WAVHeader")  # the header of WAV data, from `parse_wav`; read-only attributes

__all__ = ["WAVHeader", "load_wav", "parse_wav"]


def _byte_view(data: _Data) -> memoryview:
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"memoryview: a bytes-like object is required, not {type(data).__name__!r}") from None
    if mv.ndim != 1 or mv.format not in ("B", "b", "c") or not mv.c_contiguous:
        raise ValueError("Expected a one-dimensional, C-contiguous byte buffer.")
    return mv if mv.format == "B" else mv.cast("B")


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
    return _native_attr("wav_header")(_readable(_byte_view(data)))


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
    window = _native_attr("wav_samples")(_readable(mv), time_offset_seconds, duration_seconds)
    typestr, offset, frames, channels = window
    base = _numpy().frombuffer(mv, dtype="u1").__array_interface__["data"][0]
    interface = {
        "version": 3,
        "shape": (frames, channels),
        "typestr": typestr,
        "data": (base + offset, mv.readonly),
        "owner": mv,
    }
    return _WAVArrayInterface(interface, memoryview(mv))
