"""Running an iterable, or a whole pipeline, in a subprocess or a subinterpreter (SPDL's ``iterate_in_subprocess``,
``run_pipeline_in_subprocess``, ``iterate_in_subinterpreter``, ``run_pipeline_in_subinterpreter``), and
``cache_iterator``.

The worker is started once and reused: each iteration of the returned iterable asks it for a fresh iterator of
the same iterable. The command protocol and its bounded waits are in :py:mod:`._run_protocol`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from fractions import Fraction
from functools import partial
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any, TypeVar

from . import _run_protocol, defs
from ._arena import _Arena
from ._cache_iterator import cache_iterator
from ._run_protocol import _Cmd, _drain, _execute_iterable, _normalize_initializers, _ParentLink
from ._run_support import _make_executors_picklable, _rng_initializers, _Wrapper

if TYPE_CHECKING:
    from ._bg_task import BackgroundTaskFactory
    from ._hooks import StageInfo, TaskHook
    from ._queues import AsyncQueue

__all__ = [
    "cache_iterator",
    "iterate_in_subinterpreter",
    "iterate_in_subprocess",
    "run_pipeline_in_subinterpreter",
    "run_pipeline_in_subprocess",
]

_LG = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a stopping worker is given to exit on ``ABORT`` before it is terminated (then killed).
_JOIN_TIMEOUT = 3.0
#: How long each of terminate and kill is given.
_KILL_TIMEOUT = 2.0


def _exit_text(process: Any) -> str:
    code = process.exitcode
    if code is None:
        return ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"(exit code {code}: killed by {name})"
    return f"(exit code {code})"


class _SubprocessHandle:
    """The parent's hold on one worker process: its queues, its arena, and its bounded shutdown."""

    def __init__(self, process: Any, cmd_q: Any, data_q: Any, timeout: float, arena: Any) -> None:
        self.process = process
        self.cmd_q = cmd_q
        self.data_q = data_q
        self.arena = arena
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self.link = _ParentLink(
            data_q,
            timeout,
            "subprocess",
            is_alive=process.is_alive,
            exit_info=lambda: _exit_text(process),
            should_stop=self.closed.is_set,
        )

    def _join(self, timeout: float) -> bool:
        """Joins the process, draining its messages meanwhile (a worker blocked writing to a full pipe could
        not exit). ``True`` once it exited."""
        deadline = time.monotonic() + timeout
        while True:
            _drain(self.data_q)
            self.process.join(0.05)
            if self.process.exitcode is not None:
                return True
            if time.monotonic() > deadline:
                return False

    def terminate(self, *, force: bool = False) -> None:
        """Stops the worker (``ABORT``, then SIGTERM, then SIGKILL, each bounded) and releases the queues and
        the arena. Idempotent; never raises."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        try:
            started = self.process.pid is not None
            if started and self.process.exitcode is None:
                if force:
                    self.process.terminate()
                else:
                    try:
                        self.cmd_q.put_nowait(int(_Cmd.ABORT))
                    except Exception:  # noqa: BLE001 (the queue may be closed: terminate below)
                        _LG.debug("Could not send ABORT to the worker subprocess.", exc_info=True)
            if self.arena is not None:
                shutdown = getattr(self.arena, "shutdown_arena", None)
                if shutdown is not None:
                    try:
                        shutdown()
                    except Exception:  # noqa: BLE001
                        _LG.debug("Could not wake the arena's writer.", exc_info=True)
            if started:
                if not self._join(_JOIN_TIMEOUT):
                    _LG.warning("Terminating the worker process.")
                    self.process.terminate()
                    if not self._join(_KILL_TIMEOUT):
                        _LG.warning("Killing the worker process.")
                        self.process.kill()
                        if not self._join(_KILL_TIMEOUT):
                            _LG.warning("Failed to kill the worker process (pid %s).", self.process.pid)
        finally:
            for q in (self.cmd_q, self.data_q):
                try:
                    q.cancel_join_thread()
                    q.close()
                except Exception:  # noqa: BLE001
                    _LG.debug("Failed to close a queue of the worker subprocess.", exc_info=True)
            if self.arena is not None:
                try:
                    self.arena.close()
                except Exception:  # noqa: BLE001
                    _LG.warning("Failed to close the shared-memory arena.", exc_info=True)
                finally:
                    try:
                        self.arena.unlink()
                    except Exception:  # noqa: BLE001
                        _LG.warning("Failed to unlink the shared-memory arena.", exc_info=True)


class _SubprocessIterable(Iterable[T]):
    """Iterates the worker process's iterable; each ``iter()`` starts a new iteration in the same process."""

    def __init__(self, handle: _SubprocessHandle) -> None:
        self._handle: _SubprocessHandle | None = handle
        # Runs on garbage collection, and at interpreter exit before multiprocessing joins its children. The
        # priority is above the queues' own exit finalizers (10), which close their feeder threads: run after
        # them, the ABORT would never be sent and the worker would be terminated only after the join timeout.
        self._finalizer = Finalize(self, handle.terminate, exitpriority=100)
        self._arena: Any = None
        if handle.arena is not None:
            self._arena = _Arena(handle.arena)

    def __iter__(self) -> Iterator[T]:
        if (h := self._handle) is None:
            raise RuntimeError("The worker process is shutdown. Cannot iterate again.")
        if h.closed.is_set():
            return
        arena = self._arena
        try:
            try:
                entered = h.link.enter_iteration_mode(h.cmd_q, None if arena is None else arena.discard)
            except (ValueError, OSError):
                if h.closed.is_set():
                    return
                raise
            if not entered:
                return
            if arena is not None:
                arena.reader.reset()
            for payload in h.link.iterate_results():
                if arena is None:
                    yield pickle.loads(payload)
                else:
                    yield arena.restore(payload)
        except GeneratorExit:
            return
        except BaseException:
            self._shutdown()
            raise

    def _shutdown(self) -> None:
        if self._handle is not None:
            self._handle = None
            self._finalizer()


