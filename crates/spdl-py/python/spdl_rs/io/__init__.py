"""Media decoding in Rust (spdl-io). Every function releases the GIL for its whole duration.

- Images: :py:func:`load_image`, :py:func:`decode_image`, :py:func:`image_info`, :py:func:`load_image_batch`.
- Audio (pure Rust: WAV, FLAC, MP3, Vorbis, AAC, ...): :py:func:`load_audio`, :py:func:`load_audio_batch`;
  :py:func:`probe` describes any media file.
- Video (a build with FFmpeg, see :py:func:`has_video`): :py:func:`load_video`, or :py:func:`demux_video` then
  :py:func:`decode_packets` in separate pipeline stages.
- Video clips: :py:func:`load_clips` (clips at given starts), the samplers :py:func:`clips_at_random_indices`,
  :py:func:`clips_at_regular_indices`, :py:func:`clips_at_random_timestamps`,
  :py:func:`clips_at_regular_timestamps`, :py:func:`clips_at_fps`, and :py:func:`load_clips_batch` (many videos
  into one ``[B, clips, T, H, W, C]`` buffer): each video is demuxed once and each GOP decoded once for every
  clip that needs it.

**The result type.** Every decoder (images, audio, video, and the pipeline stages of
:py:mod:`spdl_rs.io.ops`) returns a :py:class:`spdl_rs.Buffer`: the memory the decoder wrote, owned by Rust and
never copied, with ``.shape`` and ``.dtype`` (``uint8`` images ``[H, W, C]`` / ``[N, H, W, C]``, audio
``float32`` or ``int16`` ``[C, T]`` / ``[N, C, T]``, video ``uint8`` ``[N, H, W, C]``). ``numpy.asarray(buf)``
(or ``buf.numpy()``) views it in place, and so do ``numpy.from_dlpack(buf)`` and ``torch.from_dlpack(buf)``;
a view keeps the buffer alive. With ``return_info=True`` a function returns ``(buffer, info)``.

Keywords are typed and checked: an unknown keyword is a ``TypeError``, an invalid value a ``ValueError`` that
names it. SPDL's spellings (``pix_fmt``, ``timestamp=(start, end)``, ``filter_desc=None``, ``*_config=None``,
``load_image`` of encoded bytes, :py:func:`to_numpy`) are accepted, so that code written for ``spdl.io`` runs
with an import change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import TYPE_CHECKING, Any, Callable, Literal, cast

from .. import _native
from .._lazy import lazy_attributes as _lazy_attributes
from .._native import HAS_VIDEO, Buffer
from .._native.io import (
    decode_memory_budget,
    image_info,
    load_audio_batch,
    probe,
    set_decode_memory_budget,
)
from . import _cuda
from ._filter_desc import get_video_filter_desc
from ._no_media import without_video

if HAS_VIDEO:
    from . import _media
else:
    # What needs the demuxing and decoding objects raises their ImportError.
    from . import _no_media as _media  # type: ignore[no-redef]

if TYPE_CHECKING:
    from typing_extensions import Buffer as _BufferLike

    _Src = str | PathLike[str] | bytes | _BufferLike
    """A path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, ``bytearray``, ``memoryview``, ...)."""
    _Channels = Literal["mono", "all"] | Sequence[int] | None
    _Result = Buffer | tuple[Buffer, dict[str, Any]]

    from typing_extensions import TypedDict, Unpack

    class _SpdlKeywords(TypedDict, total=False):
        """SPDL's keywords that spdl_rs takes only as ``None`` (see ``_spdl_keywords``)."""

        filter_desc: str | None
        demux_config: object
        decode_config: object
        device_config: object
        storage: object


def has_video() -> bool:
    """Whether this build decodes video (the ``ffmpeg`` cargo feature). FFmpeg's libraries are found at
    run time: :py:func:`video_available` says whether this machine has them."""
    return bool(HAS_VIDEO)


