"""SPDL's encoding and muxing objects in spdl_rs.io (a build with the `ffmpeg` feature): Muxer, AudioEncoder,
VideoEncoder, audio_encode_config, video_encode_config.

Every medium is made here from numpy arrays (the remux source too, with the encoders under test; the ffmpeg CLI
only cross-checks one file when it is there), encoded, muxed, then demuxed and decoded back by spdl_rs.io and
compared with the arrays within the codec's tolerance. The constants named ``SPDL_*`` are what SPDL 0.8.0 did with
the same inputs on the same FFmpeg (Debian's 5.1), run side by side when these tests were written; CI has no
SPDL, so they are kept here. Where spdl_rs deliberately does otherwise, the test says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import numpy as np
import pytest

import spdl_rs.io as io
from spdl_rs import _native

pytestmark = pytest.mark.skipif(not io.has_video(), reason="built without the ffmpeg feature")

H, W, FPS, N = 64, 96, 30, 10
SR = 16_000

#: SPDL 0.8.0's default codec per container (``avcodec_find_encoder`` of the muxer's default), video and audio.
SPDL_DEFAULT_VIDEO_CODEC = {"mp4": "h264", "mkv": "h264", "avi": "mpeg4", "webm": "vp9"}
SPDL_DEFAULT_AUDIO_CODEC = {"wav": "pcm_s16le", "flac": "flac", "m4a": "aac", "mp4": "aac", "ogg": "vorbis",
                            "mp3": "mp3", "mkv": "vorbis"}
#: SPDL 0.8.0's ``AudioEncoder.frame_size`` for 2 channels at 16 kHz (libopus: 48 kHz): what FFmpeg's encoders ask.
SPDL_FRAME_SIZE = {"pcm_s16le": 0, "flac": 1152, "aac": 1024, "libvorbis": 64, "libmp3lame": 576, "libopus": 960}
#: The packet times (seconds, in packet order) SPDL 0.8.0's libx264 encoder gave for the 10 frames below as
#: yuv444p at 30 fps (all of them at flush: libx264 looks ahead); spdl_rs's are the same, and its MP4 is byte
#: for byte SPDL's.
SPDL_X264_PACKET_TIMES = [0.0, 0.1333, 0.0667, 0.0333, 0.1, 0.2667, 0.2, 0.1667, 0.2333, 0.3]
#: Mean absolute error (0-255) of the gradient clip below through libx264rgb, decoded to rgb24, in SPDL 0.8.0.
SPDL_X264RGB_MEAN_ABS_ERROR = 0.5877
#: Samples decoded from SPDL 0.8.0's AAC (m4a) of 16000 samples: the encoder's padding of the last frame stays.
SPDL_AAC_DECODED_SAMPLES = 16_384

#: Samples FFmpeg's AAC encoder puts before the first (its initial padding).
AAC_PRIMING = 1024
#: Round-trip bounds (mean absolute error) and what was measured when they were set.
VIDEO_BOUND = {"libx264": 4.0, "mpeg4": 4.0, "libvpx-vp9": 4.0, "libx264rgb": 1.5}  # 1.81, 1.75, 1.52, 0.59
AUDIO_BOUND = {"aac": 0.04, "libvorbis": 0.02, "libopus": 0.01, "libmp3lame": 0.03}  # 0.0187, 0.0056, 0.0018, 0.0127


def _clip(n: int = N) -> np.ndarray:
    """Smooth gradients (what lossy codecs keep well), different in every frame: ``[n, H, W, 3]`` uint8."""
    x = np.zeros((n, H, W, 3), np.uint8)
    x[..., 0] = np.linspace(0, 255, W, dtype=np.float32)[None, None, :].astype(np.uint8)
    x[..., 1] = np.linspace(0, 255, H, dtype=np.float32)[None, :, None].astype(np.uint8)
    x[..., 2] = (np.arange(n) * 20 % 256)[:, None, None]
    return x


def _tone(n: int, rate: int = SR) -> np.ndarray:
    """Two sines (440 Hz at 0.5, 660 Hz at 0.3), planar ``[2, n]`` float32."""
    t = np.arange(n) / rate
    return np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)


def _as_fmt(x: np.ndarray, fmt: str) -> np.ndarray:
    """Planar float samples ``[C, N]`` as an array for ``sample_fmt`` (``[N, C]`` for packed formats)."""
    base = fmt.rstrip("p")
    scaled = {"flt": x, "dbl": x.astype(np.float64), "s16": (x * 32767).astype(np.int16),
              "s32": (x * 2_147_483_647.0).astype(np.int32)}[base]
    return np.ascontiguousarray(scaled if fmt.endswith("p") else scaled.T)


def _encoder_or_skip(path, config, encoder: str | None):
    """A muxer and its encoder, skipping when this FFmpeg lacks the encoder (or the container's default)."""
    muxer = io.Muxer(path)
    try:
        enc = muxer.add_encode_stream(config, encoder=encoder)
    except ValueError as e:
        if "has no encoder" in str(e):
            pytest.skip(str(e))
        raise
    return muxer, enc


def _write_all(muxer, index: int, *packets) -> int:
    n = 0
    for p in packets:
        if p is not None:
            muxer.write(index, p)
            n += len(p)
    return n


def _encode_video(path, clip: np.ndarray, *, encoder=None, pix_fmt="rgb24", chunk: int = 5, **config):
    """Encodes ``clip`` (``[N, H, W, 3]`` rgb24, or ``[N, 3, H, W]`` yuv444p) into ``path``; the packets' times."""
    cfg = io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1), pix_fmt=pix_fmt, **config)
    muxer, enc = _encoder_or_skip(path, cfg, encoder)
    times: list[float] = []
    with muxer.open():
        for i in range(0, len(clip), chunk):
            frames = io.create_reference_video_frame(clip[i : i + chunk], pix_fmt=pix_fmt, frame_rate=(FPS, 1), pts=i)
            p = enc.encode(frames)
            if p is not None:
                times += p.get_timestamps(raw=True)
                muxer.write(0, p)
        p = enc.flush()
        if p is not None:
            times += p.get_timestamps(raw=True)
            muxer.write(0, p)
    return times


