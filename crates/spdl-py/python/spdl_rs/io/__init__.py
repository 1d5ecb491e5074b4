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
        decode_memory_budget,
        image_info,
        load_audio,
        load_audio_batch,
        load_image,
        load_image_batch,
        probe,
        set_decode_memory_budget,
    )
else:  # pragma: no cover (a build without the `io` feature)
    decode_image = image_info = load_image = load_image_batch = _missing("io")
    decode_memory_budget = set_decode_memory_budget = _missing("io")
    load_audio = load_audio_batch = probe = _missing("io")

if HAS_VIDEO:
    from .._native import Packets, decode_packets, demux_video, load_video
else:
    load_video = demux_video = decode_packets = _missing("ffmpeg")

    class Packets:  # type: ignore[no-redef]
        """Demuxed video packets (only made by a build with the ``ffmpeg`` feature)."""

        def __init__(self, *_args, **_kwargs):
            raise RuntimeError("spdl_rs was built without the `ffmpeg` feature")


# SPDL spellings, so that code written for `spdl.io` runs with an import change: `pix_fmt` ("rgb24", "rgba",
# "gray") for `pixel_format`, `timestamp=(start, end)` for `start`/`duration`, `load_image` of encoded bytes,
# and `to_numpy`. Thin Python wrappers: the decoding itself still runs in Rust without the GIL.
_PIX_FMTS = {"rgb24": "rgb", "rgb": "rgb", "rgba": "rgba", "gray": "gray", "gray8": "gray"}


def _pixel_format(pixel_format: str, pix_fmt: str | None) -> str:
    if pix_fmt is None:
        return pixel_format
    try:
        return _PIX_FMTS[pix_fmt]
    except KeyError:
        raise ValueError(f"pix_fmt must be one of {sorted(_PIX_FMTS)}, got {pix_fmt!r}") from None


def _window(kwargs: dict, timestamp) -> dict:
    if timestamp is not None:
        if "start" in kwargs or "duration" in kwargs:
            raise ValueError("give either timestamp=(start, end) or start/duration, not both")
        start, end = (float(t) for t in timestamp)
        if not end > start >= 0:
            raise ValueError(f"timestamp must be (start, end) with 0 <= start < end, got {timestamp!r}")
        kwargs = {**kwargs, "start": start, "duration": end - start}
    return kwargs


# SPDL's configuration objects (``spdl.io.demux_config(...)`` and the like) and where spdl_rs puts the same
# settings; ``None``, SPDL's "defaults", is accepted.
_SPDL_CONFIGS = {
    "demux_config": "the file's own container is detected from its bytes",
    "decode_config": "decoding runs with its own threads, see the function's keywords",
    "device_config": "move the result with torch.from_dlpack(...).cuda(non_blocking=True) or spdl-cuda",
    "storage": "the result owns its memory (numpy/DLPack views keep it alive)",
}


def _spdl_keywords(kwargs: dict, func: str, instead: str) -> dict:
    """SPDL's ``filter_desc`` is an FFmpeg filter graph; spdl_rs decodes without one. ``None`` (SPDL's "no
    filter") is accepted; a graph is refused with the keywords that do the same work here. SPDL's config
    objects (``demux_config``, ``decode_config``, ``device_config``, ``storage``) are accepted as ``None`` and
    refused otherwise, naming what replaces them."""
    if kwargs.get("filter_desc") is not None:
        raise ValueError(
            f"{func}: filter_desc (an FFmpeg filter graph, spdl.io.get_*_filter_desc) is not supported by spdl_rs; "
            f"use {instead} instead"
        )
    kwargs.pop("filter_desc", None)
    for key, instead_of in _SPDL_CONFIGS.items():
        if kwargs.pop(key, None) is not None:
            raise ValueError(f"{func}: SPDL's {key} is not supported by spdl_rs ({instead_of})")
    return kwargs


if HAS_IO:
    _native_load_image, _native_decode_image = load_image, decode_image
    _native_load_image_batch, _native_load_audio = load_image_batch, load_audio

    def load_image(src, *, pixel_format: str = "rgb", pix_fmt: str | None = None, **kwargs):
        """Decodes one image into an HWC ``uint8`` :py:class:`spdl_rs.Buffer` (GIL released). ``src`` is a path
        or, as in SPDL, the encoded bytes; other keywords as :py:func:`decode_image` (``size``, ``filter``,
        ``exif_orientation``); ``pix_fmt`` is SPDL's spelling of ``pixel_format``."""
        pixel_format = _pixel_format(pixel_format, pix_fmt)
        kwargs = _spdl_keywords(kwargs, "load_image", "size=(width, height), filter= and pix_fmt=")
        if isinstance(src, (bytes, bytearray, memoryview)) or (
            not isinstance(src, str) and not hasattr(src, "__fspath__") and hasattr(src, "__buffer__")
        ):
            return _native_decode_image(src, pixel_format=pixel_format, **kwargs)
        kwargs.pop("name", None)
        return _native_load_image(src, pixel_format=pixel_format, **kwargs)

    def decode_image(data, *, pixel_format: str = "rgb", pix_fmt: str | None = None, **kwargs):
        """Decodes one encoded image (bytes or a buffer) into an HWC ``uint8`` buffer (GIL released): see the
        native ``decode_image`` for the keywords; ``pix_fmt`` is SPDL's spelling of ``pixel_format``."""
        kwargs = _spdl_keywords(kwargs, "decode_image", "size=(width, height), filter= and pix_fmt=")
        return _native_decode_image(data, pixel_format=_pixel_format(pixel_format, pix_fmt), **kwargs)

    def load_image_batch(srcs, width: int, height: int, *, pixel_format: str = "rgb", pix_fmt: str | None = None,
                         **kwargs):
        """Decodes and resizes ``srcs`` into one ``[N, H, W, C]`` buffer in parallel (GIL released): see the native
        ``load_image_batch`` for the keywords; ``pix_fmt`` is SPDL's spelling of ``pixel_format``."""
        kwargs = _spdl_keywords(kwargs, "load_image_batch", "width=, height=, filter= and pix_fmt=")
        return _native_load_image_batch(srcs, width, height, pixel_format=_pixel_format(pixel_format, pix_fmt),
                                        **kwargs)

    def load_audio(src, timestamp=None, **kwargs):
        """Decodes audio into a ``numpy`` array (GIL released): see the native ``load_audio`` for the keywords;
        ``timestamp=(start, end)`` in seconds is SPDL's spelling of ``start``/``duration``."""
        kwargs = _spdl_keywords(kwargs, "load_audio", "sample_rate=, channels=, dtype= and layout=")
        return _native_load_audio(src, **_window(kwargs, timestamp))

if HAS_VIDEO:
    _native_load_video = load_video

    def load_video(src, timestamp=None, **kwargs):
        """Decodes video frames into a ``numpy`` ``uint8`` array ``[N, H, W, C]`` (GIL released): see the native
        ``load_video`` for the keywords; ``timestamp=(start, end)`` in seconds is SPDL's spelling of
        ``start``/``duration``."""
        kwargs = _spdl_keywords(kwargs, "load_video", "width=, height=, fps=, num_frames= and pix_fmt=")
        return _native_load_video(src, **_window(kwargs, timestamp))

    _native_demux_video = demux_video

    def demux_video(src, *, timestamp=None, **kwargs):
        """Demuxes a video's packets (GIL released) for :py:func:`decode_packets`: see the native
        ``demux_video`` for the keywords; ``timestamp=(start, end)`` in seconds is SPDL's spelling of
        ``start``/``duration``; SPDL's ``bsf=None`` and ``demux_config=None`` are accepted."""
        if kwargs.pop("bsf", None) is not None:
            raise ValueError("demux_video: bitstream filters (bsf=) are not supported by spdl_rs")
        kwargs = _spdl_keywords(kwargs, "demux_video", "start=/duration=")
        return _native_demux_video(src, **_window(kwargs, timestamp))


def to_torch(buffer):
    """A ``torch.Tensor`` sharing the buffer's memory (``torch.from_dlpack``; no copy): SPDL's ``to_torch``."""
    import torch

    if hasattr(buffer, "__dlpack__"):
        return torch.from_dlpack(buffer)
    return torch.from_numpy(buffer)


def to_numpy(buffer):
    """A ``numpy`` view of a :py:class:`spdl_rs.Buffer` (no copy), or the array itself: SPDL's ``to_numpy``."""
    import numpy

    return numpy.asarray(buffer)


from . import ops  # noqa: E402

__all__ = [
    "Packets",
    "decode_image",
    "decode_memory_budget",
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
    "set_decode_memory_budget",
    "to_numpy",
    "to_torch",
]
