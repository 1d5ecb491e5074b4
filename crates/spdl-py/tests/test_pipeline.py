"""spdl_rs.pipeline: the spdl.pipeline API on the Rust engine."""

import asyncio
import random
import threading
import time

import pytest

from spdl_rs.pipeline import Pipeline, PipelineBuilder, TaskPerfStats


def run(builder: PipelineBuilder, num_threads: int = 4, **kw) -> list:
    p = builder.add_sink(3).build(num_threads=num_threads, **kw)
    with p.auto_stop():
        return list(p)


def test_three_stages_in_input_order():
    out = run(
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(lambda x: x + 1, concurrency=4, output_order="input")
        .pipe(lambda x: x * 2, concurrency=3, output_order="input")
        .pipe(str, output_order="input")
    )
    assert out == [str((i + 1) * 2) for i in range(1000)]


def test_completion_order_lets_fast_items_overtake():
    def slow_first(x):
        time.sleep(0.5 if x == 0 else 0.001)
        return x

    out = run(PipelineBuilder().add_source(range(20)).pipe(slow_first, concurrency=4))
    assert sorted(out) == list(range(20))
    assert out[0] != 0  # item 0 was still sleeping while the others came through

    out = run(PipelineBuilder().add_source(range(20)).pipe(slow_first, concurrency=4, output_order="input"))
    assert out == list(range(20))


def test_random_delays_input_order_is_kept():
    def jitter(x):
        time.sleep(random.random() * 0.005)
        return x

    out = run(PipelineBuilder().add_source(list(range(300))).pipe(jitter, concurrency=8, output_order="input"))
    assert out == list(range(300))


def test_sync_ops_overlap(watchdog):
    # Four calls must be running at once to pass the barrier; serialised calls would time out.
    barrier = threading.Barrier(4, timeout=60)

    def meet(x):
        barrier.wait()
        return x

    out = run(PipelineBuilder().add_source(range(8)).pipe(meet, concurrency=4), num_threads=4)
    assert sorted(out) == list(range(8))


def test_async_ops_overlap(watchdog):
    state = {"in_flight": 0, "peak": 0}
    everyone = asyncio.Event()

    async def meet(x):
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        if state["in_flight"] == 4:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), timeout=60)
        state["in_flight"] -= 1
        return x * 10

    out = run(PipelineBuilder().add_source(range(4)).pipe(meet, concurrency=4))
    assert sorted(out) == [0, 10, 20, 30]
    assert state["peak"] == 4


def test_generators_and_none():
    def twice(x):
        yield x
        yield None  # dropped
        yield x

    async def arange(x):
        for i in range(x):
            await asyncio.sleep(0)
            yield i

    def odd_only(x):
        return x if x % 2 else None

    out = run(PipelineBuilder().add_source(range(5)).pipe(twice).pipe(odd_only))
    assert sorted(out) == [1, 1, 3, 3]
    out = run(PipelineBuilder().add_source([3, 2]).pipe(arange, output_order="input"))
    assert out == [0, 1, 2, 0, 1]


def test_async_source_and_async_op():
    async def numbers():
        for i in range(50):
            await asyncio.sleep(0)
            yield i

    async def plus(x):
        await asyncio.sleep(0.001)
        return x + 100

    out = run(PipelineBuilder().add_source(numbers()).pipe(plus, concurrency=8, output_order="input"))
    assert out == [i + 100 for i in range(50)]


def test_aggregate_disaggregate_and_containers():
    out = run(PipelineBuilder().add_source(range(10)).aggregate(4))
    assert out == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    out = run(PipelineBuilder().add_source(range(10)).aggregate(4, drop_last=True))
    assert out == [[0, 1, 2, 3], [4, 5, 6, 7]]
    out = run(PipelineBuilder().add_source(range(10)).aggregate(3).pipe(sum).pipe(lambda s: [s, -s]).disaggregate())
    assert out == [3, -3, 12, -12, 21, -21, 9, -9]
    table = {"a": 1, "b": 2}
    out = run(PipelineBuilder().add_source(iter("abab")).pipe(table, output_order="input"))
    assert out == [1, 2, 1, 2]


def test_objects_pass_through_unchanged():
    items = [{"i": i} for i in range(5)] + [True, 2**80, b"x" * 3, 1.5, "s", None, (1, 2)]
    out = run(PipelineBuilder().add_source(iter(items)).pipe(lambda x: x, output_order="input"))
    assert out == [x for x in items if x is not None]
    assert out[5] is True and type(out[5]) is bool
    assert out[0] is items[0]  # Python objects are not copied


def test_continuous_source_epochs():
    p = PipelineBuilder().add_source([1, 2, 3], continuous=True).pipe(lambda x: x * 2).add_sink(2).build(num_threads=2)
    with p.auto_stop():
        for _ in range(3):
            assert sorted(p.get_iterator(timeout=30)) == [2, 4, 6]


def test_iterator_resumes_and_get_item_raises_at_end():
    p = PipelineBuilder().add_source(range(10)).add_sink(1).build(num_threads=1)
    with p.auto_stop():
        it = p.get_iterator(timeout=30)
        first = [next(it) for _ in range(4)]
        rest = list(p.get_iterator(timeout=30))
        assert first + rest == list(range(10))
        with pytest.raises(EOFError):
            p.get_item(timeout=5)