def video_available() -> bool:
    """Whether video decoding works here: the build has it and FFmpeg's libraries were found (this loads
    them if no call did yet). ``spdl_rs.build_info()["ffmpeg"]["error"]`` says why not."""
    return bool(HAS_VIDEO) and bool(_native._ffmpeg_status()["available"])


def _native_fn(name: str, feature: str = "io") -> Callable[..., Any]:
    fn = getattr(_native.io, name, None)
    if fn is None:
        raise RuntimeError(f"spdl_rs was built without the `{feature}` feature")
    return fn


if HAS_VIDEO:
    from .._native.io import VideoPackets as Packets
else:

    class Packets:  # type: ignore[no-redef]
        """Demuxed video packets (only made by a build with the ``ffmpeg`` feature)."""

        def __init__(self, *_args: object, **_kwargs: object) -> None:
            raise RuntimeError("spdl_rs was built without the `ffmpeg` feature")


_FILTER_DESC_DEFAULT = "__PLACEHOLDER__"
"""SPDL's default ``filter_desc`` of :py:func:`decode_packets` (``rgb24`` pixels, ``fltp`` samples)."""


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


def _window(
    timestamp: tuple[float, float] | None, start: float | None, duration: float | None
) -> tuple[float | None, float | None]:
    """``timestamp=(start, end)`` (SPDL) as ``start``/``duration``."""
    if timestamp is None:
        return start, duration
    if start is not None or duration is not None:
        raise ValueError("give either timestamp=(start, end) or start/duration, not both")
    begin, end = (float(t) for t in timestamp)
    if not end > begin >= 0:
        raise ValueError(f"timestamp must be (start, end) with 0 <= start < end, got {timestamp!r}")
    return begin, end - begin


# SPDL's configuration objects (``spdl.io.demux_config(...)`` and the like) and where spdl_rs puts the same
# settings; ``None``, SPDL's "defaults", is accepted.
_SPDL_CONFIGS = {
    "demux_config": "the file's own container is detected from its bytes",
    "decode_config": "decoding runs with its own threads, see the function's keywords",
    "device_config": "move the result with torch.from_dlpack(...).cuda(non_blocking=True) or spdl-cuda",
    "storage": "the result owns its memory (numpy/DLPack views keep it alive)",
}


def _spdl_keywords(func: str, instead: str, configs: _SpdlKeywords) -> None:
    """SPDL's keywords of a function without SPDL's composite form (:py:class:`_SpdlKeywords`): ``None``
    (SPDL's default) is accepted; anything else is refused with the keywords that do the same work here. Any
    other keyword is a ``TypeError``, as for a function that does not take it."""
    unknown = sorted(set(configs) - {"filter_desc", *_SPDL_CONFIGS})
    if unknown:
        raise TypeError(f"{func}() got an unexpected keyword argument {unknown[0]!r}")
    filter_desc = configs.get("filter_desc")
    if filter_desc is not None:
        raise ValueError(
            f"{func}: filter_desc (an FFmpeg filter graph) is not taken here; use {instead} instead, or "
            "spdl_rs.io.load_image/load_audio/load_video, which take it"
        )
    for key, instead_of in _SPDL_CONFIGS.items():
        if configs.get(key) is not None:
            raise ValueError(f"{func}: SPDL's {key} is not supported by spdl_rs ({instead_of})")


def _spdl_form(func: str, configs: _SpdlKeywords, own: Mapping[str, object]) -> bool:
    """Whether a call takes SPDL's composite form (demux, decode through an FFmpeg filter graph, convert):
    ``filter_desc=`` given (``None`` included: the decoder's own format), or a ``demux_config``/
    ``decode_config``. spdl_rs's own keywords (``own``, name to value, ``None`` or their default when not
    given) cannot be combined with it."""
    unknown = sorted(set(configs) - {"filter_desc", *_SPDL_CONFIGS})
    if unknown:
        raise TypeError(f"{func}() got an unexpected keyword argument {unknown[0]!r}")
    spdl = "filter_desc" in configs or any(configs.get(k) is not None for k in ("demux_config", "decode_config"))
    if spdl:
        given = sorted(k for k, v in own.items() if v)
        if given:
            raise ValueError(
                f"{func}: SPDL's filter_desc/demux_config/decode_config cannot be combined with spdl_rs's "
                f"{', '.join(given)}; put the conversion into filter_desc (spdl_rs.io.get_filter_desc)"
            )
    if configs.get("storage") is not None:
        raise ValueError(f"{func}: SPDL's storage is not supported by spdl_rs ({_SPDL_CONFIGS['storage']})")
    return spdl


