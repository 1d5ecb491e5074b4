"""Type stubs of the native module ``spdl_rs._native`` (Rust, PyO3)."""

import builtins
from collections.abc import Iterator, Sequence
from os import PathLike
from typing import Any, Literal, final, overload

from typing_extensions import Buffer as _BufferLike  # collections.abc.Buffer from Python 3.12
from typing_extensions import TypedDict, Unpack

# Every class is final: PyO3 classes without `subclass` cannot be subclassed at run time.

__all__ = [
    "_build_info",
    "_ffmpeg_status",
    "_ffmpeg_filters",
    "_ffmpeg_log_level",
    "_set_ffmpeg_log_level",
    "_check_count",
    "_check_duration",
    "_check_size",
    "_wait_engine_threads",
    "ARG_LIMITS",
    "Buffer",
    "PipelineCore",
    "StatsSnapshot",
    "AsyncBridge",
    "Reply",
    "RegionInputs",
    "CheckpointTracker",
    "CheckpointEpoch",
    "IterSource",
    "RangeSource",
    "ListSource",
    "AsyncSource",
    "MergeSource",
    "PipeStep",
    "AggregateStep",
    "AggregatorStep",
    "DisaggregateStep",
    "PathVariantsStep",
    "ThroughStep",
    "CoreOptions",
    "ImageLoader",
    "ClipLoader",
    "NativeOp",
    "load_image",
    "decode_image",
    "image_info",
    "load_image_batch",
    "decode_image_op",
    "load_image_batch_op",
    "decode_memory_budget",
    "set_decode_memory_budget",
    "load_audio",
    "load_audio_batch",
    "probe",
    "load_audio_op",
    "load_audio_batch_op",
    "AudioCodec",
    "VideoCodec",
    "ImageCodec",
    "AudioPackets",
    "VideoPackets",
    "ImagePackets",
    "AudioFrames",
    "VideoFrames",
    "ImageFrames",
    "MediaDemuxer",
    "MediaDecoder",
    "MediaBSF",
    "FilterGraph",
    "AudioEncodeConfig",
    "VideoEncodeConfig",
    "AudioEncoder",
    "VideoEncoder",
    "MediaMuxer",
    "media_decode_packets",
    "convert_frames",
    "reference_video_frame",
    "reference_audio_frame",
    "split_packets_at_indices",
    "concat_video_frames",
    "encode_image_file",
    "load_video",
    "demux_video",
    "decode_packets",
    "load_video_op",
    "demux_video_op",
    "decode_packets_op",
    "load_clips",
    "clips_at_random_indices",
    "clips_at_regular_indices",
    "clips_at_random_timestamps",
    "clips_at_regular_timestamps",
    "clips_at_fps",
    "load_clips_batch",
    "load_clips_op",
    "load_clips_batch_op",
    "HAS_IO",
    "HAS_VIDEO",
    "Store",
    "Sampler",
    "ElasticSampler",
    "list_dataset",
    "HAS_SOURCE",
]

#: The caps of the boundary checks (``_check_count`` and friends), by kind of argument.
ARG_LIMITS: dict[str, Any]

def _check_count(name: str, value: int, min: int, max: int) -> int:
    """Internal: ``value`` if it is an integer in ``min..=max``, else ``ValueError`` (``TypeError`` if not an int)."""

def _check_size(name: str, value: int, min: int, max: int) -> int:
    """Internal: as ``_check_count``, for byte sizes."""

def _check_duration(name: str, value: float, min: float, max: float) -> float:
    """Internal: ``value`` (seconds) if it is in ``min..=max`` and not NaN."""

def _build_info() -> dict[str, Any]:
    """Internal: the native half of ``spdl_rs.build_info()``."""

def _ffmpeg_status() -> dict[str, Any]:
    """Internal: what this process found of FFmpeg (loads it on first use)."""

def _ffmpeg_filters() -> list[str]:
    """The FFmpeg filters available (loads FFmpeg; ``RuntimeError`` without it)."""

def _ffmpeg_log_level() -> int:
    """FFmpeg's log level (loads FFmpeg)."""

def _set_ffmpeg_log_level(level: int) -> None:
    """Sets FFmpeg's log level (loads FFmpeg)."""

def _wait_engine_threads() -> int:
    """Internal: waits (bounded) for engine threads running Python code to leave it; how many are left."""

def _mark_exiting() -> None:
    """Internal: the ``atexit`` hook after which threads park instead of entering the interpreter."""

def _after_fork_in_child() -> None:
    """Internal: the ``os.register_at_fork(after_in_child=...)`` hook."""

HAS_IO: bool
"""Whether this build has :py:mod:`spdl_rs.io` (the ``io`` cargo feature)."""

HAS_VIDEO: bool
"""Whether this build decodes video (the ``ffmpeg`` cargo feature)."""

@final
class Buffer:
    """An array in host memory made by spdl-rs. ``numpy.asarray(buf)`` and ``buf.numpy()`` view it in place (the
    array keeps it alive); ``__dlpack__`` hands it to ``numpy.from_dlpack``/``torch.from_dlpack`` in place."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The extent of each axis."""
    @property
    def dtype(self) -> str:
        """numpy's name of the element type (``"uint8"``, ``"float32"``, ...)."""
    @property
    def layout(self) -> str:
        """What the axes mean (``"NHWC"``, ``"HWC"``, ... or ``""``)."""
    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
    @property
    def ndim(self) -> int:
        """Number of axes."""
    @property
    def is_pinned(self) -> bool:
        """True if the memory is page-locked (CUDA pinned)."""
    @property
    def data_ptr(self) -> int:
        """The address of the first byte."""
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface (version 3)."""
    def __len__(self) -> int:
        """Length of the first axis."""
    def numpy(self) -> Any:
        """A ``numpy.ndarray`` sharing the buffer's memory."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule (CPU) viewing the memory in place (a copy if ``copy=True``)."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(1, 0)``: the CPU."""
    def copy(self) -> Buffer:
        """A deep copy."""
    @staticmethod
    def zeros(shape: Sequence[int], dtype: str = "uint8") -> Buffer:
        """A zero-filled buffer."""
    @staticmethod
    def from_bytes(data: bytes, shape: Sequence[int], dtype: str = "uint8") -> Buffer:
        """A buffer holding a copy of ``data`` (native byte order)."""

