"""iterate_in_subprocess / run_pipeline_in_subprocess / the subinterpreter variants / cache_iterator, on real
worker processes. Every wait is bounded: the workers' ``timeout`` where a test needs one, the ``watchdog``
fixture against a hang. Iterables and ops are module-level so that any start method can pickle them."""

import gc
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import wait_for

from spdl_rs.pipeline import (
    BackgroundTask,
    PipelineBuilder,
    cache_iterator,
    iterate_in_subinterpreter,
    iterate_in_subprocess,
    run_pipeline_in_subinterpreter,
    run_pipeline_in_subprocess,
)

pytestmark = pytest.mark.usefixtures("watchdog")


class Numbers:
    """A re-iterable iterable: each iteration starts over."""

    def __init__(self, n: int, pid_first: bool = False) -> None:
        self.n = n
        self.pid_first = pid_first

    def __iter__(self):
        if self.pid_first:
            yield os.getpid()
        yield from range(self.n)


def numbers(n=5, pid_first=False):
    return Numbers(n, pid_first)


def one_shot():
    return (i for i in range(3))


def failing_init():
    raise ValueError("no config file")


def failing_factory():
    raise OSError("cannot open the dataset")


def sleepy_init():
    time.sleep(60)


class FailsAt:
    def __iter__(self):
        yield 0
        yield 1
        raise KeyError("sample 2 is missing")


def fails_at():
    return FailsAt()


class ExitsAt:
    def __iter__(self):
        yield 0
        os._exit(3)


def exits_at():
    return ExitsAt()


class Stalls:
    def __iter__(self):
        yield 0
        time.sleep(60)
        yield 1


def stalls():
    return Stalls()


class Unpicklable:
    def __iter__(self):
        yield 0
        yield lambda: None


def unpicklable():
    return Unpicklable()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def worker_pid(src) -> int:
    it = iter(src)
    pid = next(it)
    it.close()
    return pid


################################################################################
# iterate_in_subprocess
################################################################################


def test_iterates_and_reiterates_in_the_same_process():
    src = iterate_in_subprocess(numbers, buffer_size=2, timeout=30)
    assert list(src) == [0, 1, 2, 3, 4]
    assert list(src) == [0, 1, 2, 3, 4]


def test_a_generator_iterates_once():
    src = iterate_in_subprocess(one_shot, timeout=30)
    assert list(src) == [0, 1, 2]
    assert list(src) == []


def test_break_then_iterate_again_starts_over():
    from functools import partial

    src = iterate_in_subprocess(partial(numbers, 50), buffer_size=2, timeout=30)
    for i, x in enumerate(src):
        if i == 3:
            break
    assert list(src) == list(range(50))


def test_initializer_and_factory_failures_are_reported():
    with pytest.raises(RuntimeError, match=r"The worker subprocess quit\. Initializer failed: no config file"):
        iterate_in_subprocess(numbers, initializer=failing_init, timeout=30)
    with pytest.raises(RuntimeError, match="Failed to create the iterable: cannot open the dataset"):
        iterate_in_subprocess(failing_factory, timeout=30)


def test_a_failed_iteration_is_reported_and_the_worker_is_gone():
    src = iterate_in_subprocess(fails_at, timeout=30)
    got = []
    with pytest.raises(RuntimeError, match="Failed to fetch the next item: 'sample 2 is missing'"):
        for x in src:
            got.append(x)
    assert got == [0, 1]
    with pytest.raises(RuntimeError, match="The worker process is shutdown. Cannot iterate again."):
        list(src)


def test_an_unpicklable_item_is_reported():
    with pytest.raises(RuntimeError, match="Failed to fetch the next item"):
        list(iterate_in_subprocess(unpicklable, timeout=30))


def test_a_worker_that_exits_is_reported():
    src = iterate_in_subprocess(exits_at)  # no timeout: liveness alone ends the wait
    with pytest.raises(RuntimeError, match=r"The worker subprocess exited unexpectedly\. \(exit code 3\)"):
        list(src)


def test_a_killed_worker_is_reported():
    from functools import partial

    src = iterate_in_subprocess(partial(numbers, 10**9, True), buffer_size=1)
    it = iter(src)
    pid = next(it)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="exited unexpectedly.*SIGKILL"):
        for _ in it:
            pass


def test_a_stalled_worker_times_out_and_is_terminated():
    src = iterate_in_subprocess(stalls, timeout=0.5)
    proc = src._handle.worker.runner
    with pytest.raises(RuntimeError, match=r"The worker subprocess did not produce any data for \d+\.\d+ seconds"):
        list(src)
    assert proc.exitcode is not None


def test_a_stalled_initializer_times_out():
    with pytest.raises(RuntimeError, match=r"The worker subprocess did not initialize after \d+\.\d+ seconds"):
        iterate_in_subprocess(numbers, initializer=[sleepy_init], timeout=0.5)
    # The blocked initializer cannot read ABORT: the worker was terminated (no process is left behind).
    gc.collect()
    assert not [p for p in __import__("multiprocessing").active_children() if p.is_alive()]


