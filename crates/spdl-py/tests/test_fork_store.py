"""Objects that own a runtime or a thread pool, inherited through ``fork``: they work in the child (a ``Store``
reopens itself on a runtime of the child's own) or raise a clear ``RuntimeError`` (``ImageLoader``); they never
hang, and dropping them in the child leaves the parent's threads alone.

Each scenario runs in a fresh interpreter under a deadline: a child that hangs is killed and fails the test.
"""

import functools
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

RUNS = int(os.environ.get("SPDL_RS_FORK_RUNS", "20"))


@pytest.fixture
def served(tmp_path):
    """A directory of objects, and an HTTP server on 127.0.0.1 serving it."""
    root = tmp_path / "objects"
    (root / "sub").mkdir(parents=True)
    for i in range(4):
        (root / "sub" / f"{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_script(body: str, *args: str, timeout: float = 240, cwd=None) -> dict:
    script = textwrap.dedent(
        """
        import gc, json, os, sys, time, threading
        import multiprocessing as mp
        from spdl_rs.source import Store

        def wait_child(pid, deadline=30.0):
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return os.waitstatus_to_exitcode(status)
                time.sleep(0.005)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return "hung"
        """
    ) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CHILD = """
def child_checks(stores):
    # get, get_range, size, list and get_many on every inherited store, then drop them (the parent's runtime
    # must not be shut down or joined from here).
    for store in stores:
        assert store.get("sub/2.bin") == bytes([2]) * 1002, "get"
        assert store.get_range("sub/3.bin", 0, 10) == bytes([3]) * 10, "get_range"
        assert store.size("sub/1.bin") == 1001, "size"
        assert store.get_many(["sub/0.bin", "sub/3.bin"], concurrency=2) == [bytes([0]) * 1000, bytes([3]) * 1003]
    local = stores[0]
    assert [k for k, _ in local.list("sub/")] == [f"sub/{i}.bin" for i in range(4)], "list"
"""


def _stores(served_root: str, url: str) -> str:
    return f"stores = [Store.open({served_root!r}), Store.open({url!r}, read_timeout=10.0, max_attempts=2)]\n"


def test_a_store_opened_before_os_fork_works_in_the_child(served):
    root, url = served
    out = run_script(
        _stores(str(root), url)
        + CHILD
        + textwrap.dedent(f"""
        # The parent uses them first: their runtimes' threads run and the HTTP pool holds a connection.
        for s in stores:
            assert s.get("sub/1.bin") == bytes([1]) * 1001
        # And keeps requesting on another thread while it forks (the runtime is busy at the fork).
        stop = threading.Event()
        def busy():
            while not stop.is_set():
                stores[1].get("sub/0.bin")
        t = threading.Thread(target=busy, daemon=True)
        t.start()
        codes = []
        for _ in range({RUNS}):
            pid = os.fork()
            if pid == 0:
                try:
                    child_checks(stores)
                    del stores[:]
                    gc.collect()
                    code = 0
                except BaseException as e:
                    print("child failed:", repr(e), file=sys.stderr, flush=True)
                    code = 3
                os._exit(code)
            codes.append(wait_child(pid))
        stop.set()
        t.join()
        # The parent's stores still work after all that.
        parent_ok = all(s.get("sub/2.bin") == bytes([2]) * 1002 for s in stores)
        print(json.dumps({{"codes": codes, "parent_ok": parent_ok}}))
        """)
    )
    assert out["codes"] == [0] * RUNS, out
    assert out["parent_ok"]


def test_a_store_opened_before_a_multiprocessing_fork_works_in_the_child(served):
    root, url = served
    out = run_script(
        _stores(str(root), url)
        + CHILD
        + textwrap.dedent(f"""
        def target(q):
            try:
                child_checks(stores)
                q.put(("ok", stores[0].get("sub/3.bin")))
            except BaseException as e:
                q.put(("failed", repr(e)))
            # The child exits through multiprocessing's normal exit: the inherited stores are collected there.

        for s in stores:
            s.get("sub/1.bin")
        ctx = mp.get_context("fork")
        results = []
        for _ in range({RUNS}):
            q = ctx.Queue()
            p = ctx.Process(target=target, args=(q,))
            p.start()
            try:
                status, value = q.get(timeout=30)
            except Exception as e:
                status, value = "no answer", repr(e)
            p.join(30)
            if p.exitcode is None:
                p.kill()
                p.join()
                status = "hung"
            results.append([status, p.exitcode, value == bytes([3]) * 1003 if status == "ok" else value])
        print(json.dumps({{"results": results}}))
        """)
    )
    assert out["results"] == [["ok", 0, True]] * RUNS, out


def test_a_store_reopened_in_a_child_works_in_a_grandchild(served):
    root, url = served
    out = run_script(
        _stores(str(root), url)
        + CHILD
        + textwrap.dedent("""
        for s in stores:
            s.get("sub/1.bin")
        pid = os.fork()
        if pid == 0:
            child_checks(stores)  # reopened here
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    child_checks(stores)
                    os._exit(0)
                except BaseException:
                    os._exit(3)
            os._exit(wait_child(grandchild))
        print(json.dumps({"code": wait_child(pid)}))
        """)
    )
    assert out["code"] == 0, out


def test_native_fetch_op_made_before_fork_works_in_a_pipeline_built_in_the_child(served):
    root, _url = served
    out = run_script(
        f"""
        from spdl_rs.pipeline import PipelineBuilder
        store = Store.open({str(root)!r})
        op = store.get_op()
        assert store.get("sub/0.bin")
        pid = os.fork()
        if pid == 0:
            try:
                p = PipelineBuilder().add_source(["sub/1.bin", "sub/2.bin"]).pipe(op).add_sink(2).build(num_threads=1)
                with p.auto_stop():
                    got = sorted(len(b) for b in p)
                os._exit(0 if got == [1001, 1002] else 4)
            except BaseException as e:
                print("child failed:", repr(e), file=sys.stderr, flush=True)
                os._exit(3)
        print(json.dumps({{"code": wait_child(pid)}}))
        """
    )
    assert out["code"] == 0, out


def test_image_loader_made_before_fork_raises_in_the_child(tmp_path):
    import numpy as np

    import spdl_rs.io as io

    try:
        from spdl_rs.loader import ImageLoader  # noqa: F401
    except Exception as e:  # a build without the loader
        pytest.skip(f"no ImageLoader: {e}")
    (tmp_path / "a").mkdir()
    pixels = (np.arange(32 * 32 * 3) % 251).astype(np.uint8).reshape(32, 32, 3)
    for i in range(4):
        io.encode_image(str(tmp_path / "a" / f"{i}.png"), pixels, pix_fmt="rgb24")
    out = run_script(
        f"""
        from spdl_rs.loader import ImageLoader
        loader = ImageLoader({str(tmp_path)!r}, batch_size=2, num_threads=1, size=16)
        first = next(iter(loader))
        pid = os.fork()
        if pid == 0:
            try:
                next(loader)
                os._exit(5)  # must not work
            except RuntimeError as e:
                ok = "fork" in str(e)
            del loader
            gc.collect()
            # A new loader in the child works.
            fresh = ImageLoader({str(tmp_path)!r}, batch_size=2, num_threads=1, size=16)
            images, labels = next(iter(fresh))
            os._exit(0 if ok and len(labels) == 2 else 6)
        code = wait_child(pid)
        rest = sum(1 for _ in loader)  # the parent's loader goes on
        print(json.dumps({{"code": code, "parent_rest": rest}}))
        """
    )
    assert out["code"] == 0, out
    assert out["parent_rest"] == 1


def test_decoding_in_a_child_after_the_parent_decoded(tmp_path):
    # Decode calls use per-call threads (no global pool): a child decodes as the parent did.
    out = run_script(
        """
        import numpy as np
        import spdl_rs.io as io
        pixels = (np.arange(64 * 48 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
        io.encode_image("x.png", pixels, pix_fmt="rgb24")
        data = open("x.png", "rb").read()
        assert np.asarray(io.load_image_batch([data] * 8, 16, 16, num_threads=2)).shape == (8, 16, 16, 3)
        codes = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                b = np.asarray(io.load_image_batch([data] * 8, 16, 16, num_threads=2))
                one = np.asarray(io.decode_image(data))
                os._exit(0 if b.shape == (8, 16, 16, 3) and one.shape == (48, 64, 3) else 3)
            codes.append(wait_child(pid))
        print(json.dumps({"codes": codes}))
        """,
        cwd=tmp_path,
    )
    assert out["codes"] == [0] * 5, out