def _encode_audio(path, x: np.ndarray, fmt: str, *, encoder=None, rate: int = SR) -> int:
    """Encodes planar float samples ``x`` as ``fmt`` into ``path``, in frames of the encoder's frame_size."""
    cfg = io.audio_encode_config(num_channels=x.shape[0], sample_rate=rate, sample_fmt=fmt)
    muxer, enc = _encoder_or_skip(path, cfg, encoder)
    data = _as_fmt(x, fmt)
    step = enc.frame_size or x.shape[1]
    with muxer.open():
        for s in range(0, x.shape[1], step):
            part = data[:, s : s + step] if fmt.endswith("p") else data[s : s + step]
            frames = io.create_reference_audio_frame(np.ascontiguousarray(part), sample_fmt=fmt, sample_rate=rate, pts=s)
            _write_all(muxer, 0, enc.encode(frames))
        _write_all(muxer, 0, enc.flush())
    return enc.frame_size


def _decode_video(path) -> np.ndarray:
    return np.asarray(io.convert_frames(io.decode_packets(io.demux_video(str(path)))))


def _decode_audio(path, raw: bool = False) -> np.ndarray:
    """The samples of ``path``: ``fltp`` ``[C, N]`` (SPDL's default filter), or as the decoder gives them."""
    packets = io.demux_audio(str(path))
    frames = io.decode_packets(packets, filter_desc=None) if raw else io.decode_packets(packets)
    return np.asarray(io.convert_frames(frames))


