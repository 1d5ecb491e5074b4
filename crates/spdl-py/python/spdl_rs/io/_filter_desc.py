"""SPDL's FFmpeg filter-graph descriptions: strings for ``FilterGraph``, for SPDL's ``filter_desc=`` keyword
and for the ``ffmpeg -af``/``-vf`` options. The same arguments give the same strings as SPDL 0.8.0.

spdl_rs's own decoders take typed keywords instead of filter strings (``sample_rate=``, ``width=``,
``pix_fmt=``, ...); these functions are for code that builds FFmpeg filter graphs.
"""

from __future__ import annotations

import math
from typing import Any

from .._native import HAS_VIDEO

if HAS_VIDEO:
    from . import _media
else:
    from . import _no_media as _media  # type: ignore[no-redef]

__all__ = [
    "get_abuffer_desc",
    "get_audio_filter_desc",
    "get_buffer_desc",
    "get_filter_desc",
    "get_video_filter_desc",
]


def _trim(name: str, timestamp: tuple[float, float]) -> str | None:
    start, end = timestamp
    bounds = []
    if not math.isinf(start):
        bounds.append(f"start={start}")
    if not math.isinf(end):
        bounds.append(f"end={end}")
    return f"{name}={':'.join(bounds)}" if bounds else None


def get_audio_filter_desc(
    *,
    sample_rate: int | None = None,
    num_channels: int | None = None,
    sample_fmt: str | None = "fltp",
    timestamp: tuple[float, float] | None = None,
    num_frames: int | None = None,
    filter_desc: str | None = None,
) -> str | None:
    """An FFmpeg audio filter chain that converts decoded audio, or ``None`` when nothing is to be done.

    The filters, in order: ``aformat=channel_layouts=<n>c`` (``num_channels``), ``aresample=<rate>``
    (``sample_rate``), ``atrim=start=..:end=..`` (``timestamp``; an infinite bound is left out),
    ``apad,atrim=end_sample=<n>`` (``num_frames``: pad with silence or cut), the caller's ``filter_desc``, and
    ``aformat=sample_fmts=<fmt>`` (``sample_fmt``).

    Args:
        sample_rate: Resample to this rate.
        num_channels: Mix to this many channels.
        sample_fmt: The output sample format (``"u8"``, ``"s16"``, ``"s32"``, ``"flt"``, ``"s64"``, ``"dbl"``,
            or planar with a ``"p"`` suffix); default ``"fltp"`` (planar ``float32``); ``None`` keeps the source's.
        timestamp: ``(start, end)`` in seconds to trim to.
        num_frames: Exactly this many samples out.
        filter_desc: A custom filter chain, inserted before the sample format conversion.

    Example:
        >>> get_audio_filter_desc(sample_rate=16000, num_channels=1)
        'aformat=channel_layouts=1c,aresample=16000,aformat=sample_fmts=fltp'
    """
    parts: list[str] = []
    if num_channels is not None:
        parts.append(f"aformat=channel_layouts={num_channels}c")
    if sample_rate is not None:
        parts.append(f"aresample={sample_rate}")
    if timestamp is not None and (trim := _trim("atrim", timestamp)) is not None:
        parts.append(trim)
    if num_frames is not None:
        parts += ["apad", f"atrim=end_sample={num_frames}"]
    if filter_desc is not None:
        parts.append(filter_desc)
    if sample_fmt is not None:
        parts.append(f"aformat=sample_fmts={sample_fmt}")
    return ",".join(parts) if parts else None