def _check_configs(configs: _SpdlKeywords) -> None:
    """SPDL's config objects, each of its own type (``TypeError`` naming the keyword otherwise)."""
    types = {"demux_config": (_media.DemuxConfig, "spdl_rs.io.demux_config(...)"),
             "decode_config": (_media.DecodeConfig, "spdl_rs.io.decode_config(...)"),
             "device_config": (_cuda.CUDAConfig, "spdl_rs.io.cuda_config(...)")}
    for key, (cls, make) in types.items():
        value = configs.get(key)
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{key} must be a {cls.__name__} ({make}), got {type(value).__name__}")
    filter_desc = configs.get("filter_desc")
    if filter_desc is not None and not isinstance(filter_desc, str):
        raise TypeError(f"filter_desc must be a str or None, got {type(filter_desc).__name__}")


def _empty(timestamp: tuple[float, float] | None) -> bool:
    """An empty window (``(t, t)``, or end before start): SPDL's form, which decodes no frame."""
    return timestamp is not None and not float(timestamp[1]) > float(timestamp[0])


def _to_device(buffer: Buffer, configs: _SpdlKeywords) -> Any:
    """``buffer``, moved to SPDL's ``device_config`` when one is given."""
    device_config: Any = configs.get("device_config")
    if device_config is None:
        return buffer
    return _cuda.transfer_buffer(buffer, device_config=device_config)


def _load_spdl(kind: str, src: Any, timestamp: Any, name: str | None, configs: _SpdlKeywords) -> Buffer:
    """SPDL's ``load_audio``/``load_video``/``load_image``: demux, decode with ``filter_desc`` (default:
    SPDL's conversion; ``None``: the decoder's format), convert, and move to ``device_config`` if given."""
    _check_configs(configs)
    filter_desc = configs.get("filter_desc", _FILTER_DESC_DEFAULT)
    demux_config = configs.get("demux_config")
    if kind == "image":
        packets: Any = _media.demux_image(src, demux_config=demux_config, name=name)  # type: ignore[arg-type]
    elif kind == "audio":
        packets = _media.demux_audio(src, timestamp=timestamp, demux_config=demux_config, name=name)  # type: ignore[arg-type]
    else:
        packets = _media.demux_video(src, timestamp=timestamp, demux_config=demux_config, name=name)  # type: ignore[arg-type]
    decode_config: Any = configs.get("decode_config")
    frames = _media.decode_packets(packets, filter_desc, decode_config)
    return _to_device(_media.convert_frames(frames), configs)


_IMAGE_INSTEAD = "size=(width, height), filter= and pix_fmt="


def _is_bytes(src: object) -> bool:
    return isinstance(src, (bytes, bytearray, memoryview)) or (
        not isinstance(src, str) and not hasattr(src, "__fspath__") and hasattr(src, "__buffer__")
    )