def _mae(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


# ---------------------------------------------------------------------------------------------- configs


def test_config_factories_have_spdl_defaults():
    a = io.audio_encode_config(num_channels=2, sample_rate=44_100)
    assert isinstance(a, io.AudioEncodeConfig)
    assert (a.num_channels, a.sample_rate, a.sample_fmt) == (2, 44_100, "fltp")
    assert (a.bit_rate, a.compression_level, a.qscale) == (-1, -1, -1)
    v = io.video_encode_config(height=48, width=64)
    assert isinstance(v, io.VideoEncodeConfig)
    assert (v.height, v.width, v.frame_rate, v.pix_fmt) == (48, 64, None, "rgb24")
    assert (v.bit_rate, v.compression_level, v.qscale, v.gop_size, v.max_b_frames) == (-1,) * 5
    assert (v.colorspace, v.color_primaries, v.color_trc) == (None, None, None)
    assert "frame_rate=None" in repr(v) and "sample_fmt=\"fltp\"" in repr(a)
    assert io.video_encode_config(height=2, width=2, frame_rate=(30000, 1001)).frame_rate == (30000, 1001)


@pytest.mark.parametrize(
    "kwargs",
    [dict(height=0, width=64), dict(height=48, width=-1), dict(height=48, width=64, frame_rate=(0, 1)),
     dict(height=48, width=64, bit_rate=-2), dict(height=48, width=64, gop_size=2**40), dict(height=1 << 20, width=8)],
)
def test_video_config_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        io.video_encode_config(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(num_channels=0, sample_rate=SR), dict(num_channels=2, sample_rate=0),
                                    dict(num_channels=65, sample_rate=SR), dict(num_channels=1, sample_rate=SR, qscale=-5)])
def test_audio_config_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        io.audio_encode_config(**kwargs)


# ------------------------------------------------------------------------------------- video round trips


@pytest.mark.parametrize(
    "ext, encoder, pix_fmt",
    [("mp4", "libx264", "rgb24"), ("mkv", "libx264", "rgb24"), ("mp4", "mpeg4", "rgb24"), ("avi", None, "rgb24"),
     ("mkv", "libx264rgb", "rgb24"), ("webm", "libvpx-vp9", "rgb24"), ("mkv", "mpeg4", "yuv444p")],
)
def test_video_round_trip(tmp_path, ext, encoder, pix_fmt):
    clip = _clip()
    src = clip if pix_fmt == "rgb24" else np.ascontiguousarray(clip.transpose(0, 3, 1, 2))
    path = tmp_path / f"v.{ext}"
    times = _encode_video(path, src, encoder=encoder, pix_fmt=pix_fmt)
    assert sorted(times) == pytest.approx([i / FPS for i in range(N)])
    out = _decode_video(path)
    assert out.shape == (N, H, W, 3) and out.dtype == np.uint8
    frames = io.decode_packets(io.demux_video(str(path)))
    assert frames.get_timestamps() == pytest.approx([i / FPS for i in range(N)], abs=1e-3)
    if pix_fmt == "rgb24":
        err = _mae(out, clip)
        assert err < VIDEO_BOUND[encoder or "mpeg4"], err
    else:
        # yuv444p frames hold the clip's bytes as Y, U and V planes: compare in that space.
        back = np.asarray(io.convert_frames(io.decode_packets(io.demux_video(str(path)), filter_desc="format=yuv444p")))
        assert _mae(back, src) < VIDEO_BOUND["mpeg4"]


def test_rgb24_into_libx264_is_converted_where_spdl_refuses(tmp_path):
    """SPDL 0.8.0 raises "`libx264` does not support the pixel format `rgb24`" at add_encode_stream (and the
    same for mpeg4): its frames must already be in a format the encoder takes. spdl_rs converts them with
    swscale into the encoder's first format (yuv420p for both)."""
    cfg = io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1))
    for name in ("libx264", "mpeg4"):
        muxer, enc = _encoder_or_skip(tmp_path / f"{name}.mkv", cfg, name)
        with muxer.open():
            frames = io.create_reference_video_frame(_clip(), pix_fmt="rgb24", frame_rate=(FPS, 1), pts=0)
            _write_all(muxer, 0, enc.encode(frames), enc.flush())
        assert io.demux_video(str(tmp_path / f"{name}.mkv")).pix_fmt == "yuv420p"


def test_libx264_packets_match_spdl(tmp_path):
    yuv = np.ascontiguousarray(_clip().transpose(0, 3, 1, 2))  # the planes as yuv444p: what SPDL takes as is
    times = _encode_video(tmp_path / "x.mp4", yuv, encoder="libx264", pix_fmt="yuv444p")
    assert times == pytest.approx(SPDL_X264_PACKET_TIMES, abs=1e-3)


