"""Packets sent between processes, as SPDL 0.8.0 sends them: ``pickle`` of AudioPackets, VideoPackets and
ImagePackets, ``__getstate__`` bytes read back by ``deserialize`` (a copy) and ``deserialize_view`` (packets
pointing into the buffer, kept alive), and packets demuxed in a spawned process and decoded here. Decoding
what comes back must give the same samples and pixels as decoding the original packets, bit for bit."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import pickle
import shutil
import subprocess
from multiprocessing import shared_memory

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
    d = tmp_path_factory.mktemp("pickle")
    paths = {"aac": d / "a.mp4", "h264": d / "v.mp4", "jpg": d / "i.jpg", "png": d / "i.png", "mp3": d / "a.mp3"}
    # AAC in MP4 carries SKIP_SAMPLES side data on its first packet: a decode that lost it would differ.
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", "-c:a", "aac", str(paths["aac"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=duration=2:size=64x48:rate=10", "-c:v", "libx264", "-pix_fmt", "yuv420p",
            "-g", "5", "-bf", "2", str(paths["h264"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", str(paths["jpg"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=40x30", "-frames:v", "1", str(paths["png"]))
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=220:duration=1", "-ac", "2", str(paths["mp3"]))
    return {k: str(v) for k, v in paths.items()}


def _decoded(packets) -> np.ndarray:
    return io.to_numpy(io.convert_frames(io.decode_packets(packets)))


def _demux(media, key, **kw):
    if key in ("aac", "mp3"):
        return io.demux_audio(media[key], **kw)
    if key == "h264":
        return io.demux_video(media[key], **kw)
    return io.demux_image(media[key])


@pytest.mark.parametrize("key", ["aac", "mp3", "h264", "jpg", "png"])
def test_pickle_round_trip_decodes_identically(media, key):
    packets = _demux(media, key)
    expected = _decoded(packets.clone())
    restored = pickle.loads(pickle.dumps(packets))
    assert type(restored) is type(packets)
    assert len(restored) == len(packets)
    assert restored.codec.name == packets.codec.name
    np.testing.assert_array_equal(_decoded(restored), expected, strict=True)


def test_pickle_keeps_the_metadata(media):
    a = _demux(media, "aac")
    ra = pickle.loads(pickle.dumps(a))
    assert (ra.sample_rate, ra.num_channels, ra.timestamp) == (a.sample_rate, a.num_channels, a.timestamp)
    v = io.demux_video(media["h264"], timestamp=(0.5, 1.5))
    rv = pickle.loads(pickle.dumps(v))
    assert (rv.width, rv.height, rv.pix_fmt, rv.frame_rate) == (v.width, v.height, v.pix_fmt, v.frame_rate)
    assert rv.timestamp == v.timestamp == (0.5, 1.5)
    assert rv.get_timestamps(raw=True) == v.get_timestamps(raw=True)
    assert rv.get_timestamps() == v.get_timestamps()
    i = _demux(media, "jpg")
    ri = pickle.loads(pickle.dumps(i))
    assert (ri.width, ri.height, ri.pix_fmt) == (i.width, i.height, i.pix_fmt) == (64, 64, i.pix_fmt)


def test_a_window_survives_pickling(media):
    packets = io.demux_video(media["h264"], timestamp=(0.5, 1.5))
    expected = _decoded(packets.clone())
    assert expected.shape[0] == 10
    np.testing.assert_array_equal(_decoded(pickle.loads(pickle.dumps(packets))), expected, strict=True)


@pytest.mark.parametrize("key", ["aac", "h264", "png"])
def test_deserialize_view_decodes_identically(media, key):
    packets = _demux(media, key)
    expected = _decoded(packets.clone())
    state = packets.__getstate__()
    assert isinstance(state, bytes)
    view = type(packets).deserialize_view(memoryview(state))
    np.testing.assert_array_equal(_decoded(view), expected, strict=True)
    copy = type(packets).deserialize(state)
    np.testing.assert_array_equal(_decoded(copy), expected, strict=True)


def test_a_view_keeps_its_buffer_alive(media):
    packets = _demux(media, "aac")
    expected = _decoded(packets.clone())
    state = bytearray(packets.__getstate__())
    view = io.AudioPackets.deserialize_view(memoryview(state))
    clone = view.clone()
    # The view holds the buffer exported: it cannot be resized under the packets.
    with pytest.raises(BufferError):
        state.extend(b"x")
    del view, state
    gc.collect()
    np.testing.assert_array_equal(_decoded(clone), expected, strict=True)


def test_a_view_points_into_shared_memory(media):
    packets = _demux(media, "h264")
    expected = _decoded(packets.clone())
    state = packets.__getstate__()
    shm = shared_memory.SharedMemory(create=True, size=len(state))
    try:
        shm.buf[: len(state)] = state
        mv = shm.buf[: len(state)]
        view = io.VideoPackets.deserialize_view(mv)
        np.testing.assert_array_equal(_decoded(view), expected, strict=True)
        del view
        gc.collect()
        mv.release()
    finally:
        shm.close()
        shm.unlink()


def test_consumed_packets_cannot_be_pickled(media):
    packets = _demux(media, "aac")
    io.decode_packets(packets)
    with pytest.raises(TypeError):
        pickle.dumps(packets)
    with pytest.raises(TypeError):
        packets.__getstate__()


def test_damaged_bytes_are_a_clear_error(media):
    state = _demux(media, "h264").__getstate__()
    for bad in (b"", b"not packets at all", state[: len(state) // 2], state[:40]):
        with pytest.raises(RuntimeError, match="serialized packets"):
            io.VideoPackets.deserialize(bad)
        with pytest.raises(RuntimeError, match="serialized packets"):
            io.VideoPackets.deserialize_view(memoryview(bad))
    # Bytes of another kind of packets are refused by the class (a RuntimeError, as in SPDL).
    with pytest.raises(RuntimeError, match="Media type mismatch during deserialization: .* video packets, not audio"):
        io.AudioPackets.deserialize(state)
    with pytest.raises(TypeError, match="bytes-like"):
        io.VideoPackets.deserialize("a string")


def test_flipped_bytes_never_crash(media):
    # Damage anywhere in the header or data: an error or packets that decode (to something), never a crash.
    state = bytearray(_demux(media, "aac").__getstate__())
    rng = np.random.default_rng(0)
    for pos in rng.integers(0, len(state), size=200):
        damaged = bytearray(state)
        damaged[int(pos)] ^= 0xFF
        try:
            p = io.AudioPackets.deserialize(bytes(damaged))
        except (RuntimeError, TypeError):
            continue
        try:
            _decoded(p)
        except RuntimeError:
            pass


def _demux_in_child(path: str, kind: str, queue) -> None:
    import spdl_rs.io as child_io

    queue.put(child_io.demux_audio(path) if kind == "audio" else child_io.demux_video(path))


@pytest.mark.parametrize("kind", ["audio", "video"])
def test_packets_demuxed_in_a_spawned_process_decode_here(media, kind):
    path = media["aac"] if kind == "audio" else media["h264"]
    expected = _decoded(io.demux_audio(path) if kind == "audio" else io.demux_video(path))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_demux_in_child, args=(path, kind, queue))
    proc.start()
    try:
        packets = queue.get(timeout=60)
    finally:
        proc.join(timeout=60)
    assert proc.exitcode == 0
    np.testing.assert_array_equal(_decoded(packets), expected, strict=True)


class _DemuxedVideos:
    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n

    def __iter__(self):
        import spdl_rs.io as child_io

        for i in range(self.n):
            yield {"i": i, "packets": child_io.demux_video(self.path)}


@pytest.mark.parametrize("kind", ["ring", "pool"])
def test_packets_cross_an_arena_without_pickling_their_data(media, kind):
    from spdl_rs.pipeline import SharedMemoryRingBuffer, SharedMemorySegmentPool, iterate_in_subprocess

    expected = _decoded(io.demux_video(media["h264"]))
    arena = SharedMemoryRingBuffer(8 << 20) if kind == "ring" else SharedMemorySegmentPool(4 << 20, 4)
    src = iterate_in_subprocess(functools.partial(_DemuxedVideos, media["h264"], 3), arena=arena, buffer_size=2, timeout=60)
    seen = 0
    for item in src:
        assert type(item["packets"]) is io.VideoPackets
        np.testing.assert_array_equal(_decoded(item["packets"]), expected, strict=True)
        seen += 1
        del item
    assert seen == 3
    del src
    gc.collect()
