"""SPDL's demuxing and decoding objects (``spdl.io.Demuxer``, ``Decoder``, packets, frames, ``convert_frames``,
``FilterGraph``, ...) in builds with video support (:py:func:`spdl_rs.io.has_video`): the native classes and
functions of :py:mod:`spdl_rs._native.io` (``src/io/media.rs``, ``media_api.rs``, ``media_decode.rs``), with
SPDL's names, signatures and errors. The work runs in Rust with the GIL released; every object is safe to
share between threads."""

from __future__ import annotations

from .. import _native
from ._no_media import MESSAGE as _NO_FFMPEG

if not _native.HAS_VIDEO:
    raise ImportError(_NO_FFMPEG)

from .._native import Buffer as CPUBuffer  # noqa: E402
from .._native.io import (  # noqa: E402
    BSF,
    AudioCodec,
    AudioDecoder,
    AudioFrames,
    AudioPackets,
    DecodeConfig,
    Decoder,
    DemuxConfig,
    Demuxer,
    FilterGraph,
    ImageCodec,
    ImageFrames,
    ImagePackets,
    VideoCodec,
    VideoDecoder,
    VideoFrames,
    VideoPackets,
    apply_bsf,
    convert_frames,
    create_reference_audio_frame,
    create_reference_video_frame,
    decode_config,
    decode_packets,
    demux_audio,
    demux_config,
    demux_image,
    demux_video,
    sample_decode_video,
)

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
