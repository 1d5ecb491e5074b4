"""Hostile Python code inside a pipeline: ``KeyboardInterrupt``/``SystemExit`` (and other ``BaseException``s)
raised on the pipeline's threads, iterables that never end or keep raising behind ``disaggregate``, and
sources that are endless list subclasses or raise in a continuous pipeline.

Every test runs under the ``watchdog`` fixture and waits with timeouts, so a hang fails instead of blocking;
what could exhaust memory runs in a child process with an address-space limit and a time limit."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time

import pytest
from conftest import run_child, wait_for

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure
from spdl_rs.pipeline.defs import Aggregator, Pipe

pytestmark = pytest.mark.usefixtures("watchdog")

#: Seconds a consumer may wait for anything in these tests (much more than any of them needs).
WAIT = 30


def engine_threads() -> int:
    """Threads of spdl-rs pipelines (the engine's scheduler and pool) alive in this process."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                n += f.read().startswith("spdl-exec")
        except OSError:
            pass
    return n


# 1. BaseExceptions on every thread that runs Python.


class Bail(BaseException):
    """A user's BaseException subclass (neither an Exception nor KeyboardInterrupt/SystemExit)."""


def _raiser(exc_type: type[BaseException]):
    def boom() -> None:
        raise exc_type("raised on a pipeline thread")

    return boom


class _RaisingAggregator(Aggregator):
    def __init__(self, boom) -> None:
        self.boom = boom
        self.n = 0

    def accumulate(self, item):
        self.n += 1
        if item == 5:
            self.boom()
        return [item]

    def flush(self):
        return None


def _hook_factory(boom, where: str):
    from spdl_rs.pipeline import TaskHook

    class Hook(TaskHook):
        @contextlib.asynccontextmanager
        async def task_hook(self, input_item=None):
            if input_item == 5 and where == "enter":
                boom()
            yield
            if input_item == 5 and where == "exit":
                boom()

    def factory(info):
        return [Hook()] if info.stage_name == "op" else []

    return factory


def _build(where: str, boom):
    """A pipeline of 1000 items in which ``boom()`` is called on item 5 at ``where``."""
    b = PipelineBuilder()
    build_kw: dict = {}
    if where == "source":

        def src():
            for i in range(1000):
                if i == 5:
                    boom()
                yield i

        b = b.add_source(src())
    elif where == "async_source":

        async def asrc():
            for i in range(1000):
                if i == 5:
                    boom()
                yield i

        b = b.add_source(asrc())
    elif where == "continuous_source":

        class Src:
            def __iter__(self):
                for i in range(1000):
                    if i == 5:
                        boom()
                    yield i

        b = b.add_source(Src(), continuous=True)
    else:
        b = b.add_source(range(1000))
    if where == "sync":

        def op(x):
            if x == 5:
                boom()
            return x

        b = b.pipe(op)
    elif where == "async":

        async def op(x):
            await asyncio.sleep(0)
            if x == 5:
                boom()
            return x

        b = b.pipe(op, concurrency=4)
    elif where == "gen":

        def op(x):
            yield x
            if x == 5:
                boom()

        b = b.pipe(op)
    elif where == "asyncgen":

        async def op(x):
            yield x
            if x == 5:
                boom()

        b = b.pipe(op)
    elif where == "aggregator":
        b = b.aggregate(_RaisingAggregator(boom)).disaggregate()
    elif where == "aggregator_hooked":
        b = b.aggregate(_RaisingAggregator(boom)).disaggregate()

        def factory(info):
            from spdl_rs.pipeline import TaskHook

            class Hook(TaskHook):
                @contextlib.asynccontextmanager
                async def task_hook(self, input_item=None):
                    yield

            return [Hook()]

        build_kw["task_hook_factory"] = factory
    elif where == "router":

        def route(x):
            if x == 5:
                boom()
            return x % 2

        b = b.path_variants(route, [[Pipe(str)], [Pipe(str)]])
    elif where == "async_router":

        async def aroute(x):
            if x == 5:
                boom()
            return x % 2

        b = b.path_variants(aroute, [[Pipe(str)], [Pipe(str)]])
    elif where == "disaggregate_iter":

        def items():
            yield 0
            boom()

        b = b.pipe(lambda x: items() if x == 5 else [x]).disaggregate()
    elif where.startswith("hook_"):

        async def op(x):
            return x

        b = b.pipe(op, name="op")
        build_kw["task_hook_factory"] = _hook_factory(boom, where.removeprefix("hook_"))
    elif where.startswith("sync_hook_"):
        b = b.pipe(lambda x: x, name="op")
        build_kw["task_hook_factory"] = _hook_factory(boom, where.removeprefix("sync_hook_"))
    return b.add_sink(2).build(num_threads=2, **build_kw)


WHERE = [
    "sync",
    "async",
    "gen",
    "asyncgen",
    "aggregator",
    "aggregator_hooked",
    "router",
    "async_router",
    "source",
    "async_source",
    "continuous_source",
    "disaggregate_iter",
    "hook_enter",
    "hook_exit",
    "sync_hook_enter",
]


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, Bail])
@pytest.mark.parametrize("where", WHERE)
def test_base_exception_stops_the_pipeline_and_is_raised_in_the_consumer(where, exc_type):
    before = engine_threads()
    p = _build(where, _raiser(exc_type))
    got = []
    t0 = time.monotonic()
    with pytest.raises(exc_type, match="raised on a pipeline thread"):
        for x in p.get_iterator(timeout=WAIT):
            got.append(x)
    took = time.monotonic() - t0
    assert took < 10, f"the {exc_type.__name__} took {took:.1f} s to reach the consumer"
    assert len(got) < 1000  # it stopped the pipeline; it did not let the rest through
    # The engine's threads are joined, the loop and stats threads are gone (conftest checks those at the end).
    wait_for(lambda: engine_threads() <= before, timeout=WAIT, what="the engine's threads to end")
    # The same pipeline says clearly that it cannot go on; stop() raises no PipelineFailure over it.
    with pytest.raises(RuntimeError, match=f"stopped by {exc_type.__name__} raised in stage"):
        p.get_item(timeout=WAIT)
    with pytest.raises(RuntimeError, match="cannot be iterated again"):
        list(p)
    p.stop(timeout=WAIT)


