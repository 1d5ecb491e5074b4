"""Reliability of the Python facade: ops that raise, hang or leak references, and 1,000 build/iterate/stop
or garbage-collect cycles (threads and open files back to baseline, RSS not growing)."""

import asyncio
import gc
import logging
import os
import sys
import threading
import time
from fractions import Fraction

import pytest
from conftest import os_threads, wait_for

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure


def mix(x: int) -> int:
    """A deterministic spread of an index (splitmix64)."""
    z = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class Corrupt(ValueError):
    pass


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.fixture
def long_watchdog():
    """The suite's watchdog with room for 1,000 cycles on a loaded machine: dumps the stacks and exits
    after 600 s instead of hanging."""
    import faulthandler

    faulthandler.dump_traceback_later(600, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def stage(p, name):
    return next(s for s in p.get_stats() if s.name == name)


# ---------------------------------------------------------------------------------------------------------
# An op that raises


def test_an_op_that_raises_at_random_loses_and_duplicates_nothing(watchdog):
    n = 5_000

    def flaky(x):
        if mix(x) % 10 < 3:
            raise Corrupt(f"item {x} is corrupt")
        return x

    async def also_flaky(x):
        if mix(x ^ 7) % 10 == 0:
            raise Corrupt(f"item {x} failed twice")
        return x

    p = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(flaky, concurrency=4, name="flaky", output_order="input")
        .pipe(also_flaky, concurrency=8, name="also_flaky", output_order="input")
        .add_sink(8)
        .build(num_threads=3)
    )
    with p.auto_stop():
        out = list(p)
    want = [x for x in range(n) if mix(x) % 10 >= 3 and mix(x ^ 7) % 10 != 0]
    assert out == want, "every good item once, in input order"
    assert stage(p, "flaky").task.num_failures == sum(1 for x in range(n) if mix(x) % 10 < 3)
    assert len(out) + stage(p, "flaky").task.num_failures + stage(p, "also_flaky").task.num_failures == n


def test_an_op_that_raises_past_its_budget_names_the_stage(watchdog):
    def flaky(x):
        if mix(x) % 10 < 3:
            raise Corrupt(f"item {x} is corrupt")
        return x

    p = (
        PipelineBuilder()
        .add_source(range(1_000_000))
        .pipe(flaky, concurrency=4, name="flaky", max_failures=Fraction(1, 10))
        .add_sink(4)
        .build(num_threads=2)
    )
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop():
            got = sum(1 for _ in p)
    assert info.value.stage == "flaky"
    assert "flaky" in str(info.value)
    assert all(isinstance(e, Corrupt) for e in info.value.exceptions)
    assert any("is corrupt" in str(e) for e in info.value.exceptions)
    assert got < 10_000, "the budget ended the run early"


# ---------------------------------------------------------------------------------------------------------
# An op that hangs


def test_stop_cancels_an_async_op_that_hangs(watchdog):
    baseline = os_threads()

    async def hangs(x):
        if x > 0:
            await asyncio.sleep(3600)
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(hangs, concurrency=4).add_sink(2).build(num_threads=2)
    p.start()
    assert p.get_item(timeout=30) == 0
    with pytest.raises(TimeoutError):
        p.get_item(timeout=0.2)
    t = time.monotonic()
    p.stop(timeout=10)
    assert time.monotonic() - t < 5, "pending async calls are cancelled, not awaited"
    wait_for(lambda: os_threads() <= baseline, what="threads back to baseline")


def test_a_sync_op_that_hangs_times_out_the_consumer_and_stops_when_released(watchdog):
    release = threading.Event()

    def hangs(x):
        if x > 0:
            release.wait(60)
        return x

    p = PipelineBuilder().add_source(range(10)).pipe(hangs, concurrency=2).add_sink(2).build(num_threads=2)
    p.start()
    assert p.get_item(timeout=30) == 0
    # The consumer is never stuck: a timeout says nothing came.
    with pytest.raises(TimeoutError):
        p.get_item(timeout=0.3)
    # A sync call cannot be interrupted: stop waits for it, so release it shortly.
    threading.Timer(0.3, release.set).start()
    t = time.monotonic()
    p.stop()
    assert time.monotonic() - t < 30


# ---------------------------------------------------------------------------------------------------------
# An op that leaks references