def test_libx264rgb_error_matches_spdl(tmp_path):
    _encode_video(tmp_path / "x.mkv", _clip(), encoder="libx264rgb")
    assert _mae(_decode_video(tmp_path / "x.mkv"), _clip()) == pytest.approx(SPDL_X264RGB_MEAN_ABS_ERROR, abs=0.05)


def test_video_settings_reach_the_stream(tmp_path):
    path = tmp_path / "gop.mp4"
    _encode_video(path, _clip(20), encoder="mpeg4", gop_size=5, max_b_frames=0, bit_rate=400_000, chunk=20)
    packets = io.demux_video(str(path))
    assert len(packets) == 20
    # One split per keyframe: a keyframe every gop_size frames.
    assert len(_native.io.split_packets_at_indices(packets, list(range(20)))) == 4
    info = io.probe(str(path))["streams"][0]
    assert info["codec"] == "mpeg4" and info["num_frames"] == 20 and info["frame_rate"] == pytest.approx(FPS)


def test_colorspace_converts_rgb_with_its_matrix(tmp_path):
    path = tmp_path / "bt709.mp4"
    _encode_video(path, _clip(), encoder="mpeg4", colorspace="bt709", color_primaries="bt709", color_trc="bt709")
    # The decoder's filter graph reads the stream's bt709 matrix: the round trip stays as close as BT.601's.
    assert _mae(_decode_video(path), _clip()) < VIDEO_BOUND["mpeg4"]
    if shutil.which("ffprobe"):
        out = subprocess.run(["ffprobe", "-v", "error", "-show_streams", "-of", "json", str(path)],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        stream = json.loads(out)["streams"][0]
        assert stream.get("color_space") == "bt709" and stream.get("color_primaries") == "bt709"


@pytest.mark.parametrize("ext", sorted(SPDL_DEFAULT_VIDEO_CODEC))
def test_default_video_codec_per_container_is_spdls(tmp_path, ext):
    _encode_video(tmp_path / f"d.{ext}", _clip())
    assert io.demux_video(str(tmp_path / f"d.{ext}")).codec.name == SPDL_DEFAULT_VIDEO_CODEC[ext]


def test_encoded_packets_decode_without_a_container(tmp_path):
    """SPDL's encoder packets have ``codec=None``; spdl_rs's carry the encoder's codec, so they decode as they
    are (and stay usable after a write: writing does not consume them)."""
    cfg = io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1))
    muxer, enc = _encoder_or_skip(tmp_path / "p.avi", cfg, "mpeg4")
    frames = io.create_reference_video_frame(_clip(), pix_fmt="rgb24", frame_rate=(FPS, 1), pts=0)
    packets = enc.encode(frames)
    assert packets is not None and packets.codec.name == "mpeg4" and packets.codec.time_base == (1, FPS)
    assert (packets.width, packets.height, packets.pix_fmt) == (W, H, "yuv420p")
    with muxer.open():
        muxer.write(0, packets)
        _write_all(muxer, 0, enc.flush())
    assert len(frames) == N  # encoding did not consume the frames
    decoded = np.asarray(io.convert_frames(io.decode_packets(packets)))
    assert decoded.shape[1:] == (H, W, 3) and _mae(decoded, _clip()[: len(decoded)]) < VIDEO_BOUND["mpeg4"]


# ------------------------------------------------------------------------------------- audio round trips


@pytest.mark.parametrize("ext, encoder, fmt", [("wav", None, "s16"), ("wav", "pcm_f32le", "flt"),
                                               ("flac", None, "s16"), ("flac", None, "s32")])
def test_lossless_audio_is_exact(tmp_path, ext, encoder, fmt):
    x = _tone(SR)
    path = tmp_path / f"a.{ext}"
    _encode_audio(path, x, fmt, encoder=encoder)
    out = _decode_audio(path, raw=True)
    expected = _as_fmt(x, fmt)
    if fmt == "s32":  # FLAC keeps 24 of the 32 bits: exact to 1 << 8
        assert out.shape == expected.shape and np.abs(out.astype(np.int64) - expected).max() < 256
    else:
        assert out.shape == expected.shape and out.dtype == expected.dtype and np.array_equal(out, expected)