def test_fatal_exception_keeps_its_identity_and_traceback():
    err = KeyboardInterrupt("the original")

    def op(x):
        if x == 3:
            raise err
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(op).add_sink(1).build(num_threads=1)
    with pytest.raises(KeyboardInterrupt) as info:
        with p.auto_stop(timeout=WAIT):
            for _ in p.get_iterator(timeout=WAIT):
                pass
    assert info.value is err
    assert any(f.name == "op" for f in __import__("traceback").extract_tb(info.value.__traceback__))


def test_an_ordinary_exception_is_still_an_item_failure():
    async def op(x):
        if x % 10 == 0:
            raise ValueError(x)
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(op, concurrency=4).add_sink(2).build(num_threads=2)
    with p.auto_stop(timeout=WAIT):
        got = list(p.get_iterator(timeout=WAIT))
    assert sorted(got) == [x for x in range(100) if x % 10]
    assert p._core.fatal() is None
    assert [s["items_failed"] for s in p._core.stats() if s["name"] == "op"] == [10]


def test_an_ops_own_cancelled_error_is_an_item_failure_not_a_hang():
    async def op(x):
        if x == 2:
            raise asyncio.CancelledError("the op's own")
        return x

    p = PipelineBuilder().add_source(range(6)).pipe(op).add_sink(2).build(num_threads=1)
    with p.auto_stop(timeout=WAIT):
        got = list(p.get_iterator(timeout=WAIT))
    assert got == [0, 1, 3, 4, 5]
    assert p._core.fatal() is None


