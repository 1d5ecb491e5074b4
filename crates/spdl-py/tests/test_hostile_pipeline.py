"""Hostile ops and arguments: an op that never returns (bounded ``stop``, exit and garbage collection that do
not hang), Ctrl-C while waiting, generators that yield big or endless outputs, how many items are alive at
once, huge sizes and timeouts (no abort, no ``PanicException``), and quiet cancellation of async ops.

What could abort or hang the interpreter runs in a child process with a time limit (and an address-space
limit where the failure was an allocation)."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import sys
import threading
import time

import pytest
from conftest import run_child, wait_for

from spdl_rs.pipeline import PipelineBuilder


def engine_threads() -> int:
    """Threads of spdl-rs pipelines alive in this process."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                n += f.read().startswith("spdl-exec")
        except OSError:
            pass
    return n


# An op that never returns; the first item passes.
HUNG = """
import gc, sys, time
from spdl_rs.pipeline import PipelineBuilder

def hang(x):
    if x > 0:
        time.sleep(10**6)
    return x

p = PipelineBuilder().add_source(range(10)).pipe(hang).add_sink(1).build(num_threads=2)
assert p.get_item(timeout=30) == 0
time.sleep(0.2)
"""


def test_stop_with_a_hung_op_raises_timeout_error_at_its_timeout(watchdog):
    release = threading.Event()

    def hang(x):
        if x > 0:
            release.wait()
        return x

    p = PipelineBuilder().add_source(range(10)).pipe(hang, concurrency=2).add_sink(1).build(num_threads=2)
    try:
        assert p.get_item(timeout=30) == 0
        time.sleep(0.2)
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="did not stop within"):
            p.stop(timeout=1)
        took = time.monotonic() - t
        assert 0.9 <= took < 3, f"stop(timeout=1) took {took:.2f} s"
        # Stopped all the same: iteration has ended, and a second stop returns.
        with pytest.raises(EOFError):
            p.get_item(timeout=1)
        p.stop(timeout=1)
    finally:
        release.set()
    # The abandoned threads end once the op returns.
    wait_for(lambda: engine_threads() == 0, timeout=20, what="the pipeline's threads to end")