@pytest.mark.parametrize("ext, encoder, fmt, rate", [("m4a", "aac", "fltp", 48_000), ("ogg", "libvorbis", "fltp", SR),
                                                     ("opus", "libopus", "flt", 48_000),
                                                     ("mp3", "libmp3lame", "fltp", SR)])
def test_lossy_audio_round_trip(tmp_path, ext, encoder, fmt, rate):
    x = _tone(rate, rate)
    path = tmp_path / f"a.{ext}"
    frame_size = _encode_audio(path, x, fmt, encoder=encoder, rate=rate)
    assert frame_size == SPDL_FRAME_SIZE[encoder]
    out = _decode_audio(path)  # fltp
    assert out.shape[0] == 2 and abs(out.shape[1] - rate) <= 1152, out.shape
    n = min(out.shape[1], rate)
    err = _mae(out[:, :n], x[:, :n])
    assert err < AUDIO_BOUND[encoder], err


def test_aac_keeps_spdls_length(tmp_path):
    _encode_audio(tmp_path / "a.m4a", _tone(SR), "fltp")
    assert _decode_audio(tmp_path / "a.m4a").shape == (2, SPDL_AAC_DECODED_SAMPLES)


@pytest.mark.parametrize("ext", sorted(SPDL_DEFAULT_AUDIO_CODEC))
def test_default_audio_codec_per_container_is_spdls(tmp_path, ext):
    codec = SPDL_DEFAULT_AUDIO_CODEC[ext]
    fmt = {"pcm_s16le": "s16", "flac": "s16"}.get(codec, "fltp")
    muxer = io.Muxer(tmp_path / f"d.{ext}")
    try:
        enc = muxer.add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR, sample_fmt=fmt))
    except ValueError as e:
        if "has no encoder" in str(e) or "does not take sample format" in str(e):
            pytest.skip(str(e))  # an FFmpeg built without that container's default encoder
        raise
    if codec in ("pcm_s16le", "flac", "aac"):
        assert enc.frame_size == {"pcm_s16le": 0, "flac": 1152, "aac": 1024}[codec]
    muxer.close()


def test_audio_frames_must_be_sliced_to_frame_size(tmp_path):
    """As in SPDL 0.8.0 (FFmpeg's rule): each frame holds frame_size samples, only the last may hold fewer."""
    muxer = io.Muxer(tmp_path / "a.m4a")
    enc = muxer.add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR))
    assert enc.frame_size == 1024
    muxer.open()
    whole = io.create_reference_audio_frame(_tone(4000), sample_fmt="fltp", sample_rate=SR, pts=0)
    with pytest.raises(ValueError, match="frame_size"):
        enc.encode(whole)
    x = _tone(2548)
    for s, n in ((0, 1024), (1024, 1024), (2048, 500)):
        frames = io.create_reference_audio_frame(np.ascontiguousarray(x[:, s : s + n]), sample_fmt="fltp",
                                                 sample_rate=SR, pts=s)
        _write_all(muxer, 0, enc.encode(frames))
    late = io.create_reference_audio_frame(_tone(1024), sample_fmt="fltp", sample_rate=SR, pts=2548)
    with pytest.raises(ValueError, match="only the last frame"):
        enc.encode(late)
    _write_all(muxer, 0, enc.flush())
    muxer.flush()
    muxer.close()
    assert abs(_decode_audio(tmp_path / "a.m4a").shape[1] - 2548) < 1024