def test_garbage_collection_stops_the_worker():
    from functools import partial

    src = iterate_in_subprocess(partial(numbers, 10**6, True), buffer_size=2)
    pid = worker_pid(src)  # abandoned mid-iteration: the worker is blocked on a full queue
    assert alive(pid)
    del src
    gc.collect()
    wait_for(lambda: not alive(pid), timeout=20, what="the worker to exit")


def test_interpreter_exit_stops_the_worker(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            """
            import itertools, os, sys
            from spdl_rs.pipeline import iterate_in_subprocess

            class Forever:
                def __iter__(self):
                    yield os.getpid()
                    yield from itertools.count()

            def make():
                return Forever()

            if __name__ == "__main__":
                src = iterate_in_subprocess(make, buffer_size=2)
                it = iter(src)
                print(next(it), flush=True)
                # exit with the worker mid-iteration, its queue full
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Terminating the worker process" not in out.stderr  # it obeyed ABORT: no need to terminate it
    pid = int(out.stdout.split()[0])
    wait_for(lambda: not alive(pid), timeout=20, what="the worker to exit")


def test_an_unpicklable_factory_fails_to_start_with_spawn():
    with pytest.raises((pickle.PicklingError, AttributeError)):
        iterate_in_subprocess(lambda: range(3), mp_context="spawn", timeout=30)


def test_daemon_and_forkserver():
    src = iterate_in_subprocess(numbers, daemon=True, mp_context="forkserver", timeout=30)
    assert src._handle.worker.runner.daemon
    time.sleep(0.5)  # an idle worker whose parent is the fork server stays (it watches that parent)
    assert list(src) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mp_context", ["fork", "forkserver"])
def test_an_orphaned_worker_exits(tmp_path, mp_context):
    script = tmp_path / "orphan.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import itertools, os, signal
            from spdl_rs.pipeline import iterate_in_subprocess

            class Forever:
                def __iter__(self):
                    yield os.getpid()
                    yield from itertools.count()

            def make():
                return Forever()

            if __name__ == "__main__":
                src = iterate_in_subprocess(make, buffer_size=2, mp_context={mp_context!r})
                it = iter(src)
                print(next(it), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid = int(out.stdout.split()[0])
    wait_for(lambda: not alive(pid), timeout=20, what="the orphaned worker to exit")


def test_buffer_size_of_zero_or_less_is_unbounded():
    # As in SPDL (a multiprocessing.Queue's maxsize): no bound.
    assert list(iterate_in_subprocess(numbers, buffer_size=-1)) == list(numbers())
    with pytest.raises(ValueError, match="buffer_size"):
        iterate_in_subprocess(numbers, buffer_size="3")


################################################################################
# run_pipeline_in_subprocess
################################################################################


def square(x):
    return x * x


def draw(x):
    return random.random()


def bad_op(x):
    if x == 3:
        raise ValueError("bad item 3")
    return x


def test_run_pipeline_in_subprocess_builds_there_and_reiterates():
    cfg = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(square, concurrency=2, output_order="input")
        .pipe(square, concurrency=1)
        .add_sink(3)
        .get_config()
    )
    src = run_pipeline_in_subprocess(cfg, num_threads=2, timeout=30)
    expected = sorted(x**4 for x in range(20))
    assert sorted(src) == expected
    assert sorted(src) == expected


def pid_of(x):
    return os.getpid()


def test_the_pipeline_runs_in_the_child():
    cfg = PipelineBuilder().add_source(range(3)).pipe(pid_of).add_sink(3).get_config()
    pids = set(run_pipeline_in_subprocess(cfg, num_threads=1, timeout=30))
    assert len(pids) == 1 and os.getpid() not in pids


def test_continuous_source_yields_one_epoch_per_iteration():
    cfg = PipelineBuilder().add_source(range(4), continuous=True).pipe(square).add_sink(2).get_config()
    src = run_pipeline_in_subprocess(cfg, num_threads=1, timeout=30)
    assert sorted(src) == [0, 1, 4, 9]
    assert sorted(src) == [0, 1, 4, 9]


def test_rng_state_is_copied_into_the_child():
    cfg = PipelineBuilder().add_source(range(5)).pipe(draw, output_order="input").add_sink(3).get_config()
    random.seed(1234)
    expected = [random.random() for _ in range(5)]
    random.seed(1234)
    assert list(run_pipeline_in_subprocess(cfg, num_threads=1, timeout=30)) == expected


def test_a_failing_pipeline_is_reported():
    cfg = PipelineBuilder().add_source(range(6)).pipe(bad_op).add_sink(3).get_config()
    src = run_pipeline_in_subprocess(cfg, num_threads=1, max_failures=0, timeout=30)
    with pytest.raises(RuntimeError, match="The worker subprocess quit"):
        list(src)


def test_stdlib_thread_pool_is_rebuilt_in_the_child():
    cfg = (
        PipelineBuilder()
        .add_source(range(8))
        .pipe(square, executor=ThreadPoolExecutor(max_workers=2), concurrency=2)
        .add_sink(3)
        .get_config()
    )
    assert sorted(run_pipeline_in_subprocess(cfg, num_threads=1, timeout=30, mp_context="spawn")) == [
        x * x for x in range(8)
    ]
    used = ThreadPoolExecutor(max_workers=1)
    used.submit(square, 1).result()
    cfg = PipelineBuilder().add_source(range(2)).pipe(square, executor=used).add_sink(1).get_config()
    with pytest.raises(ValueError, match="freshly constructed"):
        run_pipeline_in_subprocess(cfg, num_threads=1)
    used.shutdown()


class WritesPid(BackgroundTask):
    def __init__(self, path):
        self.path = path

    async def run(self):
        with open(self.path, "w") as f:
            f.write(str(os.getpid()))


def test_build_arguments_reach_the_child(tmp_path):
    from functools import partial

    path = tmp_path / "pid"
    cfg = PipelineBuilder().add_source(range(3)).pipe(square).add_sink(1).get_config()
    src = run_pipeline_in_subprocess(
        cfg, num_threads=1, background_tasks=[partial(WritesPid, str(path))], timeout=30
    )
    assert sorted(src) == [0, 1, 4]
    wait_for(path.exists, timeout=20, what="the background task")
    assert int(path.read_text()) != os.getpid()


def test_a_builder_is_deprecated_but_works():
    builder = PipelineBuilder().add_source(range(3)).add_sink(1)
    with pytest.warns(UserWarning, match="deprecated"):
        src = run_pipeline_in_subprocess(builder, num_threads=1, timeout=30)
    assert list(src) == [0, 1, 2]


################################################################################
# Subinterpreters
################################################################################


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="the error of interpreters without subinterpreters")
def test_subinterpreters_need_python_3_14():
    msg = (
        r"iterate_in_subinterpreter requires Python 3.14 or later\. "
        rf"Current version: {sys.version_info.major}\.{sys.version_info.minor}"
    )
    with pytest.raises(RuntimeError, match=msg):
        iterate_in_subinterpreter(numbers)
    cfg = PipelineBuilder().add_source(range(3)).add_sink(1).get_config()
    with pytest.raises(RuntimeError, match=msg):
        run_pipeline_in_subinterpreter(cfg, num_threads=1)


################################################################################
# cache_iterator
################################################################################


def test_cache_iterator_serves_the_cache_after_the_source():
    pulled = []

    def src():
        for i in range(100):
            pulled.append(i)
            yield i

    it = cache_iterator(src(), 3, stop_after=10)
    assert list(it) == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert pulled == [0, 1, 2]


def test_cache_iterator_return_caches_after_and_stop_after():
    assert list(cache_iterator(range(100), 2, return_caches_after=5, stop_after=9)) == [0, 1, 2, 3, 4, 0, 1, 0, 1]
    assert list(cache_iterator(range(100), 2, stop_after=2)) == [0, 1]
    assert list(cache_iterator([], 2, stop_after=5)) == []
    forever = cache_iterator(range(2), 4)
    assert [next(forever) for _ in range(6)] == [0, 1, 0, 1, 0, 1]


def test_cache_iterator_checks_its_arguments_when_iterated():
    bad = cache_iterator(range(3), 0)  # a generator: nothing is checked yet
    with pytest.raises(ValueError, match="`num_caches` must be greater than zero. Found: 0"):
        next(bad)
    with pytest.raises(ValueError, match="return_caches_after"):
        next(cache_iterator(range(3), 2, return_caches_after=1))
    with pytest.raises(ValueError, match="stop_after"):
        next(cache_iterator(range(3), 2, stop_after=1))
    with pytest.raises(ValueError):
        next(cache_iterator(range(3), 2, return_caches_after=5, stop_after=3))


def test_the_worker_protocol_runs_without_the_spdl_rs_package():
    """A subinterpreter worker loads the protocol module by path, as here, where importing spdl_rs fails."""
    import spdl_rs.pipeline._run_protocol as proto

    script = textwrap.dedent(
        f"""
        import pickle, queue, sys, threading
        sys.modules["spdl_rs"] = None  # any import of the package fails
        exec({proto._INTERP_LOADER.format(path=proto.__file__)!r})
        p = _spdl_rs_run_protocol
        cmd_q, data_q = queue.Queue(), queue.Queue(maxsize=2)
        payload = pickle.dumps((sys.path, pickle.dumps((__import__("functools").partial(range, 4), None))))
        t = threading.Thread(target=p._interp_main, args=(cmd_q, data_q, payload))
        t.start()
        link = p._ParentLink(data_q, 10.0, "subinterpreter", is_alive=t.is_alive)
        link.wait_for_init()
        got = []
        for _ in range(2):
            assert link.enter_iteration_mode(cmd_q, None)
            got.append([pickle.loads(b) for b in link.iterate_results()])
        cmd_q.put(int(p._Cmd.ABORT))
        t.join(10)
        assert not t.is_alive()
        print(got)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[0, 1, 2, 3], [0, 1, 2, 3]]"