def test_cancelling_async_ops_at_stop_is_quiet():
    started = []

    async def op(x):
        started.append(x)
        await asyncio.sleep(3600)

    p = PipelineBuilder().add_source(range(10)).pipe(op, concurrency=4).add_sink(2).build(num_threads=1)
    p.start()
    wait_for(lambda: len(started) >= 4, timeout=WAIT, what="the async ops to start")
    t0 = time.monotonic()
    p.stop(timeout=WAIT)
    assert time.monotonic() - t0 < 5
    assert p._core.fatal() is None


def test_keyboard_interrupt_in_an_nbytes_property_is_fatal():
    class Big:
        @property
        def nbytes(self):
            raise KeyboardInterrupt("from nbytes")

    p = PipelineBuilder().add_source(range(10)).pipe(lambda x: Big()).add_sink(1).build(num_threads=1)
    with pytest.raises(KeyboardInterrupt, match="from nbytes"):
        with p.auto_stop(timeout=WAIT):
            list(p.get_iterator(timeout=WAIT))


def test_keyboard_interrupt_in_a_background_task_leaves_the_loop_running(caplog):
    from spdl_rs.pipeline import BackgroundTask, build_pipeline
    from spdl_rs.pipeline.defs import PipelineConfig, SinkConfig, SourceConfig

    class Bg(BackgroundTask):
        async def run(self):
            raise KeyboardInterrupt("background")

    async def op(x):
        await asyncio.sleep(0.001)
        return x

    cfg = PipelineConfig(src=SourceConfig(range(50)), pipes=[Pipe(op)], sink=SinkConfig(2))
    p = build_pipeline(cfg, num_threads=1, background_tasks=[Bg])
    with p.auto_stop(timeout=WAIT):
        assert list(p.get_iterator(timeout=WAIT)) == list(range(50))
    assert "Background task failed: background" in caplog.text


# 2. disaggregate streams Python iterables.


def test_disaggregate_of_an_endless_iterator_streams():
    p = PipelineBuilder().add_source(range(3)).pipe(lambda x: itertools.count(x * 1000)).disaggregate()
    p = p.add_sink(2).build(num_threads=2)
    with p.auto_stop(timeout=WAIT):
        first = [p.get_item(timeout=WAIT) for _ in range(10)]
    assert first == list(range(10))


def test_disaggregate_of_an_endless_iterator_holds_bounded_memory():
    code = """
    import itertools, time
    from spdl_rs.pipeline import PipelineBuilder
    p = (PipelineBuilder().add_source(range(2)).pipe(lambda x: (bytes(1 << 16) for _ in itertools.count()))
         .disaggregate().add_sink(2).build(num_threads=2))
    with p.auto_stop(timeout=10):
        for i, x in enumerate(p.get_iterator(timeout=10)):
            if i == 20000:  # 1.3 GB went through; a few hundred KB are alive at once
                break
    print("ok")
    """
    r = run_child(code, timeout=120, address_space=3 << 30)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_disaggregate_of_an_iterator_that_keeps_raising_fails_the_item_once():
    calls = []

    class Broken:
        def __iter__(self):
            return self

        def __next__(self):
            calls.append(1)
            raise ValueError("broken __next__")

    p = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(lambda x: Broken() if x == 1 else [x])
        .disaggregate()
        .add_sink(2)
        .build(num_threads=2)
    )
    t0 = time.monotonic()
    with p.auto_stop(timeout=3):
        got = list(p.get_iterator(timeout=WAIT))
    assert time.monotonic() - t0 < 10
    assert got == [0, 2, 3]
    assert len(calls) == 1  # the exception ended that iterable: no busy loop
    assert [s["items_failed"] for s in p._core.stats() if s["name"] == "disaggregate"] == [1]
    assert [type(e) for _, e in p._core.take_exceptions()] == [ValueError]


