"""The command protocol between a parent and a worker (subprocess or subinterpreter) that iterates an iterable.

The parent sends commands on ``cmd_q`` (:py:class:`_Cmd` values, as plain ints: a subinterpreter cannot import
this module by its package name to unpickle the enum); the worker answers on ``data_q`` with
``(status, payload)`` tuples (:py:class:`_Status` values as ints), where the payload of an item is its pickled bytes (or,
with a shared-memory arena, the small envelope of :py:mod:`._arena`). Pickling happens in the worker's own
thread, so an item that cannot be pickled is reported as an iteration failure instead of being dropped by a
queue's feeder thread.

Every wait on either side is bounded: waits are polls of at most :py:data:`_POLL` seconds, each followed by
a liveness check (the worker checks that its parent process still exists and whether an ``ABORT`` came; the
parent checks that the worker is alive and its own ``timeout``). A worker found dead gets a short grace period
for its last messages to arrive through the pipe, then the parent raises.
"""

from __future__ import annotations

import collections
import logging
import enum
import os
import pickle
import queue
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = ["_Cmd", "_Status", "_ParentLink", "_execute_iterable", "_normalize_initializers"]

#: Seconds between liveness checks while waiting on a queue (either side).
_POLL = 0.1
#: How long the parent keeps reading after it found the worker dead (its last messages may be in flight).
_EXIT_GRACE = 1.0


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


def _normalize_initializers(
    initializer: Callable[[], None] | Sequence[Callable[[], None]] | None,
) -> list[Callable[[], None]] | None:
    if initializer is None:
        return None
    if isinstance(initializer, Sequence):
        return list(initializer)
    return [initializer]


def _dumps(obj: Any) -> bytes:
    if _PLAIN_PICKLE:
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    from multiprocessing.reduction import ForkingPickler  # its reducers (e.g. PyTorch's shared memory)

    return bytes(ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL))


#: Set in a subinterpreter worker: items are pickled with plain :py:mod:`pickle`.
_PLAIN_PICKLE = False


################################################################################
# Worker side
################################################################################


class _Aborted(Exception):
    """The parent sent ``ABORT``, or is gone: the worker returns."""


class _WorkerLink:
    """The worker's end: commands are read in order (ones seen while waiting to send are kept for later)."""

    def __init__(self, cmd_q: Any, data_q: Any, watch_parent: bool) -> None:
        self._cmd_q = cmd_q
        self._data_q = data_q
        self._pending: collections.deque[Any] = collections.deque()
        # The process that started this one (multiprocessing's sentinel of it: right for fork, spawn and
        # forkserver alike, where the process's own parent is the fork server, which outlives the caller
        # while this process runs).
        self._parent: Any = None
        self._ppid: int | None = None
        if watch_parent:
            import multiprocessing

            self._parent = multiprocessing.parent_process()
            self._ppid = os.getppid()

    def parent_gone(self) -> bool:
        if self._parent is not None:
            return not self._parent.is_alive()
        return self._ppid is not None and os.getppid() != self._ppid

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
        if self._pending:
            return self._pending.popleft()
        while True:
            try:
                return self._cmd_q.get(timeout=_POLL)
            except queue.Empty:
                if self.parent_gone():
                    raise _Aborted from None

    def send(self, status: _Status, payload: Any = "") -> None:
        """Puts a message; while the queue is full, an ``ABORT`` or the parent's exit ends the wait."""
        msg = (int(status), payload)
        while True:
            try:
                self._data_q.put(msg, timeout=_POLL)
                return
            except queue.Full:
                pass
            cmd = self.poll()
            if cmd is not None:
                if cmd == _Cmd.ABORT:
                    raise _Aborted
                self._pending.append(cmd)
            if self.parent_gone():
                raise _Aborted


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
        if msg is None:
            return
        status, payload = msg
        if status == _Status.INITIALIZATION_SUCCEEDED:
            return
        if status == _Status.INITIALIZATION_FAILED:
            raise RuntimeError(f"The {self.wtype} quit. {payload}")
        raise RuntimeError(f"[INTERNAL ERROR] The {self.wtype} is in an unexpected state: {msg}")

    def enter_iteration_mode(self, cmd_q: Any, discard: Callable[[Any], None] | None) -> bool:
        """Asks the worker for a new iteration and skips what is left of an abandoned one.

        Returns ``False`` when the parent is shutting down meanwhile.
        """
        cmd_q.put(int(_Cmd.STOP_ITERATION))
        cmd_q.put(int(_Cmd.START_ITERATION))
        while True:
            msg = self.recv("The {wtype} did not produce any data for {elapsed:.2f} seconds.")
            if msg is None:
                return False
            status, payload = msg
            if status == _Status.ITERATION_STARTED:
                return True
            if status == _Status.ITERATION_FINISHED:
                continue
            if status == _Status.ITERATOR_SUCCESS:
                if discard is not None:
                    discard(payload)
                continue
            if status == _Status.UNEXPECTED_CMD_RECEIVED:
                raise RuntimeError(
                    f"The {self.wtype} was not in the stand-by mode. Please make sure that the previous iterator "
                    f"was exhausted before iterating again. {payload}"
                )
            if status == _Status.ITERATOR_FAILED:
                raise RuntimeError(f"The {self.wtype} quit. {payload}")
            raise RuntimeError(f"The {self.wtype} is in an unexpected state. {msg}")

    def iterate_results(self) -> Iterator[Any]:
        """The payloads of one iteration, up to ``ITERATION_FINISHED``."""
        while True:
            msg = self.recv("The {wtype} did not produce any data for {elapsed:.2f} seconds.")
            if msg is None:
                return
            status, payload = msg
            if status == _Status.ITERATOR_SUCCESS:
                yield payload
            elif status == _Status.ITERATION_FINISHED:
                return
            elif status == _Status.ITERATOR_FAILED:
                raise RuntimeError(f"The {self.wtype} quit. {payload}")
            elif status == _Status.UNEXPECTED_CMD_RECEIVED:
                raise RuntimeError(f"[INTERNAL ERROR] The {self.wtype} received unexpected command: {payload}")
            else:
                raise RuntimeError(f"[INTERNAL ERROR] Unexpected return value: {msg}")


def _drain(q: Any) -> None:
    """Empties a queue (unread items are dropped)."""
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            return


def _interp_main(cmd_q: Any, data_q: Any, payload: bytes) -> None:
    """The worker in a subinterpreter. This file is loaded there by path, without the ``spdl_rs`` package
    (whose PyO3 module cannot be imported in a subinterpreter). ``payload`` is ``(sys_path, inner)`` pickled, and
    ``inner`` is ``(fn, initializers)`` pickled: the parent's module search path is set before ``fn`` is
    unpickled, so that its module is found here as it was there."""
    import sys

    global _PLAIN_PICKLE
    _PLAIN_PICKLE = True
    try:
        sys_path, inner = pickle.loads(payload)
        sys.path[:] = sys_path
        fn, initializers = pickle.loads(inner)
    except Exception as e:
        _WorkerLink(cmd_q, data_q, watch_parent=False).send(_Status.INITIALIZATION_FAILED, f"Failed to create the iterable: {e}")
        return
    _execute_iterable(cmd_q, data_q, fn, initializers)


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