def get_video_filter_desc(
    *,
    frame_rate: tuple[int, int] | None = None,
    timestamp: tuple[float, float] | None = None,
    scale_width: int | None = None,
    scale_height: int | None = None,
    scale_algo: str = "bicubic",
    scale_mode: str | None = "pad",
    crop_width: int | None = None,
    crop_height: int | None = None,
    pix_fmt: str | None = "rgb24",
    num_frames: int | None = None,
    pad_mode: str | None = None,
    filter_desc: str | None = None,
) -> str | None:
    """An FFmpeg video/image filter chain, or ``None`` when nothing is to be done.

    The filters, in order: ``fps=<num>/<den>`` (``frame_rate``), ``trim=start=..:end=..`` (``timestamp``),
    ``scale`` (with ``pad`` or ``crop`` per ``scale_mode``), a center ``crop`` (``crop_width``/``crop_height``),
    ``tpad`` + ``trim=end_frame=<n>`` (``num_frames``), the caller's ``filter_desc``, and
    ``format=pix_fmts=<fmt>`` (``pix_fmt``).

    Args:
        frame_rate: ``(numerator, denominator)`` of the output frame rate.
        timestamp: ``(start, end)`` in seconds to trim to (an infinite bound is left out).
        scale_width, scale_height: Output size; ``0`` or ``None`` keeps that side, ``-n`` keeps the aspect ratio
            with a multiple of ``n``.
        scale_algo: The scaler (``"bicubic"``, ``"bilinear"``, ``"neighbor"``, ... see FFmpeg's scaler flags).
        scale_mode: ``"pad"`` (fit inside, pad with ``pad_mode``'s color, default black), ``"crop"`` (cover,
            crop the excess) or ``None`` (stretch).
        crop_width, crop_height: Crop at the center after scaling.
        pix_fmt: Output pixel format (default ``"rgb24"``; ``None`` keeps the source's).
        num_frames: Exactly this many frames out: cut, or pad by repeating the last frame (or with
            ``pad_mode``'s color). Needs FFmpeg's ``tpad`` filter (FFmpeg 4.2 or later).
        pad_mode: The color of padding (frames with ``num_frames``, borders with ``scale_mode="pad"``).
        filter_desc: A custom filter chain, inserted before the pixel format conversion.

    Raises:
        ValueError: ``scale_mode`` is not ``"pad"``, ``"crop"`` or ``None``.

    Example:
        >>> get_video_filter_desc(scale_width=64, scale_height=48, scale_mode=None)
        'scale=w=64:h=48:flags=bicubic,format=pix_fmts=rgb24'
    """
    parts: list[str] = []
    if frame_rate is not None:
        parts.append(f"fps={frame_rate[0]}/{frame_rate[1]}")
    if timestamp is not None and (trim := _trim("trim", timestamp)) is not None:
        parts.append(trim)
    if scale_width is not None or scale_height is not None:
        w, h = scale_width or 0, scale_height or 0
        scale = f"scale=w={w}:h={h}:flags={scale_algo}"
        if scale_mode is None:
            parts.append(scale)
        elif scale_mode == "pad":
            parts.append(f"{scale}:force_original_aspect_ratio=decrease")
            parts.append(f"pad=w={w}:h={h}:x=-1:y=-1:color={pad_mode or 'black'}")
        elif scale_mode == "crop":
            parts.append(f"{scale}:force_original_aspect_ratio=increase")
            parts.append(f"crop=w={w}:h={h}")
        else:
            raise ValueError(
                f"Unexpected `scale_mode` value ({scale_mode}). Expected values are \"pad\", \"crop\", or None."
            )
    if crop_width is not None or crop_height is not None:
        parts.append(f"crop=w={crop_width or 0}:h={crop_height or 0}")
    if num_frames is not None:
        if pad_mode is None:
            parts.append("tpad=stop=-1:stop_mode=clone")
        else:
            parts.append(f"tpad=stop=-1:stop_mode=add:color={pad_mode}")
        parts.append(f"trim=end_frame={num_frames}")
    if filter_desc is not None:
        parts.append(filter_desc)
    if pix_fmt is not None:
        parts.append(f"format=pix_fmts={pix_fmt}")
    return ",".join(parts) if parts else None