def test_first_get_item_starts_and_start_twice_raises():
    p = PipelineBuilder().add_source(range(3)).add_sink(3).build(num_threads=1)
    assert p.get_item(timeout=30) == 0
    with pytest.raises(RuntimeError):
        p.start()
    p.stop()
    p.stop()  # idempotent


def test_timeout():
    def stuck(x):
        time.sleep(1.0)
        return x

    p = PipelineBuilder().add_source(range(2)).pipe(stuck).add_sink(3).build(num_threads=1)
    with p.auto_stop():
        with pytest.raises(TimeoutError):
            p.get_item(timeout=0.05)
        assert p.get_item(timeout=30) == 0


def test_stats_and_report(caplog):
    p = PipelineBuilder().add_source(range(100)).pipe(lambda x: x, name="ident").add_sink(3).build(
        num_threads=2, report_stats_interval=0.05
    )
    with caplog.at_level("INFO", logger="spdl_rs.pipeline"):
        with p.auto_stop():
            assert len(list(p)) == 100
            stats = {s.name: s for s in p.get_stats()}
    assert isinstance(stats["ident"].task, TaskPerfStats)
    assert stats["ident"].task.num_tasks == 100
    assert stats["ident"].task.num_failures == 0
    assert stats["ident"].queue.num_items == 100
    assert any("ident" in r.getMessage() for r in caplog.records)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        PipelineBuilder().add_source(range(3)).pipe(str, concurrency=0)
    with pytest.raises(ValueError):
        PipelineBuilder().add_source(range(3)).pipe(str, output_order="random")
    with pytest.raises(ValueError):
        PipelineBuilder().add_source(range(3)).add_source(range(3))
    with pytest.raises(TypeError):
        PipelineBuilder().add_source(range(3)).pipe(42)
    with pytest.raises(RuntimeError):
        PipelineBuilder().build(num_threads=1)
    assert isinstance(PipelineBuilder().add_source(range(3)).add_sink(1).build(num_threads=1), Pipeline)


def test_executor_runs_sync_ops_like_spdl():
    import concurrent.futures as cf
    import math
    import multiprocessing
    import operator

    from spdl_rs.pipeline import PipelineFailure

    # A thread pool of the caller's: every call runs there, `concurrency` at a time, order kept on request.
    with cf.ThreadPoolExecutor(2, thread_name_prefix="user-pool") as ex:
        def where(x):
            return x * 2, threading.current_thread().name.startswith("user-pool")

        out = run(PipelineBuilder().add_source(range(20)).pipe(where, executor=ex, concurrency=2, output_order="input"))
        assert out == [(x * 2, True) for x in range(20)]
        # A container op goes through the executor too.
        assert run(PipelineBuilder().add_source([2, 0, 1]).pipe("abc", executor=ex, output_order="input")) == ["c", "a", "b"]

    # A process pool (spawned children: nothing of this process is forked): items and op pickle across.
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
        out = run(PipelineBuilder().add_source(range(10)).pipe(operator.neg, executor=ex, concurrency=4,
                                                                output_order="input"))
        assert out == [-x for x in range(10)]
        # An exception in the child fails that item only, counted against the stage's budget.
        p = (
            PipelineBuilder()
            .add_source([4, -1, 9, -4])
            .pipe(math.sqrt, executor=ex, name="sqrt", max_failures=1)
            .add_sink(3)
            .build(num_threads=1)
        )
        with pytest.raises(PipelineFailure) as info:
            with p.auto_stop():
                list(p)
        assert info.value.stage == "sqrt"
        assert "math domain error" in str(info.value.exceptions[0])

    with cf.ThreadPoolExecutor(1) as ex:
        def gen(x):
            for i in range(x):
                yield threading.current_thread().name, i

        # As in SPDL, a generator op's steps run in the executor.
        p = PipelineBuilder().add_source([2, 3]).pipe(gen, executor=ex).add_sink(10).build(num_threads=1)
        with p.auto_stop():
            out = list(p)
        assert sorted(i for _, i in out) == [0, 0, 1, 1, 2]
        assert all(name.startswith("ThreadPoolExecutor") for name, _ in out)

        async def coro(x):
            return x

        with pytest.raises(ValueError, match="`executor` cannot be specified when op is async"):
            PipelineBuilder().add_source([1]).pipe(coro, executor=ex)
        with pytest.raises(TypeError, match="executor"):
            PipelineBuilder().add_source([1]).pipe(abs, executor=object())


def test_get_item_nowait_drains_and_tells_not_yet_from_never(watchdog):
    import queue
    import threading

    p = PipelineBuilder().add_source(range(5)).pipe(lambda x: x + 1).add_sink(5).build(num_threads=2)
    with pytest.raises(RuntimeError, match="not started"):
        p._get_item_nowait()
    got = []
    with p.auto_stop():
        while True:
            try:
                got.append(p._get_item_nowait())
            except queue.Empty:
                time.sleep(0.001)
            except EOFError:
                break
    assert sorted(got) == [1, 2, 3, 4, 5]

    release = threading.Event()
    p = PipelineBuilder().add_source(range(1)).pipe(lambda x: release.wait() and x).add_sink(1).build(num_threads=1)
    try:
        with p.auto_stop():
            with pytest.raises(queue.Empty):
                p._get_item_nowait()
            release.set()
    finally:
        release.set()
