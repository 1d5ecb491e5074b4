"""SPDL's demuxing and decoding objects (``spdl.io.Demuxer``, ``Decoder``, packets, frames, ``convert_frames``,
``FilterGraph``, ...) over spdl-io's FFmpeg layer, in builds with video support (:py:func:`spdl_rs.io.has_video`).

The work runs in Rust with the GIL released; every object is safe to share between threads. Packets are
consumed by a decode (``.clone()`` them to decode twice), as in SPDL. Frames are FFmpeg frames owned by Rust;
:py:func:`convert_frames` copies them into one :py:class:`spdl_rs.Buffer` in SPDL's shapes and dtypes.

Bounds: demuxing and decoding keep to spdl-io's video limits (packets, packet bytes, frames, pixels per
frame, decoded bytes; pass ``limits={...}`` to :py:class:`Demuxer` to change them), and a conversion larger
than the decode memory budget fails before allocating. Long sources stream in bounded chunks with
:py:meth:`Demuxer.streaming_demux` and a :py:func:`Decoder`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, overload

from .. import _native
from .._native import Buffer
from ._no_media import MESSAGE as _NO_FFMPEG

if not _native.HAS_VIDEO:
    raise ImportError(_NO_FFMPEG)

from .._native.io import (  # noqa: E402
    AudioCodec,
    AudioFrames,
    AudioPackets,
    FilterGraph,
    ImageCodec,
    MediaBSF,
    ImageFrames,
    ImagePackets,
    MediaDecoder,
    MediaDemuxer,
    VideoCodec,
    VideoFrames,
    VideoPackets,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer as _BufferLike

    _Src = Union[str, "os.PathLike[str]", bytes, _BufferLike, Any]

__all__ = [
    "AudioCodec",
    "AudioDecoder",
    "AudioFrames",
    "AudioPackets",
    "BSF",
    "CPUBuffer",
    "DecodeConfig",
    "Decoder",
    "DemuxConfig",
    "Demuxer",
    "FilterGraph",
    "ImageCodec",
    "ImageFrames",
    "ImagePackets",
    "VideoCodec",
    "VideoDecoder",
    "VideoFrames",
    "VideoPackets",
    "apply_bsf",
    "convert_frames",
    "create_reference_audio_frame",
    "create_reference_video_frame",
    "decode_config",
    "decode_packets",
    "demux_audio",
    "demux_config",
    "demux_image",
    "demux_video",
    "sample_decode_video",
]

CPUBuffer = Buffer
"""SPDL's name for the CPU buffer type: here :py:class:`spdl_rs.Buffer` (``__array_interface__``, DLPack)."""

_FILTER_DESC_DEFAULT = "__PLACEHOLDER__"
"""The default ``filter_desc``: SPDL's (``rgb24`` pixels for video and images, ``fltp`` samples for audio)."""

TimeValue = Union[float, Decimal, str, Fraction]


# --------------------------------------------------------------------------------------------- configs


class DemuxConfig:
    """How to open a source (SPDL's ``DemuxConfig``; see :py:func:`demux_config`).

    Args:
        format: The container format, an FFmpeg demuxer name (``ffmpeg -demuxers``; e.g. ``"s16le"`` for raw
            samples, with ``format_options={"sample_rate": ..., "ch_layout": ...}``); ``None``: detected from
            the content.
        format_options: Options of the container's demuxer (FFmpeg ``AVFormatContext`` options).
        buffer_size: Accepted for SPDL compatibility; the read buffer size is spdl-io's.
    """

    def __init__(
        self, format: str | None = None, format_options: Mapping[str, str] | None = None, buffer_size: int = 8096
    ) -> None:
        if buffer_size <= 0:
            raise ValueError(f"DemuxConfig: buffer_size must be positive, got {buffer_size}")
        self.format = format
        self.format_options = {str(k): str(v) for k, v in (format_options or {}).items()}
        self.buffer_size = buffer_size

    def __repr__(self) -> str:
        return f"DemuxConfig(format={self.format!r}, format_options={self.format_options!r})"


