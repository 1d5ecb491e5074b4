"""spdl_rs.io video (a build with the `ffmpeg` feature): load_video, demux_video + decode_packets, native ops."""

import threading

import numpy as np
import pytest

from conftest import NO_FFMPEG

import spdl_rs
from spdl_rs.io import ops
from spdl_rs.pipeline import PipelineBuilder

def assert_views_a_buffer(a: np.ndarray) -> None:
    """The array views the memory of the spdl_rs.Buffer the decoder wrote (no copy)."""
    owner = a.base.obj if isinstance(a.base, memoryview) else a.base
    assert isinstance(owner, spdl_rs.Buffer) and not a.flags.owndata
    assert owner.data_ptr == a.ctypes.data and owner.nbytes == a.nbytes


pytestmark = pytest.mark.skipif(not spdl_rs.io.has_video(), reason="built without the ffmpeg feature")

# conftest's `media["mp4"]`: testsrc 160x120, 25 fps, 4 s (100 frames), a keyframe every 25 frames.
W, H, FPS, FRAMES = 160, 120, 25, 100


def test_whole_video_shape_and_info(media):
    buf, info = spdl_rs.io.load_video(media["mp4"], return_info=True)
    assert isinstance(buf, spdl_rs.Buffer) and buf.dtype == "uint8"  # the documented result type
    v = np.asarray(buf)
    assert v.shape == (FRAMES, H, W, 3)
    assert info["codec"] == "h264" and info["frame_rate"] == pytest.approx(FPS)
    assert len(info["pts"]) == FRAMES and info["pts"][1] - info["pts"][0] == pytest.approx(1 / FPS)
    assert_views_a_buffer(v)
    assert v.std() > 10  # testsrc is colourful, not a blank frame


def test_window_frame_count_and_sampling(media):
    # A window that starts between keyframes: the decoder seeks before it, but only the window's frames come out.
    v, info = spdl_rs.io.load_video(media["mp4"], start=1.2, duration=1.0, return_info=True)
    assert v.shape == (25, H, W, 3)
    assert info["pts"][0] == pytest.approx(1.2) and info["pts"][-1] == pytest.approx(2.16)
    assert spdl_rs.io.load_video(media["mp4"], start=1.0, duration=2.0, every_k=5).shape == (10, H, W, 3)
    assert spdl_rs.io.load_video(media["mp4"], num_frames=8).shape == (8, H, W, 3)
    assert spdl_rs.io.load_video(media["mp4"], start=0.0, duration=2.0, fps=5).shape == (10, H, W, 3)
    small = spdl_rs.io.load_video(media["mp4"], duration=0.2, width=80, height=60, pix_fmt="gray", filter="area")
    assert small.shape == (5, 60, 80, 1)
    with pytest.raises(ValueError, match="at most one"):
        spdl_rs.io.load_video(media["mp4"], fps=5, every_k=2)
    with pytest.raises(ValueError, match="width and height"):
        spdl_rs.io.load_video(media["mp4"], width=10)


def test_demux_then_decode_equals_load_video(media):
    expected = spdl_rs.io.load_video(media["mp4"], start=1.5, duration=1.0, num_frames=6, width=64, height=48)
    packets = spdl_rs.io.demux_video(media["mp4"], start=1.5, duration=1.0)
    assert packets.codec.name == "h264" and (packets.width, packets.height) == (W, H) and len(packets) == 25
    assert len(packets.timestamps) == 25 and packets.decodable and packets.nbytes > 0
    # Decode in another thread, as a pipeline would.
    out = {}
    t = threading.Thread(
        target=lambda: out.setdefault("v", spdl_rs.io.decode_packets(packets, num_frames=6, width=64, height=48))
    )
    t.start()
    t.join()
    np.testing.assert_array_equal(out["v"], expected)
    assert not packets.decodable
    with pytest.raises(TypeError, match="already decoded"):  # as SPDL
        spdl_rs.io.decode_packets(packets)
    with open(media["mp4"], "rb") as f:
        from_bytes = spdl_rs.io.load_video(f.read(), name="clip.mp4", start=1.5, duration=1.0, num_frames=6,
                                           width=64, height=48)
    np.testing.assert_array_equal(from_bytes, expected)


def test_corrupt_video_names_the_file(media, tmp_path):
    with open(media["mp4"], "rb") as f:
        data = f.read()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(RuntimeError, match="cut.mp4"):
        spdl_rs.io.load_video(str(cut))
    with pytest.raises(RuntimeError, match="junk.mp4"):
        spdl_rs.io.demux_video(b"\x00junk" * 100, name="junk.mp4")
    with pytest.raises(OSError, match="absent.mp4"):
        spdl_rs.io.load_video(tmp_path / "absent.mp4")


def test_video_native_ops_in_a_pipeline(media):
    expected = spdl_rs.io.load_video(media["mp4"], start=0.5, duration=1.0, every_k=5)
    p = (
        PipelineBuilder()
        .add_source([media["mp4"]] * 6)
        .pipe(ops.demux_video(start=0.5, duration=1.0), concurrency=2)
        .pipe(ops.decode_packets(every_k=5), concurrency=2)
        .add_sink(2)
        .build(num_threads=2)
    )
    with p.auto_stop():
        out = [np.asarray(b) for b in p]
    assert len(out) == 6
    for v in out:
        np.testing.assert_array_equal(v, expected)
    p = (
        PipelineBuilder()
        .add_source([media["mp4"]] * 3)
        .pipe(ops.load_video(num_frames=4, width=32, height=32), concurrency=2)
        .add_sink(2)
        .build(num_threads=2)
    )
    with p.auto_stop():
        assert [np.asarray(b).shape for b in p] == [(4, 32, 32, 3)] * 3


def test_probe_video(media):
    info = spdl_rs.io.probe(media["mp4"])
    if NO_FFMPEG:
        # Without FFmpeg, probe falls back to symphonia (it reads MP4's container), by design.
        assert info["prober"] == "symphonia"
        return
    assert info["prober"] == "ffmpeg"
    [s] = [s for s in info["streams"] if s["kind"] == "video"]
    assert s["codec"] == "h264" and (s["width"], s["height"]) == (W, H)
    assert s["frame_rate"] == pytest.approx(FPS) and info["duration_s"] == pytest.approx(4.0, abs=0.1)


def test_spdl_timestamp_spelling(media):
    a = spdl_rs.io.load_video(media["mp4"], timestamp=(1.2, 2.2))
    b = spdl_rs.io.load_video(media["mp4"], start=1.2, duration=1.0)
    np.testing.assert_array_equal(a, b)


def test_spdl_demux_and_config_spellings(media):
    a = spdl_rs.io.demux_video(media["mp4"], timestamp=(1.5, 2.5), bsf=None, demux_config=None)
    b = spdl_rs.io.demux_video(media["mp4"], start=1.5, duration=1.0)
    assert a.timestamps == b.timestamps
    v = spdl_rs.io.load_video(media["mp4"], timestamp=(0.0, 0.2), decode_config=None, device_config=None)
    assert v.shape == (5, H, W, 3)
    with pytest.raises(TypeError, match="decode_config must be a DecodeConfig"):
        spdl_rs.io.load_video(media["mp4"], decode_config=object())
    annexb = spdl_rs.io.demux_video(media["mp4"], timestamp=(1.5, 2.5), bsf="h264_mp4toannexb")
    assert annexb.timestamps == b.timestamps and annexb.codec.name == "h264"
    with pytest.raises(ValueError, match="no_such_bsf"):
        spdl_rs.io.demux_video(media["mp4"], bsf="no_such_bsf")
