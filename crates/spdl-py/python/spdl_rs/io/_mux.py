"""SPDL's encoding and muxing objects (``spdl.io.Muxer``, ``AudioEncoder``, ``VideoEncoder``,
``audio_encode_config``, ``video_encode_config``) over spdl-io's FFmpeg layer, in builds with video support
(:py:func:`spdl_rs.io.has_video`).

A :py:class:`Muxer` writes one container. Each of its streams is either encoded here from frames (an encoder
from :py:meth:`Muxer.add_encode_stream`, fed with frames made by
:py:func:`~spdl_rs.io.create_reference_video_frame` / :py:func:`~spdl_rs.io.create_reference_audio_frame` or
decoded ones) or copied from demuxed packets (:py:meth:`Muxer.add_remux_stream`). The FFmpeg work runs in Rust
with the GIL released.

Example::

    import numpy as np
    import spdl_rs.io

    rgb = np.zeros((25, 48, 64, 3), dtype=np.uint8)
    muxer = spdl_rs.io.Muxer("out.mp4")
    encoder = muxer.add_encode_stream(spdl_rs.io.video_encode_config(height=48, width=64, frame_rate=(25, 1)))
    with muxer.open():
        frames = spdl_rs.io.create_reference_video_frame(rgb, pix_fmt="rgb24", frame_rate=(25, 1), pts=0)
        for packets in (encoder.encode(frames), encoder.flush()):
            if packets is not None:
                muxer.write(0, packets)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import overload

from .. import _native

if not _native.HAS_VIDEO:
    raise ImportError("spdl_rs was built without the `ffmpeg` feature: encoding and muxing need FFmpeg")

from .._native.io import (  # noqa: E402
    AudioCodec,
    AudioEncodeConfig,
    AudioEncoder,
    AudioPackets,
    ImagePackets,
    MediaMuxer,
    VideoCodec,
    VideoEncodeConfig,
    VideoEncoder,
    VideoPackets,
)

__all__ = [
    "AudioEncodeConfig",
    "AudioEncoder",
    "Muxer",
    "VideoEncodeConfig",
    "VideoEncoder",
    "audio_encode_config",
    "video_encode_config",
]


def _options(what: str, options: Mapping[str, str] | None) -> dict[str, str] | None:
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise TypeError(f"{what} must be a mapping of option names to values, got {type(options).__name__}")
    return {str(k): str(v) for k, v in options.items()}


def audio_encode_config(
    *,
    num_channels: int,
    sample_rate: int,
    sample_fmt: str = "fltp",
    bit_rate: int = -1,
    compression_level: int = -1,
    qscale: int = -1,
) -> AudioEncodeConfig:
    """How to encode audio (SPDL's factory of :py:class:`AudioEncodeConfig`).

    Args:
        num_channels: Channels of the frames to encode.
        sample_rate: Their sample rate (Hz).
        sample_fmt: Their sample format, which the encoder must take: ``"u8"``, ``"s16"``, ``"s32"``,
            ``"flt"``, ``"dbl"`` for samples interleaved by channel (arrays ``[N, C]``), the same with a ``p``
            suffix for one plane per channel (``"fltp"``, arrays ``[C, N]``). ``pcm_s16le`` (WAV) takes
            ``"s16"``, FLAC ``"s16"``/``"s32"``, AAC and Vorbis ``"fltp"``.
        bit_rate: Bits per second (``-1``: the encoder's default).
        compression_level: The encoder's compression level (``-1``: its default).
        qscale: A fixed quantizer on the encoder's scale (``-1``: none).
    """
    return AudioEncodeConfig(
        num_channels=num_channels,
        sample_rate=sample_rate,
        sample_fmt=sample_fmt,
        bit_rate=bit_rate,
        compression_level=compression_level,
        qscale=qscale,
    )


def video_encode_config(
    *,
    height: int,
    width: int,
    frame_rate: tuple[int, int] | None = None,
    pix_fmt: str = "rgb24",
    bit_rate: int = -1,
    compression_level: int = -1,
    qscale: int = -1,
    gop_size: int = -1,
    max_b_frames: int = -1,
    colorspace: str | None = None,
    color_primaries: str | None = None,
    color_trc: str | None = None,
) -> VideoEncodeConfig:
    """How to encode video (SPDL's factory of :py:class:`VideoEncodeConfig`).

    Args:
        height: Height of the frames to encode.
        width: Their width.
        frame_rate: Frames per second, ``(numerator, denominator)``; ``None``: the encoder's default rate,
            which most encoders (``libx264``, ``mpeg4``) do not have.
        pix_fmt: The pixel format of the frames given to the encoder (the default ``"rgb24"`` is an
            ``[N, H, W, 3]`` ``uint8`` array). When the encoder does not take it (``libx264`` and ``mpeg4`` do
            not take ``rgb24``), each frame is converted with swscale to the encoder's first format
            (``yuv420p`` for both); SPDL 0.8.0 refuses such a configuration instead.
        bit_rate: Bits per second (``-1``: the encoder's default).
        compression_level: The encoder's compression level (``-1``: its default).
        qscale: A fixed quantizer on the encoder's scale (``-1``: none).
        gop_size: Frames from one keyframe to the next (``-1``: the encoder's default).
        max_b_frames: The most consecutive B-frames (``-1``: the encoder's default).
        colorspace: The color matrix written in the stream, e.g. ``"bt709"``; an RGB input is converted with
            it (swscale's default otherwise: BT.601).
        color_primaries: The color primaries written in the stream, e.g. ``"bt709"``.
        color_trc: The transfer characteristics written in the stream, e.g. ``"bt709"``.
    """
    if frame_rate is not None:
        num, den = frame_rate
        frame_rate = (int(num), int(den))
    return VideoEncodeConfig(
        height=height,
        width=width,
        frame_rate=frame_rate,
        pix_fmt=pix_fmt,
        bit_rate=bit_rate,
        compression_level=compression_level,
        qscale=qscale,
        gop_size=gop_size,
        max_b_frames=max_b_frames,
        colorspace=colorspace,
        color_primaries=color_primaries,
        color_trc=color_trc,
    )


class Muxer:
    """Writes streams of packets into one container (SPDL's ``Muxer``): a video file, an audio file, or any
    output FFmpeg writes to.

    Add the streams first (:py:meth:`add_encode_stream`, :py:meth:`add_remux_stream`; stream ``i`` is the
    ``i``-th added), then :py:meth:`open` the output, :py:meth:`write` packets to each stream, and end with
    :py:meth:`flush` and :py:meth:`close` (a ``with muxer.open():`` block does both).

    Args:
        dst: Where to write: a path, or a URL of an FFmpeg protocol (``pipe:1``, ``rtmp://...``).
        format: The container, an FFmpeg muxer name (``ffmpeg -muxers``; the ``-f`` of the ``ffmpeg`` CLI),
            for a destination whose extension does not tell it, or an output device. ``None``: from the
            extension of ``dst``.
    """

    def __init__(self, dst: str | os.PathLike[str], /, *, format: str | None = None) -> None:
        self._muxer = MediaMuxer(os.fspath(dst), format=format)
        self._open = False

    @overload
    def add_encode_stream(
        self,
        config: AudioEncodeConfig,
        *,
        encoder: str | None = None,
        encoder_config: dict[str, str] | None = None,
    ) -> AudioEncoder: ...

    @overload
    def add_encode_stream(
        self,
        config: VideoEncodeConfig,
        *,
        encoder: str | None = None,
        encoder_config: dict[str, str] | None = None,
    ) -> VideoEncoder: ...

    def add_encode_stream(
        self,
        config: AudioEncodeConfig | VideoEncodeConfig,
        *,
        encoder: str | None = None,
        encoder_config: dict[str, str] | None = None,
    ) -> AudioEncoder | VideoEncoder:
        """Adds a stream that is encoded from frames, and returns its encoder.

        Args:
            config: What the frames are (:py:func:`audio_encode_config`, :py:func:`video_encode_config`).
            encoder: An encoder by name (``ffmpeg -encoders``: ``"libx264"``, ``"mpeg4"``, ``"aac"``,
                ``"flac"``, ...); ``None``: the container's default encoder for the medium.
            encoder_config: The encoder's options (``ffmpeg -h encoder=NAME``; e.g. ``{"crf": "18"}``).
                Encoding is single-threaded unless ``"threads"`` is given; an option the encoder does not take
                is an error.

        Returns:
            The encoder: ``encoder.encode(frames)`` gives packets (or ``None`` while it holds them back) to
            :py:meth:`write`, ``encoder.flush()`` the rest at the end.
        """
        if not isinstance(config, (AudioEncodeConfig, VideoEncodeConfig)):
            raise TypeError(
                "add_encode_stream takes the result of audio_encode_config(...) or video_encode_config(...), got "
                f"{type(config).__name__}"
            )
        options = _options("encoder_config", encoder_config)
        return self._muxer.add_encode_stream(config, encoder=encoder, encoder_config=options)

    @overload
    def add_remux_stream(self, codec: AudioCodec) -> None: ...

    @overload
    def add_remux_stream(self, codec: VideoCodec) -> None: ...

    def add_remux_stream(self, codec: AudioCodec | VideoCodec) -> None:
        """Adds a stream whose packets are written as they are, without decoding them: demuxed packets of another
        source (``Demuxer.audio_codec``, ``.video_codec``, or ``packets.codec``).

        Example::

            demuxer = spdl_rs.io.Demuxer("source.mp4")
            muxer = spdl_rs.io.Muxer("audio_only.m4a")
            muxer.add_remux_stream(demuxer.audio_codec)
            with muxer.open():
                for packets in demuxer.streaming_demux(demuxer.audio_stream_index, num_packets=64):
                    muxer.write(0, packets)
        """
        self._muxer.add_remux_stream(codec)

    def open(self, muxer_config: dict[str, str] | None = None) -> Muxer:
        """Opens the output and writes the container's header; returns the muxer (for ``with muxer.open():``).

        Args:
            muxer_config: Options of the output protocol and of the muxer (``ffmpeg -h muxer=NAME``; e.g.
                ``{"movflags": "+faststart"}`` for MP4, ``{"listen": "1"}`` for an RTMP server). An option
                neither takes is an error.
        """
        self._muxer.open(_options("muxer_config", muxer_config))
        self._open = True
        return self

    def write(self, stream_index: int, packets: AudioPackets | VideoPackets | ImagePackets) -> None:
        """Writes packets to one stream (the packets stay usable).

        Args:
            stream_index: The stream, in the order the streams were added (from 0).
            packets: Packets of that stream's codec: from its encoder, or demuxed (remux streams). Their
                timestamps are rescaled from their codec's time base to the stream's.
        """
        self._muxer.write(stream_index, packets)

    def flush(self) -> None:
        """Writes the packets FFmpeg still holds to interleave the streams (after the last :py:meth:`write`)."""
        self._muxer.flush()

    def close(self) -> None:
        """Writes the container's trailer and closes the output. Closing again does nothing."""
        self._muxer.close()
        self._open = False

    def __enter__(self) -> Muxer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        """Flushes and closes; when the block raised, closes without masking its exception."""
        if exc_type is None:
            self.flush()
            self.close()
            return
        try:
            self.close()
        except Exception:  # the block's exception is the one to see
            pass

    def __repr__(self) -> str:
        return f"Muxer({self._muxer.dst!r}, num_streams={self._muxer.num_streams})"