def iterate_in_subprocess(
    fn: Callable[[], Iterable[T]],
    *,
    buffer_size: int = 3,
    initializer: Callable[[], None] | Sequence[Callable[[], None]] | None = None,
    mp_context: str | None = None,
    timeout: float | None = None,
    daemon: bool = False,
    arena: Any = None,
) -> Iterable[T]:
    """**[Experimental]** Runs the iterable made by ``fn`` in a subprocess and iterates its items here.

    The subprocess starts once (``fn()`` and the initializers run there before this returns) and is reused:
    every ``iter()`` of the result makes a fresh iterator of the same iterable in the subprocess. A generator
    returned by ``fn`` can therefore be iterated only once (later iterations are empty). Breaking out of a loop
    leaves the worker waiting; the next iteration discards what it had produced. The subprocess is stopped when
    an iteration fails, when the result is garbage-collected, and at interpreter exit.

    Args:
        fn: Makes the iterable (use :py:func:`functools.partial` for arguments). Must be picklable for the
            ``spawn``/``forkserver`` start methods, as must the items.
        buffer_size: The most items waiting in the queue between the processes (0 or less: no bound, as a
            ``multiprocessing.Queue``'s ``maxsize``, and as in SPDL).
        initializer: Functions called in the subprocess before ``fn``.
        mp_context: The start method (``None``: multiprocessing's default).
        timeout: The most seconds to wait for initialization or for one item (``None``: no limit while the
            subprocess lives). On timeout the subprocess is terminated and ``RuntimeError`` raised.
        daemon: Whether the subprocess is a daemon (it then cannot start processes of its own).
        arena: A :py:class:`SharedMemoryRingBuffer` or :py:class:`SharedMemorySegmentPool`: large binary
            fields of the items (bytes, NumPy arrays, PyTorch tensors) travel through it instead of being
            pickled. The returned iterable owns it from then on (it is closed and unlinked at shutdown).

    Raises:
        RuntimeError: The subprocess failed to initialize (the message holds the cause), died, or timed out.
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
        raise ValueError(f"buffer_size must be an integer, got {buffer_size!r}")
    initializers = _normalize_initializers(initializer)
    ctx = mp.get_context(mp_context)
    cmd_q = ctx.Queue()
    data_q = ctx.Queue(maxsize=buffer_size)
    process = ctx.Process(  # type: ignore[attr-defined]
        target=_execute_iterable,
        args=(cmd_q, data_q, fn, initializers, arena, os.getpid(), _Arena),
        daemon=daemon,
    )
    handle = _SubprocessHandle(process, cmd_q, data_q, float("inf") if timeout is None else timeout, arena)
    try:
        process.start()
        handle.link.wait_for_init()
    except BaseException:
        # An initializer that blocks cannot read ABORT: terminate at once.
        handle.terminate(force=True)
        raise
    return _SubprocessIterable(handle)


################################################################################
# Subinterpreters
################################################################################


def _interpreters_unavailable(func: str) -> RuntimeError | None:
    if sys.version_info < (3, 14):
        return RuntimeError(
            f"{func} requires Python 3.14 or later. "
            f"Current version: {sys.version_info.major}.{sys.version_info.minor}"
        )
    try:
        import concurrent.interpreters  # noqa: F401
    except ImportError as e:
        return RuntimeError(f"{func} needs concurrent.interpreters, which this interpreter lacks: {e}")
    return None


class _SubinterpreterHandle:
    """The parent's hold on one worker subinterpreter (run on a thread of this process)."""

    def __init__(self, interp: Any, thread: threading.Thread, cmd_q: Any, data_q: Any, timeout: float) -> None:
        self.interp = interp
        self.thread = thread
        self.cmd_q = cmd_q
        self.data_q = data_q
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self.link = _ParentLink(data_q, timeout, "subinterpreter", is_alive=thread.is_alive)

    def terminate(self) -> None:
        """Sends ``ABORT``, waits (bounded) for the worker thread, and closes the interpreter. A worker stuck in
        user code cannot be interrupted: its interpreter is then closed by a daemon thread once it returns."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        if self.thread.is_alive():
            try:
                self.cmd_q.put(int(_Cmd.ABORT))
            except Exception:  # noqa: BLE001
                _LG.debug("Could not send ABORT to the worker subinterpreter.", exc_info=True)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        while self.thread.is_alive() and time.monotonic() < deadline:
            _drain(self.data_q)
            self.thread.join(0.05)
        if self.thread.is_alive():
            _LG.warning("The worker subinterpreter did not stop; it is closed once its thread returns.")

            def close_later() -> None:
                self.thread.join()
                self._close()

            threading.Thread(target=close_later, name="spdl_rs-subinterpreter-close", daemon=True).start()
            return
        self._close()

    def _close(self) -> None:
        try:
            self.interp.close()
        except Exception:  # noqa: BLE001
            _LG.warning("Failed to close the worker subinterpreter.", exc_info=True)


class _SubinterpreterIterable(Iterable[T]):
    """Iterates the worker subinterpreter's iterable; each ``iter()`` starts a new iteration there."""

    def __init__(self, handle: _SubinterpreterHandle) -> None:
        self._handle: _SubinterpreterHandle | None = handle
        import weakref

        self._finalizer = weakref.finalize(self, handle.terminate)

    def __iter__(self) -> Iterator[T]:
        if (h := self._handle) is None:
            raise RuntimeError("The subinterpreter is shutdown. Cannot iterate again.")
        try:
            if not h.link.enter_iteration_mode(h.cmd_q, None):
                return
            for payload in h.link.iterate_results():
                yield pickle.loads(payload)
        except GeneratorExit:
            return
        except (Exception, KeyboardInterrupt):
            self._handle = None
            self._finalizer()
            raise


