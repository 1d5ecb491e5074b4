"""The messages between a ``.to()`` region's pool and its workers, and the pure-Python runner of its
subinterpreter workers (:py:mod:`._region` is the pool and the process workers).

spdl_rs's native module cannot be loaded in a subinterpreter (PyO3 does not support them), so a subinterpreter
worker loads this file by path (:py:data:`_INTERP_LOADER`), without the ``spdl_rs`` package, and runs the
region's stages, sent as plain tuples, with the runner below. This module imports nothing from ``spdl_rs``.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import traceback
from collections.abc import Sequence
from typing import Any

_LG = logging.getLogger("spdl_rs.pipeline")

# Messages into a worker.
_IN_ITEMS = 0  # (_IN_ITEMS, pickled list of items)
_IN_END = 1  # (_IN_END, epoch): the end of this epoch's items
_IN_SHUTDOWN = 2  # (_IN_SHUTDOWN, None): exit

# Messages out of a worker.
_OUT_ITEMS = 0  # (_OUT_ITEMS, worker, pickled list of outputs)
_OUT_DONE = 1  # (_OUT_DONE, worker, epoch): the worker finished the epoch
_OUT_ERROR = 2  # (_OUT_ERROR, worker, text): the worker failed (initializer, pipeline, pickling)

#: Seconds between checks (stop requested, worker alive, parent alive) while waiting on a queue.
_POLL = 0.1


def _describe(e: BaseException, what: str) -> str:
    return f"{what} raised {type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e)).rstrip()


def _get(in_q: Any, parent_pid: int | None) -> tuple[int, Any] | None:
    """The next message, or ``None`` once the parent process is gone."""
    while True:
        try:
            return in_q.get(timeout=_POLL)
        except queue.Empty:
            if parent_pid is not None and os.getppid() != parent_pid:
                return None


def _put(out_q: Any, msg: tuple[Any, ...], parent_pid: int | None) -> None:
    """Puts ``msg`` on the output queue; exits the worker once the parent process is gone."""
    while True:
        try:
            out_q.put(msg, timeout=_POLL)
            return
        except queue.Full:
            if parent_pid is not None and os.getppid() != parent_pid:
                raise SystemExit(0) from None


#: Run in a new subinterpreter: loads this file as ``_spdl_rs_region``.
_INTERP_LOADER = """
import importlib.util, sys
if "_spdl_rs_region" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("_spdl_rs_region", {path!r})
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["_spdl_rs_region"] = _mod
    _spec.loader.exec_module(_mod)
import _spdl_rs_region
"""


################################################################################
# The pure-Python runner of subinterpreter workers
################################################################################


class _Env:
    """What the runner's stages share: the event loop for async ops, failure handling."""

    def __init__(self, fail_fast: bool) -> None:
        self.fail_fast = fail_fast
        self._loop: Any = None

    def run(self, coro: Any) -> Any:
        import asyncio

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def call(self, kind: str, fn: Any, item: Any) -> list[Any]:
        """``fn(item)``'s outputs."""
        if kind == "sync":
            return [fn(item)]
        if kind == "gen":
            return list(fn(item))
        if kind == "async":
            return [self.run(fn(item))]

        async def collect() -> list[Any]:
            return [x async for x in fn(item)]

        return self.run(collect())

    def failed(self, stage: str, e: BaseException) -> None:
        if self.fail_fast:
            raise RuntimeError(f"stage `{stage}` failed: {type(e).__name__}: {e}") from e
        _LG.error("Stage `%s` failed on an item (the item is dropped): %s: %s", stage, type(e).__name__, e, exc_info=e)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


