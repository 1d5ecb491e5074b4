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

from typing import Any

from .. import _native
from .._lazy import lazy_attributes as _lazy_attributes
from .._native import HAS_VIDEO
from .._native.io import (
    decode_image,
    decode_memory_budget,
    encode_image,
    get_abuffer_desc,
    get_audio_filter_desc,
    get_buffer_desc,
    get_filter_desc,
    get_video_filter_desc,
    image_info,
    load_audio,
    load_audio_batch,
    load_image,
    load_image_batch,
    probe,
    save_image,
    set_decode_memory_budget,
)
from ._no_media import without_video


def has_video() -> bool:
    """Whether this build decodes video (the ``ffmpeg`` cargo feature). FFmpeg's libraries are found at
    run time: :py:func:`video_available` says whether this machine has them."""
    return bool(HAS_VIDEO)


def video_available() -> bool:
    """Whether video decoding works here: the build has it and FFmpeg's libraries were found (this loads
    them if no call did yet). ``spdl_rs.build_info()["ffmpeg"]["error"]`` says why not."""
    return bool(HAS_VIDEO) and bool(_native._ffmpeg_status()["available"])


if HAS_VIDEO:
    from .._native.io import VideoPackets as Packets
else:

    class Packets:  # type: ignore[no-redef]
        """Demuxed video packets (only made by a build with the ``ffmpeg`` feature)."""

        def __init__(self, *_args: object, **_kwargs: object) -> None:
            raise RuntimeError("spdl_rs was built without the `ffmpeg` feature")


# SPDL's demux_video/decode_packets, which take spdl_rs's window and frame sampler too: the native functions.
if HAS_VIDEO:
    from .._native.io import decode_packets, demux_video, load_video
else:
    load_video = without_video("spdl_rs.io.load_video")
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
    "encode_image",
    "get_abuffer_desc",
    "get_audio_filter_desc",
    "get_buffer_desc",
    "get_filter_desc",
    "get_video_filter_desc",
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
    "save_image",
    "set_decode_memory_budget",
    "to_numpy",
    "to_torch",
    *_LAZY,
]