def test_disaggregate_of_a_generator_that_raises_counts_the_failure():
    def gen(x):
        yield from (1, 2, 3)
        raise ValueError("after 3 values")

    p = PipelineBuilder().add_source([0]).pipe(lambda x: gen(x)).disaggregate().add_sink(2)
    p = p.build(num_threads=1, max_failures=0)  # the first failure ends the pipeline: PipelineFailure
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop(timeout=WAIT):
            got = list(p.get_iterator(timeout=WAIT))
    assert got == [1, 2, 3]
    dis = [s for s in p._core.stats() if s["name"] == "disaggregate"]
    assert dis and dis[0]["items_failed"] == 1
    assert any(isinstance(e, ValueError) and "after 3 values" in str(e) for e in info.value.exceptions)


def test_disaggregate_of_a_raising_iter_is_a_failure_not_one_element():
    class BadIter:
        def __iter__(self):
            raise RuntimeError("no iterator")

    p = (
        PipelineBuilder()
        .add_source(range(3))
        .pipe(lambda x: BadIter() if x == 1 else (x,))
        .disaggregate()
        .add_sink(2)
        .build(num_threads=1)
    )
    with p.auto_stop(timeout=WAIT):
        assert list(p.get_iterator(timeout=WAIT)) == [0, 2]
    assert [type(e) for _, e in p._core.take_exceptions()] == [RuntimeError]


def test_disaggregate_keeps_lists_tuples_non_iterables_and_order():
    p = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(lambda x: [x, None] if x % 3 == 0 else (x,) if x % 3 == 1 else iter([x, x]))
        .disaggregate()
        .pipe(lambda x: x)  # None passes a disaggregate, a pipe op's None is dropped
        .add_sink(2)
        .build(num_threads=2)
    )
    with p.auto_stop(timeout=WAIT):
        assert list(p.get_iterator(timeout=WAIT)) == [0, 1, 2, 2, 3, 4, 5, 5]
    p = PipelineBuilder().add_source([7]).pipe(lambda x: object.__new__(type("X", (), {}))).disaggregate()
    p = p.add_sink(1).build(num_threads=1)
    with p.auto_stop(timeout=WAIT):
        assert len(list(p.get_iterator(timeout=WAIT))) == 1  # not iterable: a one-element batch


def test_aggregate_then_disaggregate_stays_native():
    p = PipelineBuilder().add_source(range(100)).aggregate(7).disaggregate().add_sink(4).build(num_threads=1)
    with p.auto_stop(timeout=WAIT):
        assert list(p.get_iterator(timeout=WAIT)) == list(range(100))
    kinds = {s["name"]: s["kind"] for s in p._core.stats()}
    assert kinds["disaggregate"] == "disaggregate"


def test_stop_with_an_endless_disaggregate_returns_at_once():
    p = PipelineBuilder().add_source(range(3)).pipe(lambda x: itertools.count()).disaggregate()
    p = p.add_sink(2).build(num_threads=2)
    p.start()
    assert p.get_item(timeout=WAIT) == 0
    t0 = time.monotonic()
    p.stop(timeout=3)
    assert time.monotonic() - t0 < 3


def test_batched_router_with_endless_indices_is_a_failure():
    p = (
        PipelineBuilder()
        .add_source(range(8))
        .aggregate(4)
        .path_variants(lambda b: itertools.repeat(0), [[Pipe(list)], [Pipe(list)]], batched=True)
        .add_sink(2)
        .build(num_threads=1)
    )
    # A router's error fails the pipeline (as in SPDL), after reading at most len(batch) + 1 indices.
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop(timeout=WAIT):
            assert list(p.get_iterator(timeout=WAIT)) == []
    assert any("more indices" in str(e) for e in info.value.exceptions)


