"""Native ops: decoders as pipeline stages that run entirely in Rust, without the GIL.

.. code-block:: python

    from spdl_rs.io import ops
    from spdl_rs.pipeline import PipelineBuilder

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .aggregate(32)
        .pipe(ops.load_image_batch(224, 224), concurrency=4)
        .add_sink(4)
        .build(num_threads=4)
    )

A pipeline whose source is a list, tuple or range and whose stages are all native ops holds the GIL for no
item-level work: other Python threads run at full speed while it decodes (``demux_video`` takes it once per
item, only to wrap its result in a :py:class:`spdl_rs.io.Packets`).

Native ops output :py:class:`spdl_rs.Buffer` objects (``numpy.asarray(buf)`` views one in place).
"""

from __future__ import annotations

from .. import _native
from .._native.io import (
    decode_image_op as decode_image,
    load_audio_batch_op as load_audio_batch,
    load_audio_op as load_audio,
    load_image_batch_op as load_image_batch,
)
from ._no_media import without_video

__all__ = [
    "decode_audio",
    "decode_image",
    "decode_packets",
    "demux_video",
    "load_audio",
    "load_audio_batch",
    "load_clips",
    "load_clips_batch",
    "load_image",
    "load_image_batch",
    "load_video",
]

# Each op is the native constructor itself: its keywords are declared once, in Rust (``keyword_options!``),
# checked there, and typed in the stubs (``_native/io.pyi``) from that declaration.

load_image = decode_image
decode_audio = load_audio


if _native.HAS_VIDEO:
    from .._native.io import (
        decode_packets_op as decode_packets,
        demux_video_op as demux_video,
        load_clips_batch_op as load_clips_batch,
        load_clips_op as load_clips,
        load_video_op as load_video,
    )
else:
    load_video = without_video("spdl_rs.io.ops.load_video")
    demux_video = without_video("spdl_rs.io.ops.demux_video")
    decode_packets = without_video("spdl_rs.io.ops.decode_packets")
    load_clips = without_video("spdl_rs.io.ops.load_clips")
    load_clips_batch = without_video("spdl_rs.io.ops.load_clips_batch")
