"""spdl_rs.io clips (a build with video): load_clips against a full decode, the samplers, the batch form, the
native ops in a pipeline, policies past the end and the limits."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import spdl_rs
from spdl_rs.io import ops
from spdl_rs.pipeline import PipelineBuilder

pytestmark = pytest.mark.skipif(not spdl_rs.io.has_video(), reason="built without the ffmpeg feature")


def _make(path, *codec):
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=96x64:rate=30",
         "-frames:v", "90", *codec, "-pix_fmt", "yuv420p", str(path)],
        check=True, timeout=120,
    )
    return str(path)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI is needed to make the test media")
    d = tmp_path_factory.mktemp("clips")
    return {
        "h264": _make(d / "b.mp4", "-c:v", "libx264", "-preset", "veryfast", "-bf", "3", "-g", "30", "-sc_threshold", "0"),
        "vp9": _make(d / "v.webm", "-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-g", "25"),
        "mpeg4": _make(d / "m.mkv", "-c:v", "mpeg4", "-q:v", "4", "-bf", "2", "-g", "15"),
    }


def _full(path, **size):
    return np.asarray(spdl_rs.io.load_video(path, **size))


@pytest.mark.parametrize("codec", ["h264", "vp9", "mpeg4"])
def test_clips_equal_the_full_decode_at_the_same_frames(videos, codec):
    path = videos[codec]
    full = _full(path)
    assert full.shape == (90, 64, 96, 3)
    buf, info = spdl_rs.io.load_clips(path, [0, 7, 40, 70], num_frames=8, stride=2, return_info=True)
    assert isinstance(buf, spdl_rs.Buffer)
    clips = np.asarray(buf)
    assert clips.shape == (4, 8, 64, 96, 3)
    assert info["indices"] == [[s + 2 * i for i in range(8)] for s in (0, 7, 40, 70)]
    for c, idx in enumerate(info["indices"]):
        np.testing.assert_array_equal(clips[c], full[idx])
    assert info["codec"] in ("h264", "vp9", "mpeg4") and info["frame_rate"] == pytest.approx(30)
    st = info["stats"]
    assert st["frames_converted"] == st["frames_kept"] == 32 and st["frames_in_video"] == 90
    # Resized in the same swscale pass: as the full decode at that size.
    small = np.asarray(spdl_rs.io.load_clips(path, [5], num_frames=4, width=48, height=32, filter="bilinear"))
    np.testing.assert_array_equal(small[0], _full(path, width=48, height=32, filter="bilinear")[5:9])


def test_overlapping_clips_share_their_decoded_frames(videos):
    _, info = spdl_rs.io.load_clips(videos["h264"], [2, 4, 6, 8], num_frames=16, return_info=True)
    st = info["stats"]
    assert st["frames_kept"] == 22 and st["frames_converted"] == 22 and st["runs"] == 1
    assert st["frames_decoded"] < 4 * 16


def test_starts_by_time_and_clip_fps(videos):
    _, info = spdl_rs.io.load_clips(videos["h264"], [1.0, 2.51], num_frames=3, by="time", return_info=True)
    assert info["indices"] == [[30, 31, 32], [75, 76, 77]]
    _, info = spdl_rs.io.load_clips(videos["h264"], [3], num_frames=4, fps=10.0, return_info=True)
    assert info["indices"] == [[3, 6, 9, 12]]
    with pytest.raises(ValueError, match="fps or stride"):
        spdl_rs.io.load_clips(videos["h264"], [3], num_frames=4, fps=10.0, stride=2)


def test_past_the_end_policies(videos):
    path = videos["h264"]
    with pytest.raises(ValueError, match=r"clip 1 runs past the end.*3 of its 6"):
        spdl_rs.io.load_clips(path, [0, 87], num_frames=6)
    _, info = spdl_rs.io.load_clips(path, [87], num_frames=6, policy="repeat_last", return_info=True)
    assert info["indices"] == [[87, 88, 89, 89, 89, 89]]
    _, info = spdl_rs.io.load_clips(path, [87], num_frames=6, policy="wrap", return_info=True)
    assert info["indices"] == [[87, 88, 89, 87, 88, 89]]
    with pytest.raises(ValueError, match="past the end"):
        spdl_rs.io.load_clips(path, [90], num_frames=1, policy="repeat_last")
    with pytest.raises(ValueError, match="policy"):
        spdl_rs.io.load_clips(path, [0], num_frames=1, policy="pad_with_zeros")


def test_bad_arguments_and_oversized_requests_are_refused(videos):
    path = videos["h264"]
    for bad in ({"num_frames": 0}, {"num_frames": 2, "stride": 0}, {"num_frames": 2, "by": "frames"}):
        with pytest.raises(ValueError):
            spdl_rs.io.load_clips(path, [0], **bad)
    with pytest.raises(ValueError, match="negative"):
        spdl_rs.io.load_clips(path, [-1], num_frames=2)
    with pytest.raises(TypeError):
        spdl_rs.io.load_clips(path, "0", num_frames=2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        spdl_rs.io.load_clips(path, [0], num_frames=2, num_frame=3)
    # 10^5 clips of 10^6 frames, and 8192x8192 frames: refused from the arguments, before allocating.
    with pytest.raises(RuntimeError, match="clip frames"):
        spdl_rs.io.load_clips(path, [0] * 60_000, num_frames=1_000_000, policy="repeat_last")
    with pytest.raises(RuntimeError, match="output bytes"):
        spdl_rs.io.load_clips(path, [0] * 64, num_frames=64, width=8192, height=8192)
    with pytest.raises(RuntimeError, match="output bytes"):
        spdl_rs.io.load_clips(path, [0, 10], num_frames=60, limits={"max_output_bytes": 1 << 20}, policy="wrap")


def test_samplers_follow_from_the_seed_and_the_video(videos):
    path = videos["h264"]
    a, ia = spdl_rs.io.clips_at_random_indices(path, 5, 8, seed=3, return_info=True)
    b, ib = spdl_rs.io.clips_at_random_indices(path, 5, 8, seed=3, return_info=True)
    _, ic = spdl_rs.io.clips_at_random_indices(path, 5, 8, seed=4, return_info=True)
    assert ia["indices"] == ib["indices"] and ia["indices"] != ic["indices"]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    starts = [c[0] for c in ia["indices"]]
    assert starts == sorted(starts) and all(s + 8 <= 90 for s in starts)
    _, reg = spdl_rs.io.clips_at_regular_indices(path, 3, 10, return_info=True)
    assert [c[0] for c in reg["indices"]] == [0, 40, 80]
    _, rt = spdl_rs.io.clips_at_random_timestamps(path, 4, 8, seed=1, return_info=True)
    assert all(0.0 <= c[0] <= 3.0 for c in rt["pts"])
    _, rgt = spdl_rs.io.clips_at_regular_timestamps(path, 2, 8, return_info=True)
    assert rgt["indices"][0][0] == 0
    # The whole video at 10 fps in clips of 6 frames: 3 s -> 30 ticks -> 5 clips, every third frame.
    buf, fps = spdl_rs.io.clips_at_fps(path, 10.0, 6, return_info=True)
    assert np.asarray(buf).shape[:2] == (5, 6)
    assert [i for c in fps["indices"] for i in c] == list(range(0, 90, 3))
    with pytest.raises(ValueError, match="at most|above"):
        spdl_rs.io.clips_at_random_indices(path, 10**9, 8)


def test_batch_is_one_buffer_of_every_videos_clips(videos):
    paths = [videos["h264"], videos["vp9"], videos["mpeg4"]]
    batch = spdl_rs.io.load_clips_batch(paths, [[0, 30], [5, 6], [80, 1]], num_frames=4, num_threads=2)
    arr = np.asarray(batch)
    assert arr.shape == (3, 2, 4, 64, 96, 3)
    for i, (p, starts) in enumerate(zip(paths, [[0, 30], [5, 6], [80, 1]])):
        np.testing.assert_array_equal(arr[i], np.asarray(spdl_rs.io.load_clips(p, starts, num_frames=4)))
    # One list of starts for all, or a sampler; resized.
    same = np.asarray(spdl_rs.io.load_clips_batch(paths, [10], num_frames=2, width=32, height=32))
    assert same.shape == (3, 1, 2, 32, 32, 3)
    sampled = np.asarray(
        spdl_rs.io.load_clips_batch(paths, num_frames=2, sampler="random_indices", num_clips=3, seed=9)
    )
    again = np.asarray(
        spdl_rs.io.load_clips_batch(paths, num_frames=2, sampler="random_indices", num_clips=3, seed=9)
    )
    np.testing.assert_array_equal(sampled, again)
    # A failing video names its batch index and file.
    with pytest.raises(RuntimeError, match=r"batch item 1: .*v\.webm.*past the end"):
        spdl_rs.io.load_clips_batch(paths, [[0], [89], [0]], num_frames=4)
    with pytest.raises(ValueError, match="2 lists of starts for 3 videos"):
        spdl_rs.io.load_clips_batch(paths, [[0], [1]], num_frames=1)


def test_native_ops_in_a_pipeline(videos):
    # A direct call first: where FFmpeg is missing it raises the clear error (a pipeline counts it per item).
    spdl_rs.io.load_clips(videos["h264"], [0], num_frames=1)
    paths = [videos["h264"], videos["vp9"], videos["mpeg4"]]
    p = (
        PipelineBuilder()
        .add_source(paths)
        .pipe(ops.load_clips(num_frames=4, sampler="regular_indices", num_clips=2, width=32, height=32), concurrency=2)
        .add_sink(4)
        .build(num_threads=2)
    )
    with p.auto_stop():
        got = [np.asarray(b) for b in p]
    assert len(got) == 3 and all(g.shape == (2, 4, 32, 32, 3) for g in got)
    # (src, starts) pairs, and the batch op after aggregate.
    p = (
        PipelineBuilder()
        .add_source([(paths[0], [1, 2]), (paths[2], [3])])
        .pipe(ops.load_clips(num_frames=2))
        .add_sink(4)
        .build(num_threads=1)
    )
    with p.auto_stop():
        shapes = sorted(np.asarray(b).shape for b in p)
    assert shapes == [(1, 2, 64, 96, 3), (2, 2, 64, 96, 3)]
    p = (
        PipelineBuilder()
        .add_source(paths)
        .aggregate(3)
        .pipe(ops.load_clips_batch(num_frames=2, starts=[0, 20]))
        .add_sink(2)
        .build(num_threads=1)
    )
    with p.auto_stop():
        (batch,) = list(p)
    assert np.asarray(batch).shape == (3, 2, 2, 64, 96, 3)


def test_the_decode_memory_budget_refuses_before_allocating(videos):
    from conftest import run_child

    # Limits raised out of the way: 4,000 clips of 1,000 frames (74 GB) are refused by the process's decode
    # memory budget from the arguments, in a child whose address space is capped at 2 GiB.
    proc = run_child(
        f"""
        import spdl_rs.io as io
        spdl_rs_budget = io.decode_memory_budget()
        io.set_decode_memory_budget(1 << 30)
        try:
            io.load_clips({videos["h264"]!r}, [0] * 4000, num_frames=1000, policy="wrap",
                          limits={{"max_frames": 1 << 40, "max_output_bytes": 1 << 50}})
        except RuntimeError as e:
            print("refused:", e)
        """,
        address_space=2 << 30,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "clip output bytes" in proc.stdout, proc.stdout
    # In this process: a batch over the budget, and a clip request over it.
    old = spdl_rs.io.decode_memory_budget()
    spdl_rs.io.set_decode_memory_budget(16 << 20)
    try:
        with pytest.raises(RuntimeError, match="clip output bytes"):
            spdl_rs.io.load_clips(videos["h264"], list(range(60)), num_frames=20, policy="wrap")
        with pytest.raises(RuntimeError, match="batch output bytes"):
            spdl_rs.io.load_clips_batch([videos["h264"]] * 4, list(range(20)), num_frames=20, policy="wrap")
    finally:
        spdl_rs.io.set_decode_memory_budget(old)


def test_clip_loader_batches_every_video_once_per_epoch_and_counts_a_broken_one(videos, tmp_path):
    import shutil as sh

    from spdl_rs.loader import ClipLoader

    spdl_rs.io.load_clips(videos["h264"], [0], num_frames=1)  # the clear error where FFmpeg is missing
    root = tmp_path / "videos"
    for cls, names in {"a": ["h264", "vp9"], "b": ["mpeg4"]}.items():
        (root / cls).mkdir(parents=True)
        for n in names:
            sh.copy(videos[n], root / cls / f"{n}{Path(videos[n]).suffix}")
    (root / "b" / "broken.mp4").write_bytes(b"\x00" * 4096)
    loader = ClipLoader(str(root), batch_size=2, num_threads=2, num_clips=3, num_frames=4, size=32, epochs=2,
                        sampling="regular")
    assert loader.videos_per_epoch == 4
    seen = []
    for clips, labels in loader:
        arr = np.asarray(clips)
        assert arr.shape[1:] == (3, 4, 32, 32, 3) and arr.shape[0] == len(labels)
        seen += labels
    assert sorted(seen) == [0, 0, 0, 0, 1, 1]  # 3 good videos x 2 epochs, by class folder
    assert loader.failed_videos == 2  # the broken one, once per epoch
    assert "decode" in loader.stats_table()
    # The same clips as load_clips' regular sampler at that size.
    one = ClipLoader(str(root / "a"), batch_size=1, num_clips=3, num_frames=4, size=32, sampling="regular")
    got = [np.asarray(c)[0] for c, _ in one]
    want = {
        n: np.asarray(spdl_rs.io.clips_at_regular_indices(videos[n], 3, 4, width=32, height=32))
        for n in ("h264", "vp9")
    }
    assert len(got) == 2 and all(any(np.array_equal(g, w) for w in want.values()) for g in got)
    with pytest.raises(ValueError):
        ClipLoader(str(root), sampling="sometimes")
    with pytest.raises(ValueError):
        ClipLoader(str(root), num_frames=0)