def load_image(
    src: _Src,
    *,
    size: tuple[int, int] | None = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    exif_orientation: bool = False,
    name: str = "<bytes>",
    pix_fmt: str | None = None,
    **spdl: Unpack[_SpdlKeywords],
) -> Buffer:
    """Decodes one image into an HWC ``uint8`` :py:class:`spdl_rs.Buffer` (GIL released).

    Args:
        src: A path or, as in SPDL, the encoded bytes.
        size: ``(width, height)`` to resize to, or ``None`` for the original size.
        pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
        filter: The resize filter (``"bilinear"``, ``"nearest"``, ``"box"``, ``"hamming"``, ``"bicubic"``).
        exif_orientation: Apply the EXIF orientation.
        name: The name of ``src`` in error messages when it is bytes.
        pix_fmt: SPDL's spelling of ``pixel_format`` (``"rgb24"``, ``"rgba"``, ``"gray"``).
        filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
            given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
            graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
            device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.
    """
    own = {"size": size, "pix_fmt": pix_fmt, "exif_orientation": exif_orientation,
           "pixel_format": pixel_format != "rgb", "filter": filter != "bilinear"}
    if _spdl_form("load_image", spdl, own):
        return _load_spdl("image", src, None, None if name == "<bytes>" else name, spdl)
    _spdl_keywords("load_image", _IMAGE_INSTEAD, cast("_SpdlKeywords", {k: v for k, v in spdl.items() if k != "device_config"}))
    if spdl.get("device_config") is not None:
        return _load_spdl("image", src, None, None if name == "<bytes>" else name, spdl)
    options = dict(size=size, pixel_format=_pixel_format(pixel_format, pix_fmt), filter=filter,
                   exif_orientation=exif_orientation)
    if _is_bytes(src):
        return _native_fn("decode_image")(src, name=name, **options)
    return _native_fn("load_image")(src, **options)


def decode_image(
    data: bytes | _BufferLike,
    *,
    size: tuple[int, int] | None = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    exif_orientation: bool = False,
    name: str = "<bytes>",
    pix_fmt: str | None = None,
    **spdl: Unpack[_SpdlKeywords],
) -> Buffer:
    """Decodes one encoded image (JPEG, PNG, WebP, GIF, BMP, TIFF; bytes or a buffer) into an HWC ``uint8``
    :py:class:`spdl_rs.Buffer` (GIL released). Arguments as :py:func:`load_image`."""
    _spdl_keywords("decode_image", _IMAGE_INSTEAD, spdl)
    return _native_fn("decode_image")(
        data, name=name, size=size, pixel_format=_pixel_format(pixel_format, pix_fmt), filter=filter,
        exif_orientation=exif_orientation,
    )


def load_image_batch(
    srcs: Sequence[str | PathLike[str] | bytes],
    width: int | None = None,
    height: int | None = None,
    *,
    layout: Literal["NHWC", "NCHW"] = "NHWC",
    normalize: str | tuple[Sequence[float], Sequence[float]] | None = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    strict: bool = True,
    num_threads: int | None = None,
    return_info: bool = False,
    transform: Literal["resize", "center-crop", "random-resized-crop"] = "resize",
    seed: int = 0,
    keys: Sequence[int] | None = None,
    pix_fmt: str | None = None,
    **spdl: Unpack[_SpdlKeywords],
) -> _Result:
    """Decodes a batch of images (paths or encoded bytes) resized to ``width`` x ``height`` into one contiguous
    :py:class:`spdl_rs.Buffer` of shape ``[N, H, W, C]`` (or ``[N, C, H, W]``), in parallel, GIL released.

    Args:
        srcs: Paths or encoded bytes.
        width, height: The output size of every image. Either ``None``: SPDL's form (below) at the images' own
            size in that dimension.
        layout: ``"NHWC"`` or ``"NCHW"``.
        normalize: ``None`` (``uint8`` output), ``"imagenet"``, ``"unit"`` or ``(mean, std)`` (``float32``
            output, ``(x / 255 - mean) / std``).
        pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"`` (``pix_fmt``: SPDL's spelling).
        filter: The resize filter.
        strict: Fail the whole batch if one image fails (the message names its index and file). ``False``:
            a failed image's slot stays zero and the failure is logged on the ``spdl_rs.io`` logger.
        num_threads: Decoding threads (``None``: all cores).
        return_info: Return ``(buffer, info)``, where ``info["failures"]`` lists the failed items as
            ``(index, item, message)`` tuples.
        transform: ``"resize"``, ``"center-crop"`` (ImageNet eval) or ``"random-resized-crop"`` (ImageNet
            train: torchvision's ``RandomResizedCrop`` + a horizontal flip half the time).
        seed: Seed of the random crop and flip.
        keys: One integer per item that seeds its crop and flip with ``seed``; default: its position.
        filter_desc, demux_config, decode_config, device_config: SPDL's form, also taken where ``width`` or
            ``height`` is ``None``: each image decoded through the FFmpeg filter graph (default: scaled, in
            ``pix_fmt``), failed images logged and left out (``strict``: any failure raises), the rest converted
            into one buffer (their shapes must agree). ``storage``: ``None`` only.
    """
    own = {"layout": layout != "NHWC", "normalize": normalize, "pixel_format": pixel_format != "rgb",
           "filter": filter != "bilinear", "num_threads": num_threads, "return_info": return_info,
           "transform": transform != "resize", "seed": seed, "keys": keys}
    if _spdl_form("load_image_batch", spdl, own) or width is None or height is None:
        if width is None and height is None and any(own.values()):
            raise ValueError("load_image_batch: width and height are needed with spdl_rs's keywords")
        return _load_image_batch_spdl(srcs, width, height, pix_fmt, strict, spdl)
    _spdl_keywords("load_image_batch", "width=, height=, filter= and pix_fmt=", spdl)
    return _native_fn("load_image_batch")(
        srcs, width, height, return_info=return_info, keys=keys, layout=layout, normalize=normalize,
        pixel_format=_pixel_format(pixel_format, pix_fmt), filter=filter, strict=strict, num_threads=num_threads,
        transform=transform, seed=seed,
    )


