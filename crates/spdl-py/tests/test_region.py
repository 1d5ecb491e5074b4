"""``PipelineBuilder.to(...)``: a region of stages run as one nested pipeline in each worker of a process pool.

The expected values are SPDL 0.8.0's for the same pipelines (outputs come in completion order, so they are
compared sorted). The ops are module-level functions so that the ``spawn`` start method can pickle them.
"""

import multiprocessing
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure, build_pipeline
from spdl_rs.pipeline.defs import (
    MAIN_PROCESS,
    Aggregate,
    InterpreterPoolExecutorConfig,
    Pipe,
    PipelineConfig,
    PlacementConfig,
    ProcessPoolExecutorConfig,
    SinkConfig,
    SourceConfig,
)

OFFSET = 0


def set_offset(value):
    global OFFSET
    OFFSET = value


def add_offset(x):
    return x + OFFSET


def double(x):
    return x * 2


def flaky(x):
    if x % 5 == 3:
        raise ValueError(f"bad {x}")
    return x


def pid_of(_):
    return os.getpid()


def die_on_5(x):
    if x == 5:
        os._exit(3)
    return x


def by_three(batch):
    return [x % 3 for x in batch]


def tag0(batch):
    return [(0, x) for x in batch]


def tag1(batch):
    return [(1, x) for x in batch]


def drop_all(batch):
    return []


def run(pipeline):
    with pipeline.auto_stop():
        return list(pipeline)


def region_children():
    return [p for p in multiprocessing.active_children() if p.name == "spdl_rs-region"]


@pytest.fixture(autouse=True)
def _no_worker_left():
    yield
    deadline = time.monotonic() + 10
    while region_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert region_children() == []


def test_pipe_and_aggregate_run_in_the_workers(watchdog):
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(double)
        .aggregate(3)
        .to(MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    # Items are dealt round-robin to the two workers, each of which batches its own.
    assert sorted(run(pipeline)) == [
        [0, 4, 8], [2, 6, 10], [12, 16, 20], [14, 18, 22], [24, 28, 32], [26, 30, 34], [36], [38],
    ]
    assert "subprocess_pipeline(double+aggregate(op=collate(3), drop_last=False))" in [
        s.name for s in pipeline.get_stats()
    ]


def test_transfers_of_several_items(watchdog):
    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .to(ProcessPoolExecutorConfig(max_workers=2), buffer_size=4)
        .pipe(double)
        .aggregate(3)
        .to(MAIN_PROCESS, buffer_size=2)
        .pipe(sum)
        .add_sink(3)
        .build(num_threads=2)
    )
    assert sorted(run(pipeline)) == [6, 30, 40, 58, 64, 74, 108]
    names = [s.name for s in pipeline.get_stats()]
    assert "subprocess_pipeline(double+aggregate(op=collate(3), drop_last=False))[buffer_size in=4 out=2]" in names


def test_initializer_runs_in_each_worker(watchdog):
    spec = ProcessPoolExecutorConfig(max_workers=2, initializer=set_offset, initargs=(100,))
    pipeline = PipelineBuilder().add_source(range(6)).to(spec).pipe(add_offset).to(MAIN_PROCESS).add_sink(3)
    pipeline = pipeline.build(num_threads=2)
    assert sorted(run(pipeline)) == [100, 101, 102, 103, 104, 105]
    assert OFFSET == 0  # not in this process


def test_spawn_context_and_an_executor_left_behind(watchdog):
    spec = ProcessPoolExecutorConfig(max_workers=2, mp_context="spawn")
    with ThreadPoolExecutor(1) as executor:
        pipeline = (
            PipelineBuilder()
            .add_source(range(8))
            .to(spec)
            .pipe(double, executor=executor)  # not carried into the workers: the op runs on their threads
            .to(MAIN_PROCESS)
            .add_sink(3)
            .build(num_threads=2)
        )
        assert sorted(run(pipeline)) == [0, 2, 4, 6, 8, 10, 12, 14]


