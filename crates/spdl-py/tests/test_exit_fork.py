"""Interpreter exit and fork with work in flight: every run exits cleanly, whatever was running.

Each scenario runs in a fresh interpreter, many times over (a flaky crash is a crash): exit status 0, and
nothing on stderr that says the process aborted or CPython died (``FATAL: exception not rethrown``,
``Fatal Python error``, ``PyThreadState_Get``, a panic). The scenarios are what training scripts do: a daemon
thread decoding in a loop, an op still running after ``stop(timeout=...)`` gave up, a read still dripping
from a server, a fork while a pipeline runs, a pipeline dropped inside a reference cycle.
"""

import os
import subprocess
import sys
import textwrap
import time
import weakref

import pytest
from conftest import HostileServer, os_threads, wait_for

RUNS = int(os.environ.get("SPDL_RS_EXIT_RUNS", "12"))
BAD = ("FATAL", "Fatal Python error", "PyThreadState_Get", "panicked", "Aborted", "Segmentation fault")

PRELUDE = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    import spdl_rs.io as io
    from spdl_rs.pipeline import PipelineBuilder

    def image_bytes():
        import tempfile
        pixels = (np.arange(64 * 48 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.png")
            io.encode_image(path, pixels, pix_fmt="rgb24")
            with open(path, "rb") as f:
                return f.read()

    def endless():
        i = 0
        while True:
            yield i
            i += 1
    """
)


def run_script(body: str, *, runs: int = RUNS, timeout: float = 60, env=None) -> None:
    """Runs ``PRELUDE + body`` ``runs`` times; each must exit 0 within ``timeout`` with a clean stderr."""
    script = PRELUDE + textwrap.dedent(body)
    for i in range(runs):
        try:
            proc = subprocess.run(
                [sys.executable, "-c", script],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **(env or {})},
            )
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"run {i}: the interpreter did not exit within {timeout} s\n{e.stderr}") from None
        bad = [w for w in BAD if w in proc.stderr]
        assert proc.returncode == 0 and not bad, (
            f"run {i}: exit status {proc.returncode}, stderr:\n{proc.stderr[-4000:]}\nstdout:\n{proc.stdout[-2000:]}"
        )


def test_exit_while_a_daemon_thread_decodes_in_a_loop():
    run_script(
        """
        data = image_bytes()
        def loop():
            while True:
                io.decode_image(data)
        for _ in range(2):
            threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.05 + 0.1 * (os.getpid() % 3))
        """
    )


def test_exit_while_a_daemon_thread_loads_batches_in_a_loop():
    run_script(
        """
        data = image_bytes()
        def loop():
            while True:
                io.load_image_batch([data] * 8, width=16, height=16)
        threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.05 + 0.05 * (os.getpid() % 4))
        """
    )


def test_exit_with_a_sync_op_still_running_after_stop_gave_up():
    run_script(
        """
        def slow(x):
            time.sleep(0.5)
            return x
        p = PipelineBuilder().add_source(endless()).pipe(slow, concurrency=2).add_sink(2).build(num_threads=2)
        p.start()
        time.sleep(0.1)
        try:
            p.stop(timeout=0.05)
        except TimeoutError:
            pass
        """
    )


def test_exit_with_a_busy_python_op_still_running():
    # The op never sleeps: it holds the interpreter in bytecode until the exit interrupts it.
    run_script(
        """
        def busy(x):
            t = time.monotonic() + 1.5
            while time.monotonic() < t:
                pass
            return x
        p = PipelineBuilder().add_source(endless()).pipe(busy, concurrency=2).add_sink(2).build(num_threads=2)
        p.start()
        time.sleep(0.1)
        try:
            p.stop(timeout=0.05)
        except TimeoutError:
            pass
        """,
        runs=max(3, RUNS // 3),
    )


def test_exit_while_pipelines_run_with_async_ops_and_no_stop():
    run_script(
        """
        import asyncio
        async def aop(x):
            await asyncio.sleep(0.01)
            return x
        def op(x):
            return x + 1
        p = (PipelineBuilder().add_source(endless()).pipe(aop, concurrency=4).pipe(op, concurrency=2)
             .add_sink(2).build(num_threads=2))
        it = iter(p)
        for _ in range(5):
            next(it)
        """
    )


def test_exit_while_an_http_read_still_drips():
    from spdl_rs.source import Store

    try:
        Store.open("http://127.0.0.1:1/")
    except Exception as e:  # noqa: BLE001
        if "http" in str(e) and "feature" in str(e):
            pytest.skip(f"built without the http feature: {e}")
    server = HostileServer()
    try:
        run_script(
            f"""
            from spdl_rs.source import Store
            store = Store.open("http://127.0.0.1:{server.port}/data")
            def read():
                try:
                    store.get("drip")
                except Exception:
                    pass
            for _ in range(2):
                threading.Thread(target=read, daemon=True).start()
            time.sleep(0.3)
            """,
            runs=max(4, RUNS // 2),
        )
    finally:
        server.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_a_pipeline_runs_in_the_parent():
    # The child inherits a running pipeline whose threads stayed in the parent: using it raises a clear
    # error, a pipeline of its own works, and its exit (finalizers of the inherited pipeline included) is clean.
    run_script(
        """
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: CPython 3.12+ warns
        def op(x):
            return x * 2
        p = PipelineBuilder().add_source(endless()).pipe(op, concurrency=2).add_sink(2).build(num_threads=2)
        it = iter(p)
        next(it)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                p.get_item(timeout=1)
                code = 3
            except RuntimeError as e:
                if "fork" not in str(e):
                    code = 4
            except BaseException:
                code = 5
            q = PipelineBuilder().add_source(range(20)).pipe(op).add_sink(2).build(num_threads=1)
            with q.auto_stop():
                if list(q) != [2 * i for i in range(20)]:
                    code = 6
            sys.exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
        assert next(it) % 2 == 0  # the parent's pipeline still runs
        """,
        runs=RUNS + 3,
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_multiprocessing_fork_children_with_a_running_pipeline():
    run_script(
        """
        import multiprocessing as mp
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        p = PipelineBuilder().add_source(endless()).pipe(lambda x: x, concurrency=2).add_sink(2).build(num_threads=2)
        it = iter(p)
        next(it)
        def child(q):
            out = PipelineBuilder().add_source(range(5)).add_sink(1).build(num_threads=1)
            with out.auto_stop():
                q.put(list(out))
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            procs = [ctx.Process(target=child, args=(q,)) for _ in range(2)]
            for pr in procs:
                pr.start()
            got = [q.get(timeout=30) for _ in procs]
            for pr in procs:
                pr.join(30)
                assert pr.exitcode == 0, pr.exitcode
            assert got == [[0, 1, 2, 3, 4]] * 2
        """,
        runs=max(4, RUNS // 2),
    )


class _Owner:
    """Owns a running pipeline whose op is one of its bound methods: a reference cycle through the engine."""

    alive = weakref.WeakSet()

    def __init__(self):
        _Owner.alive.add(self)
        self.pipeline = (
            PipelineBuilderRef().add_source(_endless()).pipe(self.op, concurrency=2).add_sink(2).build(num_threads=2)
        )
        self.it = iter(self.pipeline)
        next(self.it)

    def op(self, x):
        return x


class _RaisingOwner(_Owner):
    """The same cycle, and the op raises now and then: the kept exceptions' tracebacks hold ``self`` too."""

    def op(self, x):
        if x % 5 == 0:
            raise ValueError(f"item {x}")
        return x


