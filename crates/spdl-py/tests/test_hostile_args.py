"""Hostile counts, sizes and durations given to the Python API: every one is checked at the boundary by the
module's one helper (``_native._check_count`` and its Rust side), with one message
(``NAME must be between MIN and MAX, got VALUE``), as a ``ValueError`` (never an ``OverflowError``, an abort, a
runaway allocation or 10**9 threads), before anything is allocated or started; and ``bytes`` inputs are
borrowed, not copied.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import os_threads

from spdl_rs import _native

def _pipeline_build(**kw):
    from spdl_rs.pipeline import PipelineBuilder

    return PipelineBuilder().add_source(range(3)).add_sink(2).build(**kw)


def _dataloader(**kw):
    from spdl_rs.dataloader import DataLoader

    return DataLoader(range(3), **kw)


def _elastic(**kw):
    from spdl_rs.source import ElasticSampler

    return ElasticSampler(1000, rank=0, world_size=1, **kw)


def _store(tmp, **kw):
    from spdl_rs.source import Store

    return Store.open(str(tmp), **kw)


def _cases(tmp):
    from spdl_rs import io
    from spdl_rs.source import DistributedRandomSampler, ElasticSampler, Sampler

    store = _store(tmp)
    cases = [
        ("num_threads", lambda: _pipeline_build(num_threads=10**9)),
        ("num_threads", lambda: _pipeline_build(num_threads=0)),
        ("num_threads", lambda: _pipeline_build(num_threads=2**70)),
        ("num_threads", lambda: _dataloader(num_threads=10**9)),
        ("buffer_size", lambda: _dataloader(buffer_size=-1)),
        ("batch_size", lambda: _dataloader(batch_size=-5)),
        ("timeout", lambda: _dataloader(timeout=float("nan"))),
        ("num_partitions", lambda: _elastic(num_partitions=2**40)),
        ("num_partitions", lambda: _elastic(num_partitions=10**9)),
        ("num_partitions", lambda: _elastic(num_partitions=0)),
        ("world_size", lambda: ElasticSampler(10, rank=0, world_size=-1)),
        ("rank", lambda: ElasticSampler(10, rank=3, world_size=2)),
        ("n", lambda: ElasticSampler(-1, rank=0, world_size=1)),
        ("batch_size", lambda: ElasticSampler(10, rank=0, world_size=1).num_batches(0)),
        ("n", lambda: Sampler.sequential(-1)),
        ("n", lambda: Sampler.shuffled(-3, 0)),
        ("num_samples", lambda: Sampler.weighted([1.0], -1, 0)),
        ("world_size", lambda: Sampler.sequential(10).sharded(0, 0)),
        ("rank", lambda: Sampler.sequential(10).sharded(5, 2)),
        ("n", lambda: DistributedRandomSampler(10**12, rank=0, world_size=1)),
        ("num_draws", lambda: DistributedRandomSampler(10, rank=0, world_size=1, num_draws=10**12, weights=[1.0] * 10)),
        ("world_size", lambda: DistributedRandomSampler(10**7, rank=0, world_size=10**7)),
        ("max_in_flight", lambda: _store(tmp, max_in_flight=10**9)),
        ("max_in_flight", lambda: _store(tmp, max_in_flight=-1)),
        ("max_attempts", lambda: _store(tmp, max_attempts=0)),
        ("max_attempts", lambda: _store(tmp, max_attempts=2**40)),
        ("max_object_size", lambda: _store(tmp, max_object_size=-1)),
        ("special_file_limit", lambda: _store(tmp, special_file_limit=2**70)),
        ("read_timeout", lambda: _store(tmp, read_timeout=float("nan"))),
        ("connect_timeout", lambda: _store(tmp, connect_timeout=-1.0)),
        ("attempt_timeout", lambda: _store(tmp, attempt_timeout=0.0)),
        ("concurrency", lambda: store.get_many(["a"], concurrency=10**9)),
        ("concurrency", lambda: store.get_many(["a"], concurrency=0)),
        ("start", lambda: store.get_range("a", -1, 10)),
        ("width", lambda: io.load_image_batch([b"x"], 0, 16)),
        ("height", lambda: io.load_image_batch([b"x"], 16, 10**9)),
        ("num_threads", lambda: io.load_image_batch([b"x"], 16, 16, num_threads=10**9)),
        ("num_threads", lambda: io.load_image_batch([b"x"], 16, 16, num_threads=-1)),
        ("width", lambda: io.load_image("x.png", size=(-1, 16))),
        ("width", lambda: io.decode_image(b"x", size=(2**40, 16))),
        ("width", lambda: _native.io.load_image_batch_op(0, 16)),
        ("nbytes", lambda: io.set_decode_memory_budget(-1)),
    ]
    try:
        from spdl_rs.loader import ImageLoader
    except Exception:
        ImageLoader = None
    if ImageLoader is not None:
        cases += [
            ("num_threads", lambda: ImageLoader(str(tmp), num_threads=10**9)),
            ("batch_size", lambda: ImageLoader(str(tmp), batch_size=10**12)),
            ("io_concurrency", lambda: ImageLoader(str(tmp), io_concurrency=-2)),
            ("size", lambda: ImageLoader(str(tmp), size=0)),
            ("epochs", lambda: ImageLoader(str(tmp), epochs=2**64)),
        ]
    return cases


def test_every_count_size_and_duration_is_refused_with_one_message(tmp_path, watchdog):
    threads = os_threads()
    (tmp_path / "a").write_bytes(b"hello")
    for name, call in _cases(tmp_path):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{name} must be between "), (name, message)
        assert ", got " in message, message
    # Nothing was started for the refused values (the store opened above holds one runtime thread).
    assert os_threads() <= threads + 2


def test_the_python_level_check_is_the_native_one():
    assert _native._check_count("num_threads", 4, 1, 1024) == 4
    with pytest.raises(ValueError, match=r"^num_threads must be between 1 and 1024, got 1000000000$"):
        _native._check_count("num_threads", 10**9, 1, 1024)
    with pytest.raises(ValueError, match=r"^n must be between 0 and 8, got -100000000000000000000000000000000000000000$"):
        _native._check_count("n", -(10**41), 0, 8)
    with pytest.raises(TypeError):
        _native._check_count("n", 2.5, 0, 8)
    with pytest.raises(ValueError, match="^timeout must be between 0 and inf, got NaN$"):
        _native._check_duration("timeout", float("nan"), 0.0, float("inf"))
    assert _native._check_duration("timeout", float("inf"), 0.0, float("inf")) == float("inf")
    limits = _native.ARG_LIMITS
    assert limits["threads"] == 1024 and limits["partitions_floor"] == 2**16


def test_in_range_values_keep_working(tmp_path):
    from spdl_rs.dataloader import DataLoader
    from spdl_rs.source import ElasticSampler, Sampler

    assert len(list(DataLoader(range(10), batch_size=4, num_threads=2, timeout=30.0))) == 3
    # SPDL's default of 64 partitions over a 10-item dataset (under the floor), and one per sample above it.
    assert sorted(ElasticSampler(10, rank=0, world_size=1)) == list(range(10))
    big = ElasticSampler(100_000, rank=0, world_size=1, num_partitions=100_000)
    assert len(big) == 100_000
    with pytest.raises(ValueError, match="^num_partitions must be between 1 and 100000, got 100001$"):
        ElasticSampler(100_000, rank=0, world_size=1, num_partitions=100_001)
    # Samplers stay lazy: a 2-item share of a 2**40-item order.
    assert Sampler.sequential(2**40).sharded(0, 2**39).order(0) == [0, 2**39]


def test_a_huge_pipeline_pool_is_refused_before_any_thread_starts():
    threads = os_threads()
    with pytest.raises(ValueError, match="^num_threads must be between 1 and 1024, got 1000000000$"):
        _pipeline_build(num_threads=10**9)
    with pytest.raises(ValueError, match="^num_threads must be between 1 and 1024, got 1000000000$"):
        _dataloader(num_threads=10**9)
    assert os_threads() == threads


RSS_SCRIPT = textwrap.dedent(
    """
    import json, resource, struct, sys, zlib
    import numpy as np
    from spdl_rs import io

    def png(w, h, seed):
        rows = np.random.default_rng(seed).integers(0, 256, (h, w * 3), dtype=np.uint8)
        raw = b"".join(b"\\x00" + r.tobytes() for r in rows)
        def chunk(t, d):
            return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
        ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
        return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")

    n = int(sys.argv[1])
    data = png(64, 64, 1)  # ~12 KB of incompressible pixels
    srcs = [data] * n
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = np.asarray(io.load_image_batch(srcs, 16, 16, num_threads=2))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ok = bool((out == out[0]).all())
    print(json.dumps({"input": len(data), "grew": peak - base, "output": out.nbytes, "same": ok}))
    """
)


def test_load_image_batch_borrows_bytes_instead_of_copying_them(tmp_path):
    n = 20_000
    proc = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(n)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["output"] == n * 16 * 16 * 3 and out["same"], out
    # A copy per item would be n * 12 KB = 245 MB on top of the output.
    assert out["input"] * n > 200 << 20
    assert out["grew"] < out["output"] + (100 << 20), out