class Payload:
    pass


def test_the_pipeline_holds_no_reference_after_stop_even_when_an_op_leaks_some(watchdog):
    item = Payload()
    leaked = []

    def leaky(x):
        # A user bug: keeps a reference to every 10th item it sees.
        if x[0] % 10 == 0:
            leaked.append(x[1])
        return x

    async def passthrough(x):
        return x

    gc.collect()
    baseline = sys.getrefcount(item)
    p = (
        PipelineBuilder()
        .add_source((i, item) for i in range(5_000))
        .pipe(leaky, concurrency=3)
        .pipe(passthrough, concurrency=4)
        .aggregate(7)
        .disaggregate()
        .add_sink(4)
        .build(num_threads=2)
    )
    with p.auto_stop():
        n = sum(1 for _ in p)
    assert n == 5_000
    del p
    gc.collect()
    # Exactly the references the op leaked: the pipeline itself keeps none.
    assert sys.getrefcount(item) - baseline == len(leaked) == 500
    leaked.clear()
    assert sys.getrefcount(item) == baseline


def test_items_are_freed_once_consumed(watchdog):
    import weakref

    refs = []

    def make(x):
        obj = Payload()
        refs.append(weakref.ref(obj))
        return obj

    p = PipelineBuilder().add_source(range(2_000)).pipe(make, concurrency=2).add_sink(2).build(num_threads=2)
    with p.auto_stop():
        for _ in p:
            pass
    del _  # the loop variable still holds the last item
    del p
    gc.collect()
    assert len(refs) == 2_000
    assert sum(r() is not None for r in refs) == 0, "a consumed item is still alive"


# ---------------------------------------------------------------------------------------------------------
# 1,000 cycles


def endless():
    i = 0
    while True:
        yield i
        i += 1


async def aop(x):
    if x % 5 == 0:
        await asyncio.sleep(0)
    return x


def raises_sometimes(x):
    if x % 7 == 3:
        raise Corrupt(f"item {x}")
    return x


def one_cycle(i: int) -> None:
    b = PipelineBuilder().add_source(endless()).pipe(raises_sometimes, concurrency=2)
    if i % 2 == 0:
        b = b.pipe(aop, concurrency=3)
    p = b.aggregate(3).add_sink(2).build(num_threads=2 + i % 2)
    shape = i % 4
    if shape == 0:
        # auto_stop around a few items.
        with p.auto_stop():
            for j, _ in enumerate(p):
                if j == 2:
                    break
    elif shape == 1:
        # Explicit stop mid-iteration.
        p.get_item(timeout=30)
        p.stop()
    elif shape == 2:
        # Dropped and garbage-collected while running.
        p.get_item(timeout=30)
        del p
        gc.collect()
    else:
        # Built, never started, dropped.
        del p


def test_thousand_cycles_leave_no_threads_no_fds_and_no_memory_growth(long_watchdog, monkeypatch):
    # The failing items log errors with their tracebacks; pytest's log capture keeps every record (and so
    # every traceback and what its frames reference) until the test ends, which on the free-threaded build
    # held some pipelines' event loops, and their fds, past the check. Not logging them measures the library.
    monkeypatch.setattr(logging.getLogger("spdl_rs.pipeline"), "disabled", True)
    gc.collect()
    threads0, fds0 = os_threads(), open_fds()
    rss_warm = 0
    t = time.monotonic()
    for i in range(1_000):
        one_cycle(i)
        if i == 99:
            gc.collect()
            wait_for(lambda: os_threads() <= threads0, what="threads back to baseline after 100 cycles")
            rss_warm = rss_kib()
    gc.collect()
    wait_for(lambda: os_threads() <= threads0, what=f"threads back to {threads0} (now {os_threads()})")
    wait_for(lambda: open_fds() <= fds0, what=f"fds back to {fds0} (now {open_fds()})")
    growth = rss_kib() - rss_warm
    print(
        f"1000 cycles in {time.monotonic() - t:.1f} s: threads {threads0} -> {os_threads()}, fds {fds0} -> "
        f"{open_fds()}, RSS +{growth} KiB after the first 100"
    )
    # 900 cycles each leaking a thread stack or an event loop would add far more than this.
    assert growth < 16 * 1024, f"RSS grew by {growth} KiB"