def _load_image_batch_spdl(
    srcs: Sequence[Any], width: int | None, height: int | None, pix_fmt: str | None, strict: bool,
    configs: _SpdlKeywords,
) -> Buffer:
    """SPDL's ``load_image_batch``: each image demuxed and decoded through the filter graph (default: scaled to
    ``width`` x ``height`` where given, in ``pix_fmt``), the failures logged and left out (``strict``: any
    failure raises), then one :py:func:`convert_frames` of the rest (their shapes must agree)."""
    import logging

    if not srcs:
        raise ValueError("`srcs` must not be empty.")
    _check_configs(configs)
    filter_desc = configs.get("filter_desc", _FILTER_DESC_DEFAULT)
    if filter_desc == _FILTER_DESC_DEFAULT:
        filter_desc = get_video_filter_desc(scale_width=width, scale_height=height, pix_fmt=pix_fmt or "rgb24")
    frames = []
    for src in srcs:
        try:
            packets = _media.demux_image(src, demux_config=configs.get("demux_config"))  # type: ignore[arg-type]
            decode_config: Any = configs.get("decode_config")
            frames.append(_media.decode_packets(packets, filter_desc, decode_config))
        except Exception as err:
            what = f"bytes object at {id(src)}" if isinstance(src, (bytes, bytearray, memoryview)) else repr(src)
            logging.getLogger("spdl_rs.io").error("Failed to decode an image from %s: %s.", what, err)
    if strict and len(frames) != len(srcs):
        raise RuntimeError(f"Failed to load some images ({len(srcs) - len(frames)} of {len(srcs)}; logged).")
    if not frames:
        raise RuntimeError("Failed to load all the images.")
    return _to_device(_media.convert_frames(frames), configs)


