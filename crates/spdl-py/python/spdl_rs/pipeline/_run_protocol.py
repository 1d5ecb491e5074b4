"""The worker protocol: what a worker process or subinterpreter runs, and the parent's end of it.

Two kinds of worker speak it:

- the worker of ``iterate_in_subprocess`` / ``iterate_in_subinterpreter`` (:py:mod:`._subprocess`): the parent
  sends commands on ``cmd_q`` (:py:class:`_Cmd` values, as plain ints: a subinterpreter cannot import this
  module by its package name to unpickle the enum); the worker answers on ``data_q`` with ``(status, payload)``
  tuples (:py:class:`_Status` values as ints), where the payload of an item is its pickled bytes (or, with a
  shared-memory arena, the small envelope of :py:mod:`._arena`). Pickling happens in the worker's own thread,
  so an item that cannot be pickled is reported as an iteration failure instead of being dropped by a queue's
  feeder thread.
- a worker of a ``.to()`` region's pool (:py:mod:`._region`): ``_IN_*`` messages in, ``_OUT_*`` messages out;
  a subinterpreter worker runs the region's stages, sent as plain tuples, with the pure-Python runner below.

spdl_rs's native module cannot be loaded in a subinterpreter (PyO3 does not support them), so a subinterpreter
loads this file by path (:py:data:`_INTERP_LOADER`, :py:func:`_start_interp`), without the ``spdl_rs``
package: this module imports nothing from ``spdl_rs``.

Every wait on either side is bounded: waits are polls of at most :py:data:`_POLL` seconds, each followed by
a liveness check (a worker checks that its parent process still exists and whether an ``ABORT`` came; the
parent checks that the worker is alive and its own ``timeout``). A worker found dead gets a short grace period
for its last messages to arrive through the pipe, then the parent raises.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = ["_Cmd", "_Status", "_ParentLink", "_execute_iterable", "_normalize_initializers"]

_LG = logging.getLogger("spdl_rs.pipeline")

#: Seconds between liveness checks while waiting on a queue (either side).
_POLL = 0.1
#: How long the parent keeps reading after it found the worker dead (its last messages may be in flight).
_EXIT_GRACE = 1.0
#: How long each of terminate and kill is given when a worker process is stopped.
_KILL_TIMEOUT = 2.0


class _Cmd(enum.IntEnum):
    """Commands from the parent to the worker."""

    ABORT = 1
    START_ITERATION = 2
    STOP_ITERATION = 3


class _Status(enum.IntEnum):
    """Messages from the worker to the parent."""

    UNEXPECTED_CMD_RECEIVED = 1
    INITIALIZATION_FAILED = 2
    INITIALIZATION_SUCCEEDED = 3
    ITERATION_STARTED = 4
    ITERATION_FINISHED = 5
    ITERATOR_SUCCESS = 6
    ITERATOR_FAILED = 7


# Messages into a region's worker.
_IN_ITEMS = 0  # (_IN_ITEMS, pickled list of items)
_IN_END = 1  # (_IN_END, epoch): the end of this epoch's items
_IN_SHUTDOWN = 2  # (_IN_SHUTDOWN, None): exit

# Messages out of a region's worker.
_OUT_ITEMS = 0  # (_OUT_ITEMS, worker, pickled list of outputs)
_OUT_DONE = 1  # (_OUT_DONE, worker, epoch): the worker finished the epoch
_OUT_ERROR = 2  # (_OUT_ERROR, worker, text): the worker failed (initializer, pipeline, pickling)


def _normalize_initializers(
    initializer: Callable[[], None] | Sequence[Callable[[], None]] | None,
) -> list[Callable[[], None]] | None:
    if initializer is None:
        return None
    if isinstance(initializer, Sequence):
        return list(initializer)
    return [initializer]


def _interpreters_unavailable(what: str) -> RuntimeError | None:
    """Why ``what`` cannot run subinterpreters (``concurrent.interpreters``, CPython 3.14+), or ``None``."""
    if sys.version_info < (3, 14):
        return RuntimeError(
            f"{what} requires Python 3.14 or later. "
            f"Current version: {sys.version_info.major}.{sys.version_info.minor}"
        )
    try:
        import concurrent.interpreters  # noqa: F401
    except ImportError as e:
        return RuntimeError(f"{what} needs concurrent.interpreters, which this interpreter lacks: {e}")
    return None


#: Set in a subinterpreter worker: items are pickled with plain :py:mod:`pickle`.
_PLAIN_PICKLE = False


def _dumps(obj: Any) -> bytes:
    if _PLAIN_PICKLE:
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    from multiprocessing.reduction import ForkingPickler  # its reducers (e.g. PyTorch's shared memory)

    return bytes(ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL))


def _describe(e: BaseException, what: str) -> str:
    return f"{what} raised {type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e)).rstrip()


################################################################################
# Worker side
################################################################################


class _Aborted(Exception):
    """The parent sent ``ABORT``, or is gone: the worker returns."""


def _parent_watch(watch: bool) -> Callable[[], bool]:
    """Whether the process that started this one is gone (never, unless ``watch``). It is multiprocessing's
    sentinel of that process: right for fork, spawn and forkserver alike, where the process's own parent is the
    fork server, which outlives the caller while this process runs."""
    if not watch:
        return lambda: False
    import multiprocessing

    parent, ppid = multiprocessing.parent_process(), os.getppid()
    if parent is not None:
        return lambda: not parent.is_alive()
    return lambda: os.getppid() != ppid


def _get(q: Any, gone: Callable[[], bool]) -> Any:
    """The next message; raises :py:class:`_Aborted` once ``gone()``."""
    while True:
        try:
            return q.get(timeout=_POLL)
        except queue.Empty:
            if gone():
                raise _Aborted from None


def _put(q: Any, msg: Any, gone: Callable[[], bool]) -> None:
    """Puts ``msg``; while the queue is full, raises :py:class:`_Aborted` once ``gone()``."""
    while True:
        try:
            q.put(msg, timeout=_POLL)
            return
        except queue.Full:
            if gone():
                raise _Aborted from None


class _WorkerLink:
    """The worker's end: commands are read in order (ones seen while waiting to send are kept for later)."""

    def __init__(self, cmd_q: Any, data_q: Any, watch_parent: bool) -> None:
        self._cmd_q = cmd_q
        self._data_q = data_q
        self._pending: collections.deque[Any] = collections.deque()
        self.parent_gone = _parent_watch(watch_parent)

    def poll(self) -> Any | None:
        """The next command, or ``None`` if none is waiting."""
        if self._pending:
            return self._pending.popleft()
        try:
            return self._cmd_q.get_nowait()
        except queue.Empty:
            return None

    def command_waiting(self) -> bool:
        """Whether a command came (it is kept for :py:meth:`poll`)."""
        if self._pending:
            return True
        try:
            self._pending.append(self._cmd_q.get_nowait())
        except queue.Empty:
            return self.parent_gone()
        return True

    def wait(self) -> Any:
        """The next command; raises :py:class:`_Aborted` once the parent is gone."""
        return self._pending.popleft() if self._pending else _get(self._cmd_q, self.parent_gone)

    def _interrupted(self) -> bool:
        cmd = self.poll()
        if cmd is not None:
            if cmd == _Cmd.ABORT:
                return True
            self._pending.append(cmd)
        return self.parent_gone()

    def send(self, status: _Status, payload: Any = "") -> None:
        """Puts a message; while the queue is full, an ``ABORT`` or the parent's exit ends the wait."""
        _put(self._data_q, (int(status), payload), self._interrupted)