def _packet_kind(packets: object) -> str | None:
    """``"audio"``, ``"video"`` or ``"image"`` for spdl_rs's packet types (``spdl_rs.io.AudioPackets``, ...,
    and the native video :py:class:`spdl_rs.io.Packets`, the same type as ``VideoPackets``), ``None`` for
    anything else. In a build without FFmpeg, the ``ImportError`` of the demuxing objects."""
    for kind in ("audio", "video", "image"):
        cls = getattr(_media, f"{kind.capitalize()}Packets", None)
        if isinstance(cls, type) and isinstance(packets, cls):
            return kind
    return None


def get_filter_desc(packets: Any, **filter_args: Any) -> str | None:
    """The filter chain for decoding ``packets``: :py:func:`get_audio_filter_desc` with the packets'
    ``timestamp`` for audio packets (trimmed by ``atrim``), :py:func:`get_video_filter_desc` without a timestamp
    for video and image packets (their window is applied while decoding).

    Args:
        packets: ``AudioPackets``, ``VideoPackets``/``Packets`` or ``ImagePackets``.
        filter_args: Passed to the audio or video function.

    Raises:
        TypeError: ``packets`` is not a packets object.
    """
    kind = _packet_kind(packets)
    if kind == "audio":
        return get_audio_filter_desc(timestamp=getattr(packets, "timestamp", None), **filter_args)
    if kind in ("video", "image"):
        return get_video_filter_desc(timestamp=None, **filter_args)
    raise TypeError(f"Unexpected type: {type(packets)}")


def get_abuffer_desc(codec: Any, *, label: str | None = None, sample_fmt: str | None = None) -> str:
    """The ``abuffer`` source filter that feeds frames of an audio ``codec`` into a filter graph:
    ``abuffer[@label]=time_base=N/D:sample_rate=R:sample_fmt=F:channel_layout=L``.

    Args:
        codec: An audio codec description: ``time_base`` (``(num, den)``), ``sample_rate``, ``sample_fmt`` and
            ``channel_layout`` are read from it.
        label: Names the node ``abuffer@<label>`` (to refer to it in a graph with several inputs).
        sample_fmt: Overrides the codec's sample format.

    Example:
        >>> from types import SimpleNamespace as C
        >>> get_abuffer_desc(C(time_base=(1, 16000), sample_rate=16000, sample_fmt="s16", channel_layout="mono"))
        'abuffer=time_base=1/16000:sample_rate=16000:sample_fmt=s16:channel_layout=mono'
    """
    name = "abuffer" if label is None else f"abuffer@{label}"
    num, den = codec.time_base
    return (
        f"{name}=time_base={num}/{den}:sample_rate={codec.sample_rate}"
        f":sample_fmt={sample_fmt or codec.sample_fmt}:channel_layout={codec.channel_layout}"
    )


def get_buffer_desc(codec: Any, label: str | None = None, pix_fmt: str | None = None) -> str:
    """The ``buffer`` source filter that feeds frames of a video or image ``codec`` into a filter graph:
    ``buffer[@label]=video_size=WxH:pix_fmt=F:time_base=N/D:pixel_aspect=N/D``.

    Args:
        codec: A video/image codec description: ``width``, ``height``, ``pix_fmt``, ``time_base`` and
            ``sample_aspect_ratio`` (both ``(num, den)``) are read from it.
        label: Names the node ``buffer@<label>``.
        pix_fmt: Overrides the codec's pixel format.

    Example:
        >>> from types import SimpleNamespace as C
        >>> get_buffer_desc(C(width=64, height=48, pix_fmt="yuv420p", time_base=(1, 25), sample_aspect_ratio=(1, 1)))
        'buffer=video_size=64x48:pix_fmt=yuv420p:time_base=1/25:pixel_aspect=1/1'
    """
    name = "buffer" if label is None else f"buffer@{label}"
    tb_num, tb_den = codec.time_base
    sar_num, sar_den = codec.sample_aspect_ratio
    return (
        f"{name}=video_size={codec.width}x{codec.height}:pix_fmt={pix_fmt or codec.pix_fmt}"
        f":time_base={tb_num}/{tb_den}:pixel_aspect={sar_num}/{sar_den}"
    )