def iterate_in_subinterpreter(
    fn: Callable[[], Iterable[T]],
    *,
    buffer_size: int = 3,
    initializer: Callable[[], None] | Sequence[Callable[[], None]] | None = None,
    timeout: float | None = None,
) -> Iterable[T]:
    """**[Experimental]** Runs the iterable made by ``fn`` in a subinterpreter (``concurrent.interpreters``,
    Python 3.14+) and iterates its items here; otherwise as :py:func:`iterate_in_subprocess`.

    Args:
        fn: Makes the iterable; it and the items must be shareable (picklable) between interpreters.
        buffer_size: The most items waiting in the queue between the interpreters (0 or less: no bound).
        initializer: Functions called in the subinterpreter before ``fn``.
        timeout: The most seconds to wait for initialization or for one item. Code running in a subinterpreter
            cannot be interrupted: on timeout, termination is requested cooperatively.

    Raises:
        RuntimeError: The interpreter has no subinterpreters (before 3.14), or the worker failed.
    """
    if (error := _interpreters_unavailable("iterate_in_subinterpreter")) is not None:
        raise error
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int):
        raise ValueError(f"buffer_size must be an integer, got {buffer_size!r}")
    import concurrent.interpreters as interpreters  # type: ignore[import-not-found, unused-ignore]

    payload = pickle.dumps((list(sys.path), pickle.dumps((fn, _normalize_initializers(initializer)))))
    cmd_q = interpreters.create_queue()
    data_q = interpreters.create_queue(maxsize=max(buffer_size, 0))
    interp = interpreters.create()
    try:
        # The worker runs the protocol module loaded by path: the spdl_rs package cannot be imported there.
        interp.exec(_run_protocol._INTERP_LOADER.format(path=os.path.abspath(_run_protocol.__file__)))
        interp.prepare_main(cmd_q=cmd_q, data_q=data_q, payload=payload)
        thread = threading.Thread(
            target=interp.exec,
            args=("_spdl_rs_run_protocol._interp_main(cmd_q, data_q, payload)",),
            name="spdl_rs-subinterpreter",
            daemon=True,
        )
        thread.start()
    except BaseException:
        interp.close()
        raise
    handle = _SubinterpreterHandle(interp, thread, cmd_q, data_q, float("inf") if timeout is None else timeout)
    try:
        handle.link.wait_for_init()
    except BaseException:
        handle.terminate()
        raise
    return _SubinterpreterIterable(handle)