class _Collect:
    """The end of a chain: keeps what reaches it."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def push(self, item: Any) -> None:
        self.items.append(item)

    def finish(self) -> None:
        pass


class _Forward:
    """The end of a path: passes on to the stage after the path variants."""

    def __init__(self, nxt: Any) -> None:
        self.nxt = nxt

    def push(self, item: Any) -> None:
        self.nxt.push(item)

    def finish(self) -> None:
        pass


class _Step:
    """One stage of the runner: ``push`` an item, ``finish`` at the end of the session."""

    def __init__(self, spec: tuple[Any, ...], nxt: Any, env: _Env) -> None:
        self.spec, self.nxt, self.env = spec, nxt, env
        self.kind = spec[0]
        self.name = spec[1]
        self.buf: list[Any] = []
        if self.kind == "path_variants":
            self.paths_out: list[Any] = []
            self.paths = []
            for path in spec[4]:
                tail: Any = _Collect() if spec[5] else _Forward(nxt)
                self.paths_out.append(tail)
                self.paths.append(_chain(path, tail, env))

    def push(self, item: Any) -> None:
        kind, env = self.kind, self.env
        if kind == "pipe":
            try:
                outputs = env.call(self.spec[2], self.spec[3], item)
            except Exception as e:  # noqa: BLE001
                env.failed(self.name, e)
                return
            for out in outputs:
                if out is not None:
                    self.nxt.push(out)
        elif kind == "aggregate":
            self.buf.append(item)
            if len(self.buf) >= self.spec[2]:
                batch, self.buf = self.buf, []
                self.nxt.push(batch)
        elif kind == "aggregator":
            try:
                out = self.spec[2].accumulate(item)
            except Exception as e:  # noqa: BLE001
                env.failed(self.name, e)
                return
            if out is not None:
                self.nxt.push(out)
        elif kind == "disaggregate":
            for x in item:
                self.nxt.push(x)
        else:
            self._route(item)

    def _route(self, item: Any) -> None:
        _, name, router_kind, router, _, batched = self.spec
        n = len(self.paths)
        try:
            idx = self.env.call("async" if router_kind == "async" else "sync", router, item)[0]
            if batched:
                idx = list(idx)
                if len(idx) != len(item):
                    raise ValueError(f"the router returned {len(idx)} indices for a batch of {len(item)}")
            for i in idx if batched else [idx]:
                if not (isinstance(i, int) and 0 <= i < n):
                    raise IndexError(
                        f"Router returned index {i}, but there are only {n} paths (valid range: [0, {n}))."
                    )
        except Exception as e:  # noqa: BLE001
            self.env.failed(name, e)
            return
        if not batched:
            self.paths[idx].push(item)
            return
        parts: list[list[Any]] = [[] for _ in range(n)]
        for i, x in zip(idx, item):
            parts[i].append(x)
        for path, part in zip(self.paths, parts):
            path.push(part)
        self._gather()

    def _gather(self) -> None:
        merged: list[Any] = []
        for tail in self.paths_out:
            for out in tail.items:
                merged.extend(out)
            tail.items.clear()
        if merged:
            self.nxt.push(merged)

    def finish(self) -> None:
        kind = self.kind
        if kind == "aggregate":
            if self.buf and not self.spec[3]:
                self.nxt.push(self.buf)
            self.buf = []
        elif kind == "aggregator" and not self.spec[3]:
            try:
                out = self.spec[2].flush()
            except Exception as e:  # noqa: BLE001
                self.env.failed(self.name, e)
                out = None
            if out is not None:
                self.nxt.push(out)
        elif kind == "path_variants":
            for path in self.paths:
                path.finish()
            if self.spec[5]:
                self._gather()
        self.nxt.finish()


def _chain(specs: Sequence[tuple[Any, ...]], tail: Any, env: _Env) -> Any:
    node = tail
    for spec in reversed(specs):
        node = _Step(spec, node, env)
    return node


def _interp_worker_main(in_q: Any, out_q: Any, worker: int, payload: bytes) -> None:
    """A subinterpreter worker's body: as :py:func:`_worker_main`, with the pure-Python runner (the region's
    stages one item at a time, in order; a stage's ``concurrency`` is not applied)."""
    stages, output_buffer_size, initializer, initargs, fail_fast = pickle.loads(payload)
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException as e:  # noqa: BLE001
            out_q.put((_OUT_ERROR, worker, _describe(e, "the worker's initializer")))
            return
    while True:
        msg = _get(in_q, None)
        if msg is None or msg[0] == _IN_SHUTDOWN:
            return
        env = _Env(fail_fast)
        sink = _Collect()
        head = _chain(stages, sink, env)

        def send(final: bool) -> None:
            while len(sink.items) >= output_buffer_size or (final and sink.items):
                chunk = sink.items[:output_buffer_size]
                del sink.items[:output_buffer_size]
                out_q.put((_OUT_ITEMS, worker, pickle.dumps(chunk)))

        try:
            while msg is not None and msg[0] == _IN_ITEMS:
                for item in pickle.loads(msg[1]):
                    head.push(item)
                    send(False)
                msg = _get(in_q, None)
            head.finish()
            send(True)
        except BaseException as e:  # noqa: BLE001 (relayed to the main process)
            out_q.put((_OUT_ERROR, worker, _describe(e, "the region's stages")))
            while msg is not None and msg[0] == _IN_ITEMS:
                msg = _get(in_q, None)
        finally:
            env.close()
        if msg is None or msg[0] == _IN_SHUTDOWN:
            return
        out_q.put((_OUT_DONE, worker, msg[1]))