@final
class NativeOp:
    """A Rust op to give to ``PipelineBuilder.pipe``; it runs without the GIL. Calling it applies it to one item."""

    @property
    def name(self) -> str:
        """The op's name."""
    def __call__(self, item: Any) -> Any:
        """Applies the op to one item (GIL released)."""

@final
class AsyncBridge:
    """Internal: how the engine's scheduler hands coroutines to a pipeline's asyncio loop."""

    def __init__(self) -> None: ...
    def fileno(self) -> int:
        """The socket the loop watches."""
    def take_jobs(self) -> list[tuple[str, Any, Any, Reply]]:
        """The waiting jobs: ``(kind, op, arg, reply)``; kind is ``call``, ``gen``, ``next`` or ``start``."""

@final
class Reply:
    """Internal: the done-callback of one async job."""

    def done(self, task: Any) -> None:
        """Forwards the finished task's result or exception."""
    def fail(self, exc: BaseException) -> None:
        """Fails the job with ``exc``."""

@final
class RegionInputs:
    """Internal: the inputs of one epoch of a region. Iterating waits without the GIL and ends at the epoch's
    end, at the end of the input or when the pipeline stops."""

    def __iter__(self) -> RegionInputs: ...
    def __next__(self) -> Any: ...

@final
class CheckpointTracker:
    """Internal: the checkpoint of one pipeline (spdl-exec's): its inputs, what was delivered, what failed.
    A source's state reaches it as ``encode(source.state_dict())`` and goes back through ``decode``."""

    def __new__(cls, encode: Any, decode: Any) -> CheckpointTracker: ...
    def add_input(self, source: Any, *, deterministic_epoch_order: bool, name: str) -> int:
        """Registers ``source`` as the next input and returns its number; reads its state."""
    def epoch(self, input: int) -> CheckpointEpoch:
        """One epoch of input ``input``, without what a loaded state says was delivered."""
    def deliver(self, keys: list[tuple[int, int, int]]) -> None:
        """Records ``keys`` (``(input, epoch, index)``) as delivered."""
    def fail(self, keys: list[tuple[int, int, int]], stage: str, cause: str) -> None:
        """Records ``keys`` as failed in ``stage`` (they count as delivered)."""
    def state_json(self) -> str:
        """The state as JSON text."""
    def load_json(self, state: str) -> None:
        """Resumes from a state's JSON text (before any epoch begins)."""

@final
class CheckpointEpoch:
    """Internal: one epoch of a checkpointed input, as ``(input, epoch, index, item)`` tuples."""

    def __iter__(self) -> CheckpointEpoch: ...
    def __next__(self) -> tuple[int, int, int, Any]: ...

@final
class IterSource:
    """Internal: a Python iterable source (``continuous``: iterated again every epoch)."""

    def __new__(cls, iterable: Any, *, continuous: bool = False) -> IterSource: ...

@final
class RangeSource:
    """Internal: a ``range`` source, iterated in Rust."""

    def __new__(cls, start: int, stop: int, step: int) -> RangeSource: ...

@final
class ListSource:
    """Internal: a ``list``/``tuple`` source, taken into Rust at build time."""

    def __new__(cls, items: Any) -> ListSource: ...

@final
class AsyncSource:
    """Internal: an async iterator source, iterated on the pipeline's event loop."""

    def __new__(cls, aiter: Any) -> AsyncSource: ...

_Source = IterSource | RangeSource | ListSource | AsyncSource | MergeSource
_Step = PipeStep | AggregateStep | AggregatorStep | DisaggregateStep | PathVariantsStep | ThroughStep

@final
class MergeSource:
    """Internal: a merge of sources, each with its own steps."""

    def __new__(
        cls,
        name: str,
        inputs: list[tuple[_Source, list[_Step]]],
        *,
        policy: str = "as_available",  # "as_available", "round_robin" or "weighted"
        weights: list[float] | None = None,
        stop_after: int = 0,
        seed: int = 0,
    ) -> MergeSource: ...

@final
class PipeStep:
    """Internal: a ``pipe`` step (``kind``: "sync", "gen", "async", "asyncgen" or "native")."""

    def __new__(
        cls,
        name: str,
        kind: str,
        op: Any,
        *,
        concurrency: int = 1,
        output_order: str = "completion",
        max_failures: int | None = None,
        max_failure_fraction: float | None = None,
    ) -> PipeStep: ...

@final
class AggregateStep:
    """Internal: ``aggregate(size)``."""

    def __new__(cls, size: int, *, drop_last: bool = False) -> AggregateStep: ...

@final
class AggregatorStep:
    """Internal: a custom aggregation (``accumulate``/``flush``)."""

    def __new__(cls, name: str, aggregator: Any, *, drop_last: bool = False) -> AggregatorStep: ...

@final
class DisaggregateStep:
    """Internal: ``disaggregate()``."""

    def __new__(cls) -> DisaggregateStep: ...

@final
class PathVariantsStep:
    """Internal: ``path_variants``: a router and its paths (lists of steps)."""

    def __new__(
        cls,
        name: str,
        router: Any,
        paths: list[list[_Step]],
        *,
        is_async: bool = False,
        batched: bool = False,
        output_order: str = "completion",
    ) -> PathVariantsStep: ...