################################################################################
# Pipelines
################################################################################


def _pipeline_config(config_or_builder: Any, func: str) -> Any:
    if isinstance(config_or_builder, defs.PipelineConfig):
        return config_or_builder
    get_config = getattr(config_or_builder, "get_config", None)
    if get_config is None:
        raise TypeError(f"{func} needs a spdl_rs.pipeline.defs.PipelineConfig, got {type(config_or_builder).__name__}")
    warnings.warn(
        f"Passing a `PipelineBuilder` object directly to `{func}` is now deprecated. "
        "Please call `get_config()` method and pass the config object.",
        stacklevel=3,
    )
    return get_config()


def _initializers(kwargs: dict[str, Any]) -> list[Callable[[], None]]:
    inits = _rng_initializers()
    extra = _normalize_initializers(kwargs.pop("initializer", None))
    return inits + (extra or [])


def run_pipeline_in_subprocess(
    config_or_builder: Any,
    /,
    *,
    num_threads: int,
    max_failures: int | Fraction = -1,
    report_stats_interval: float = -1,
    queue_class: type[AsyncQueue] | None = None,
    task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
    background_tasks: list[BackgroundTaskFactory] | None = None,
    use_thread_output_queue: bool = False,
    **kwargs: Any,
) -> Iterable[Any]:
    """Builds the pipeline of ``config_or_builder`` in a subprocess (with :py:func:`build_pipeline`) and
    iterates its outputs here.

    The subprocess is started once; each iteration builds and runs a fresh pipeline there (one epoch). With a
    continuous source, the pipeline is built once and kept running between epochs; each iteration yields one
    epoch. The global RNG states of ``random`` (and of NumPy's legacy RNG and PyTorch's CPU generator, if
    already imported) are copied into the subprocess. Stdlib ``ThreadPoolExecutor`` / ``ProcessPoolExecutor``
    executors of pipe stages are rebuilt in the subprocess (same type and ``max_workers``); they must not have
    been used yet.

    Args:
        config_or_builder: A :py:class:`spdl_rs.pipeline.defs.PipelineConfig` (a ``PipelineBuilder`` works
            but is deprecated).
        num_threads, max_failures, report_stats_interval, queue_class, task_hook_factory, background_tasks,
            use_thread_output_queue: Passed to :py:func:`build_pipeline` (in the subprocess: they must be
            picklable for the ``spawn``/``forkserver`` start methods).
        kwargs: Passed to :py:func:`iterate_in_subprocess` (``buffer_size``, ``initializer``, ``mp_context``,
            ``timeout``, ``daemon``, ``arena``).
    """
    config = _make_executors_picklable(_pipeline_config(config_or_builder, "run_pipeline_in_subprocess"))
    initializer = _initializers(kwargs)
    return iterate_in_subprocess(
        partial(
            _Wrapper,
            config=config,
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_class=queue_class,
            task_hook_factory=task_hook_factory,
            background_tasks=background_tasks,
            use_thread_output_queue=use_thread_output_queue,
        ),
        initializer=initializer,
        **kwargs,
    )