def test_failures_inside_a_worker(watchdog):
    def build(**kwargs):
        return (
            PipelineBuilder()
            .add_source(range(20))
            .to(ProcessPoolExecutorConfig(max_workers=2))
            .pipe(flaky)
            .to(MAIN_PROCESS)
            .add_sink(3)
            .build(num_threads=2, **kwargs)
        )

    # As in SPDL: logged by the worker, the item dropped, the rest goes on ...
    assert sorted(run(build(max_failures=3))) == [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17, 19]
    # ... and with max_failures=0 the worker's pipeline fails, which fails the region.
    with pytest.raises(PipelineFailure) as info:
        run(build(max_failures=0))
    assert info.value.stage == "subprocess_pipeline(flaky)"
    assert "bad 3" in str(info.value.exceptions[0]) or "bad 8" in str(info.value.exceptions[0])


def test_a_worker_that_dies_is_an_error_not_a_hang(watchdog):
    def build(**kwargs):
        return (
            PipelineBuilder()
            .add_source(range(50))
            .to(ProcessPoolExecutorConfig(max_workers=2))
            .pipe(die_on_5)
            .to(MAIN_PROCESS)
            .add_sink(3)
            .build(num_threads=2, **kwargs)
        )

    start = time.monotonic()
    with pytest.raises(PipelineFailure) as info:
        run(build(max_failures=0))
    assert time.monotonic() - start < 20
    assert info.value.stage == "subprocess_pipeline(die_on_5)"
    message = str(info.value.exceptions[0])
    assert "exited unexpectedly (exit code 3)" in message, message
    # Without a budget it is one failure of the region: that epoch ends early, nothing hangs.
    start = time.monotonic()
    out = run(build())
    assert time.monotonic() - start < 20
    assert 5 not in out and len(out) < 50