def test_audio_and_video_in_one_file(tmp_path):
    path = tmp_path / "av.mkv"
    muxer = io.Muxer(path)
    venc = muxer.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="mpeg4")
    aenc = muxer.add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR), encoder="aac")
    assert isinstance(venc, io.VideoEncoder) and isinstance(aenc, io.AudioEncoder)
    x = _tone(SR // 3)  # the clip's 1/3 s
    with muxer.open():
        frames = io.create_reference_video_frame(_clip(), pix_fmt="rgb24", frame_rate=(FPS, 1), pts=0)
        _write_all(muxer, 0, venc.encode(frames), venc.flush())
        for s in range(0, x.shape[1], 1024):
            part = io.create_reference_audio_frame(np.ascontiguousarray(x[:, s : s + 1024]), sample_fmt="fltp",
                                                   sample_rate=SR, pts=s)
            _write_all(muxer, 1, aenc.encode(part))
        _write_all(muxer, 1, aenc.flush())
    streams = io.probe(str(path))["streams"]
    assert [s["kind"] for s in streams] == ["video", "audio"] and [s["codec"] for s in streams] == ["mpeg4", "aac"]
    assert _decode_video(path).shape == (N, H, W, 3)
    # 6 frames of 1024 (the last padded), after the priming MKV keeps (see test_remux_copies_packets).
    assert _decode_audio(path).shape == (2, AAC_PRIMING + 6 * 1024)


# --------------------------------------------------------------------------------------------- remuxing


@pytest.fixture
def av_source(tmp_path):
    """An MP4 with B-frame H.264 (mpeg4 without libx264) at 30 fps and 16 kHz stereo AAC, made by the encoders."""
    path = tmp_path / "src.mp4"
    muxer = io.Muxer(path)
    try:
        venc = muxer.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="libx264")
    except ValueError:
        muxer = io.Muxer(path)
        venc = muxer.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="mpeg4")
    aenc = muxer.add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR))
    clip, x = _clip(30), _tone(SR)
    with muxer.open():
        _write_all(muxer, 0, venc.encode(io.create_reference_video_frame(clip, pix_fmt="rgb24", frame_rate=(FPS, 1),
                                                                          pts=0)), venc.flush())
        for s in range(0, SR, 1024):
            part = np.ascontiguousarray(x[:, s : s + 1024])
            _write_all(muxer, 1, aenc.encode(io.create_reference_audio_frame(part, sample_fmt="fltp", sample_rate=SR,
                                                                              pts=s)))
        _write_all(muxer, 1, aenc.flush())
    return path


@pytest.mark.parametrize("ext", ["mp4", "mkv"])
def test_remux_copies_packets(tmp_path, av_source, ext):
    """Both streams streamed through, interleaved. SPDL 0.8.0 fails to write the header of an MKV remuxed from
    an MP4 (it keeps the MP4's codec tag); spdl_rs lets the container pick its own tag."""
    src = str(av_source)
    dst = tmp_path / f"re.{ext}"
    demuxer = io.Demuxer(src)
    vi, ai = demuxer.video_stream_index, demuxer.audio_stream_index
    muxer = io.Muxer(dst)
    muxer.add_remux_stream(demuxer.video_codec)
    muxer.add_remux_stream(demuxer.audio_codec)
    counts = {0: 0, 1: 0}
    with muxer.open():
        for chunk in demuxer.streaming_demux([vi, ai], num_packets=8):
            for index, packets in chunk.items():
                out = 0 if index == vi else 1
                muxer.write(out, packets)
                counts[out] += len(packets)
    demuxer.close()
    assert counts == {0: len(io.demux_video(src)), 1: len(io.demux_audio(src))}
    assert len(io.demux_video(str(dst))) == counts[0] and len(io.demux_audio(str(dst))) == counts[1]
    assert np.array_equal(_decode_video(dst), _decode_video(av_source))
    # MP4 records the AAC encoder's priming (1024 samples) and the decoder skips it; MKV has no field for it
    # (FFmpeg writes one for Opus only), so its decode starts with the priming. The samples are the same.
    priming = AAC_PRIMING if ext == "mkv" else 0
    assert np.array_equal(_decode_audio(dst)[:, priming:], _decode_audio(av_source))
    src_times = io.decode_packets(io.demux_video(src)).get_timestamps()
    dst_times = io.decode_packets(io.demux_video(str(dst))).get_timestamps()
    # MKV takes no negative timestamp: FFmpeg shifts every stream by the earliest (the AAC priming, -0.064 s),
    # as `ffmpeg -i src.mp4 -c copy dst.mkv` does.
    shift = AAC_PRIMING / SR if ext == "mkv" else 0.0
    assert dst_times == pytest.approx([t + shift for t in src_times], abs=1e-3)


