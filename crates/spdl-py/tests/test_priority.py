"""Priority pool executors (order of waiting calls, pickling, shutdown) and the process-group stats (on a real
process group of its own)."""

import asyncio
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import CancelledError
from functools import partial

import pytest
from conftest import wait_for

from spdl_rs.pipeline import (
    PipelineBuilder,
    PriorityExecutorEntrypoint,
    PriorityInterpreterPoolExecutor,
    PriorityProcessPoolExecutor,
    PriorityThreadPoolExecutor,
    ProcessGroupResourceUsage,
    ProcessGroupStatsMonitor,
    run_pipeline_in_subprocess,
)

pytestmark = pytest.mark.usefixtures("watchdog")


def record(log, gate, name):
    if gate is not None:
        assert gate.wait(10)
    log.append(name)
    return name


def test_waiting_calls_run_by_priority():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    log: list[str] = []
    gate = threading.Event()
    upstream = pool.get_executor()
    downstream = pool.get_executor()  # made later: higher priority
    urgent = pool.get_executor(priority=100)
    assert isinstance(upstream, PriorityExecutorEntrypoint)
    first = upstream.submit(record, log, gate, "busy")  # occupies the only worker
    futures = [upstream.submit(record, log, None, f"up{i}") for i in range(3)]
    futures += [downstream.submit(record, log, None, f"down{i}") for i in range(3)]
    futures += [urgent.submit(record, log, None, "urgent")]
    gate.set()
    assert first.result(10) == "busy"
    assert [f.result(10) for f in futures][-1] == "urgent"
    assert log == ["busy", "urgent", "down0", "down1", "down2", "up0", "up1", "up2"]
    pool.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        upstream.submit(record, log, None, "late")


def test_explicit_priorities_and_exceptions():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    log: list[str] = []
    gate = threading.Event()
    low = pool.get_executor(priority=-5)
    high = pool.get_executor(priority=5)
    low.submit(record, log, gate, "busy")
    f_low = low.submit(record, log, None, "low")
    f_high = high.submit(record, log, None, "high")
    f_bad = high.submit(int, "not a number")
    gate.set()
    with pytest.raises(ValueError, match="invalid literal"):
        f_bad.result(10)
    assert f_low.result(10) == "low" and f_high.result(10) == "high"
    assert log == ["busy", "high", "low"]
    pool.shutdown()


def test_shutdown_cancel_futures():
    pool = PriorityThreadPoolExecutor(max_workers=1)
    gate = threading.Event()
    ex = pool.get_executor()
    busy = ex.submit(record, [], gate, "busy")
    waiting = [ex.submit(record, [], None, i) for i in range(3)]
    threading.Timer(0.2, gate.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert busy.result(0) == "busy"
    for f in waiting:
        with pytest.raises(CancelledError):
            f.result(0)


def test_pickled_entrypoints_share_one_rebuilt_owner():
    pool = PriorityThreadPoolExecutor(max_workers=2)
    a, b = pool.get_executor(), pool.get_executor()
    same = pickle.loads(pickle.dumps(a))
    assert same._owner is pool  # same process, owner alive: reused
    pool.shutdown()
    a2, b2 = pickle.loads(pickle.dumps((a, b)))
    assert a2._owner is b2._owner and a2._owner is not pool
    assert a2.submit(pow, 2, 10).result(10) == 1024
    a2._owner.shutdown()


def cube(x):
    return x**3


def test_process_pool_and_a_pipeline_in_a_subprocess():
    with PriorityProcessPoolExecutor(max_workers=2) as pool:
        ex = pool.get_executor()
        assert [f.result(30) for f in [ex.submit(cube, i) for i in range(5)]] == [0, 1, 8, 27, 64]
    threads = PriorityThreadPoolExecutor(max_workers=1)
    assert threads.get_executor().submit(cube, 2).result(10) == 8  # its threads exist here, not in a forked child
    cfg = (
        PipelineBuilder()
        .add_source(range(6))
        .pipe(cube, executor=threads.get_executor(), concurrency=2)
        .pipe(cube, executor=threads.get_executor(), concurrency=2)
        .add_sink(2)
        .get_config()
    )
    assert sorted(run_pipeline_in_subprocess(cfg, num_threads=1, timeout=30)) == [x**9 for x in range(6)]
    threads.shutdown()


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="the error of interpreters without subinterpreters")
def test_interpreter_pool_needs_python_3_14():
    with pytest.raises(RuntimeError, match="PriorityInterpreterPoolExecutor requires Python 3.14 or later"):
        PriorityInterpreterPoolExecutor(max_workers=1)