def test_batched_route_branch_returning_an_endless_iterable_is_a_failure():
    code = """
    import itertools
    from spdl_rs.pipeline import PipelineBuilder, PipelineFailure
    from spdl_rs.pipeline.defs import Pipe
    p = (PipelineBuilder().add_source(range(4)).aggregate(2)
         .path_variants(lambda b: [0] * len(b), [[Pipe(lambda b: itertools.count())], [Pipe(list)]], batched=True)
         .add_sink(2).build(num_threads=1))
    with p.auto_stop(timeout=30):
        out = list(p.get_iterator(timeout=60))
    print(out, [str(e) for _, e in p._core.take_exceptions()])
    """
    r = run_child(code, timeout=120, address_space=3 << 30)
    assert r.returncode == 0 and "more than 1048576 items" in r.stdout, (r.stdout, r.stderr[-2000:])


# 3. Sources.


def test_an_endless_list_subclass_source_is_iterated_lazily():
    class Endless(list):
        def __iter__(self):
            return itertools.count()

    t0 = time.monotonic()
    p = PipelineBuilder().add_source(Endless([1, 2, 3])).add_sink(2).build(num_threads=1)
    assert time.monotonic() - t0 < 5  # build() does not snapshot it
    with p.auto_stop(timeout=WAIT):
        assert [p.get_item(timeout=WAIT) for _ in range(5)] == [0, 1, 2, 3, 4]


def test_an_endless_tuple_subclass_given_to_the_native_list_source_is_lazy():
    from spdl_rs import _native
    from spdl_rs.pipeline import defs

    class Endless(tuple):
        def __iter__(self):
            return itertools.count(10)

    core = _native.pipeline.PipelineCore(
        defs.SourceConfig(Endless()), [], _native.pipeline.CoreOptions(buffer_size=2, num_threads=1)
    )
    core.start()
    try:
        assert [core.get_item(WAIT)[1] for _ in range(3)] == [10, 11, 12]
    finally:
        core.stop(WAIT)


def test_exact_lists_and_tuples_are_still_snapshotted():
    items = [1, 2, 3]
    p = PipelineBuilder().add_source(items).add_sink(2).build(num_threads=1)
    items.append(4)  # after build: not seen
    with p.auto_stop(timeout=WAIT):
        assert list(p.get_iterator(timeout=WAIT)) == [1, 2, 3]


def test_a_raising_continuous_source_ends_the_pipeline_and_is_counted():
    class Src:
        def __init__(self):
            self.epochs = 0

        def __iter__(self):
            self.epochs += 1
            yield 1
            yield 2
            raise ValueError("source broke")

    src = Src()
    p = PipelineBuilder().add_source(src, continuous=True).add_sink(2).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop(timeout=WAIT):
            assert list(p.get_iterator(timeout=WAIT)) == [1, 2]
            # The pipeline has ended (as a one-pass source's would): no further epoch.
            assert list(p.get_iterator(timeout=WAIT)) == []
    assert info.value.stage == "source"
    assert isinstance(info.value.exceptions[0], ValueError)
    assert src.epochs == 1
    rows = p._core.stats()
    assert rows[0]["kind"] == "source" and rows[0]["items_failed"] == 1


def test_a_raising_one_pass_source_is_counted_in_the_stats():
    def src():
        yield 1
        raise ValueError("source broke")

    p = PipelineBuilder().add_source(src()).add_sink(2).build(num_threads=1)
    with pytest.raises(PipelineFailure):
        with p.auto_stop(timeout=WAIT):
            assert list(p.get_iterator(timeout=WAIT)) == [1]
    assert p._core.stats()[0]["items_failed"] == 1


def test_a_continuous_source_still_runs_epochs():
    p = PipelineBuilder().add_source([1, 2], continuous=True).add_sink(2).build(num_threads=1)
    with p.auto_stop(timeout=WAIT):
        for _ in range(3):
            assert list(p.get_iterator(timeout=WAIT)) == [1, 2]