def test_remux_one_stream_of_a_cli_made_file(tmp_path):
    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI makes this source")
    src = tmp_path / "cli.mp4"
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    "testsrc=size=96x64:rate=25:duration=2", "-f", "lavfi", "-i",
                    "sine=frequency=440:sample_rate=16000:duration=2", "-c:v", "mpeg4", "-c:a", "aac", "-shortest",
                    str(src)], check=True, timeout=120)
    packets = io.demux_audio(str(src))
    muxer = io.Muxer(tmp_path / "audio.m4a")
    muxer.add_remux_stream(packets.codec)
    with muxer.open():
        muxer.write(0, packets)
    assert len(io.demux_audio(str(tmp_path / "audio.m4a"))) == len(packets)
    assert np.array_equal(_decode_audio(tmp_path / "audio.m4a"), _decode_audio(src))


# --------------------------------------------------------------------------------------------- errors


def _video_muxer(tmp_path, name="e.mkv"):
    muxer = io.Muxer(tmp_path / name)
    enc = muxer.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="mpeg4")
    return muxer, enc


def _frames(n=3, h=H, w=W, pix_fmt="rgb24"):
    return io.create_reference_video_frame(np.zeros((n, h, w, 3), np.uint8), pix_fmt=pix_fmt, frame_rate=(FPS, 1),
                                           pts=0)


def test_unknown_encoder_and_container(tmp_path):
    cfg = io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1))
    with pytest.raises(ValueError, match='no encoder named "nope"'):
        io.Muxer(tmp_path / "a.mp4").add_encode_stream(cfg, encoder="nope")
    with pytest.raises(ValueError, match="not a video encoder"):
        io.Muxer(tmp_path / "a.mp4").add_encode_stream(cfg, encoder="aac")
    with pytest.raises(ValueError, match="cannot tell the container"):
        io.Muxer(tmp_path / "a.nopeext")
    with pytest.raises(ValueError, match="no muxer"):
        io.Muxer(tmp_path / "a.mp4", format="nope")
    with pytest.raises(ValueError, match="holds no video"):
        io.Muxer(tmp_path / "a.wav").add_encode_stream(cfg)
    with pytest.raises(TypeError, match="audio_encode_config"):
        io.Muxer(tmp_path / "a.mp4").add_encode_stream({"height": 4})


def test_encoder_configuration_errors(tmp_path):
    m = io.Muxer(tmp_path / "a.mkv")
    with pytest.raises(ValueError, match="no default frame rate"):  # SPDL: the same refusal (RuntimeError)
        m.add_encode_stream(io.video_encode_config(height=H, width=W), encoder="mpeg4")
    with pytest.raises(ValueError, match="unknown pixel format"):
        m.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1), pix_fmt="rgb25"))
    with pytest.raises(ValueError, match="multiple of 2"):
        m.add_encode_stream(io.video_encode_config(height=H + 1, width=W, frame_rate=(FPS, 1)), encoder="mpeg4")
    with pytest.raises(ValueError, match="has no option bogus"):
        m.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="mpeg4",
                            encoder_config={"bogus": "1"})
    with pytest.raises(ValueError, match="unknown colorspace"):
        m.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1), colorspace="nope"),
                            encoder="mpeg4")
    with pytest.raises(ValueError, match='does not take sample format "fltp"'):  # as SPDL (RuntimeError there)
        io.Muxer(tmp_path / "a.wav").add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR))
    assert m.add_encode_stream(io.video_encode_config(height=H, width=W, frame_rate=(FPS, 1)), encoder="mpeg4",
                               encoder_config={"threads": "2", "qmax": "20"}) is not None