def load_audio(
    src: _Src,
    timestamp: tuple[float, float] | None = None,
    *,
    start: float | None = None,
    duration: float | None = None,
    sample_rate: int | None = None,
    channels: _Channels = None,
    dtype: Literal["float32", "int16"] = "float32",
    layout: Literal["channels_first", "interleaved"] = "channels_first",
    num_samples: int | None = None,
    backend: Literal["auto", "symphonia", "ffmpeg"] = "auto",
    limits: dict[str, int] | None = None,
    name: str | None = None,
    return_info: bool = False,
    **spdl: Unpack[_SpdlKeywords],
) -> _Result:
    """Decodes one audio clip into a :py:class:`spdl_rs.Buffer` (GIL released, no copy): ``[C, T]``
    (``layout="channels_first"``) or ``[T, C]`` (``"interleaved"``), ``float32`` in ``[-1, 1]`` or ``int16``.

    WAV, FLAC, MP3, Ogg Vorbis, AAC (ADTS, MP4/M4A) and MKV/WebM audio decode in Rust (symphonia); in a build
    with video support FFmpeg reads the rest (audio tracks of videos, Opus, ...).

    Args:
        src: A path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, ``bytearray``, ``memoryview``).
        timestamp: SPDL's ``(start, end)`` in seconds, instead of ``start``/``duration``.
        start: Window start in seconds (the decoder seeks to it when the container allows).
        duration: Window length in seconds (``None``: to the end).
        sample_rate: Output rate in Hz (``None``: the source's).
        channels: ``None`` (all, in order), ``"mono"`` (mean of all channels) or a list of source channel
            indices (repeats allowed, e.g. ``[0, 0]``).
        dtype: ``"float32"`` or ``"int16"``.
        layout: ``"channels_first"`` or ``"interleaved"``.
        num_samples: Pad with zeros or truncate to exactly this many samples per channel.
        backend: ``"auto"``, ``"symphonia"`` or ``"ffmpeg"`` (video builds only).
        limits: Overrides of the decoding bounds (``max_samples``, ``max_packets``, ``max_channels``,
            ``max_sample_rate``, ``max_bad_packets``).
        name: The name of ``src`` in error messages when it is bytes (its extension is a format hint).
        return_info: Also return a dict: ``sample_rate``, ``num_samples`` (samples decoded, before padding),
            ``start`` (seconds), ``codec``, ``container``, ``source_sample_rate``, ``source_channels``.
        filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
            given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
            graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
            device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.

    Raises:
        OSError: The file cannot be read.
        ValueError: Invalid options (e.g. a channel the file does not have).
        RuntimeError: The input is empty, corrupt, in an unknown format or over a limit; the message names it.
    """
    own = {"start": start is not None, "duration": duration is not None, "sample_rate": sample_rate,
           "channels": channels, "dtype": dtype != "float32", "layout": layout != "channels_first",
           "num_samples": num_samples, "backend": backend != "auto", "limits": limits, "return_info": return_info}
    if _spdl_form("load_audio", spdl, own) or spdl.get("device_config") is not None or _empty(timestamp):
        return _load_spdl("audio", src, timestamp, name, spdl)
    start, duration = _window(timestamp, start, duration)
    return _native_fn("load_audio")(
        src, name=name, return_info=return_info, start=start, duration=duration, sample_rate=sample_rate,
        channels=channels, dtype=dtype, layout=layout, num_samples=num_samples, backend=backend, limits=limits,
    )


_VIDEO_INSTEAD = "width=, height=, fps=, num_frames= and pix_fmt="


