"""Media decoding in Rust (spdl-io). Every function releases the GIL for its whole duration.

- Images: :py:func:`load_image`, :py:func:`decode_image`, :py:func:`image_info`, :py:func:`load_image_batch`
  return :py:class:`spdl_rs.Buffer` objects; ``numpy.asarray(buf)`` or ``buf.numpy()`` views them without a
  copy, and ``torch.from_dlpack(buf)`` / ``numpy.from_dlpack(buf)`` take them in place.
- Audio (pure Rust: WAV, FLAC, MP3, Vorbis, AAC, ...): :py:func:`load_audio`, :py:func:`load_audio_batch`
  return ``numpy`` arrays viewing the decoded memory in place; :py:func:`probe` describes any media file.
- Video (a build with FFmpeg, see :py:func:`has_video`): :py:func:`load_video`, or :py:func:`demux_video` then
  :py:func:`decode_packets` in separate pipeline stages; ``numpy`` ``uint8`` arrays ``[N, H, W, C]``.

The same decoders as pipeline stages that never take the GIL are in :py:mod:`spdl_rs.io.ops`.
"""

from .._native import HAS_IO, HAS_VIDEO


def has_video() -> bool:
    """Whether this build decodes video (the ``ffmpeg`` cargo feature: FFmpeg's libraries are linked)."""
    return bool(HAS_VIDEO)


def _missing(feature: str):
    def missing(*_args, **_kwargs):
        raise RuntimeError(f"spdl_rs was built without the `{feature}` feature")

    return missing


if HAS_IO:
    from .._native import (
        decode_image,
        image_info,
        load_audio,
        load_audio_batch,
        load_image,
        load_image_batch,
        probe,
    )
else:  # pragma: no cover (a build without the `io` feature)
    decode_image = image_info = load_image = load_image_batch = _missing("io")
    load_audio = load_audio_batch = probe = _missing("io")

if HAS_VIDEO:
    from .._native import Packets, decode_packets, demux_video, load_video
else:
    load_video = demux_video = decode_packets = _missing("ffmpeg")

    class Packets:  # type: ignore[no-redef]
        """Demuxed video packets (only made by a build with the ``ffmpeg`` feature)."""

        def __init__(self, *_args, **_kwargs):
            raise RuntimeError("spdl_rs was built without the `ffmpeg` feature")


from . import ops  # noqa: E402

__all__ = [
    "Packets",
    "decode_image",
    "decode_packets",
    "demux_video",
    "has_video",
    "image_info",
    "load_audio",
    "load_audio_batch",
    "load_image",
    "load_image_batch",
    "load_video",
    "ops",
    "probe",
]