def test_muxer_state_errors(tmp_path):
    muxer, enc = _video_muxer(tmp_path)
    packets = enc.encode(_frames())
    packets = packets or enc.flush()
    assert packets is not None
    with pytest.raises(ValueError, match=r"call open\(\) before write"):  # SPDL: a segmentation fault
        muxer.write(0, packets)
    with pytest.raises(ValueError, match=r"add a stream before open"):
        io.Muxer(tmp_path / "none.mkv").open()
    assert muxer.open() is muxer
    with pytest.raises(ValueError, match="already opened"):
        muxer.open()
    with pytest.raises(ValueError, match=r"before open\(\)"):
        muxer.add_encode_stream(io.audio_encode_config(num_channels=1, sample_rate=SR))
    with pytest.raises(ValueError, match="stream index 1 is out of range"):  # SPDL: RuntimeError
        muxer.write(1, packets)
    with pytest.raises(ValueError, match="stream_index"):
        muxer.write(-1, packets)
    other = io.Muxer(tmp_path / "o.m4a")
    aenc = other.add_encode_stream(io.audio_encode_config(num_channels=1, sample_rate=SR))
    apk = aenc.encode(io.create_reference_audio_frame(np.zeros((1, 1024), np.float32), sample_fmt="fltp",
                                                      sample_rate=SR, pts=0)) or aenc.flush()
    with pytest.raises(ValueError, match="holds video mpeg4, these packets are audio aac"):
        muxer.write(0, apk)
    muxer.write(0, packets)
    muxer.flush()
    muxer.close()
    muxer.close()  # again: nothing (SPDL: a segmentation fault)
    muxer.flush()
    with pytest.raises(ValueError, match="closed"):
        muxer.write(0, packets)
    other.close()


def test_frame_errors(tmp_path):
    muxer, enc = _video_muxer(tmp_path)
    muxer.open()
    with pytest.raises(ValueError, match="configured for rgb24 frames of 96x64"):
        enc.encode(_frames(w=W + 2))
    with pytest.raises(ValueError, match="configured for rgb24"):
        enc.encode(io.create_reference_video_frame(np.zeros((1, H, W, 4), np.uint8), pix_fmt="rgba",
                                                   frame_rate=(FPS, 1), pts=0))
    audio = io.create_reference_audio_frame(np.zeros((2, 1024), np.float32), sample_fmt="fltp", sample_rate=SR, pts=0)
    with pytest.raises(TypeError, match="takes VideoFrames"):
        enc.encode(audio)
    _write_all(muxer, 0, enc.encode(_frames()), enc.flush())
    assert enc.flush() is None  # again: nothing (SPDL: a segmentation fault)
    with pytest.raises(ValueError, match="flushed"):
        enc.encode(_frames())
    muxer.close()
    am = io.Muxer(tmp_path / "a.m4a")
    aenc = am.add_encode_stream(io.audio_encode_config(num_channels=2, sample_rate=SR))
    for bad in (io.create_reference_audio_frame(np.zeros((1024, 2), np.float32), sample_fmt="flt", sample_rate=SR,
                                                pts=0),
                io.create_reference_audio_frame(np.zeros((1, 1024), np.float32), sample_fmt="fltp", sample_rate=SR,
                                                pts=0),
                io.create_reference_audio_frame(np.zeros((2, 1024), np.float32), sample_fmt="fltp", sample_rate=8000,
                                                pts=0)):
        with pytest.raises(ValueError, match="configured for fltp audio of 2 channels at 16000 Hz"):
            aenc.encode(bad)
    with pytest.raises(TypeError, match="takes AudioFrames"):
        aenc.encode(_frames())


def test_output_errors_are_os_errors(tmp_path):
    muxer, _ = _video_muxer(tmp_path, name="missing/dir/x.mkv")
    with pytest.raises(FileNotFoundError, match="x.mkv"):
        muxer.open()
    muxer2, _ = _video_muxer(tmp_path, name="m.mkv")
    with pytest.raises(ValueError, match="takes the option nonsense"):
        muxer2.open({"nonsense": "1"})


def test_context_manager_closes_on_error(tmp_path):
    muxer, enc = _video_muxer(tmp_path, name="c.mkv")
    with pytest.raises(KeyError):
        with muxer.open():
            _write_all(muxer, 0, enc.encode(_frames(10)), enc.flush())
            raise KeyError("boom")
    with pytest.raises(ValueError, match="closed"):
        muxer.write(0, enc.flush() or io.demux_video(str(tmp_path / "c.mkv")))
    assert len(io.demux_video(str(tmp_path / "c.mkv"))) == 10  # the file was finished


def test_encoders_run_in_parallel_threads(tmp_path):
    """Each object has its own lock and releases the GIL: two muxers encode at once from two threads."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            _encode_video(tmp_path / f"t{i}.avi", _clip(30), encoder="mpeg4", chunk=3)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert all(len(io.demux_video(str(tmp_path / f"t{i}.avi"))) == 30 for i in range(2))