@final
class ThroughStep:
    """Internal: a stage run by ``func(inputs)`` once per epoch (a ``.to()`` region)."""

    def __new__(cls, name: str, func: Any) -> ThroughStep: ...

@final
class CoreOptions:
    """Internal: the whole pipeline's options."""

    def __new__(
        cls,
        *,
        buffer_size: int,
        num_threads: int,
        max_failures: int | None = None,
        max_failure_fraction: float | None = None,
        stage_buffer_size: int = ...,  # 2
        autotune: bool = False,
        max_memory_bytes: int | None = None,
    ) -> CoreOptions: ...

@final
class PipelineCore:
    """Internal: the engine pipeline behind :py:class:`spdl_rs.pipeline.Pipeline`."""

    def __new__(
        cls,
        source: _Source,
        steps: list[_Step],
        options: CoreOptions,
        *,
        bridge: AsyncBridge | None = None,
    ) -> PipelineCore: ...
    def start(self) -> None:
        """Starts the scheduler and the pool."""
    def stop(self, timeout: float | None = None) -> None:
        """Stops and joins every thread (GIL released), within ``timeout`` seconds; raises ``TimeoutError``
        if an op is still running then (its thread is left to finish)."""
    def get_item(self, timeout: float | None = None) -> tuple[int, Any]:
        """``(0, item)``, ``(1, epoch)`` or ``(2, None)``; raises ``TimeoutError``; ``inf`` waits forever,
        NaN or a negative timeout raises ``ValueError``."""
    def fatal(self) -> tuple[str, BaseException] | None:
        """The stage and the ``BaseException`` (not an ``Exception``) that stopped the pipeline, if one did."""

    def error(self) -> tuple[str, str | None] | None:
        """Why the pipeline ended early: ``(message, stage)``."""
    def take_exceptions(self) -> list[tuple[str, BaseException]]:
        """The kept exceptions of failed items."""
    def stats(self) -> list[dict[str, Any]]:
        """One dict per stage."""
    def autotune_decisions(self) -> list[dict[str, Any]] | None:
        """The auto-tuner's changes (None without autotune)."""
    def autotune_report(self) -> dict[str, Any] | None:
        """The auto-tuner's state (None without autotune)."""
    def stats_table(self) -> str:
        """The stats as a text table."""
    def stats_anchor(self) -> StatsSnapshot:
        """A snapshot of the stats: the start of a ``stats_window``."""
    def stats_window(self, anchor: StatsSnapshot | None = None) -> dict[str, Any]:
        """The ``autotune::Window`` since ``anchor`` (``None``: since the start) as a dict (``duration``,
        ``items``, ``throughput``, ``stages``); ``ValueError`` for an anchor of another pipeline."""

@final
class StatsSnapshot:
    """Internal: an opaque stats snapshot of one pipeline, from ``PipelineCore.stats_anchor()``."""

    @property
    def elapsed(self) -> float:
        """Seconds since the pipeline started when it was taken."""

# The decoders take their options as keywords (`**options`): Rust reads each decoder's options into one
# struct, shared by the function and its op. The typed public signatures are spdl_rs.io's and spdl_rs.io.ops'.

_Src = str | PathLike[str] | bytes | _BufferLike
_Channels = str | Sequence[int] | None

class _ImageOptions(TypedDict, total=False):
    size: tuple[int, int] | None
    pixel_format: str  # "rgb", "rgba" or "gray" (ValueError otherwise)
    filter: str
    exif_orientation: bool

class _ImageBatchOptions(TypedDict, total=False):
    layout: str  # "NHWC" or "NCHW"
    normalize: str | tuple[Sequence[float], Sequence[float]] | None
    pixel_format: str
    filter: str
    strict: bool
    num_threads: int | None  # None: all cores in the function, 1 in the op
    transform: str  # "resize", "center-crop" or "random-resized-crop"
    seed: int

class _AudioOptions(TypedDict, total=False):
    start: float | None
    duration: float | None
    sample_rate: int | None
    channels: _Channels
    dtype: str  # "float32" or "int16"
    layout: str  # "channels_first" or "interleaved"
    num_samples: int | None  # required by the batch functions
    backend: str  # "auto", "symphonia" or "ffmpeg"
    limits: dict[str, int] | None

class _AudioBatchOptions(_AudioOptions, total=False):
    strict: bool
    num_threads: int | None  # None: all cores in the function, 1 in the op

class _DemuxOptions(TypedDict, total=False):
    start: float | None
    duration: float | None
    limits: dict[str, int] | None

class _DecodeOptions(TypedDict, total=False):
    fps: float | None
    every_k: int | None
    num_frames: int | None
    width: int | None
    height: int | None
    pix_fmt: str  # "rgb24" or "gray"
    filter: str  # "bicubic", "bilinear", "nearest" or "area"
    threads: int

class _VideoOptions(_DemuxOptions, _DecodeOptions, total=False): ...

class _ClipOutputOptions(TypedDict, total=False):
    width: int | None
    height: int | None
    pix_fmt: str  # "rgb24" or "gray"
    filter: str  # "bicubic", "bilinear", "nearest" or "area"
    policy: str  # "error", "repeat_last" or "wrap"
    threads: int
    skip_unused: bool
    limits: dict[str, int] | None

class _ClipOptions(_ClipOutputOptions, total=False):
    stride: int
    fps: float | None
    by: str  # "index" or "time"

class _ClipBatchOptions(_ClipOptions, total=False):
    sampler: str | None  # "random_indices", "regular_indices", "random_timestamps", "regular_timestamps", "all_at_fps"
    num_clips: int | None
    seed: int
    num_threads: int | None  # None: all cores in the function, 1 in the op

