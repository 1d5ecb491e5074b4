"""SPDL's composite forms of spdl_rs.io: ``filter_desc=`` on load_image/load_audio/load_video and
load_image_batch, native output with ``filter_desc=None``, ``DemuxConfig(format=...)``, empty windows, and
``load_image_batch(width=None)``. The expected shapes, dtypes and errors are SPDL 0.8.0's on the same media
(checked side by side with ``spdl.io``)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import spdl_rs.io as io

pytestmark = pytest.mark.skipif(
    shutil.which("ffmpeg") is None or not io.video_available(), reason="needs FFmpeg and the ffmpeg CLI"
)


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("forms")
    paths = {
        "mp4": d / "t.mp4",
        "wav": d / "a.wav",
        "png": d / "x.png",
        "jpg": d / "y.jpg",
        "raw": d / "raw.s16le",
    }
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=2", "-pix_fmt", "yuv420p", str(paths["mp4"]))
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=2", "-ar", "16000", str(paths["wav"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=32x24", "-frames:v", "1", str(paths["png"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=40x30", "-frames:v", "1", str(paths["jpg"]))
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", "-ar", "8000", "-ac", "2", "-f", "s16le",
            str(paths["raw"]))
    return {k: str(v) for k, v in paths.items()}


def test_filter_desc_none_is_the_decoders_own_format(media):
    # yuv420p video: [N, 1, H * 3 / 2, W]; a JPEG in yuvj444p: [3, H, W]; WAV s16: packed [T, C] int16.
    video = np.asarray(io.load_video(media["mp4"], filter_desc=None))
    assert video.shape == (20, 1, 72, 64) and video.dtype == np.uint8
    jpeg = np.asarray(io.load_image(media["jpg"], filter_desc=None))
    assert jpeg.shape == (3, 30, 40)
    assert np.asarray(io.load_image(media["png"], filter_desc=None)).shape == (24, 32, 3)
    audio = np.asarray(io.load_audio(media["wav"], filter_desc=None))
    assert audio.shape == (32000, 1) and audio.dtype == np.int16


def test_filter_desc_graphs_run_as_given(media):
    gray = np.asarray(io.load_video(media["mp4"], filter_desc="scale=32:24,format=gray"))
    assert gray.shape == (20, 24, 32, 1)
    desc = io.get_video_filter_desc(scale_width=16, scale_height=12, pix_fmt="rgb24")
    window = np.asarray(io.load_video(media["mp4"], (0.5, 1.0), filter_desc=desc))
    assert window.shape == (5, 12, 16, 3)
    assert np.asarray(io.load_image(media["jpg"], filter_desc="scale=20:15,format=rgb24")).shape == (15, 20, 3)
    s16 = np.asarray(io.load_audio(media["wav"], filter_desc=io.get_audio_filter_desc(sample_rate=8000,
                                                                                        sample_fmt="s16")))
    assert s16.shape == (16000, 1) and s16.dtype == np.int16
    # SPDL's default graph matches spdl_rs's own decode of the same window.
    default = np.asarray(io.load_audio(media["wav"], (0.5, 1.5)))
    assert default.shape == (1, 16000) and default.dtype == np.float32
    # A graph FFmpeg rejects is an error naming the graph; spdl_rs's own keywords do not mix with SPDL's form.
    with pytest.raises(ValueError, match="no_such_filter"):
        io.load_video(media["mp4"], filter_desc="no_such_filter")
    with pytest.raises(ValueError, match="cannot be combined with spdl_rs's height, width"):
        io.load_video(media["mp4"], filter_desc=None, width=16, height=12)


def test_demux_config_format_forces_the_container(media):
    config = io.demux_config(format="s16le", format_options={"sample_rate": "8000", "ch_layout": "stereo"})
    raw = np.asarray(io.load_audio(media["raw"], demux_config=config, filter_desc=None))
    assert raw.shape == (8000, 2) and raw.dtype == np.int16
    with pytest.raises(ValueError, match="no demuxer of that name"):
        io.demux_audio(media["raw"], demux_config=io.demux_config(format="no_such_format"))


@pytest.mark.parametrize("window", [(0.5, 0.5), (3.0, 4.0), (1.0, 0.5)])
def test_windows_without_frames(media, window):
    # As in SPDL: an empty window or one past the end demuxes to no packet and decodes to no frame; converting
    # nothing is a RuntimeError.
    packets = io.demux_video(media["mp4"], timestamp=window)
    assert len(packets) == 0
    frames = io.decode_packets(packets)
    assert len(frames) == 0
    with pytest.raises(RuntimeError, match="No frame to convert"):
        io.convert_frames(frames)
    audio = io.decode_packets(io.demux_audio(media["wav"], timestamp=window))
    assert audio.num_frames == 0
    if not window[1] > window[0]:
        with pytest.raises(RuntimeError, match="No frame to convert"):
            io.load_video(media["mp4"], window)
    else:
        # spdl_rs's own decode of a window past the end is an empty buffer (SPDL raises).
        assert io.load_video(media["mp4"], window).shape == (0, 48, 64, 3)


def test_load_image_batch_at_native_size(media):
    batch = np.asarray(io.load_image_batch([media["png"], media["png"]], width=None, height=None))
    assert batch.shape == (2, 24, 32, 3)
    one = np.asarray(io.load_image(media["png"]))
    assert (batch[0] == one).all()
    # Different native sizes cannot share one buffer.
    with pytest.raises(ValueError):
        io.load_image_batch([media["png"], media["jpg"]], width=None, height=None)
    # SPDL's form leaves failed images out: strict raises, strict=False returns the rest.
    with pytest.raises(RuntimeError, match="Failed to load some images"):
        io.load_image_batch([media["png"], media["png"] + ".absent"], width=None, height=None)
    rest = np.asarray(io.load_image_batch([media["png"], media["png"] + ".absent"], width=None, height=None,
                                          strict=False))
    assert rest.shape == (1, 24, 32, 3)
    with pytest.raises(ValueError, match="must not be empty"):
        io.load_image_batch([], width=None, height=None)