def test_interpreter_exit_and_garbage_collection_with_a_hung_op_complete():
    # Falling off the end of the script: the finalizer's stop is bounded and the process exits.
    t = time.monotonic()
    r = run_child(HUNG + "print('end of script', flush=True)\n", timeout=30)
    assert r.returncode == 0, r.stderr
    assert "end of script" in r.stdout
    assert time.monotonic() - t < 25
    # Garbage collection of the running pipeline does not block the collecting thread for long.
    r = run_child(
        HUNG
        + """
t = time.monotonic()
del p
gc.collect()
print(f"gc {time.monotonic() - t:.2f}", flush=True)
""",
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    gc_s = float(r.stdout.split("gc ")[1].split()[0])
    assert gc_s < 3, f"collecting a pipeline with a hung op took {gc_s} s"
    # stop(timeout) in a script, then exit.
    r = run_child(
        HUNG
        + """
try:
    p.stop(timeout=0.5)
except TimeoutError:
    print("stop timed out", flush=True)
""",
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert "stop timed out" in r.stdout


@pytest.mark.parametrize("where", ["iterate", "get_item", "stop"])
def test_ctrl_c_reaches_python_while_waiting(where):
    code = HUNG + f"""
import os, signal, threading
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t = time.monotonic()
try:
    if {where!r} == "iterate":
        for _ in p:
            pass
    elif {where!r} == "get_item":
        p.get_item()
    else:
        p.stop()
except KeyboardInterrupt:
    print(f"interrupted {{time.monotonic() - t:.2f}}", flush=True)
"""
    r = run_child(code, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "interrupted" in r.stdout, (r.stdout, r.stderr)
    took = float(r.stdout.split("interrupted ")[1].split()[0])
    assert took < 2.0, f"Ctrl-C took {took} s to reach Python"


class Blob:
    """A big item that counts how many of its kind are alive."""

    alive = 0
    peak = 0
    made = 0
    # Re-entrant: on a free-threaded interpreter, a Blob dropped by another thread can be finalized on its
    # owner thread at any point, including inside `with Blob.lock` in __init__ (a plain Lock deadlocked there).
    lock = threading.RLock()

    def __init__(self, n: int, size: int = 0) -> None:
        self.n = n
        self.payload = bytearray(size)
        with Blob.lock:
            Blob.alive += 1
            Blob.made += 1
            Blob.peak = max(Blob.peak, Blob.alive)

    def __del__(self) -> None:
        with Blob.lock:
            Blob.alive -= 1

    @classmethod
    def reset(cls) -> None:
        gc.collect()
        with cls.lock:
            cls.alive = cls.peak = cls.made = 0


def gen_op(x):
    for i in range(40):
        yield Blob(i, 10 * 2**20)


async def agen_op(x):
    for i in range(40):
        await asyncio.sleep(0)
        yield Blob(i, 10 * 2**20)


@pytest.mark.parametrize("op", [gen_op, agen_op], ids=["generator", "async generator"])
def test_generator_outputs_stream_under_back_pressure(watchdog, op):
    Blob.reset()
    p = PipelineBuilder().add_source(range(1)).pipe(op).add_sink(1).build(num_threads=2)
    with p.auto_stop():
        t = time.monotonic()
        first = p.get_item(timeout=30)
        took = time.monotonic() - t
        assert first.n == 0
        assert took < 1.0, f"the first output took {took:.2f} s (collected in full?)"
        time.sleep(0.3)  # let the pipeline fill what it may
        assert Blob.made <= 8, f"{Blob.made} outputs made for 1 read"
        del first
        n = 1 + sum(1 for _ in p)
    assert n == 40
    assert Blob.peak <= 10, f"{Blob.peak} outputs of 10 MB alive at once"


def endless(x):
    i = 0
    while True:
        yield Blob(i)
        i += 1


async def aendless(x):
    i = 0
    while True:
        yield Blob(i)
        i += 1


@pytest.mark.parametrize("op", [endless, aendless], ids=["generator", "async generator"])
def test_an_endless_generator_makes_only_what_is_read(watchdog, op):
    Blob.reset()
    p = PipelineBuilder().add_source(range(2)).pipe(op).add_sink(2).build(num_threads=2)
    with p.auto_stop():
        got = [p.get_item(timeout=30).n for _ in range(20)]
        assert got == list(range(20))
        time.sleep(0.3)
        assert Blob.made <= 20 + 8, f"{Blob.made} outputs made for 20 read"


def test_a_generator_that_raises_keeps_earlier_outputs_and_counts_a_failure(watchdog, caplog):
    def gen(x):
        yield x * 10
        if x == 1:
            raise ValueError(f"item {x} broke")
        yield x * 10 + 1

    async def agen(x):
        yield x * 10
        if x == 1:
            raise ValueError(f"item {x} broke")
        yield x * 10 + 1

    for op in (gen, agen):
        p = PipelineBuilder().add_source(range(3)).pipe(op, name="g").add_sink(4).build(num_threads=2)
        with p.auto_stop():
            got = sorted(p)
        assert got == [0, 1, 10, 20, 21]
        stats = {s.name: s for s in p.get_stats()}
        assert stats["g"].task.num_failures == 1
        assert any("item 1 broke" in r.getMessage() or "item 1 broke" in str(r.exc_info) for r in caplog.records)


def peak_alive(build) -> int:
    """The most ``Blob``s alive at once while a slow consumer reads 100 items made by the source."""
    Blob.reset()

    def source():
        for i in range(100):
            yield Blob(i)

    p = build(PipelineBuilder().add_source(source()))
    with p.auto_stop():
        for _ in p:
            time.sleep(0.002)
    return Blob.peak


def test_items_alive_at_once_are_bounded_like_spdl_and_the_knob_changes_it(watchdog):
    # SPDL 0.8.0 keeps 8 alive for this pipeline.
    one = peak_alive(lambda b: b.pipe(lambda x: x).add_sink(1).build(num_threads=2))
    assert one <= 9, f"{one} items alive (concurrency 1, sink 1)"
    # SPDL: 32 with an aggregate. Batches of 4: each queued batch is 4 items.
    agg = peak_alive(lambda b: b.pipe(lambda x: x).aggregate(4).add_sink(1).build(num_threads=2))
    assert agg <= 32, f"{agg} items alive (with aggregate(4))"
    deep = peak_alive(lambda b: b.pipe(lambda x: x).add_sink(1).build(num_threads=2, stage_buffer_size=32))
    assert deep > one, "stage_buffer_size=32 should let more items queue"
    with pytest.raises(ValueError, match="stage_buffer_size"):
        PipelineBuilder().add_source(range(3)).add_sink(1).build(num_threads=1, stage_buffer_size=0)


def test_small_items_queue_deeper_within_a_byte_bound(watchdog):
    # Ints are of known size (8 bytes): their queues hold up to 64 items (64 KiB at most) instead of
    # stage_buffer_size, so the hand-off between threads is batched. Objects of unknown size stay bounded in
    # items (the test above: Blobs).
    pulled: list[int] = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield i

    p = PipelineBuilder().add_source(source()).pipe(lambda x: x).add_sink(2).build(num_threads=2)
    with p.auto_stop():
        it = iter(p)
        first = next(it)
        time.sleep(0.5)
        ahead = len(pulled)
        rest = list(it)
    assert [first, *rest] == list(range(1000))
    # The source's queue deepens to at most 64 (the sink's stays at its buffer size: the next test), plus what
    # the source and stage hold in hand.
    assert 9 < ahead <= 3 * 64 + 40, ahead


def test_the_sink_buffer_bounds_what_runs_ahead_even_for_small_items(watchdog):
    # SPDL's `buffer_size` is what the consumer lets run ahead: the stage before the sink must not work through
    # a source of small items while the consumer holds one (only the queues before it deepen).
    done: list[int] = []

    def track(x):
        done.append(x)
        return x

    p = PipelineBuilder().add_source(list(range(64))).pipe(track).add_sink(1).build(num_threads=1)
    with p.auto_stop():
        it = iter(p)
        assert next(it) == 0
        time.sleep(0.5)
        ahead = len(done)
        rest = list(it)
    assert rest == list(range(1, 64))
    # The item taken, one in the sink's buffer, one in the stage's hands, and a little slack.
    assert ahead <= 5, ahead


def test_huge_sizes_neither_abort_nor_preallocate():
    # 3 GiB of address space: add_sink(10**8) used to preallocate 3.8 GB; 10**9 aborted.
    r = run_child(
        """
from spdl_rs.pipeline import PipelineBuilder
for build in (
    lambda b: b.aggregate(10**9).add_sink(3),
    lambda b: b.add_sink(10**9),
    lambda b: b.add_sink(10**8),
    lambda b: b.pipe(lambda x: x).add_sink(2),
):
    p = build(PipelineBuilder().add_source(range(10))).build(num_threads=2, stage_buffer_size=10**9)
    with p.auto_stop():
        out = list(p)
    assert out in ([list(range(10))], list(range(10))), out
for bad in (lambda: PipelineBuilder().add_source(range(3)).aggregate(2**60),
            lambda: PipelineBuilder().add_source(range(3)).add_sink(2**60)):
    try:
        bad()
    except ValueError:
        pass
    else:
        raise AssertionError("a size of 2**60 was accepted")
print("ok", flush=True)
""",
        timeout=60,
        address_space=3 * 2**30,
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_timeouts_are_validated_and_huge_ones_mean_forever(watchdog):
    p = PipelineBuilder().add_source(range(3)).add_sink(1).build(num_threads=1)
    with p.auto_stop():
        assert p.get_item(timeout=1e300) == 0
        assert p.get_item(timeout=math.inf) == 1
        for bad in (math.nan, -1.0):
            with pytest.raises(ValueError, match="timeout"):
                p.get_item(timeout=bad)
            with pytest.raises(ValueError, match="timeout"):
                p.stop(timeout=bad)
        assert p.get_item(timeout=30) == 2
    p.stop(timeout=1e300)


def test_stop_cancels_async_ops_quietly(watchdog, caplog):
    async def hangs(x):
        if x > 0:
            await asyncio.sleep(3600)
        return x

    caplog.set_level(logging.DEBUG)
    p = PipelineBuilder().add_source(range(10)).pipe(hangs, concurrency=4).add_sink(2).build(num_threads=2)
    assert p.get_item(timeout=30) == 0
    time.sleep(0.2)
    t = time.monotonic()
    p.stop(timeout=10)
    assert time.monotonic() - t < 5
    noisy = [r for r in caplog.records if "Cancelled" in r.getMessage() or (r.exc_info and "Cancelled" in repr(r.exc_info[1]))]
    assert not noisy, [r.getMessage() for r in noisy]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_stop_with_an_async_op_that_blocks_the_event_loop_raises_timeout_error(watchdog):
    release = threading.Event()

    async def blocks(x):
        if x > 0:
            release.wait()  # a blocking call inside an async op: the loop thread is stuck
        return x

    p = PipelineBuilder().add_source(range(5)).pipe(blocks).add_sink(1).build(num_threads=2)
    try:
        assert p.get_item(timeout=30) == 0
        time.sleep(0.2)
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="event loop"):
            p.stop(timeout=1)
        assert time.monotonic() - t < 3
    finally:
        release.set()
