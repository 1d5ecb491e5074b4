import os
import sys
import threading
import time

import pytest


def os_threads() -> int:
    """Threads of this process, Rust ones included (Linux)."""
    return len(os.listdir("/proc/self/task"))


def wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    """Polls ``cond`` until it is true; generous on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def watchdog():
    """Fails a test that hangs instead of hanging the suite: dumps the stacks and exits after 120 s."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _no_leaked_python_threads():
    before = {t.ident for t in threading.enumerate()}
    yield
    wait_for(
        lambda: {t.ident for t in threading.enumerate() if t.name.startswith("spdl_rs")} - before == set(),
        what="the pipeline's Python threads to end",
    )


EXPECT_NO_GIL = os.environ.get("SPDL_RS_EXPECT_NO_GIL") == "1"
FREE_THREADED_BUILD = bool(getattr(sys, "_is_gil_enabled", None)) and not sys._is_gil_enabled()
