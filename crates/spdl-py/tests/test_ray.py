"""``spdl_rs.ray`` against a real local Ray cluster (``ray.init(num_cpus=2)``, one per test session): spdl-rs
decoding inside ``map_batches`` (tasks and an actor pool), failed rows, reproducible random crops, and Ray's
iterators (``Dataset.iterator()``, ``streaming_split``) as the source of an spdl_rs pipeline. Real JPEGs made by
the ``ffmpeg`` CLI. Needs ``ray[data]``; skipped where Ray is not installed (free-threaded CPython)."""

import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import spdl_rs.io as io
from spdl_rs.pipeline import PipelineBuilder


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster with 2 CPUs for the whole session, shut down at its end."""
    ray = pytest.importorskip("ray")  # no Ray wheels for free-threaded CPython
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:  # Ray without its Data extra: a broken setup, not a reason to skip
        pytest.fail(f'Ray is installed but Ray Data is not importable ({exc}): install "ray[data]"')
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # A small object store: the test data is small, and a CI container's /dev/shm may be too.
    ray.init(num_cpus=2, object_store_memory=256 * 2**20, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True  # the tests compare rows with their paths
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.fail("the ffmpeg CLI is needed to make the test JPEGs")
    d = tmp_path_factory.mktemp("ray_jpegs")
    paths = []
    for i in range(10):
        w, h = 96 + 8 * i, 72 + 4 * (i % 3)
        p = d / f"{i:02d}.jpg"
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
             f"testsrc2=size={w}x{h}:rate=1", "-vf", f"hue=h={i * 36}", "-frames:v", "1", "-q:v", "3", str(p)],
            check=True,
            timeout=60,
        )
        paths.append(str(p))
    return paths


def _by_path(rows_or_batches, column="image"):
    out = {}
    for batch in rows_or_batches:
        for path, image in zip(batch["path"], batch[column]):
            out[str(path)] = np.asarray(image)
    return out


def test_decoder_as_tasks_matches_load_image_batch(ray_cluster, jpegs):
    from spdl_rs.ray import ImageBatchDecoder

    ray = ray_cluster
    ds = ray.data.read_binary_files(jpegs, include_paths=True)
    ds = ds.map_batches(ImageBatchDecoder(40, 30), batch_size=4)
    batches = list(ds.iter_batches(batch_size=3, batch_format="numpy"))
    assert all(set(b) == {"path", "image"} for b in batches)  # the encoded bytes are dropped
    got = _by_path(batches)
    assert sorted(got) == sorted(jpegs)
    want = np.asarray(io.load_image_batch(jpegs, 40, 30))
    for i, path in enumerate(jpegs):
        assert got[path].dtype == np.uint8 and got[path].shape == (30, 40, 3)
        assert np.array_equal(got[path], want[i]), path


def test_decoder_in_an_actor_pool_reads_paths_with_center_crop(ray_cluster, jpegs):
    from spdl_rs.ray import ImageBatchDecoder

    ray = ray_cluster
    ds = ray.data.from_items([{"file": p, "label": i} for i, p in enumerate(jpegs)])
    ds = ds.map_batches(
        ImageBatchDecoder,
        fn_constructor_kwargs=dict(width=32, height=32, column="file", output_column="pixels", keep_input=True,
                                   transform="center-crop", layout="NCHW", normalize="unit", num_threads=2),
        batch_size=5,
        num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=1),
    )
    rows = ds.take_all()
    assert sorted(r["file"] for r in rows) == sorted(jpegs)
    want = np.asarray(io.load_image_batch(jpegs, 32, 32, transform="center-crop", layout="NCHW", normalize="unit"))
    for row in rows:
        pixels = np.asarray(row["pixels"])
        assert pixels.dtype == np.float32 and pixels.shape == (3, 32, 32)
        assert np.array_equal(pixels, want[row["label"]]), row["file"]


def test_failed_rows_fail_the_job_or_are_dropped(ray_cluster, jpegs, tmp_path):
    from spdl_rs.ray import ImageBatchDecoder

    ray = ray_cluster
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    files = [*jpegs[:3], str(broken), *jpegs[3:5]]
    ds = ray.data.read_binary_files(files, include_paths=True)
    lenient = ds.map_batches(ImageBatchDecoder(24, 24, strict=False), batch_size=6)
    rows = lenient.take_all()
    assert sorted(r["path"] for r in rows) == sorted([*jpegs[:5]])  # the broken one only is gone
    assert all(np.asarray(r["image"]).std() > 5 for r in rows)  # real pixels, no zero slot
    strict = ds.map_batches(ImageBatchDecoder(24, 24), batch_size=6)
    with pytest.raises(Exception, match=r"row 3 \(.*broken\.jpg\) failed to decode"):
        strict.take_all()


def test_random_crops_are_reproducible_with_a_key_column(ray_cluster, jpegs):
    from spdl_rs.ray import ImageBatchDecoder

    ray = ray_cluster
    items = [{"bytes": open(p, "rb").read(), "id": 100 + i} for i, p in enumerate(jpegs)]
    ds = ray.data.from_items(items)

    def crops(seed, batch_size):
        decoder = ImageBatchDecoder(24, 24, transform="random-resized-crop", seed=seed, key_column="id")
        return {int(r["id"]): np.asarray(r["image"]) for r in ds.map_batches(decoder, batch_size=batch_size).take_all()}

    a, b, c = crops(7, 3), crops(7, 4), crops(8, 3)
    want = np.asarray(io.load_image_batch(jpegs, 24, 24, transform="random-resized-crop", seed=7,
                                          keys=[100 + i for i in range(len(jpegs))]))
    for i in range(len(jpegs)):
        assert np.array_equal(a[100 + i], want[i]) and np.array_equal(b[100 + i], want[i]), i
    assert any(not np.array_equal(a[k], c[k]) for k in a)  # another seed, other crops


def test_decoder_checks_its_arguments_and_batches():
    from spdl_rs.ray import ImageBatchDecoder

    with pytest.raises(ValueError, match="width"):
        ImageBatchDecoder(0, 10)
    with pytest.raises(ValueError, match="transform"):
        ImageBatchDecoder(10, 10, transform="crop")
    with pytest.raises(ValueError, match="layout"):
        ImageBatchDecoder(10, 10, layout="HWC")
    decoder = ImageBatchDecoder(10, 10)
    with pytest.raises(KeyError, match="'bytes' is not in the batch"):
        decoder({"path": np.array(["a"])})
    with pytest.raises(TypeError, match="row 1 of column 'bytes' is int"):
        decoder({"bytes": np.array([b"x", 3], dtype=object)})
    empty = decoder({"bytes": np.array([], dtype=object), "path": np.array([], dtype=object)})
    assert empty["image"].shape == (0, 10, 10, 3) and list(empty) == ["path", "image"]


def test_decoder_names_a_failed_row_or_drops_it(jpegs):
    from spdl_rs.ray import ImageBatchDecoder

    data = [open(p, "rb").read() for p in jpegs[:3]]
    data[1] = data[1][:50]
    batch = {"bytes": np.array(data, dtype=object), "path": np.array(["a.jpg", "b.jpg", "c.jpg"]),
             "label": np.array([0, 1, 2])}
    with pytest.raises(RuntimeError, match=r"row 1 \(b\.jpg\) failed to decode: .*truncated"):
        ImageBatchDecoder(16, 16)(batch)
    out = ImageBatchDecoder(16, 16, strict=False)(batch)
    assert out["path"].tolist() == ["a.jpg", "c.jpg"] and out["label"].tolist() == [0, 2]
    want = np.asarray(io.load_image_batch([data[0], data[2]], 16, 16))
    assert np.array_equal(out["image"], want)


def _pipeline(source, collate=None):
    builder = PipelineBuilder().add_source(source)
    if collate is not None:
        builder = builder.pipe(collate)
    return builder.add_sink(1).build(num_threads=2, stage_buffer_size=1)


def test_source_runs_a_pipeline_over_a_data_iterator_epoch_after_epoch(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    ds = ray.data.range(40, override_num_blocks=4)
    source = RayDataSource(ds.iterator(), batch_size=8)

    def collate(batch):
        return batch["id"].sum(), len(batch["id"])

    for epoch in range(2):
        assert source.epoch == epoch
        pipeline = _pipeline(source, collate)
        with pipeline.auto_stop():
            out = list(pipeline)
        assert sum(s for s, _ in out) == sum(range(40)) and [n for _, n in out] == [8] * 5
    assert source.state_dict() == {"epoch": 2, "position": 0}

    rows = RayDataSource(ds, rows=True)  # a Dataset too, row by row
    pipeline = _pipeline(rows)
    with pipeline.auto_stop():
        assert sorted(r["id"] for r in pipeline) == list(range(40))


def test_source_keeps_back_pressure(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    ds = ray.data.range(400, override_num_blocks=4)
    source = RayDataSource(ds.iterator(), batch_size=4, prefetch_batches=1)
    pipeline = _pipeline(source)
    with pipeline.auto_stop():
        first = pipeline.get_item(timeout=60)
        time.sleep(1.0)  # room for a source that ignored back-pressure to run ahead
        # The consumer holds one batch; the source's queue, the sink and the items in hand hold a few more.
        assert source.position <= 8, source.position
        rest = list(pipeline)
    assert sum(len(b["id"]) for b in [first, *rest]) == 400


def test_streaming_split_feeds_one_pipeline_per_rank(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    shards = ray.data.range(60, override_num_blocks=6).streaming_split(2, equal=True)
    seen: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def rank(r):
        try:
            pipeline = _pipeline(RayDataSource(shards[r], batch_size=5), lambda b: b["id"].tolist())
            with pipeline.auto_stop():
                for ids in pipeline:
                    seen[r].extend(ids)
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(seen[0]) == len(seen[1]) == 30
    assert sorted(seen[0] + seen[1]) == list(range(60))


def test_source_state_is_exact_at_epoch_boundaries_only(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    ds = ray.data.range(30, override_num_blocks=3)  # preserve_order: one deterministic order
    first = RayDataSource(ds.iterator(), batch_size=5)
    items = iter(first)
    taken = [next(items)["id"].tolist() for _ in range(2)]
    mid = first.state_dict()
    assert mid == {"epoch": 0, "position": 2}
    items.close()

    with pytest.raises(ValueError, match="cannot resume mid-epoch"):
        RayDataSource(ds.iterator(), batch_size=5).load_state_dict(mid)
    with pytest.raises(ValueError, match="not a state"):
        RayDataSource(ds.iterator()).load_state_dict({"step": 3})

    skip = RayDataSource(ds.iterator(), batch_size=5, mid_epoch="skip")
    skip.load_state_dict(mid)
    rest = [b["id"].tolist() for b in skip]
    assert [i for b in taken + rest for i in b] == list(range(30))
    assert skip.state_dict() == {"epoch": 1, "position": 0}

    restart = RayDataSource(ds.iterator(), batch_size=5, mid_epoch="restart")
    restart.load_state_dict(mid)
    assert [i for b in restart for i in b["id"].tolist()] == list(range(30))

    boundary = RayDataSource(ds.iterator(), batch_size=5)
    boundary.load_state_dict({"epoch": 3, "position": 0})
    assert boundary.epoch == 3 and len(list(boundary)) == 6 and boundary.epoch == 4


def test_without_ray_the_module_imports_and_says_what_is_missing():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import spdl_rs.ray as r\n"
        "d = r.ImageBatchDecoder(8, 8)\n"  # decoding needs no Ray: it runs wherever the callable is
        "try:\n"
        "    r.RayDataSource(object())\n"
        "except ImportError as e:\n"
        "    print('IMPORT-ERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORT-ERROR spdl_rs.ray needs Ray Data" in out.stdout and "pip install" in out.stdout


def test_a_failed_ray_job_fails_the_pipeline(ray_cluster, jpegs, tmp_path):
    from spdl_rs.pipeline import PipelineFailure
    from spdl_rs.ray import ImageBatchDecoder, RayDataSource

    ray = ray_cluster
    broken = tmp_path / "truncated.jpg"
    broken.write_bytes(open(jpegs[0], "rb").read()[:64])
    ds = ray.data.read_binary_files([jpegs[1], str(broken)], include_paths=True)
    ds = ds.map_batches(ImageBatchDecoder(16, 16), batch_size=2)
    source = RayDataSource(ds.iterator(), batch_size=2)
    pipeline = _pipeline(source)
    got = []
    with pytest.raises(PipelineFailure) as failure:
        with pipeline.auto_stop():
            got.extend(pipeline)
    assert "truncated.jpg) failed to decode" in str(failure.value) + repr(failure.value.args), failure.value
    assert [p for b in got for p in b["path"]] in ([], [jpegs[1]])  # nothing after the failure
    assert source.epoch == 0  # the epoch did not end: a restore goes back to its start


def test_a_continuous_source_reads_epoch_after_epoch(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    source = RayDataSource(ray.data.range(12, override_num_blocks=2).iterator(), batch_size=4)
    pipeline = PipelineBuilder().add_source(source, continuous=True).add_sink(1).build(num_threads=2)
    with pipeline.auto_stop():
        for epoch in range(3):
            ids = [i for b in pipeline.get_iterator(timeout=60) for i in b["id"].tolist()]
            assert sorted(ids) == list(range(12)), epoch
    assert source.epoch >= 2


def test_a_pipeline_stopped_mid_epoch_leaves_the_source_reusable(ray_cluster):
    from spdl_rs.ray import RayDataSource

    ray = ray_cluster
    source = RayDataSource(ray.data.range(20, override_num_blocks=2).iterator(), batch_size=4)
    pipeline = _pipeline(source)
    with pipeline.auto_stop():
        pipeline.get_item(timeout=60)
    assert source.epoch == 0 and source.position >= 1  # the unfinished epoch does not count
    pipeline = _pipeline(source)
    with pipeline.auto_stop():
        ids = [i for b in pipeline for i in b["id"].tolist()]
    assert sorted(ids) == list(range(20))  # the epoch read again, whole
    assert source.state_dict() == {"epoch": 1, "position": 0}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.fail("the ffmpeg CLI is needed to make the test videos")
    if not io.has_video():
        pytest.skip("built without the ffmpeg feature")
    d = tmp_path_factory.mktemp("ray_videos")
    paths = []
    for i in range(4):
        p = d / f"v{i}.mp4"
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
             f"testsrc2=size={64 + 16 * i}x48:rate=25", "-frames:v", str(40 + 10 * i), "-c:v", "libx264", "-g", "20",
             "-pix_fmt", "yuv420p", str(p)],
            check=True,
            timeout=60,
        )
        paths.append(str(p))
    return paths


def test_clip_decoder_as_tasks_matches_load_clips(ray_cluster, videos):
    from spdl_rs.ray import VideoClipDecoder

    io.load_clips(videos[0], [0], num_frames=1)  # the clear error where FFmpeg is missing

    ray = ray_cluster
    ds = ray.data.read_binary_files(videos, include_paths=True)
    ds = ds.map_batches(VideoClipDecoder(3, 4, width=32, height=24, seed=5, num_threads=2), batch_size=2)
    got = _by_path(ds.iter_batches(batch_size=4, batch_format="numpy"), column="clips")
    assert sorted(got) == sorted(videos)
    for path in videos:
        want = np.asarray(io.clips_at_random_indices(path, 3, 4, seed=5, width=32, height=24, policy="repeat_last"))
        assert got[path].shape == (3, 4, 24, 32, 3)
        assert np.array_equal(got[path], want), path


def test_clip_decoder_keys_seed_each_row_and_failed_rows_are_named_or_dropped(videos):
    from spdl_rs.ray import VideoClipDecoder

    io.load_clips(videos[0], [0], num_frames=1)  # the clear error where FFmpeg is missing

    data = [open(p, "rb").read() for p in videos[:2]] + [b"not a video"]
    batch = {"bytes": np.array(data, dtype=object), "path": np.array(["a.mp4", "b.mp4", "bad.mp4"]),
             "id": np.array([7, 8, 9])}
    dec = VideoClipDecoder(2, 3, width=16, height=16, key_column="id", strict=False)
    out = dec(batch)
    assert out["clips"].shape == (2, 2, 3, 16, 16, 3) and list(out["path"]) == ["a.mp4", "b.mp4"]
    again = dec({k: v[:1] for k, v in batch.items()})
    assert np.array_equal(again["clips"][0], out["clips"][0])  # the same row, the same clips
    with pytest.raises(RuntimeError, match=r"row 2 \(bad\.mp4\)"):
        VideoClipDecoder(2, 3, width=16, height=16)(batch)
    for bad in ({"sampler": "sometimes"}, {"policy": "pad"}, {"width": 0}):
        kwargs = {"width": 16, "height": 16, **bad}
        with pytest.raises(ValueError):
            VideoClipDecoder(2, 3, **kwargs)