def run_pipeline_in_subinterpreter(
    config: Any,
    /,
    *,
    num_threads: int,
    max_failures: int | Fraction = -1,
    report_stats_interval: float = -1,
    queue_class: type[AsyncQueue] | None = None,
    task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
    background_tasks: list[BackgroundTaskFactory] | None = None,
    use_thread_output_queue: bool = False,
    **kwargs: Any,
) -> Iterable[Any]:
    """**[Experimental]** SPDL runs the pipeline in a subinterpreter (Python 3.14+). spdl_rs's engine is a PyO3
    extension module, which cannot be loaded in a subinterpreter, so this always raises ``RuntimeError``: before
    3.14 with SPDL's message, from 3.14 with the reason. Use :py:func:`run_pipeline_in_subprocess`, or
    ``PipelineBuilder.to(InterpreterPoolExecutorConfig(...))`` to run pure-Python stages in subinterpreters.

    Args:
        config: A :py:class:`spdl_rs.pipeline.defs.PipelineConfig`.
        num_threads, max_failures, report_stats_interval, queue_class, task_hook_factory, background_tasks,
            use_thread_output_queue: Passed to :py:func:`build_pipeline`.
        kwargs: As for :py:func:`iterate_in_subinterpreter`.

    Raises:
        RuntimeError: Always (see above).
    """
    del num_threads, max_failures, report_stats_interval, queue_class, task_hook_factory, background_tasks
    del use_thread_output_queue, kwargs, config
    if (error := _interpreters_unavailable("iterate_in_subinterpreter")) is not None:
        raise error
    # SPDL's engine is pure Python and runs in the subinterpreter; spdl_rs's is a PyO3 extension module, which
    # CPython refuses to load in a subinterpreter: say so now rather than as the worker's import failure.
    raise RuntimeError(
        "run_pipeline_in_subinterpreter: the spdl_rs engine (a PyO3 extension module) cannot be loaded in a "
        "subinterpreter. Use run_pipeline_in_subprocess, or run pure-Python stages in subinterpreters with "
        "PipelineBuilder.to(InterpreterPoolExecutorConfig(...))."
    )
