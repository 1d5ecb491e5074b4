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

from collections.abc import Sequence
from typing import Any

from .. import _native
from .._native.pipeline import NativeOp

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


def decode_image(
    *,
    size: tuple[int, int] | None = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    exif_orientation: bool = False,
) -> NativeOp:
    """A stage that decodes each item (a path or encoded bytes) into an HWC ``uint8`` buffer.

    Args:
        size: ``(width, height)`` to resize to, or ``None`` for the original size.
        pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
        filter: The resize filter.
        exif_orientation: Apply the EXIF orientation.
    """
    return _native.io.decode_image_op(size=size, pixel_format=pixel_format, filter=filter, exif_orientation=exif_orientation)


load_image = decode_image
"""Same as :py:func:`decode_image` (each item may be a path or encoded bytes)."""


def load_image_batch(
    width: int,
    height: int,
    *,
    layout: str = "NHWC",
    normalize: Any = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    strict: bool = True,
    num_threads: int = 1,
    transform: str = "resize",
    seed: int = 0,
) -> NativeOp:
    """A stage that decodes each item (a list of paths or encoded bytes, e.g. after ``aggregate(32)``) into one
    ``[N, H, W, C]`` (or ``[N, C, H, W]``) buffer. Arguments as :py:func:`spdl_rs.io.load_image_batch`;
    ``num_threads`` is per call (the stage's ``concurrency`` gives the parallelism). With
    ``transform="random-resized-crop"``, an item's crop is seeded by ``seed`` and its place in the batch."""
    return _native.io.load_image_batch_op(
        width,
        height,
        layout=layout,
        normalize=normalize,
        pixel_format=pixel_format,
        filter=filter,
        strict=strict,
        num_threads=num_threads,
        transform=transform,
        seed=seed,
    )


def load_audio(
    *,
    start: float | None = None,
    duration: float | None = None,
    sample_rate: int | None = None,
    channels: str | Sequence[int] | None = None,
    dtype: str = "float32",
    layout: str = "channels_first",
    num_samples: int | None = None,
    backend: str = "auto",
    limits: dict[str, int] | None = None,
) -> NativeOp:
    """A stage that decodes each item (a path or encoded bytes) into a ``[C, T]`` (or ``[T, C]``) buffer.
    Arguments as :py:func:`spdl_rs.io.load_audio`."""
    return _native.io.load_audio_op(
        start=start,
        duration=duration,
        sample_rate=sample_rate,
        channels=channels,
        dtype=dtype,
        layout=layout,
        num_samples=num_samples,
        backend=backend,
        limits=limits,
    )


decode_audio = load_audio
"""Same as :py:func:`load_audio` (each item may be a path or encoded bytes)."""


def load_audio_batch(
    *,
    num_samples: int,
    start: float | None = None,
    duration: float | None = None,
    sample_rate: int | None = None,
    channels: str | Sequence[int] | None = None,
    dtype: str = "float32",
    layout: str = "channels_first",
    backend: str = "auto",
    limits: dict[str, int] | None = None,
    strict: bool = True,
    num_threads: int = 1,
) -> NativeOp:
    """A stage that decodes each item (a list of paths or encoded bytes, e.g. after ``aggregate(16)``) into one
    ``[N, C, T]`` (or ``[N, T, C]``) buffer, every clip padded or truncated to ``num_samples``. Arguments as
    :py:func:`spdl_rs.io.load_audio_batch`; in non-strict mode failed clips are zero and logged on the
    ``spdl_rs.io`` logger."""
    return _native.io.load_audio_batch_op(
        num_samples=num_samples,
        start=start,
        duration=duration,
        sample_rate=sample_rate,
        channels=channels,
        dtype=dtype,
        layout=layout,
        backend=backend,
        limits=limits,
        strict=strict,
        num_threads=num_threads,
    )


def _video_op(name: str):
    op = getattr(_native.io, name, None)
    if op is None:
        raise RuntimeError("spdl_rs was built without the `ffmpeg` feature (see spdl_rs.io.has_video())")
    return op


def load_video(
    *,
    start: float | None = None,
    duration: float | None = None,
    fps: float | None = None,
    every_k: int | None = None,
    num_frames: int | None = None,
    width: int | None = None,
    height: int | None = None,
    pix_fmt: str = "rgb24",
    filter: str = "bicubic",
    threads: int = 1,
    limits: dict[str, int] | None = None,
) -> NativeOp:
    """A stage that demuxes and decodes each item (a path or encoded bytes) into a ``[N, H, W, C]`` ``uint8``
    buffer. Arguments as :py:func:`spdl_rs.io.load_video` (needs a build with video support)."""
    return _video_op("load_video_op")(
        start=start,
        duration=duration,
        fps=fps,
        every_k=every_k,
        num_frames=num_frames,
        width=width,
        height=height,
        pix_fmt=pix_fmt,
        filter=filter,
        threads=threads,
        limits=limits,
    )


def demux_video(
    *, start: float | None = None, duration: float | None = None, limits: dict[str, int] | None = None
) -> NativeOp:
    """A stage that demuxes each item (a path or encoded bytes) into a :py:class:`spdl_rs.io.Packets`, for a
    later :py:func:`decode_packets` stage. Arguments as :py:func:`spdl_rs.io.demux_video`."""
    return _video_op("demux_video_op")(start=start, duration=duration, limits=limits)


def decode_packets(
    *,
    fps: float | None = None,
    every_k: int | None = None,
    num_frames: int | None = None,
    width: int | None = None,
    height: int | None = None,
    pix_fmt: str = "rgb24",
    filter: str = "bicubic",
    threads: int = 1,
) -> NativeOp:
    """A stage that decodes each item (a :py:class:`spdl_rs.io.Packets`) into a ``[N, H, W, C]`` ``uint8``
    buffer. Arguments as :py:func:`spdl_rs.io.decode_packets`."""
    return _video_op("decode_packets_op")(
        fps=fps,
        every_k=every_k,
        num_frames=num_frames,
        width=width,
        height=height,
        pix_fmt=pix_fmt,
        filter=filter,
        threads=threads,
    )


def load_clips(*, num_frames: int, starts: Sequence[float] | None = None, **options: Any) -> NativeOp:
    """A stage that decodes clips from each item, a video (a path or encoded bytes) or a ``(src, starts)``
    pair, into a ``[clips, num_frames, H, W, C]`` ``uint8`` buffer: at ``starts`` (the same for every video),
    where ``sampler=`` (``"random_indices"``, ... with ``num_clips=`` and ``seed=``) puts them, or at the
    pair's own starts. Other options as :py:func:`spdl_rs.io.load_clips` (needs a build with video support)."""
    return _video_op("load_clips_op")(num_frames=num_frames, starts=starts, **options)


def load_clips_batch(*, num_frames: int, starts: Sequence[Any] | None = None, **options: Any) -> NativeOp:
    """A stage that decodes each item, a list of videos (after ``aggregate``), into one
    ``[B, clips, num_frames, H, W, C]`` ``uint8`` buffer. Arguments as :py:func:`spdl_rs.io.load_clips_batch`;
    ``num_threads`` defaults to 1 here (the stage's ``concurrency`` gives the parallelism)."""
    return _video_op("load_clips_batch_op")(num_frames=num_frames, starts=starts, **options)