def PipelineBuilderRef():  # noqa: N802 (kept beside _Owner for readability)
    from spdl_rs.pipeline import PipelineBuilder

    return PipelineBuilder()


def _endless():
    i = 0
    while True:
        yield i
        i += 1


@pytest.fixture
def no_failure_log_records():
    """pytest's log capture keeps every record, and a failed item's record holds its exception, whose
    traceback holds the op's frame and ``self``: that would keep the cycle alive from outside."""
    import logging

    import gc

    logger = logging.getLogger("spdl_rs.pipeline")
    logger.disabled = True
    yield
    # A cycle whose op was in flight at the last collection is collected by a later one: until then its
    # pipeline runs (its queues fill) and logs the op's failures, which later tests would capture.
    wait_for(lambda: (gc.collect(), len(_Owner.alive))[1] == 0, what="every pipeline-owning cycle to be collected")
    logger.disabled = False


def test_a_running_pipeline_in_a_reference_cycle_is_collected_and_its_threads_end(watchdog, no_failure_log_records):
    import gc

    gc.collect()
    baseline = os_threads()
    for i in range(16):
        (_Owner if i % 2 else _RaisingOwner)()
        gc.collect()
    wait_for(lambda: (gc.collect(), os_threads())[1] <= baseline + 4, what="the cycles' pipeline threads to end")


def test_a_cycle_through_a_raising_op_is_collected(watchdog, no_failure_log_records):
    import gc
    import weakref

    owner = _RaisingOwner()
    for _ in range(8):
        next(owner.it)
    ref = weakref.ref(owner)
    del owner
    wait_for(lambda: (gc.collect(), ref())[1] is None, what="the owner of a pipeline whose op raised to be collected")