class DecodeConfig:
    """Which decoder to use and its options (SPDL's ``DecodeConfig``; see :py:func:`decode_config`).

    Args:
        decoder: A decoder by name (``ffmpeg -decoders``); default: the codec's.
        decoder_options: Decoder options, e.g. ``{"threads": "4"}`` (decoding is single-threaded without it).
    """

    def __init__(self, decoder: str | None = None, decoder_options: Mapping[str, str] | None = None) -> None:
        self.decoder = decoder
        self.decoder_options = {str(k): str(v) for k, v in (decoder_options or {}).items()}

    def __repr__(self) -> str:
        return f"DecodeConfig(decoder={self.decoder!r}, decoder_options={self.decoder_options!r})"


def demux_config(
    format: str | None = None, format_options: Mapping[str, str] | None = None, buffer_size: int = 8096
) -> DemuxConfig:
    """A :py:class:`DemuxConfig` (SPDL's factory)."""
    return DemuxConfig(format=format, format_options=format_options, buffer_size=buffer_size)


def decode_config(decoder: str | None = None, decoder_options: Mapping[str, str] | None = None) -> DecodeConfig:
    """A :py:class:`DecodeConfig` (SPDL's factory)."""
    return DecodeConfig(decoder=decoder, decoder_options=decoder_options)


# -------------------------------------------------------------------------------------------- demuxing


def _resolve_src(src: object) -> Any:
    """A path or encoded bytes, as SPDL takes them (a CPU tensor is read through ``.numpy()``)."""
    if hasattr(src, "numpy") and not isinstance(src, (str, bytes)):
        src = src.numpy()
    if isinstance(src, (str, bytes, bytearray, memoryview)) or hasattr(src, "__fspath__"):
        return src
    try:
        return memoryview(src)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"the source must be a path or a buffer of encoded bytes, got {type(src).__name__}"
        ) from None


def _window(window: tuple[TimeValue, TimeValue] | None) -> tuple[float, float] | None:
    if window is None:
        return None
    start, end = window
    s, e = float(Fraction(start)) if not isinstance(start, float) else start, (
        float(Fraction(end)) if not isinstance(end, float) else end
    )
    if s != s or e != e:
        raise ValueError(f"the window must be (start, end) in seconds, got {window!r}")
    # As in SPDL, an empty window ((t, t), or end before start) is allowed: it holds no packet.
    return (s, e)


def _with_bsf(bsf: str | None, packets: Any) -> Any:
    if bsf is None:
        return packets
    return apply_bsf(packets, bsf)