def load_video(
    src: _Src,
    timestamp: tuple[float, float] | None = None,
    *,
    start: float | None = None,
    duration: float | None = None,
    fps: float | None = None,
    every_k: int | None = None,
    num_frames: int | None = None,
    width: int | None = None,
    height: int | None = None,
    pix_fmt: Literal["rgb24", "gray"] = "rgb24",
    filter: Literal["bicubic", "bilinear", "nearest", "area"] = "bicubic",
    threads: int = 1,
    limits: dict[str, int] | None = None,
    name: str | None = None,
    return_info: bool = False,
    **spdl: Unpack[_SpdlKeywords],
) -> _Result:
    """Demuxes and decodes a video (a path or encoded bytes) into a ``uint8`` :py:class:`spdl_rs.Buffer`
    ``[N, H, W, C]`` (GIL released, no copy). FFmpeg seeks to the keyframe before ``start``; frames that are
    not selected are decoded but never converted.

    Args:
        src: A path (``str`` or ``os.PathLike``) or encoded bytes.
        timestamp: SPDL's ``(start, end)`` in seconds, instead of ``start``/``duration``.
        start: Window start in seconds (presentation time).
        duration: Window length in seconds (``None``: to the end).
        fps: Output frame rate: at each tick the frame on screen then (frames repeat above the source rate).
        every_k: Every k-th frame of the window.
        num_frames: Exactly this many frames, spread uniformly over the window (repeats if it has fewer).
            At most one of ``fps``, ``every_k``, ``num_frames``; none: every frame.
        width, height: Output size (both or neither; neither keeps the coded size).
        pix_fmt: ``"rgb24"`` (``C = 3``) or ``"gray"`` (``C = 1``).
        filter: Scaling filter: ``"bicubic"``, ``"bilinear"``, ``"nearest"`` or ``"area"``.
        threads: Decoder threads (``0``: FFmpeg picks one per core).
        limits: Overrides of the bounds (``max_packets``, ``max_packet_bytes``, ``max_frames``, ``max_pixels``,
            ``max_output_bytes``, ``max_bad_packets``).
        name: The name of ``src`` in error messages when it is bytes.
        return_info: Also return a dict: ``pts`` (seconds, per frame), ``frame_rate``, ``codec``, ``item``.
        filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
            given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
            graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
            device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.

    Raises:
        OSError: The file cannot be read.
        ValueError: Invalid options.
        RuntimeError: The input is corrupt, has no video stream or is over a limit; the message names it.
    """
    own = {"start": start is not None, "duration": duration is not None, "fps": fps, "every_k": every_k,
           "num_frames": num_frames, "width": width, "height": height, "pix_fmt": pix_fmt != "rgb24",
           "filter": filter != "bicubic", "threads": threads != 1, "limits": limits, "return_info": return_info}
    if _spdl_form("load_video", spdl, own) or spdl.get("device_config") is not None or _empty(timestamp):
        return _load_spdl("video", src, timestamp, name, spdl)
    start, duration = _window(timestamp, start, duration)
    return _native_fn("load_video", "ffmpeg")(
        src, name=name, return_info=return_info, start=start, duration=duration, fps=fps, every_k=every_k,
        num_frames=num_frames, width=width, height=height, pix_fmt=pix_fmt, filter=filter, threads=threads,
        limits=limits,
    )


# SPDL's demux_video/decode_packets, which take spdl_rs's window and frame sampler too: the native functions.
if HAS_VIDEO:
    from .._native.io import decode_packets, demux_video
else:
    demux_video = without_video("spdl_rs.io.demux_video")
    decode_packets = without_video("spdl_rs.io.decode_packets")


_CLIP_FUNCTIONS = (
    "load_clips",
    "load_clips_batch",
    "clips_at_random_indices",
    "clips_at_regular_indices",
    "clips_at_random_timestamps",
    "clips_at_regular_timestamps",
    "clips_at_fps",
)


# Clips: the native functions themselves (each video demuxed once, each GOP its clips need decoded once).
if HAS_VIDEO:
    from .._native.io import (
        clips_at_fps,
        clips_at_random_indices,
        clips_at_random_timestamps,
        clips_at_regular_indices,
        clips_at_regular_timestamps,
        load_clips,
        load_clips_batch,
    )
else:
    load_clips = without_video("spdl_rs.io.load_clips")
    load_clips_batch = without_video("spdl_rs.io.load_clips_batch")
    clips_at_random_indices = without_video("spdl_rs.io.clips_at_random_indices")
    clips_at_regular_indices = without_video("spdl_rs.io.clips_at_regular_indices")
    clips_at_random_timestamps = without_video("spdl_rs.io.clips_at_random_timestamps")
    clips_at_regular_timestamps = without_video("spdl_rs.io.clips_at_regular_timestamps")
    clips_at_fps = without_video("spdl_rs.io.clips_at_fps")