def load_image(path: str | PathLike[str], **options: Unpack[_ImageOptions]) -> Buffer:
    """Decodes one image file into an HWC ``uint8`` buffer (GIL released)."""

def decode_image(data: bytes | _BufferLike, *, name: str = "<bytes>", **options: Unpack[_ImageOptions]) -> Buffer:
    """Decodes one encoded image into an HWC ``uint8`` buffer (GIL released)."""

def decode_memory_budget() -> int:
    """The process-wide decode memory budget, in bytes."""

def set_decode_memory_budget(nbytes: int) -> None:
    """Sets the process-wide decode memory budget (at least 16 MiB)."""

def image_info(data: bytes | _BufferLike) -> tuple[str, int, int]:
    """``(format, width, height)`` from the header only."""

def load_image_batch(
    srcs: Sequence[str | PathLike[str] | bytes],
    width: int,
    height: int,
    *,
    return_info: bool = False,
    keys: Sequence[int] | None = None,
    **options: Unpack[_ImageBatchOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Decodes and resizes a batch of images into one ``[N, H, W, C]`` buffer, in parallel (GIL released).
    Non-strict failures leave zero slots and are logged on ``spdl_rs.io``; ``return_info=True`` returns
    ``(buffer, {"failures": [(index, item, message), ...]})``."""

def decode_image_op(**options: Unpack[_ImageOptions]) -> NativeOp:
    """The native op of :py:func:`decode_image`."""

def load_image_batch_op(width: int, height: int, **options: Unpack[_ImageBatchOptions]) -> NativeOp:
    """The native op of :py:func:`load_image_batch`."""

def load_audio(
    src: _Src, *, name: str | None = None, return_info: bool = False, **options: Unpack[_AudioOptions]
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Decodes one clip into a buffer ``[C, T]`` (or ``[T, C]``), GIL released; ``(buffer, info)`` with
    ``return_info=True``."""

def load_audio_batch(
    srcs: Sequence[_Src], *, return_info: bool = False, **options: Unpack[_AudioBatchOptions]
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Decodes clips into one buffer ``[N, C, T]`` (or ``[N, T, C]``), each padded or truncated to
    ``num_samples`` (required); ``(buffer, {"sample_rate", "num_samples", "failures"})`` with
    ``return_info=True``."""

def probe(src: _Src, *, name: str | None = None) -> dict[str, Any]:
    """What a media file holds (container, duration, streams), from its headers only (GIL released)."""

def load_audio_op(**options: Unpack[_AudioOptions]) -> NativeOp:
    """The native op of :py:func:`load_audio`."""

def load_audio_batch_op(**options: Unpack[_AudioBatchOptions]) -> NativeOp:
    """The native op of :py:func:`load_audio_batch`."""

@final
class AudioCodec:
    """The codec of an audio stream (SPDL's ``AudioCodec``)."""

    @property
    def name(self) -> str: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def num_channels(self) -> int: ...
    @property
    def sample_fmt(self) -> str: ...
    @property
    def time_base(self) -> tuple[int, int]: ...
    @property
    def channel_layout(self) -> str: ...

@final
class VideoCodec:
    """The codec of a video stream (SPDL's ``VideoCodec``)."""

    @property
    def name(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def pix_fmt(self) -> str: ...
    @property
    def frame_rate(self) -> tuple[int, int]: ...
    @property
    def time_base(self) -> tuple[int, int]: ...
    @property
    def sample_aspect_ratio(self) -> tuple[int, int]: ...

@final
class ImageCodec:
    """The codec of an image (SPDL's ``ImageCodec``)."""

    @property
    def name(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def pix_fmt(self) -> str: ...
    @property
    def time_base(self) -> tuple[int, int]: ...
    @property
    def sample_aspect_ratio(self) -> tuple[int, int]: ...

@final
class AudioPackets:
    """Packets of an audio stream (SPDL's ``AudioPackets``); a decode consumes them."""

    @property
    def item(self) -> str: ...
    @property
    def codec(self) -> AudioCodec: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def decodable(self) -> bool: ...
    @property
    def timestamp(self) -> tuple[float, float] | None: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def num_channels(self) -> int: ...
    def clone(self) -> AudioPackets: ...
    def __len__(self) -> int: ...
    def __getstate__(self) -> bytes: ...
    def __reduce__(self) -> tuple[object, tuple[bytes]]: ...
    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview) -> AudioPackets: ...
    @staticmethod
    def deserialize_view(data: bytes | bytearray | memoryview) -> AudioPackets: ...

@final
class VideoPackets:
    """Packets of a video stream (SPDL's ``VideoPackets``; ``spdl_rs.io.Packets``); a decode consumes them."""

    @property
    def item(self) -> str: ...
    @property
    def codec(self) -> VideoCodec: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def decodable(self) -> bool: ...
    @property
    def timestamp(self) -> tuple[float, float] | None: ...
    @property
    def timestamps(self) -> list[float]:
        """Presentation times (seconds) of the frames a full decode of the window yields."""
    def get_timestamps(self, *, raw: bool = False) -> list[float]: ...
    @property
    def pix_fmt(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def frame_rate(self) -> tuple[int, int]: ...
    def clone(self) -> VideoPackets: ...
    def __len__(self) -> int: ...
    def __getstate__(self) -> bytes: ...
    def __reduce__(self) -> tuple[object, tuple[bytes]]: ...
    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview) -> VideoPackets: ...
    @staticmethod
    def deserialize_view(data: bytes | bytearray | memoryview) -> VideoPackets: ...

@final
class ImagePackets:
    """The packet of an image (SPDL's ``ImagePackets``); a decode consumes it."""

    @property
    def item(self) -> str: ...
    @property
    def codec(self) -> ImageCodec: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def decodable(self) -> bool: ...
    @property
    def pix_fmt(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    def clone(self) -> ImagePackets: ...
    def __len__(self) -> int: ...
    def __getstate__(self) -> bytes: ...
    def __reduce__(self) -> tuple[object, tuple[bytes]]: ...
    @staticmethod
    def deserialize(data: bytes | bytearray | memoryview) -> ImagePackets: ...
    @staticmethod
    def deserialize_view(data: bytes | bytearray | memoryview) -> ImagePackets: ...

@final
class AudioFrames:
    """Decoded audio (SPDL's ``AudioFrames``)."""

    @property
    def num_frames(self) -> int: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def num_channels(self) -> int: ...
    @property
    def sample_fmt(self) -> str: ...
    def clone(self) -> AudioFrames: ...
    def __len__(self) -> int: ...

@final
class VideoFrames:
    """Decoded video frames (SPDL's ``VideoFrames``)."""

    @property
    def num_frames(self) -> int: ...
    @property
    def num_planes(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def pix_fmt(self) -> str: ...
    def get_timestamps(self) -> list[float]: ...
    def get_pts(self) -> list[int]: ...
    @property
    def time_base(self) -> tuple[int, int]: ...
    def clone(self) -> VideoFrames: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int, /) -> ImageFrames: ...
    @overload
    def __getitem__(self, key: slice | Sequence[int], /) -> VideoFrames: ...

@final
class ImageFrames:
    """One decoded image (SPDL's ``ImageFrames``)."""

    @property
    def num_planes(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def pix_fmt(self) -> str: ...
    @property
    def metadata(self) -> dict[str, str]: ...
    @property
    def pts(self) -> float: ...
    def clone(self) -> ImageFrames: ...

_Codec = AudioCodec | VideoCodec | ImageCodec
_AnyPackets = AudioPackets | VideoPackets | ImagePackets
_AnyFrames = AudioFrames | VideoFrames | ImageFrames

@final
class MediaDemuxer:
    """A source kept open (``spdl_rs.io.Demuxer`` wraps it)."""

    def __new__(
        cls,
        src: _Src,
        *,
        name: str | None = None,
        format: str | None = None,
        format_options: dict[str, str] | None = None,
        limits: dict[str, int] | None = None,
    ) -> MediaDemuxer: ...
    @property
    def item(self) -> str: ...
    def demux(self, kind: str, window: tuple[float, float] | None = None) -> Any: ...
    def stream_index(self, kind: str) -> int | None: ...
    def codec(self, kind: str) -> Any: ...
    def start_streaming(
        self, indices: Sequence[int], *, num_packets: int | None = None, duration: float | None = None
    ) -> None: ...
    def next_chunk(self) -> dict[int, Any] | None: ...
    def close(self) -> None: ...

@final
class MediaDecoder:
    """A streaming decoder (``spdl_rs.io.Decoder`` wraps it)."""

    def __new__(
        cls,
        codec: _Codec,
        *,
        filter_desc: str | None = None,
        decoder: str | None = None,
        decoder_options: dict[str, str] | None = None,
        limits: dict[str, int] | None = None,
    ) -> MediaDecoder: ...
    def decode(self, packets: _AnyPackets) -> Any: ...
    def flush(self) -> Any: ...

@final
class MediaBSF:
    """A bitstream filter chain (``spdl_rs.io.BSF`` wraps it)."""

    def __new__(cls, codec: _Codec, bsf: str) -> MediaBSF: ...
    def filter(self, packets: _AnyPackets, *, flush: bool = False) -> Any: ...
    def flush(self) -> Any: ...

@final
class FilterGraph:
    """An FFmpeg filter graph (SPDL's ``FilterGraph``)."""

    def __new__(cls, filter_desc: str) -> FilterGraph: ...
    def add_frames(self, frames: _AnyFrames, *, key: str | None = None) -> None: ...
    def flush(self) -> None: ...
    def get_frames(self, *, key: str | None = None) -> _AnyFrames | None: ...
    def dump(self) -> str: ...

@final
class AudioEncodeConfig:
    """How to encode audio (SPDL's ``AudioEncodeConfig``; see ``spdl_rs.io.audio_encode_config``)."""

    def __new__(
        cls,
        *,
        num_channels: int,
        sample_rate: int,
        sample_fmt: str | None = None,
        bit_rate: int = ...,
        compression_level: int = ...,
        qscale: int = ...,
    ) -> AudioEncodeConfig: ...
    @property
    def num_channels(self) -> int: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def sample_fmt(self) -> str | None: ...
    @property
    def bit_rate(self) -> int: ...
    @property
    def compression_level(self) -> int: ...
    @property
    def qscale(self) -> int: ...

@final
class VideoEncodeConfig:
    """How to encode video (SPDL's ``VideoEncodeConfig``; see ``spdl_rs.io.video_encode_config``)."""

    def __new__(
        cls,
        *,
        height: int,
        width: int,
        frame_rate: tuple[int, int] | None = None,
        pix_fmt: str | None = None,
        bit_rate: int = ...,
        compression_level: int = ...,
        qscale: int = ...,
        gop_size: int = ...,
        max_b_frames: int = ...,
        colorspace: str | None = None,
        color_primaries: str | None = None,
        color_trc: str | None = None,
    ) -> VideoEncodeConfig: ...
    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def frame_rate(self) -> tuple[int, int] | None: ...
    @property
    def pix_fmt(self) -> str | None: ...
    @property
    def bit_rate(self) -> int: ...
    @property
    def compression_level(self) -> int: ...
    @property
    def qscale(self) -> int: ...
    @property
    def gop_size(self) -> int: ...
    @property
    def max_b_frames(self) -> int: ...
    @property
    def colorspace(self) -> str | None: ...
    @property
    def color_primaries(self) -> str | None: ...
    @property
    def color_trc(self) -> str | None: ...

@final
class AudioEncoder:
    """Encodes audio frames into the packets of one muxer stream (SPDL's ``AudioEncoder``)."""

    def encode(self, frames: AudioFrames, /) -> AudioPackets | None: ...
    def flush(self) -> AudioPackets | None: ...
    @property
    def frame_size(self) -> int:
        """Samples per channel each frame must hold (only the last may hold fewer); ``0``: any."""

@final
class VideoEncoder:
    """Encodes video frames into the packets of one muxer stream (SPDL's ``VideoEncoder``)."""

    def encode(self, frames: VideoFrames, /) -> VideoPackets | None: ...
    def flush(self) -> VideoPackets | None: ...

@final
class MediaMuxer:
    """A container being written (``spdl_rs.io.Muxer`` wraps it)."""

    def __new__(cls, dst: str | PathLike[str], *, format: str | None = None) -> MediaMuxer: ...
    @property
    def dst(self) -> str: ...
    @property
    def num_streams(self) -> int: ...
    def add_encode_stream(
        self,
        config: AudioEncodeConfig | VideoEncodeConfig,
        *,
        encoder: str | None = None,
        encoder_config: dict[str, str] | None = None,
    ) -> AudioEncoder | VideoEncoder: ...
    def add_remux_stream(self, codec: _Codec) -> int: ...
    def open(self, muxer_config: dict[str, str] | None = None) -> None: ...
    def write(self, stream_index: int, packets: _AnyPackets) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...

def media_decode_packets(
    packets: _AnyPackets,
    *,
    filter_desc: str | None = None,
    decoder: str | None = None,
    decoder_options: dict[str, str] | None = None,
    num_frames: int = ...,
) -> Any: ...
def convert_frames(frames: Any) -> Buffer: ...
def reference_video_frame(
    data: bytes, shape: Sequence[int], itemsize: int, *, pix_fmt: str, frame_rate: tuple[int, int], pts: int,
    source: object = None,
) -> VideoFrames: ...
def reference_audio_frame(
    data: bytes, shape: Sequence[int], itemsize: int, *, sample_fmt: str, sample_rate: int, pts: int,
    source: object = None,
) -> AudioFrames: ...
def split_packets_at_indices(packets: VideoPackets, indices: Sequence[int]) -> list[tuple[VideoPackets, list[int]]]: ...
def concat_video_frames(a: VideoFrames, b: VideoFrames) -> VideoFrames: ...
def encode_image_file(
    path: str | PathLike[str],
    data: bytes,
    width: int,
    height: int,
    color: str,
    *,
    quality: int | None = None,
    compression: int | None = None,
) -> None: ...

def load_video(
    src: _Src, *, name: str | None = None, return_info: bool = False, **options: Unpack[_VideoOptions]
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Demuxes and decodes a video into a ``uint8`` buffer ``[N, H, W, C]`` (GIL released); ``(buffer,
    {"pts", "frame_rate", "codec", "item"})`` with ``return_info=True``. Only in builds with ``HAS_VIDEO``."""

def demux_video(src: _Src, *, name: str | None = None, **options: Unpack[_DemuxOptions]) -> VideoPackets:
    """The packets the window needs, to decode later with :py:func:`decode_packets` (GIL released)."""

def decode_packets(
    packets: VideoPackets, *, return_info: bool = False, **options: Unpack[_DecodeOptions]
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Decodes (and consumes) packets into a ``uint8`` buffer ``[N, H, W, C]`` (GIL released)."""

def load_clips(
    src: _Src,
    starts: Sequence[float],
    *,
    num_frames: int,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Clips at ``starts`` into one ``uint8`` buffer ``[clips, num_frames, H, W, C]``, each GOP decoded once
    (GIL released). Only in builds with ``HAS_VIDEO``."""

def clips_at_random_indices(
    src: _Src,
    num_clips: int,
    num_frames: int,
    *,
    seed: int = 0,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Clips at seeded random start indices (sorted), as :py:func:`load_clips`."""

def clips_at_regular_indices(
    src: _Src,
    num_clips: int,
    num_frames: int,
    *,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Clips at evenly spaced start indices, as :py:func:`load_clips`."""

def clips_at_random_timestamps(
    src: _Src,
    num_clips: int,
    num_frames: int,
    *,
    seed: int = 0,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Clips at seeded random start times (sorted), as :py:func:`load_clips`."""

def clips_at_regular_timestamps(
    src: _Src,
    num_clips: int,
    num_frames: int,
    *,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """Clips at evenly spaced start times, as :py:func:`load_clips`."""

def clips_at_fps(
    src: _Src,
    fps: float,
    num_frames: int,
    *,
    name: str | None = None,
    return_info: bool = False,
    **options: Unpack[_ClipOutputOptions],
) -> Buffer | tuple[Buffer, dict[str, Any]]:
    """The whole video at ``fps`` in consecutive clips, as :py:func:`load_clips`."""

def load_clips_batch(
    srcs: Sequence[_Src], starts: Sequence[Any] | None = None, *, num_frames: int, **options: Unpack[_ClipBatchOptions]
) -> Buffer:
    """Clips of many videos into one ``uint8`` buffer ``[B, clips, num_frames, H, W, C]`` (GIL released)."""

def load_clips_op(
    *, num_frames: int, starts: Sequence[float] | None = None, **options: Unpack[_ClipBatchOptions]
) -> NativeOp:
    """The native op of :py:func:`load_clips` (items: videos, or ``(src, starts)`` pairs)."""

def load_clips_batch_op(
    *, num_frames: int, starts: Sequence[Any] | None = None, **options: Unpack[_ClipBatchOptions]
) -> NativeOp:
    """The native op of :py:func:`load_clips_batch` (items: lists of videos)."""

def load_video_op(**options: Unpack[_VideoOptions]) -> NativeOp:
    """The native op of :py:func:`load_video`."""

def demux_video_op(**options: Unpack[_DemuxOptions]) -> NativeOp:
    """The native op of :py:func:`demux_video` (outputs :py:class:`VideoPackets`)."""

def decode_packets_op(**options: Unpack[_DecodeOptions]) -> NativeOp:
    """The native op of :py:func:`decode_packets`."""

HAS_SOURCE: bool
"""Whether this build has :py:mod:`spdl_rs.source` (the ``source`` cargo feature)."""

@final
class Sampler:
    """A deterministic order of indices per epoch (same configuration and epoch, same order everywhere)."""

    @staticmethod
    def sequential(n: int) -> Sampler:
        """``0..n`` every epoch."""
    @staticmethod
    def shuffled(n: int, seed: int) -> Sampler:
        """A permutation of ``0..n`` from ``(seed, epoch)``."""
    @staticmethod
    def weighted(weights: Sequence[float], num_samples: int, seed: int) -> Sampler:
        """Indices drawn with replacement, proportionally to ``weights``."""
    def sharded(self, rank: int, world_size: int, *, drop_remainder: bool = False) -> Sampler:
        """This sampler's share for ``rank`` of ``world_size``."""
    def order(self, epoch: int = 0) -> list[int]:
        """The indices of ``epoch``."""
    @property
    def seed(self) -> int:
        """The seed (0 if it does not shuffle)."""
    def __len__(self) -> int:
        """Indices per epoch."""

@final
class ElasticSampler:
    """One rank's share of a dataset's epochs over a canonical-partition order (the same for every world
    size); checkpointable, and resumable at another world size."""

    def __new__(
        cls,
        n: int,
        /,
        *,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        num_partitions: int = ...,
        drop_remainder: bool = False,
    ) -> ElasticSampler: ...
    def __iter__(self) -> Iterator[int]:
        """This rank's indices for the current epoch; then moves to the next epoch."""
    def __len__(self) -> int:
        """Indices the next iteration yields (the same on every rank)."""
    def num_batches(self, batch_size: int, *, drop_last: bool = False) -> int:
        """Batches the next iteration makes on every rank."""
    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields."""
    def set_epoch(self, epoch: int) -> None:
        """Moves to the start of ``epoch``."""
    def state_dict(self) -> dict[str, Any]:
        """The state the next iteration starts from."""
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a state from :py:meth:`state_dict`."""
    @staticmethod
    def merge_progress(start: dict[str, Any], delivered: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        """``start`` with what the ranks delivered (positions in their shares) added."""

@final
class Store:
    """An object store (local directory, HTTP(S) base URL, ``s3://bucket/prefix``) read without the GIL.

    A missing object raises ``FileNotFoundError``, a refused one ``PermissionError``, a read that still fails
    after its retries ``OSError``; each names the object's full address.
    """

    @staticmethod
    def open(
        url: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        max_attempts: int | None = None,
        max_in_flight: int = ...,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        force_path_style: bool | None = None,
        attempt_timeout: float | None = ...,  # 600.0
        max_object_size: int | None = None,
        follow_symlinks_outside_root: bool = False,
        special_file_limit: int | None = None,
    ) -> Store:
        """Opens the store ``url`` names; raises if its backend is not in this build or it cannot be reached.

        ``endpoint``, ``region``, ``access_key``/``secret_key`` and ``force_path_style`` configure ``s3://``
        stores (S3-compatible servers); unset, they come from the standard AWS chain. ``attempt_timeout`` caps
        one whole request (``None``: no cap); ``max_object_size`` (default 2 GiB) refuses larger objects. Local
        directories only: ``follow_symlinks_outside_root`` and ``special_file_limit`` (bytes read from FIFOs,
        devices and sockets; ``None`` refuses them).
        """
    def get(self, key: str) -> bytes:
        """The whole object ``key``."""
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start..end`` of ``key`` (``end`` past the size is clipped)."""
    def size(self, key: str) -> int:
        """The size of ``key`` in bytes, without reading it."""
    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """``(key, size)`` of every object under ``prefix``, in key order."""
    def get_many(self, keys: Sequence[str], *, concurrency: int = ...) -> builtins.list[bytes]:
        """The objects ``keys``, fetched ``concurrency`` at a time, in the order of ``keys``."""
    def get_op(self) -> NativeOp:
        """A native pipeline op: each item (a key) becomes the object's ``bytes``, awaited in Rust without the
        GIL (``builder.pipe(store.get_op(), concurrency=32)``); a failed key fails that item, naming it."""
    @property
    def url(self) -> str:
        """The address the store was opened with."""

def list_dataset(
    root: str | PathLike[str], *, extensions: Sequence[str] = ..., layout: Literal["class_folders", "flat"] = "class_folders"
) -> tuple[list[str], list[int | None], list[str]]:
    """``(keys, labels, classes)`` of a dataset directory, keys sorted."""

@final
class ImageLoader:
    """The image-loading recipe: batches of images from a directory, a list file or an object store."""

    def __new__(
        cls,
        path: str,
        *,
        batch_size: int = 32,
        num_threads: int = 4,
        io_concurrency: int | None = None,
        epochs: int = 1,
        size: int = 224,
        transform: str = "center-crop",  # "center-crop", "resize" or "random-resized-crop"
        seed: int = 0,
        normalize: bool = False,
        layout: str = "NHWC",  # or "NCHW"
        store: str | None = None,
        endpoint: str | None = None,
        limit: int | None = None,
    ) -> ImageLoader: ...
    def __iter__(self) -> ImageLoader: ...
    def __next__(self) -> tuple[Buffer, list[int]]: ...
    @property
    def images_per_epoch(self) -> int: ...
    @property
    def failed_images(self) -> int: ...
    def stats_table(self) -> str: ...
    def stop(self) -> None: ...

@final
class ClipLoader:
    """The video-clip recipe: batches of clips ``[B, clips, T, H, W, 3]`` from a directory of videos. Only in
    builds with ``HAS_VIDEO``."""

    def __new__(
        cls,
        path: str,
        *,
        batch_size: int = 8,
        num_threads: int = 4,
        io_concurrency: int | None = None,
        epochs: int = 1,
        num_clips: int = 4,
        num_frames: int = 16,
        size: int = 112,
        sampling: str = "random",  # or "regular"
        seed: int = 0,
        store: str | None = None,
        endpoint: str | None = None,
        limit: int | None = None,
    ) -> ClipLoader: ...
    def __iter__(self) -> ClipLoader: ...
    def __next__(self) -> tuple[Buffer, list[int]]: ...
    @property
    def videos_per_epoch(self) -> int: ...
    @property
    def failed_videos(self) -> int: ...
    def stats_table(self) -> str: ...
    def stop(self) -> None: ...

# `spdl_rs.io`'s host/device memory (the `cuda` feature; wrapped by `spdl_rs.io._cuda`). The names below exist
# only in builds with ``HAS_CUDA``.
__all__ += [
    "HAS_CUDA",
    "CUDAUnavailableError",
    "CUDAConfig",
    "CPUStorage",
    "CUDABuffer",
    "cuda_device_count",
    "cuda_open",
    "cuda_cpu_storage",
    "cuda_pinned_buffer",
    "cuda_transfer_buffer",
    "cuda_transfer_buffer_cpu",
]

HAS_CUDA: bool
"""Whether this build has the ``cuda`` feature (spdl-cuda; the CUDA driver is looked for at run time)."""

class CUDAUnavailableError(RuntimeError):
    """No usable CUDA GPU: no ``cuda`` feature, no CUDA driver, no device, or an index beyond the devices."""

@final
class CUDAConfig:
    """The CUDA device of :py:func:`spdl_rs.io.transfer_buffer`, and SPDL's stream and allocator settings."""

    def __new__(
        cls,
        device_index: int,
        stream: int = 2,
        allocator: tuple[Any, Any] | None = None,
    ) -> CUDAConfig: ...
    @property
    def device_index(self) -> int:
        """The CUDA device ordinal."""
    @property
    def stream(self) -> int:
        """The CUDA stream handle given (kept for SPDL compatibility)."""
    @property
    def allocator(self) -> tuple[Any, Any] | None:
        """The ``(allocate, delete)`` pair given, or ``None``."""

@final
class CPUStorage:
    """Host memory from :py:func:`spdl_rs.io.cpu_storage` (page-locked or ordinary)."""

    @property
    def size(self) -> int:
        """Size in bytes."""
    @property
    def pinned(self) -> bool:
        """True if the memory is page-locked."""
    @property
    def buffer(self) -> Buffer:
        """The memory as a writable 1-D ``uint8`` :py:class:`Buffer` (shared, not copied)."""

@final
class CUDABuffer:
    """An array in CUDA device memory (``__cuda_array_interface__`` and DLPack)."""

    @property
    def device_index(self) -> int:
        """The CUDA device ordinal."""
    @property
    def shape(self) -> tuple[int, ...]:
        """The extent of each axis."""
    @property
    def dtype(self) -> str:
        """numpy's name of the element type."""
    @property
    def nbytes(self) -> int:
        """Size in bytes."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule (``kDLCUDA``) viewing the device memory in place."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, device_index)``."""

def cuda_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver)."""

def cuda_open(device_index: int) -> None:
    """Opens a device (its pinned pool and copy stream); ``CUDAUnavailableError`` if it cannot be used."""

def cuda_cpu_storage(size: int, pin_memory: bool = True) -> CPUStorage:
    """``size`` zeroed bytes, page-locked (device 0's pinned pool) or ordinary."""

def cuda_pinned_buffer(shape: Sequence[int], dtype: str, device_index: int) -> Buffer:
    """A zeroed buffer in the pinned pool of a device."""

def cuda_transfer_buffer(buffer: Buffer, *, device_config: CUDAConfig) -> CUDABuffer:
    """Copies a buffer to the device and waits for the copy."""

def cuda_transfer_buffer_cpu(buffer: CUDABuffer) -> Buffer:
    """Copies a device buffer back into a new host buffer."""

# `spdl_rs.io.iter_tarfile`'s native half (the `io` feature; wrapped by `spdl_rs.io._tar`).
__all__ += ["tar_index", "TarStream"]

def tar_index(data: bytes | _BufferLike) -> tuple[list[tuple[str, int, int]], str | None]:
    """The regular members of the TAR archive ``data`` as ``(path, offset, size)`` triples, in archive order, and
    the message of the error that ended the scan early (``None`` for a well-formed archive). One call; the GIL is
    released while scanning ``bytes`` (and, where the ABI has the buffer protocol, read-only buffers)."""

@final
class TarStream:
    """Iterator over the regular members of a TAR stream as ``(path, bytes)``, reading ``file.read(n)`` header by
    header and member by member; a malformed archive raises ``error_type(message)``."""

    def __new__(cls, file: Any, error_type: type[Exception]) -> TarStream: ...
    def __iter__(self) -> TarStream: ...
    def __next__(self) -> tuple[str, bytes]: ...