################################################################################
# Process-group stats
################################################################################

GROUP_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, subprocess, sys, time
    from spdl_rs.pipeline._pgrp_stats import _collect_pgrp_stats

    # A member of this process group holding 64 MiB it has written to.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; x = bytearray(64 << 20); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    usage, *prev = _collect_pgrp_stats()
    sum(range(3_000_000))
    usage2, *_ = _collect_pgrp_stats(*prev)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    child.kill()
    child.wait()
    print(json.dumps({"first": dataclasses.asdict(usage), "second": dataclasses.asdict(usage2),
                      "pid": os.getpid(), "child": child.pid}))
    """
)


def test_stats_of_a_real_process_group():
    out = subprocess.run(
        [sys.executable, "-c", GROUP_SCRIPT], capture_output=True, text=True, timeout=60, process_group=0
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    first, second = res["first"], res["second"]
    assert first["pgid"] == res["pid"] and first["pid"] == res["pid"]  # the script leads its own group
    assert first["num_procs"] == 2 and second["num_procs"] == 2
    assert first["cpu_percent"] is None and first["net_rx_bytes"] is None
    assert second["cpu_percent"] is not None and second["cpu_percent"] >= 0
    assert second["net_rx_bytes"] is not None and second["net_rx_bytes"] >= 0
    assert first["rss_bytes"] >= 64 << 20
    if first["pss_bytes"] is not None:
        assert first["private_bytes"] <= first["pss_bytes"]
        # stat's RSS is the kernel's running counter, smaps_rollup a page walk: allow them to disagree a little.
        assert first["pss_bytes"] <= first["rss_bytes"] + (8 << 20)
        assert first["private_bytes"] >= 64 << 20
    assert second["disk_write_bytes"] >= first["disk_write_bytes"] >= 0


async def save_usage(path, usage):
    with open(path + ".tmp", "w") as f:
        json.dump({"pgid": usage.pgid, "num_procs": usage.num_procs, "rss": usage.rss_bytes}, f)
    os.replace(path + ".tmp", path)


def test_monitor_reports_and_stops_on_cancel(tmp_path):
    path = str(tmp_path / "usage.json")
    monitor = ProcessGroupStatsMonitor(partial(save_usage, path), interval=0.1)

    async def main():
        task = asyncio.create_task(monitor.run())
        for _ in range(200):
            if os.path.exists(path):
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    usage = json.load(open(path))
    assert usage["pgid"] == os.getpgrp()
    assert usage["num_procs"] >= 2  # this process and the monitor
    assert usage["rss"] > 0
    wait_for(lambda: not [c for c in __import__("multiprocessing").active_children()], timeout=10,
             what="the monitor subprocess to exit")


def test_usage_fields():
    u = ProcessGroupResourceUsage(pid=1, pgid=2)
    assert (u.cpu_percent, u.rss_bytes, u.pss_bytes, u.private_bytes, u.disk_read_bytes, u.disk_write_bytes,
            u.num_procs, u.net_rx_bytes, u.net_tx_bytes) == (None,) * 9


async def append_count(path, usage):
    with open(path, "a") as f:
        f.write(f"{usage.num_procs}\n")


def slow_identity(x):
    import time

    time.sleep(0.05)
    return x


def test_monitor_as_a_pipeline_background_task(tmp_path):
    import multiprocessing

    from spdl_rs.pipeline import build_pipeline

    path = tmp_path / "counts"
    cfg = PipelineBuilder().add_source(range(20)).pipe(slow_identity).add_sink(2).get_config()
    monitor = partial(ProcessGroupStatsMonitor, partial(append_count, str(path)), interval=0.1)
    pipeline = build_pipeline(cfg, num_threads=1, background_tasks=[monitor])
    with pipeline.auto_stop():
        out = list(pipeline)
        wait_for(path.exists, timeout=20, what="a snapshot")
    assert out == list(range(20))
    assert all(int(n) >= 2 for n in path.read_text().split())  # this process and the monitor at least
    wait_for(lambda: not multiprocessing.active_children(), timeout=20, what="the monitor to stop with the pipeline")