def to_torch(buffer: Any) -> Any:
    """A ``torch.Tensor`` sharing the buffer's memory (``torch.from_dlpack``; no copy): SPDL's ``to_torch``."""
    import torch

    if hasattr(buffer, "__dlpack__"):
        return torch.from_dlpack(buffer)
    return torch.from_numpy(buffer)


def to_numpy(buffer: Any) -> Any:
    """A ``numpy`` view of a :py:class:`spdl_rs.Buffer` (no copy), or the array itself: SPDL's ``to_numpy``."""
    import numpy

    return numpy.asarray(buffer)


from . import ops  # noqa: E402

# SPDL's other ``spdl.io`` names, each in the module that implements it; loaded on first use.
_LAZY: dict[str, str] = {
    # arrays: NumPy formats and interop
    "load_npy": "._array",
    "load_npz": "._array",
    "NpzFile": "._array",
    "ArrayInterface": "._array",
    "CUDAArrayInterface": "._array",
    "convert_array": "._array",
    "to_jax": "._array",
    "to_numba": "._array",
    # WAV and tar
    "load_wav": "._wav",
    "parse_wav": "._wav",
    "WAVHeader": "._wav",
    "iter_tarfile": "._tar",
    # FFmpeg filter descriptions
    "get_filter_desc": "._filter_desc",
    "get_video_filter_desc": "._filter_desc",
    "get_audio_filter_desc": "._filter_desc",
    "get_buffer_desc": "._filter_desc",
    "get_abuffer_desc": "._filter_desc",
    # demuxing and decoding objects
    "Demuxer": "._media",
    "Decoder": "._media",
    "AudioDecoder": "._media",
    "VideoDecoder": "._media",
    "demux_audio": "._media",
    "demux_image": "._media",
    "sample_decode_video": "._media",
    "AudioPackets": "._media",
    "VideoPackets": "._media",
    "ImagePackets": "._media",
    "AudioFrames": "._media",
    "VideoFrames": "._media",
    "ImageFrames": "._media",
    "AudioCodec": "._media",
    "VideoCodec": "._media",
    "ImageCodec": "._media",
    "DemuxConfig": "._media",
    "DecodeConfig": "._media",
    "demux_config": "._media",
    "decode_config": "._media",
    "convert_frames": "._media",
    "create_reference_audio_frame": "._media",
    "create_reference_video_frame": "._media",
    "CPUBuffer": "._media",
    "FilterGraph": "._media",
    "BSF": "._media",
    "apply_bsf": "._media",
    # encoding
    "encode_image": "._encode",
    "save_image": "._encode",
    # encoding and muxing media
    "Muxer": "._mux",
    "AudioEncoder": "._mux",
    "VideoEncoder": "._mux",
    "AudioEncodeConfig": "._mux",
    "VideoEncodeConfig": "._mux",
    "audio_encode_config": "._mux",
    "video_encode_config": "._mux",
    # host/device memory
    "transfer_tensor": "._cuda",
    "transfer_tensor_h2d": "._cuda",
    "transfer_tensor_d2h": "._cuda",
    "transfer_buffer": "._cuda",
    "transfer_buffer_cpu": "._cuda",
    "cpu_storage": "._cuda",
    "CPUStorage": "._cuda",
    "CUDAConfig": "._cuda",
    "cuda_config": "._cuda",
    "CUDABuffer": "._cuda",
    # spdl_rs's own error classes of the above (SPDL raises plain RuntimeError/ValueError; these subclass them)
    "CUDAUnavailableError": "._cuda",
    "FormatError": "._tar",
}


__getattr__, __dir__ = _lazy_attributes(__name__, globals(), _LAZY)


__all__ = [
    "Packets",
    *_CLIP_FUNCTIONS,
    "decode_image",
    "decode_memory_budget",
    "decode_packets",
    "demux_video",
    "has_video",
    "video_available",
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
    *_LAZY,
]
