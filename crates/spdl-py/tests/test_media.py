"""SPDL's demuxing and decoding objects in spdl_rs.io (a build with the `ffmpeg` feature): Demuxer, Decoder,
packets, frames, convert_frames, sample_decode_video, FilterGraph, BSF, frames from arrays, image encoding.

The expected shapes, counts and timestamps are SPDL 0.8.0's for the same media (checked side by side)."""

import shutil
import subprocess
import threading

import numpy as np
import pytest

import spdl_rs
import spdl_rs.io as io

pytestmark = pytest.mark.skipif(not io.has_video(), reason="built without the ffmpeg feature")

W, H, FPS = 160, 120, 25


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args], check=True, timeout=120)


@pytest.fixture(scope="module")
def av(tmp_path_factory):
    """A 2 s 160x120 25 fps H.264 video (keyframe every second, B-frames) with 16 kHz mono AAC; a 12 s
    64x48 video for streaming; a PNG image; a video without audio."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI is needed to make the test media")
    d = tmp_path_factory.mktemp("av")
    files = {"av": d / "av.mp4", "long": d / "long.mp4", "png": d / "image.png", "silent": d / "silent.mp4"}
    _ffmpeg("-f", "lavfi", "-i", f"testsrc=size={W}x{H}:rate={FPS}:duration=2", "-f", "lavfi", "-i",
            "sine=frequency=440:sample_rate=16000:duration=2", "-c:v", "libx264", "-g", "25", "-bf", "2",
            "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(files["av"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x48:rate=25:duration=12", "-c:v", "libx264", "-g", "25",
            "-pix_fmt", "yuv420p", str(files["long"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=96x64", "-frames:v", "1", str(files["png"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x48:rate=25:duration=1", "-c:v", "libx264", "-pix_fmt",
            "yuv420p", str(files["silent"]))
    return {k: str(v) for k, v in files.items()}


def test_video_packets_frames_and_buffer(av):
    packets = io.demux_video(av["av"])
    assert isinstance(packets, io.VideoPackets) and io.Packets is io.VideoPackets
    assert len(packets) == 50 and packets.codec.name == "h264" and packets.pix_fmt == "yuv420p"
    assert packets.frame_rate == (25, 1) and (packets.width, packets.height) == (W, H)
    assert packets.timestamp is None
    assert packets.get_timestamps()[:3] == pytest.approx([0.0, 0.04, 0.08])
    frames = io.decode_packets(packets.clone())
    assert isinstance(frames, io.VideoFrames) and len(frames) == 50 and frames.pix_fmt == "rgb24"
    assert frames.num_planes == 1 and (frames.width, frames.height) == (W, H)
    assert frames.time_base == (1, 12800) and frames.get_pts()[:3] == [0, 512, 1024]
    assert frames.get_timestamps() == pytest.approx([i / FPS for i in range(50)])
    buf = io.convert_frames(frames)
    assert isinstance(buf, io.CPUBuffer) and buf.shape == (50, H, W, 3) and buf.dtype == "uint8"
    # The same pixels as spdl_rs's own decoder (both convert yuv420p to rgb24 with swscale).
    expected = np.asarray(io.load_video(av["av"]))
    assert np.abs(np.asarray(buf).astype(int) - expected.astype(int)).mean() < 3
    # Decoding consumes the packets, as in SPDL.
    io.decode_packets(packets)
    with pytest.raises(TypeError, match="already decoded"):  # as SPDL
        io.decode_packets(packets)


@pytest.mark.parametrize(
    "pix_fmt, shape",
    [("rgb24", (50, H, W, 3)), ("gray8", (50, H, W, 1)), ("rgba", (50, H, W, 4)), ("yuv420p", (50, 1, 180, W)),
     ("yuv444p", (50, 3, H, W)), ("nv12", (50, 1, 180, W)), (None, (50, 1, 180, W))],
)
def test_convert_frames_shapes_follow_spdl(av, pix_fmt, shape):
    fd = f"format=pix_fmts={pix_fmt}" if pix_fmt else None
    frames = io.decode_packets(io.demux_video(av["av"]), filter_desc=fd)
    assert np.asarray(io.convert_frames(frames)).shape == shape


def test_window_and_num_frames(av):
    packets = io.demux_video(av["av"], timestamp=(0.5, 1.0))
    assert packets.timestamp == (0.5, 1.0) and len(packets) == 12
    assert packets.get_timestamps() == pytest.approx([0.52 + 0.04 * i for i in range(12)])
    frames = io.decode_packets(packets)
    assert frames.get_timestamps() == pytest.approx([0.52 + 0.04 * i for i in range(12)])
    five = io.decode_packets(io.demux_video(av["av"]), num_frames=5)
    assert len(five) == 5
    first, pair, picked = five[0], five[1:3], five[[0, 2]]
    assert isinstance(first, io.ImageFrames) and first.pts == 0.0 and five[1].pts == pytest.approx(0.04)
    assert len(pair) == 2 and pair.get_timestamps() == pytest.approx([0.04, 0.08])
    assert picked.get_timestamps() == pytest.approx([0.0, 0.08])
    assert np.asarray(io.convert_frames(first)).shape == (H, W, 3)
    assert np.asarray(io.convert_frames([five.clone(), five.clone()])).shape == (2, 5, H, W, 3)
    with pytest.raises(IndexError):
        five[5]
    # As in SPDL, converting consumes the frames: every later use is a TypeError.
    io.convert_frames(five)
    for use in (len, repr, lambda f: f.clone(), lambda f: f.num_frames, lambda f: f[0], io.convert_frames):
        with pytest.raises(TypeError, match="consumed by convert_frames"):
            use(five)


def test_audio_packets_and_frames(av):
    packets = io.demux_audio(av["av"])
    assert isinstance(packets, io.AudioPackets) and packets.codec.name == "aac"
    assert packets.sample_rate == 16000 and packets.num_channels == 1
    frames = io.decode_packets(packets.clone())
    assert frames.sample_fmt == "fltp" and frames.sample_rate == 16000 and frames.num_channels == 1
    a = np.asarray(io.convert_frames(frames))
    assert a.dtype == np.float32 and a.shape[0] == 1 and 31000 <= a.shape[1] <= 33800
    assert 0.05 < np.abs(a).max() <= 1.0
    s16 = np.asarray(io.convert_frames(io.decode_packets(packets.clone(), "aformat=sample_fmts=s16")))
    assert s16.dtype == np.int16 and s16.shape == (a.shape[1], 1)
    # A window trims the samples to it exactly: 0.5 s at 16 kHz.
    window = io.decode_packets(io.demux_audio(av["av"], timestamp=(0.5, 1.0)))
    assert np.asarray(io.convert_frames(window)).shape == (1, 8000)


def test_image_packets(av):
    packets = io.demux_image(av["png"])
    assert isinstance(packets, io.ImagePackets) and packets.codec.name == "png"
    assert (packets.width, packets.height) == (96, 64)
    frames = io.decode_packets(packets)
    assert isinstance(frames, io.ImageFrames) and frames.pix_fmt == "rgb24"
    img = np.asarray(io.convert_frames(frames))
    np.testing.assert_array_equal(img, np.asarray(io.load_image(av["png"])))


def test_demuxer_streams_and_decoder(av):
    with io.Demuxer(av["av"]) as demuxer:
        assert demuxer.has_audio() and demuxer.video_stream_index == 0 and demuxer.audio_stream_index == 1
        vc, ac = demuxer.video_codec, demuxer.audio_codec
        assert (vc.name, vc.width, vc.height, vc.pix_fmt, vc.frame_rate) == ("h264", W, H, "yuv420p", (25, 1))
        assert vc.time_base == (1, 12800) and vc.sample_aspect_ratio[1] > 0
        assert (ac.name, ac.sample_rate, ac.num_channels, ac.sample_fmt) == ("aac", 16000, 1, "fltp")
        chunks = list(demuxer.streaming_demux(duration=0.5))
        assert len(chunks) == 4 and sum(len(c) for c in chunks) == 50
        both = list(demuxer.streaming_demux([0, 1], num_packets=10))
        assert all(isinstance(c, dict) and max(len(p) for p in c.values()) <= 10 for c in both)
        assert len(both[0][0]) == 10 and 1 in both[0]
        assert sum(len(c[0]) for c in both if 0 in c) == 50
        # Streaming decode: every frame once, in order.
        decoder = io.Decoder(vc)
        out = []
        for packets in demuxer.streaming_demux(0, num_packets=7):
            out.extend(decoder.streaming_decode_packets(packets))
        out.extend(decoder.flush())
        ts = [t for f in out for t in f.get_timestamps()]
        assert ts == pytest.approx([i / FPS for i in range(50)])
        # Fixed-size chunks.
        decoder = io.Decoder(vc, filter_desc=None)
        decoder.set_buffer_size(8)
        sizes = [len(f) for p in demuxer.streaming_demux(0, num_packets=5) for f in decoder.streaming_decode_packets(p)]
        sizes += [len(f) for f in decoder.flush()]
        assert sizes == [8] * 6 + [2]
    with pytest.raises(ValueError, match="closed"):
        demuxer.demux_video()
    with pytest.raises(ValueError, match="duration"):
        io.Demuxer(av["av"]).streaming_demux()


def test_long_video_streams_in_bounded_chunks(av):
    demuxer = io.Demuxer(av["long"])
    decoder = io.Decoder(demuxer.video_codec)
    n, largest = 0, 0
    for packets in demuxer.streaming_demux(num_packets=50):
        assert len(packets) <= 50
        for frames in decoder.streaming_decode_packets(packets):
            largest = max(largest, len(frames))
            n += len(frames)
    n += sum(len(f) for f in decoder.flush())
    assert n == 300 and largest <= 50


def test_sample_decode_video(av):
    packets = io.demux_video(av["av"])
    every = np.asarray(io.convert_frames(io.decode_packets(packets.clone())))
    picked = io.sample_decode_video(packets, [0, 5, 30, 49])
    assert [f.pts for f in picked] == pytest.approx([0.0, 0.2, 1.2, 1.96])
    got = np.asarray(io.convert_frames(picked))
    np.testing.assert_array_equal(got, every[[0, 5, 30, 49]])
    assert packets.decodable  # not consumed
    with pytest.raises(IndexError):
        io.sample_decode_video(packets, [50])
    with pytest.raises(ValueError, match="sorted"):
        io.sample_decode_video(packets, [5, 1])
    windowed = io.demux_video(av["av"], timestamp=(1.1, 1.9))
    ts = windowed.get_timestamps()
    sub = io.sample_decode_video(windowed, [0, 3, len(ts) - 1])
    assert [f.pts for f in sub] == pytest.approx([ts[0], ts[3], ts[-1]])


def test_filter_graph_and_reference_frames():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(3, 8, 10, 3), dtype=np.uint8)
    frames = io.create_reference_video_frame(arr, pix_fmt="rgb24", frame_rate=(30, 1), pts=5)
    assert frames.get_pts() == [5, 6, 7] and frames.time_base == (1, 30)
    np.testing.assert_array_equal(np.asarray(io.convert_frames(frames.clone())), arr)
    graph = io.FilterGraph("buffer=video_size=10x8:pix_fmt=rgb24:time_base=1/30:pixel_aspect=1/1,hflip,buffersink")
    graph.add_frames(frames)
    graph.flush()
    out = graph.get_frames()
    np.testing.assert_array_equal(np.asarray(io.convert_frames(out)), arr[:, :, ::-1])
    assert "hflip" in graph.dump()
    audio = rng.standard_normal((2, 100)).astype(np.float32)
    af = io.create_reference_audio_frame(audio, sample_fmt="fltp", sample_rate=8000, pts=0)
    assert len(af) == 100 and af.num_channels == 2
    np.testing.assert_array_equal(np.asarray(io.convert_frames(af)), audio)
    with pytest.raises(ValueError, match="shape"):
        io.create_reference_video_frame(arr[0], pix_fmt="rgb24", frame_rate=(30, 1), pts=0)
    with pytest.raises(ValueError, match="filter graph"):
        io.FilterGraph("buffer=video_size=10x8:pix_fmt=rgb24:time_base=1/30,no_such_filter,buffersink")


def test_bitstream_filter(av):
    packets = io.demux_video(av["av"])
    annexb = io.apply_bsf(packets, "h264_mp4toannexb")
    assert len(annexb) == 50 and packets.decodable
    a = np.asarray(io.convert_frames(io.decode_packets(annexb)))
    b = np.asarray(io.convert_frames(io.decode_packets(packets)))
    np.testing.assert_array_equal(a, b)
    bsf = io.BSF(io.Demuxer(av["av"]).video_codec, "h264_mp4toannexb")
    n = 0
    for chunk in io.Demuxer(av["av"]).streaming_demux(num_packets=20):
        out = bsf.filter(chunk)
        n += 0 if out is None else len(out)
    rest = bsf.flush()
    assert n + (0 if rest is None else len(rest)) == 50


def test_encode_image_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, size=(24, 32, 3), dtype=np.uint8)
    io.encode_image(str(tmp_path / "a.png"), rgb)
    np.testing.assert_array_equal(np.asarray(io.load_image(str(tmp_path / "a.png"))), rgb)
    io.save_image(tmp_path / "b.png", rgb, pix_fmt="bgr24", compression_level=9)
    np.testing.assert_array_equal(np.asarray(io.load_image(str(tmp_path / "b.png"))), rgb[:, :, ::-1])
    smooth = np.tile(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (24, 1, 3))
    io.save_image(tmp_path / "c.jpg", smooth, qscale=2)
    assert np.abs(np.asarray(io.load_image(str(tmp_path / "c.jpg"))).astype(int) - smooth).mean() < 4
    gray = rng.integers(0, 256, size=(10, 12), dtype=np.uint8)
    io.encode_image(str(tmp_path / "g.png"), gray, pix_fmt="gray")
    np.testing.assert_array_equal(np.asarray(io.load_image(str(tmp_path / "g.png"), pixel_format="gray"))[..., 0], gray)
    with pytest.raises(ValueError, match="shape"):
        io.encode_image(str(tmp_path / "x.png"), gray, pix_fmt="rgb24")
    with pytest.raises(ValueError, match="extension"):
        io.encode_image(str(tmp_path / "x.unknown"), rgb)


def test_errors_name_the_file_and_cause(av, tmp_path):
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(open(av["av"], "rb").read()[:3000])
    with pytest.raises(RuntimeError, match="cut.mp4"):
        io.decode_packets(io.demux_video(str(cut)))
    with pytest.raises(FileNotFoundError, match="absent.mp4"):
        io.Demuxer(str(tmp_path / "absent.mp4"))
    with pytest.raises(RuntimeError, match="junk.mp4"):
        io.Demuxer(b"\x00junk" * 100, name="junk.mp4")
    with pytest.raises(RuntimeError, match="no audio stream"):
        io.demux_audio(av["silent"])
    assert not io.Demuxer(av["silent"]).has_audio()
    with pytest.raises(RuntimeError, match="above the limit"):
        io.Demuxer(av["long"], limits={"max_packets": 10}).demux_video()
    with pytest.raises(ValueError, match="no_such_decoder"):
        io.decode_packets(io.demux_video(av["av"]), decode_config=io.decode_config(decoder="no_such_decoder"))
    with pytest.raises(ValueError, match="no demuxer of that name"):
        io.Demuxer(av["av"], demux_config=io.demux_config(format="no_such_format"))
    # Flipped bytes in the middle: a typed error or fewer frames, never a crash.
    data = bytearray(open(av["av"], "rb").read())
    for i in range(len(data) // 2, len(data) // 2 + 2000):
        data[i] ^= 0xFF
    try:
        frames = io.decode_packets(io.demux_video(bytes(data), name="flipped.mp4"))
        assert len(frames) <= 50
    except RuntimeError as e:
        assert "flipped.mp4" in str(e)


def test_objects_are_shared_between_threads(av):
    packets = io.demux_video(av["av"])
    expected = np.asarray(io.convert_frames(io.decode_packets(packets.clone())))
    out: list = []
    demuxer = io.Demuxer(av["av"])

    def work() -> None:
        p = demuxer.demux_video((0.0, 2.0))
        out.append(np.asarray(io.convert_frames(io.decode_packets(p))))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 4
    for a in out:
        np.testing.assert_array_equal(a, expected)


def test_encode_image_gray16_reads_the_bytes_in_the_named_order(tmp_path):
    import shutil
    import subprocess
    import sys

    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI reads the 16-bit PNG back")
    a = np.array([[108, 1, 0x1234], [65535, 256, 7]], dtype=np.uint16)

    def written(pix_fmt: str) -> np.ndarray:
        path = tmp_path / f"{pix_fmt}.png"
        io.encode_image(str(path), a, pix_fmt=pix_fmt)
        raw = subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt",
             "gray16le", "-"], check=True, capture_output=True, timeout=60,
        ).stdout
        return np.frombuffer(raw, dtype="<u2").reshape(a.shape)

    # SPDL hands the array's bytes to FFmpeg as they are: gray16be reads them big-endian (108 -> 27648 on a
    # little-endian machine), gray16le little-endian; "gray16" is the native order.
    np.testing.assert_array_equal(written("gray16be"), a.byteswap() if sys.byteorder == "little" else a)
    assert written("gray16be")[0, 0] == (27648 if sys.byteorder == "little" else 108)
    np.testing.assert_array_equal(written("gray16le"), a if sys.byteorder == "little" else a.byteswap())
    np.testing.assert_array_equal(written("gray16"), a)
