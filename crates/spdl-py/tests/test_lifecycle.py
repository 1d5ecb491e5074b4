"""Stopping, garbage collection, thread hygiene, interpreter exit."""

import gc
import subprocess
import sys
import textwrap
import threading
import time

from conftest import os_threads, wait_for

from spdl_rs.pipeline import PipelineBuilder


def endless():
    i = 0
    while True:
        yield i
        i += 1


def test_stop_mid_iteration(watchdog):
    def slowish(x):
        time.sleep(0.001)
        return x

    p = PipelineBuilder().add_source(endless()).pipe(slowish, concurrency=4).add_sink(3).build(num_threads=4)
    got = []
    with p.auto_stop():
        for x in p:
            got.append(x)
            if len(got) == 50:
                break
    assert len(got) == 50
    assert list(p.get_iterator(timeout=1)) == []  # stopped: nothing more


def test_stop_while_an_op_blocks_and_another_thread_iterates(watchdog):
    release = threading.Event()

    def wait_a_bit(x):
        release.wait(10)
        return x

    p = PipelineBuilder().add_source(endless()).pipe(wait_a_bit, concurrency=2).add_sink(3).build(num_threads=2)
    p.start()
    consumer = threading.Thread(target=lambda: list(p.get_iterator(timeout=60)))
    consumer.start()
    time.sleep(0.2)
    threading.Timer(0.3, release.set).start()
    p.stop()  # waits for the running ops (they return within 0.3 s) and joins every thread
    consumer.join(30)
    assert not consumer.is_alive()


def test_no_thread_leak_after_many_cycles(watchdog):
    async def aop(x):
        return x

    baseline = os_threads()
    for i in range(40):
        b = PipelineBuilder().add_source(range(100)).pipe(lambda x: x + 1, concurrency=2)
        if i % 4 == 0:
            b = b.pipe(aop)
        p = b.add_sink(2).build(num_threads=3)
        with p.auto_stop():
            for j, _ in enumerate(p):
                if j == 10 and i % 2:
                    break
    wait_for(lambda: os_threads() <= baseline, what=f"threads back to {baseline} (now {os_threads()})")


def test_garbage_collected_pipeline_is_stopped(watchdog):
    baseline = os_threads()
    p = PipelineBuilder().add_source(endless()).pipe(lambda x: x, concurrency=2).add_sink(3).build(num_threads=3)
    # Completion order with 2 concurrent calls: either of the first two items may come first.
    assert p.get_item(timeout=30) in (0, 1)
    assert os_threads() > baseline
    del p
    gc.collect()
    wait_for(lambda: os_threads() <= baseline, what="the pipeline's threads to end after GC")


def test_running_pipeline_at_interpreter_exit_is_stopped():
    code = textwrap.dedent(
        """
        import itertools, time
        from spdl_rs.pipeline import PipelineBuilder

        def op(x):
            time.sleep(0.001)
            return x

        async def aop(x):
            return x

        p = (PipelineBuilder().add_source(itertools.count()).pipe(op, concurrency=2).pipe(aop)
             .add_sink(3).build(num_threads=2))
        assert p.get_item(timeout=30) is not None
        print("started", flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout
