"""On a free-threaded interpreter, importing spdl_rs keeps the GIL off, and ops run in parallel."""

import sys
import threading

import pytest
from conftest import EXPECT_NO_GIL

import spdl_rs  # noqa: F401 (the import is what is tested)
from spdl_rs.pipeline import PipelineBuilder


def test_gil_stays_disabled_after_import():
    if not EXPECT_NO_GIL:
        pytest.skip("not the free-threaded run (SPDL_RS_EXPECT_NO_GIL=1 is set by `cargo xtask test` there)")
    assert sys._is_gil_enabled() is False


def test_python_ops_run_in_parallel_without_the_gil(watchdog):
    if not EXPECT_NO_GIL:
        pytest.skip("needs a free-threaded interpreter")
    # Pure-Python busy loops on 2 threads: both must be inside the op at the same time.
    barrier = threading.Barrier(2, timeout=60)

    def spin(x):
        barrier.wait()
        return sum(range(20000)) + x

    p = PipelineBuilder().add_source(range(2)).pipe(spin, concurrency=2).add_sink(2).build(num_threads=2)
    with p.auto_stop():
        assert sorted(p) == [199990000, 199990001]