class Demuxer:
    """Demuxes the audio, video or an image of one source, or streams its packets in bounded chunks (SPDL's
    ``Demuxer``). The source stays open until :py:meth:`close` (or the end of a ``with`` block).

    Args:
        src: A path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, a buffer, a 1-D ``uint8``
            array or CPU tensor).
        demux_config: See :py:func:`demux_config`.
        name: The name of ``src`` in error messages when it is bytes.
        limits: spdl_rs's bounds (``max_packets``, ``max_packet_bytes``, ``max_frames``, ``max_pixels``,
            ``max_output_bytes``, ``max_bad_packets``).
    """

    def __init__(
        self,
        src: _Src,
        *,
        demux_config: DemuxConfig | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        limits = kwargs.pop("limits", None)
        if kwargs:
            raise TypeError(f"Demuxer() got an unexpected keyword argument {next(iter(kwargs))!r}")
        options = demux_config.format_options if demux_config is not None else None
        fmt = demux_config.format if demux_config is not None else None
        self._demuxer = MediaDemuxer(_resolve_src(src), name=name, format=fmt, format_options=options, limits=limits)

    def demux_audio(self, window: tuple[TimeValue, TimeValue] | None = None, *, bsf: str | None = None) -> AudioPackets:
        """The packets of the audio stream in ``window`` (``(start, end)`` seconds; ``None``: all)."""
        return _with_bsf(bsf, self._demuxer.demux("audio", _window(window)))

    def demux_video(self, window: tuple[TimeValue, TimeValue] | None = None, *, bsf: str | None = None) -> VideoPackets:
        """The packets of the video stream that ``window`` needs (from the keyframe before its start)."""
        return _with_bsf(bsf, self._demuxer.demux("video", _window(window)))

    def demux_image(self, *, bsf: str | None = None) -> ImagePackets:
        """The packet of the image (the first frame of the video stream)."""
        return _with_bsf(bsf, self._demuxer.demux("image"))

    @overload
    def streaming_demux(
        self, indices: None = None, *, duration: float = -1, num_packets: int = -1
    ) -> Iterator[AudioPackets | VideoPackets | ImagePackets]: ...

    @overload
    def streaming_demux(
        self, indices: int, *, duration: float = -1, num_packets: int = -1
    ) -> Iterator[AudioPackets | VideoPackets | ImagePackets]: ...

    @overload
    def streaming_demux(
        self, indices: Sequence[int] | set[int], *, duration: float = -1, num_packets: int = -1
    ) -> Iterator[dict[int, AudioPackets | VideoPackets | ImagePackets]]: ...

    def streaming_demux(
        self,
        indices: Sequence[int] | set[int] | int | None = None,
        *,
        duration: float = -1,
        num_packets: int = -1,
    ) -> Iterator[Any]:
        """Streams the packets of the streams ``indices`` from the start in chunks of ``num_packets`` packets or
        ``duration`` seconds (exactly one of them): one packets object per chunk for ``None`` (stream 0) or an
        ``int``, a ``{index: packets}`` dict for a set or sequence. Only one chunk is held at a time."""
        if duration <= 0 and num_packets <= 0:
            raise ValueError("Either `duration` or `num_packets` must be specified.")
        if duration > 0 and num_packets > 0:
            raise ValueError(
                f"Only one of `duration` or `num_packets` can be specified. Found: {duration=}, {num_packets=}."
            )
        idxs = {0} if indices is None else ({indices} if isinstance(indices, int) else set(indices))
        self._demuxer.start_streaming(
            sorted(idxs), num_packets=num_packets if num_packets > 0 else None, duration=duration if duration > 0 else None
        )
        unwrap = indices is None or isinstance(indices, int)
        return self._stream(unwrap)

    def _stream(self, unwrap: bool) -> Iterator[Any]:
        while (chunk := self._demuxer.next_chunk()) is not None:
            if unwrap:
                yield next(iter(chunk.values()))
            else:
                yield chunk

    def has_audio(self) -> bool:
        """Whether the source has an audio stream."""
        return self._demuxer.stream_index("audio") is not None

    def _index(self, kind: str) -> int:
        index = self._demuxer.stream_index(kind)
        if index is None:
            raise RuntimeError(f"{self._demuxer.item}: no {kind} stream")
        return int(index)

    @property
    def video_stream_index(self) -> int:
        """The index of the default video stream."""
        return self._index("video")

    @property
    def audio_stream_index(self) -> int:
        """The index of the default audio stream."""
        return self._index("audio")

    @property
    def audio_codec(self) -> AudioCodec:
        """The codec of the default audio stream."""
        return self._demuxer.codec("audio")

    @property
    def video_codec(self) -> VideoCodec:
        """The codec of the default video stream."""
        return self._demuxer.codec("video")

    @property
    def image_codec(self) -> ImageCodec:
        """The codec of the image (the default video stream)."""
        return self._demuxer.codec("image")

    def close(self) -> None:
        """Closes the source; later calls raise."""
        self._demuxer.close()

    def __enter__(self) -> Demuxer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def demux_audio(
    src: _Src,
    *,
    timestamp: tuple[TimeValue, TimeValue] | None = None,
    demux_config: DemuxConfig | None = None,
    bsf: str | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> AudioPackets:
    """The packets of the audio stream of ``src`` in ``timestamp`` (``(start, end)`` seconds). See
    :py:class:`Demuxer`."""
    with Demuxer(src, demux_config=demux_config, name=name, **kwargs) as demuxer:
        return demuxer.demux_audio(window=timestamp, bsf=bsf)


def demux_video(
    src: _Src,
    *,
    timestamp: tuple[TimeValue, TimeValue] | None = None,
    demux_config: DemuxConfig | None = None,
    bsf: str | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> VideoPackets:
    """The packets of the video stream of ``src`` that ``timestamp`` (``(start, end)`` seconds) needs. See
    :py:class:`Demuxer`."""
    with Demuxer(src, demux_config=demux_config, name=name, **kwargs) as demuxer:
        return demuxer.demux_video(window=timestamp, bsf=bsf)


def demux_image(
    src: _Src,
    *,
    demux_config: DemuxConfig | None = None,
    bsf: str | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> ImagePackets:
    """The packet of the image ``src``. See :py:class:`Demuxer`."""
    with Demuxer(src, demux_config=demux_config, name=name, **kwargs) as demuxer:
        return demuxer.demux_image(bsf=bsf)


# ----------------------------------------------------------------------------------- bitstream filters

TCodec = TypeVar("TCodec")
TPackets = TypeVar("TPackets")


class BSF(Generic[TCodec, TPackets]):
    """A bitstream filter chain for the packets of one stream (SPDL's ``BSF``), e.g. ``"h264_mp4toannexb"``
    (see ``ffmpeg -bsfs``). Filtered packets carry the filter's output codec.

    Args:
        codec: The codec of the incoming packets (``Demuxer.video_codec``, ``packets.codec``, ...).
        bsf: The filter chain (``"name"`` or ``"name1=opt=value,name2"``).
    """

    def __init__(self, codec: TCodec, bsf: str) -> None:
        self._bsf = MediaBSF(codec, bsf)

    def filter(self, packets: TPackets, flush: bool = False) -> TPackets | None:
        """Filters ``packets`` (not consumed); ``flush`` ends the stream. The packets ready, or ``None``."""
        return self._bsf.filter(packets, flush=flush)

    def flush(self) -> TPackets | None:
        """Ends the stream: the packets the filter still held, or ``None``."""
        return self._bsf.flush()


@overload
def apply_bsf(packets: AudioPackets, bsf: str) -> AudioPackets: ...


@overload
def apply_bsf(packets: VideoPackets, bsf: str) -> VideoPackets: ...


@overload
def apply_bsf(packets: ImagePackets, bsf: str) -> ImagePackets: ...


def apply_bsf(packets: AudioPackets | VideoPackets | ImagePackets, bsf: str) -> Any:
    """``packets`` through the bitstream filter chain ``bsf`` in one call (SPDL's ``apply_bsf``)."""
    out: Any = BSF[Any, Any](packets.codec, bsf).filter(packets, flush=True)
    if out is None:
        raise RuntimeError(f"{packets.item}: the bitstream filter {bsf!r} produced no packets")
    return out


# -------------------------------------------------------------------------------------------- decoding


def _fmt_time(t: float) -> str:
    return repr(float(t))


def _abuffer_desc(codec: AudioCodec) -> str:
    layout = codec.channel_layout
    if not layout or " " in layout:
        layout = f"{codec.num_channels}c"
    tb = codec.time_base
    return (
        f"abuffer=time_base={tb[0]}/{tb[1]}:sample_rate={codec.sample_rate}:sample_fmt={codec.sample_fmt}:"
        f"channel_layout={layout}"
    )


def _buffer_desc(codec: VideoCodec | ImageCodec) -> str:
    tb, sar = codec.time_base, codec.sample_aspect_ratio
    if sar[0] <= 0 or sar[1] <= 0:
        sar = (1, 1)
    return (
        f"buffer=video_size={codec.width}x{codec.height}:pix_fmt={codec.pix_fmt}:time_base={tb[0]}/{tb[1]}:"
        f"pixel_aspect={sar[0]}/{sar[1]}"
    )


def _resolve_filter_graph(
    filter_desc: str, codec: AudioCodec | VideoCodec | ImageCodec, timestamp: tuple[float, float] | None = None
) -> str:
    """The complete graph: the input described from ``codec``, ``filter_desc`` (SPDL's default when it is the
    placeholder), the sink."""
    if isinstance(codec, AudioCodec):
        if filter_desc == _FILTER_DESC_DEFAULT:
            parts = []
            if timestamp is not None:
                start, end = timestamp
                trim = [f"start={_fmt_time(start)}"] if start != float("-inf") else []
                if end != float("inf"):
                    trim.append(f"end={_fmt_time(end)}")
                if trim:
                    parts.append("atrim=" + ":".join(trim))
            parts.append("aformat=sample_fmts=fltp")
            filter_desc = ",".join(parts)
        return f"{_abuffer_desc(codec)},{filter_desc},abuffersink"
    if isinstance(codec, (VideoCodec, ImageCodec)):
        if filter_desc == _FILTER_DESC_DEFAULT:
            filter_desc = "format=pix_fmts=rgb24"
        return f"{_buffer_desc(codec)},{filter_desc},buffersink"
    raise TypeError(f"expected AudioCodec, VideoCodec or ImageCodec, got {type(codec).__name__}")


class _DecoderBase:
    def __init__(self, decoder: MediaDecoder) -> None:
        self._decoder = decoder

    def decode(self, packets: Any) -> Any:
        """Decodes ``packets`` (consumed): the frames ready now, or ``None``."""
        return self._decoder.decode(packets)


class AudioDecoder(_DecoderBase):
    """Decodes a stream of audio packets chunk by chunk (made by :py:func:`Decoder`)."""

    def streaming_decode_packets(self, packets: AudioPackets) -> Iterator[AudioFrames]:
        """Decodes ``packets`` (consumed) and yields the frames ready."""
        frames = self._decoder.decode(packets)
        if frames is not None:
            yield frames

    def flush(self) -> Iterator[AudioFrames]:
        """Ends the stream and yields the frames the decoder still held."""
        frames = self._decoder.flush()
        if frames is not None:
            yield frames


class VideoDecoder(_DecoderBase):
    """Decodes a stream of video packets chunk by chunk (made by :py:func:`Decoder`)."""

    def __init__(self, decoder: MediaDecoder) -> None:
        super().__init__(decoder)
        self._buffer_size = 0
        self._held: list[VideoFrames] = []
        self._held_count = 0

    def set_buffer_size(self, buffer_size: int) -> None:
        """Yield frames in chunks of exactly ``buffer_size`` frames from
        :py:meth:`streaming_decode_packets` (the rest at :py:meth:`flush`); ``0``: as they come."""
        if buffer_size < 0:
            raise ValueError(f"buffer_size must be >= 0, got {buffer_size}")
        self._buffer_size = buffer_size

    def _chunks(self, final: bool) -> Iterator[VideoFrames]:
        n = self._buffer_size
        if n == 0:
            for f in self._held:
                yield f
            self._held, self._held_count = [], 0
            return
        while self._held_count >= n or (final and self._held_count > 0):
            take = min(n, self._held_count)
            parts: list[VideoFrames] = []
            need = take
            while need > 0:
                head = self._held[0]
                if len(head) <= need:
                    parts.append(head)
                    self._held.pop(0)
                    need -= len(head)
                else:
                    parts.append(head[:need])
                    self._held[0] = head[need:]
                    need = 0
            self._held_count -= take
            yield parts[0] if len(parts) == 1 else _concat(parts)

    def streaming_decode_packets(self, packets: VideoPackets) -> Iterator[VideoFrames]:
        """Decodes ``packets`` (consumed) and yields the frames ready (in chunks of the buffer size, if set)."""
        frames = self._decoder.decode(packets)
        if frames is not None:
            self._held.append(frames)
            self._held_count += len(frames)
        yield from self._chunks(final=False)

    def flush(self) -> Iterator[VideoFrames]:
        """Ends the stream and yields the frames still held."""
        frames = self._decoder.flush()
        if frames is not None:
            self._held.append(frames)
            self._held_count += len(frames)
        yield from self._chunks(final=True)


def _concat(parts: list[VideoFrames]) -> VideoFrames:
    """Frames of several ``VideoFrames`` (same stream) as one object, sharing the data."""
    first = parts[0]
    out = first[list(range(len(first)))]
    for p in parts[1:]:
        out = _native_concat(out, p)
    return out


def _native_concat(a: VideoFrames, b: VideoFrames) -> VideoFrames:
    return _native.io.concat_video_frames(a, b)


@overload
def Decoder(
    codec: AudioCodec, *, filter_desc: str | None = _FILTER_DESC_DEFAULT, decode_config: DecodeConfig | None = None
) -> AudioDecoder: ...


@overload
def Decoder(
    codec: VideoCodec | ImageCodec,
    *,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
) -> VideoDecoder: ...


def Decoder(
    codec: AudioCodec | VideoCodec | ImageCodec,
    *,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
) -> AudioDecoder | VideoDecoder:
    """A decoder that decodes the packets of one stream chunk by chunk (SPDL's ``Decoder``).

    Args:
        codec: The stream's codec (``Demuxer.audio_codec``, ``.video_codec``, ``.image_codec``).
        filter_desc: The filters applied after decoding (without the ``buffer``/``abuffer`` input and the sink,
            which are added); default: SPDL's (``rgb24`` pixels, ``fltp`` samples); ``None``: no filter.
        decode_config: See :py:func:`decode_config`.
    """
    fd = None if filter_desc is None else _resolve_filter_graph(filter_desc, codec)
    cfg = decode_config or DecodeConfig()
    native = MediaDecoder(codec, filter_desc=fd, decoder=cfg.decoder, decoder_options=cfg.decoder_options)
    if isinstance(codec, AudioCodec):
        return AudioDecoder(native)
    return VideoDecoder(native)


@overload
def decode_packets(
    packets: AudioPackets,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
    *,
    num_frames: int = -1,
) -> AudioFrames: ...


@overload
def decode_packets(
    packets: VideoPackets,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
    *,
    num_frames: int = -1,
) -> VideoFrames: ...


@overload
def decode_packets(
    packets: ImagePackets,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
    *,
    num_frames: int = -1,
) -> ImageFrames: ...


def decode_packets(
    packets: AudioPackets | VideoPackets | ImagePackets,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
    decode_config: DecodeConfig | None = None,
    *,
    num_frames: int = -1,
) -> AudioFrames | VideoFrames | ImageFrames:
    """Decodes ``packets`` (consumed) into frames (SPDL's ``decode_packets``): every frame of the packets'
    window (audio trimmed to it), at most ``num_frames`` video frames when ``num_frames >= 0``.

    Args:
        packets: From :py:func:`demux_audio`, :py:func:`demux_video`, :py:func:`demux_image` or a
            :py:class:`Demuxer`.
        filter_desc: Filters applied after decoding (see :py:func:`Decoder`); default: SPDL's (``rgb24``
            pixels, ``fltp`` samples, audio trimmed to the window); ``None``: the decoder's own format.
        decode_config: See :py:func:`decode_config`.
        num_frames: The most video frames to decode (``-1``: all).
    """
    if not isinstance(packets, (AudioPackets, VideoPackets, ImagePackets)):
        raise TypeError(f"expected AudioPackets, VideoPackets or ImagePackets, got {type(packets).__name__}")
    fd = filter_desc
    if fd is not None:
        timestamp = packets.timestamp if isinstance(packets, AudioPackets) else None
        fd = _resolve_filter_graph(fd, packets.codec, timestamp)
    cfg = decode_config or DecodeConfig()
    return _native.io.media_decode_packets(
        packets, filter_desc=fd, decoder=cfg.decoder, decoder_options=cfg.decoder_options, num_frames=num_frames
    )


def convert_frames(
    frames: AudioFrames
    | VideoFrames
    | ImageFrames
    | Sequence[AudioFrames]
    | Sequence[VideoFrames]
    | Sequence[ImageFrames],
    storage: object = None,
) -> Buffer:
    """Copies frames into one :py:class:`spdl_rs.Buffer` (SPDL's ``convert_frames``), GIL released.

    Shapes: video ``[N, H, W, C]`` (``rgb24``, ``rgba``, ``gray``, ...), ``[N, 3, H, W]`` (``yuv444p``),
    ``[N, 1, H * 3 / 2, W]`` (``yuv420p``, ``nv12``); images the same without ``N``; audio ``[C, N]``
    (planar sample formats) or ``[N, C]`` (packed), in the sample format's dtype. A sequence of frames gives
    a leading batch axis (all items must have the same shape).

    Args:
        frames: Frames, or a sequence of frames of one kind.
        storage: SPDL's pre-allocated storage; only ``None`` is accepted (the buffer is allocated here, within
            the decode memory budget).
    """
    if storage is not None:
        raise ValueError("convert_frames: storage= is not supported by spdl_rs (the buffer is allocated here)")
    if isinstance(frames, (AudioFrames, VideoFrames, ImageFrames)):
        return _native.io.convert_frames(frames)
    items = list(frames)
    if not items:
        raise ValueError("convert_frames: the sequence of frames is empty")
    return _native.io.convert_frames(items)


def sample_decode_video(
    packets: VideoPackets,
    indices: list[int],
    *,
    decode_config: DecodeConfig | None = None,
    filter_desc: str | None = _FILTER_DESC_DEFAULT,
) -> list[ImageFrames]:
    """The frames at ``indices`` (positions among the frames of the packets' window, sorted and distinct),
    decoding only from the keyframe before each (SPDL's ``sample_decode_video``). ``packets`` is not
    consumed."""
    if not indices:
        raise ValueError("Frame indices must be non-empty.")
    num_packets = len(packets)
    if any(not (0 <= i < num_packets) for i in indices):
        raise IndexError(f"Frame index must be [0, {num_packets}).")
    if sorted(indices) != list(indices):
        raise ValueError("Frame indices must be sorted in ascending order.")
    if len(set(indices)) != len(indices):
        raise ValueError("Frame indices must be unique.")
    ret: list[ImageFrames] = []
    for split, idxes in _native.io.split_packets_at_indices(packets, list(indices)):
        frames = decode_packets(split, filter_desc, decode_config, num_frames=max(idxes) + 1)
        ret.extend(frames[i] for i in idxes)
    return ret


# ------------------------------------------------------------------------------------ frames from arrays


def _array_bytes(array: Any) -> tuple[bytes, list[int], int]:
    if hasattr(array, "numpy") and not hasattr(array, "__array_interface__"):
        array = array.numpy()
    import numpy

    arr = numpy.ascontiguousarray(array)
    return arr.tobytes(), list(arr.shape), int(arr.dtype.itemsize)


def create_reference_audio_frame(array: Any, sample_fmt: str, sample_rate: int, pts: int) -> AudioFrames:
    """Audio frames made from a 2-D array (SPDL's ``create_reference_audio_frame``): ``[C, N]`` for planar
    ``sample_fmt`` (``"fltp"``, ``"s16p"``, ...) or ``[N, C]`` for packed ones (``"flt"``, ``"s16"``, ...),
    whose dtype matches it; ``pts`` is the first sample's time in samples. The data are copied; the frames
    keep ``array`` alive, as SPDL's do."""
    data, shape, itemsize = _array_bytes(array)
    return _native.io.reference_audio_frame(
        data, shape, itemsize, sample_fmt=sample_fmt, sample_rate=sample_rate, pts=pts, source=array
    )


def create_reference_video_frame(array: Any, pix_fmt: str, frame_rate: tuple[int, int], pts: int) -> VideoFrames:
    """Video frames made from an array (SPDL's ``create_reference_video_frame``): ``[N, H, W, 3]``
    (``"rgb24"``, ``"bgr24"``), ``[N, H, W, 4]`` (``"rgba"``, ...), ``[N, H, W]`` (``"gray8"``; ``"gray16"``
    with 16-bit elements) or ``[N, 3, H, W]`` (``"yuv444p"``); ``pts`` is the first frame's time in frames at
    ``frame_rate``. The data are copied; the frames keep ``array`` alive, as SPDL's do."""
    data, shape, itemsize = _array_bytes(array)
    return _native.io.reference_video_frame(
        data, shape, itemsize, pix_fmt=pix_fmt, frame_rate=(int(frame_rate[0]), int(frame_rate[1])), pts=pts,
        source=array,
    )