def test_stop_mid_run_leaves_no_worker(watchdog):
    pipeline = (
        PipelineBuilder()
        .add_source(iter(range(10**9)))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(double)
        .to(MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    pipeline.start()
    got = [pipeline.get_item(timeout=30) for _ in range(10)]
    assert all(x % 2 == 0 for x in got)
    assert len(region_children()) == 2
    start = time.monotonic()
    pipeline.stop(timeout=30)
    assert time.monotonic() - start < 15
    assert region_children() == []


def test_the_pool_is_kept_across_epochs(watchdog):
    pipeline = (
        PipelineBuilder()
        .add_source(range(10), continuous=True)
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(double)
        .aggregate(4)
        .to(MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        for _ in range(3):
            assert sorted(pipeline.get_iterator(timeout=30)) == [[0, 4, 8, 12], [2, 6, 10, 14], [16], [18]]

    pipeline = (
        PipelineBuilder()
        .add_source(range(10), continuous=True)
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(pid_of)
        .to(MAIN_PROCESS)
        .add_sink(3)
        .build(num_threads=2)
    )
    with pipeline.auto_stop():
        pids = [set(pipeline.get_iterator(timeout=30)) for _ in range(3)]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]
    assert os.getpid() not in pids[0]


def test_a_region_in_a_config(watchdog):
    cfg = PipelineConfig(
        src=SourceConfig(range(6)),
        pipes=[
            PlacementConfig(ProcessPoolExecutorConfig(max_workers=2)),
            Pipe(double),
            Aggregate(6),
            PlacementConfig(MAIN_PROCESS),
        ],
        sink=SinkConfig(2),
    )
    assert sorted(x for batch in run(build_pipeline(cfg, num_threads=1)) for x in batch) == [0, 2, 4, 6, 8, 10]


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="subinterpreters exist on 3.14+")
def test_interpreter_pool_needs_python_3_14():
    builder = (
        PipelineBuilder()
        .add_source(range(3))
        .to(InterpreterPoolExecutorConfig(max_workers=1))
        .pipe(double)
        .to(MAIN_PROCESS)
        .add_sink(1)
    )
    with pytest.raises(RuntimeError, match="requires Python 3.14 or later"):
        builder.build(num_threads=1)
    cfg = PipelineConfig(
        src=SourceConfig(range(3)),
        pipes=[PlacementConfig(InterpreterPoolExecutorConfig()), Pipe(double), PlacementConfig(MAIN_PROCESS)],
        sink=SinkConfig(1),
    )
    with pytest.raises(RuntimeError, match="requires Python 3.14 or later"):
        build_pipeline(cfg, num_threads=1)


def test_region_markers_are_checked():
    spec = ProcessPoolExecutorConfig(max_workers=1)
    with pytest.raises(ValueError, match="must be closed with `to\\(MAIN_PROCESS\\)`"):
        PipelineBuilder().add_source(range(3)).to(spec).pipe(double).add_sink(1).build(num_threads=1)
    with pytest.raises(ValueError, match="empty `to\\(...\\)` region"):
        PipelineBuilder().add_source(range(3)).to(spec).to(MAIN_PROCESS).add_sink(1).get_config()
    with pytest.raises(ValueError, match="output_order='input'"):
        (
            PipelineBuilder()
            .add_source(range(3))
            .to(spec)
            .pipe(double, output_order="input")
            .to(MAIN_PROCESS)
            .add_sink(1)
            .build(num_threads=1)
        )
    with ThreadPoolExecutor(1) as executor, pytest.raises(TypeError, match="not a live Executor"):
        PipelineBuilder().to(executor)
    with pytest.raises(TypeError, match="Got: object"):
        PipelineBuilder().to(object())
    with pytest.raises(ValueError, match="must be a positive integer"):
        PipelineBuilder().to(spec, buffer_size=0)
    assert repr(PlacementConfig(MAIN_PROCESS)) == "placement(MAIN_PROCESS)"
    assert repr(PlacementConfig(ProcessPoolExecutorConfig(max_workers=2), buffer_size=3)) == (
        "placement(ProcessPoolExecutorConfig(max_workers=2, initializer=None, initargs=(), mp_context=None), "
        "buffer_size=3)"
    )


def test_subinterpreter_workers_run_the_stages_in_python(monkeypatch, watchdog):
    """spdl_rs's native module cannot be loaded in a subinterpreter (PyO3), so subinterpreter workers run a
    region's stages with a pure-Python runner. Here it runs on threads with ``queue.Queue`` (this CPython may
    have no ``concurrent.interpreters``): the same protocol and results as on 3.14, without the interpreters."""
    from spdl_rs.pipeline import _region

    class ThreadBackend(_region._InterpreterBackend):
        def __init__(self):
            pass

        def make_queue(self, maxsize):
            return queue.Queue(maxsize)

        def spawn(self, args):
            worker = threading.Thread(
                target=_region._interp_worker_main, args=self.worker_args(args), name="spdl_rs-test-interp", daemon=True
            )
            worker.start()
            return _region._Worker(worker)

        def stop(self, w, out_q):
            w.runner.join(10)

    monkeypatch.setattr(_region, "_InterpreterBackend", ThreadBackend)
    monkeypatch.setattr(_region, "check_interpreters_available", lambda: None)
    spec = InterpreterPoolExecutorConfig(max_workers=2)

    def build(*stages, max_failures=-1, buffer_size=1):
        builder = PipelineBuilder().add_source(range(20)).to(spec, buffer_size=buffer_size)
        for stage in stages:
            builder = stage(builder)
        return builder.to(MAIN_PROCESS).add_sink(3).build(num_threads=2, max_failures=max_failures)

    pipeline = build(lambda b: b.pipe(double), lambda b: b.aggregate(3))
    assert sorted(run(pipeline)) == [
        [0, 4, 8], [2, 6, 10], [12, 16, 20], [14, 18, 22], [24, 28, 32], [26, 30, 34], [36], [38],
    ]
    pipeline = build(lambda b: b.pipe(double), lambda b: b.aggregate(3), lambda b: b.pipe(sum), buffer_size=4)
    assert sorted(run(pipeline)) == [6, 30, 40, 58, 64, 74, 108]
    pipeline = build(lambda b: b.pipe(flaky))
    assert sorted(run(pipeline)) == [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17, 19]
    with pytest.raises(PipelineFailure) as info:
        run(build(lambda b: b.pipe(flaky), max_failures=0))
    assert info.value.stage == "subprocess_pipeline(flaky)"
    paths = [[Pipe(tag0)], [Pipe(tag1)], [Pipe(drop_all)]]
    pipeline = build(lambda b: b.aggregate(4), lambda b: b.path_variants(by_three, paths, batched=True))
    # Each worker batches the items dealt to it (0, 2, 4, ... and 1, 3, 5, ...), then routes the batch.
    assert sorted(run(pipeline)) == [
        [(0, 0), (0, 6), (1, 4)],
        [(0, 3), (1, 1), (1, 7)],
        [(0, 9), (0, 15), (1, 13)],
        [(0, 12), (1, 10)],
        [(0, 18), (1, 16)],
        [(1, 19)],
    ]
