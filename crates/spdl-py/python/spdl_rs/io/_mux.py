"""SPDL's encoding and muxing objects (``spdl.io.Muxer``, ``AudioEncoder``, ``VideoEncoder``,
``audio_encode_config``, ``video_encode_config``): the native ones, over spdl-io's FFmpeg layer, in builds with
video support (:py:func:`spdl_rs.io.has_video`).

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

from .. import _native

if not _native.HAS_VIDEO:
    raise ImportError("spdl_rs was built without the `ffmpeg` feature: encoding and muxing need FFmpeg")

from .._native.io import (  # noqa: E402
    AudioEncodeConfig,
    AudioEncoder,
    Muxer,
    VideoEncodeConfig,
    VideoEncoder,
    audio_encode_config,
    video_encode_config,
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