def _execute_iterable(
    cmd_q: Any,
    data_q: Any,
    fn: Callable[[], Iterable[Any]],
    initializers: Sequence[Callable[[], None]] | None,
    arena: Any = None,
    parent_pid: int | None = None,
    open_arena: Callable[[Any], Any] | None = None,
) -> None:
    """The worker: initialize, then serve iterations until ``ABORT`` (or a failure, or the parent's exit).

    With an ``arena``, items travel through it: ``open_arena(arena)`` (``._arena._Arena``, passed by the
    caller: this module imports nothing from ``spdl_rs``, a subinterpreter loads it by path) is its writer.

    Stand-by: waits for a command. ``START_ITERATION`` creates a fresh iterator of the iterable and sends its
    items until it is exhausted or ``STOP_ITERATION`` comes (both answered with ``ITERATION_FINISHED``, back to
    stand-by). A failure is reported and ends the worker.
    """
    link = _WorkerLink(cmd_q, data_q, watch_parent=parent_pid is not None)
    try:
        _serve(link, fn, initializers, arena, open_arena)
    except _Aborted:
        # Nothing the parent still waits for: do not let unsent items hold the exit.
        cancel = getattr(data_q, "cancel_join_thread", None)
        if cancel is not None:
            cancel()


def _serve(
    link: _WorkerLink,
    fn: Callable[[], Iterable[Any]],
    initializers: Sequence[Callable[[], None]] | None,
    arena: Any,
    open_arena: Callable[[Any], Any] | None,
) -> None:
    try:
        for initializer in initializers or ():
            initializer()
    except Exception as e:
        link.send(_Status.INITIALIZATION_FAILED, f"Initializer failed: {e}")
        return
    try:
        iterable = fn()
    except Exception as e:
        link.send(_Status.INITIALIZATION_FAILED, f"Failed to create the iterable: {e}")
        return
    link.send(_Status.INITIALIZATION_SUCCEEDED)

    offloader = None
    if arena is not None:
        if open_arena is None:
            raise TypeError("an arena needs open_arena")
        offloader = open_arena(arena)
        # A writer waiting for arena space (the parent abandoned an iteration, or holds its views) gives up its
        # item when a command comes, so STOP_ITERATION / ABORT are obeyed without waiting for acquire_timeout.
        offloader.writer.interrupt = link.command_waiting

    while True:
        cmd = link.wait()
        if cmd == _Cmd.ABORT:
            return
        if cmd == _Cmd.STOP_ITERATION:
            continue
        if cmd != _Cmd.START_ITERATION:
            link.send(_Status.UNEXPECTED_CMD_RECEIVED, str(cmd))
            return
        if offloader is not None:
            offloader.writer.reset()
        link.send(_Status.ITERATION_STARTED)
        try:
            gen = iter(iterable)
        except Exception as e:
            link.send(_Status.ITERATOR_FAILED, f"Failed to create the iterator: {e}")
            return
        try:
            ok = _one_iteration(link, gen, offloader)
        finally:
            # Stops a pipeline iterated by the generator now, not whenever it is collected.
            close = getattr(gen, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 (the iteration's outcome is already reported)
                    logging.getLogger(__name__).warning("Closing the worker's iterator failed.", exc_info=True)
        if not ok:
            return


def _one_iteration(link: _WorkerLink, gen: Iterator[Any], offloader: Any) -> bool:
    """Sends the items of one iteration; ``False`` when the worker must end."""
    while True:
        cmd = link.poll()
        if cmd is not None:
            if cmd == _Cmd.STOP_ITERATION:
                link.send(_Status.ITERATION_FINISHED)
                return True
            if cmd == _Cmd.ABORT:
                return False
            link.send(_Status.UNEXPECTED_CMD_RECEIVED, str(cmd))
            return False
        try:
            item = next(gen)
            payload = offloader.offload(item) if offloader is not None else _dumps(item)
        except StopIteration:
            link.send(_Status.ITERATION_FINISHED)
            return True
        except Exception as e:
            if offloader is not None and isinstance(e, offloader.interrupted):
                if link.parent_gone():
                    return False
                continue  # the waiting command is read at the top of the loop

            link.send(_Status.ITERATOR_FAILED, f"Failed to fetch the next item: {e}")
            return False
        link.send(_Status.ITERATOR_SUCCESS, payload)


def _interp_main(cmd_q: Any, data_q: Any, payload: bytes) -> None:
    """The worker of ``iterate_in_subinterpreter``. ``payload`` is ``(sys_path, inner)`` pickled, and ``inner``
    is ``(fn, initializers)`` pickled: the parent's module search path is set before ``fn`` is unpickled, so
    that its module is found here as it was there."""
    global _PLAIN_PICKLE
    _PLAIN_PICKLE = True
    try:
        sys_path, inner = pickle.loads(payload)
        sys.path[:] = sys_path
        fn, initializers = pickle.loads(inner)
    except Exception as e:
        _WorkerLink(cmd_q, data_q, watch_parent=False).send(
            _Status.INITIALIZATION_FAILED, f"Failed to create the iterable: {e}"
        )
        return
    _execute_iterable(cmd_q, data_q, fn, initializers)


################################################################################
# The pure-Python runner of a region's subinterpreter workers
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
    """A region's subinterpreter worker: as ``._region._worker_main``, with the pure-Python runner (the
    region's stages one item at a time, in order; a stage's ``concurrency`` is not applied)."""
    global _PLAIN_PICKLE
    _PLAIN_PICKLE = True
    stages, output_buffer_size, initializer, initargs, fail_fast = pickle.loads(payload)
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException as e:  # noqa: BLE001
            out_q.put((_OUT_ERROR, worker, _describe(e, "the worker's initializer")))
            return
    never = _parent_watch(False)
    while True:
        msg = _get(in_q, never)
        if msg[0] == _IN_SHUTDOWN:
            return
        env = _Env(fail_fast)
        sink = _Collect()
        head = _chain(stages, sink, env)

        def send(final: bool) -> None:
            while len(sink.items) >= output_buffer_size or (final and sink.items):
                chunk = sink.items[:output_buffer_size]
                del sink.items[:output_buffer_size]
                out_q.put((_OUT_ITEMS, worker, _dumps(chunk)))

        try:
            while msg[0] == _IN_ITEMS:
                for item in pickle.loads(msg[1]):
                    head.push(item)
                    send(False)
                msg = _get(in_q, never)
            head.finish()
            send(True)
        except BaseException as e:  # noqa: BLE001 (relayed to the main process)
            out_q.put((_OUT_ERROR, worker, _describe(e, "the region's stages")))
            while msg[0] == _IN_ITEMS:
                msg = _get(in_q, never)
        finally:
            env.close()
        if msg[0] == _IN_SHUTDOWN:
            return
        out_q.put((_OUT_DONE, worker, msg[1]))


################################################################################
# Parent side
################################################################################


class _ParentLink:
    """The parent's end: bounded reads of the worker's messages.

    Args:
        data_q: The worker's message queue.
        timeout: The most seconds to wait for one message (``inf``: as long as the worker lives).
        worker_type: ``"subprocess"`` or ``"subinterpreter"`` (for messages).
        is_alive: Whether the worker still runs.
        exit_info: Text describing how the worker ended (e.g. its exit code), for the error.
        should_stop: Whether the parent is shutting the worker down (reads then end quietly).
    """

    def __init__(
        self,
        data_q: Any,
        timeout: float,
        worker_type: str,
        is_alive: Callable[[], bool],
        exit_info: Callable[[], str] = lambda: "",
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.data_q = data_q
        self.timeout = timeout
        self.wtype = f"worker {worker_type}"
        self._worker_type = worker_type
        self._is_alive = is_alive
        self._exit_info = exit_info
        self.should_stop = should_stop

    def _dead(self) -> RuntimeError:
        info = self._exit_info()
        return RuntimeError(f"The worker {self._worker_type} exited unexpectedly.{' ' + info if info else ''}")

    def recv(self, what: str) -> tuple[int, Any] | None:
        """The next message, or ``None`` when the parent is shutting the worker down.

        Raises:
            RuntimeError: No message within ``timeout`` (``what`` words the error), or the worker died.
        """
        t0 = time.monotonic()
        dead_since: float | None = None
        while True:
            if self.should_stop():
                return None
            try:
                msg: tuple[int, Any] = self.data_q.get(timeout=_POLL)
                return msg
            except queue.Empty:
                pass
            now = time.monotonic()
            if not self._is_alive():
                # Its last messages may still be on their way through the pipe.
                if dead_since is None:
                    dead_since = now
                elif now - dead_since > _EXIT_GRACE:
                    raise self._dead()
            if (elapsed := now - t0) > self.timeout:
                raise RuntimeError(what.format(wtype=self.wtype, elapsed=elapsed))

    def wait_for_init(self) -> None:
        msg = self.recv("The {wtype} did not initialize after {elapsed:.2f} seconds.")
        if msg is None or msg[0] == _Status.INITIALIZATION_SUCCEEDED:
            return
        if msg[0] == _Status.INITIALIZATION_FAILED:
            raise RuntimeError(f"The {self.wtype} quit. {msg[1]}")
        raise RuntimeError(f"[INTERNAL ERROR] The {self.wtype} is in an unexpected state: {msg}")

    def _next(self) -> tuple[int, Any] | None:
        """The next message of an iteration; raises for a failed iterator."""
        msg = self.recv("The {wtype} did not produce any data for {elapsed:.2f} seconds.")
        if msg is not None and msg[0] == _Status.ITERATOR_FAILED:
            raise RuntimeError(f"The {self.wtype} quit. {msg[1]}")
        return msg

    def enter_iteration_mode(self, cmd_q: Any, discard: Callable[[Any], None] | None) -> bool:
        """Asks the worker for a new iteration and skips what is left of an abandoned one.

        Returns ``False`` when the parent is shutting down meanwhile.
        """
        cmd_q.put(int(_Cmd.STOP_ITERATION))
        cmd_q.put(int(_Cmd.START_ITERATION))
        while (msg := self._next()) is not None:
            status, payload = msg
            if status == _Status.ITERATION_STARTED:
                return True
            if status == _Status.ITERATOR_SUCCESS:
                if discard is not None:
                    discard(payload)
            elif status == _Status.UNEXPECTED_CMD_RECEIVED:
                raise RuntimeError(
                    f"The {self.wtype} was not in the stand-by mode. Please make sure that the previous iterator "
                    f"was exhausted before iterating again. {payload}"
                )
            elif status != _Status.ITERATION_FINISHED:
                raise RuntimeError(f"The {self.wtype} is in an unexpected state. {msg}")
        return False

    def iterate_results(self) -> Iterator[Any]:
        """The payloads of one iteration, up to ``ITERATION_FINISHED``."""
        while (msg := self._next()) is not None and msg[0] == _Status.ITERATOR_SUCCESS:
            yield msg[1]
        if msg is None or msg[0] == _Status.ITERATION_FINISHED:
            return
        if msg[0] == _Status.UNEXPECTED_CMD_RECEIVED:
            raise RuntimeError(f"[INTERNAL ERROR] The {self.wtype} received unexpected command: {msg[1]}")
        raise RuntimeError(f"[INTERNAL ERROR] Unexpected return value: {msg}")


def _drain(q: Any) -> None:
    """Empties a queue (unread items are dropped)."""
    while True:
        try:
            q.get_nowait()
        except (queue.Empty, EOFError, OSError, ValueError, pickle.UnpicklingError):
            return


def _close_queue(q: Any) -> None:
    """Closes a ``multiprocessing`` queue without waiting for its unsent items (a subinterpreter queue has no
    close)."""
    try:
        if (cancel := getattr(q, "cancel_join_thread", None)) is not None:
            cancel()
            q.close()
    except Exception:  # noqa: BLE001
        _LG.debug("Failed to close a queue of a worker.", exc_info=True)


class _Worker:
    """The parent's hold on one worker: a ``multiprocessing`` process, or a subinterpreter (``interp``) run on a
    thread (``runner``)."""

    def __init__(self, runner: Any, interp: Any = None) -> None:
        self.runner, self.interp = runner, interp
        self.kind = "subprocess" if interp is None else "subinterpreter"

    def alive(self) -> bool:
        return bool(self.runner.is_alive())

    def exit_text(self) -> str:
        """How a worker process ended, e.g. ``(exit code -9: killed by SIGKILL)``; ``""`` while it runs."""
        code = getattr(self.runner, "exitcode", None)
        if code is None:
            return ""
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"(exit code {code}: killed by {name})"
        return f"(exit code {code})"

    def join(self, timeout: float, drain: Sequence[Any] = ()) -> bool:
        """Waits for the worker to exit, emptying the ``drain`` queues meanwhile (a worker blocked writing to a
        full queue could not exit). ``True`` once it exited."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            for q in drain:
                _drain(q)
            self.runner.join(0.05)
        return True

    def stop(self, timeout: float, drain: Sequence[Any] = (), log: Callable[..., None] = _LG.warning) -> None:
        """Gives the worker ``timeout`` seconds to exit. A process is then terminated, then killed (each
        bounded); a subinterpreter cannot be interrupted: it is closed by a daemon thread once its thread
        returns. Never raises."""
        if self.join(timeout, drain):
            self._close()
        elif self.interp is not None:
            log("The worker subinterpreter did not stop; it is closed once its thread returns.")

            def close_later() -> None:
                self.runner.join()
                self._close()

            threading.Thread(target=close_later, name="spdl_rs-subinterpreter-close", daemon=True).start()
        else:
            log("Terminating the worker process.")
            self.runner.terminate()
            if not self.join(_KILL_TIMEOUT, drain):
                log("Killing the worker process.")
                self.runner.kill()
                if not self.join(_KILL_TIMEOUT, drain):
                    _LG.warning("Failed to kill the worker process (pid %s).", self.runner.pid)

    def _close(self) -> None:
        if self.interp is not None:
            try:
                self.interp.close()
            except Exception:  # noqa: BLE001
                _LG.warning("Failed to close the worker subinterpreter.", exc_info=True)


#: Run in a new subinterpreter: loads this file as ``_spdl_rs_run_protocol``.
_INTERP_LOADER = """
import importlib.util, sys
try:
    import concurrent.interpreters  # its queue type, so that the queues passed in can be received here
except ImportError:
    pass
if "_spdl_rs_run_protocol" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("_spdl_rs_run_protocol", {path!r})
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["_spdl_rs_run_protocol"] = _mod
    _spec.loader.exec_module(_mod)
import _spdl_rs_run_protocol
"""


def _start_interp(main: str, name: str, **shared: Any) -> _Worker:
    """A new subinterpreter that loaded this file, running ``_spdl_rs_run_protocol.<main>`` on a daemon thread
    named ``name``, with ``shared`` as names of its ``__main__``."""
    import concurrent.interpreters as interpreters  # type: ignore[import-not-found, unused-ignore]

    interp = interpreters.create()
    try:
        interp.exec(_INTERP_LOADER.format(path=os.path.abspath(__file__)))
        interp.prepare_main(**shared)
        thread = threading.Thread(target=interp.exec, args=(f"_spdl_rs_run_protocol.{main}",), name=name, daemon=True)
        thread.start()
    except BaseException:
        interp.close()
        raise
    return _Worker(thread, interp)
