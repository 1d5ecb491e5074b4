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
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from fractions import Fraction
from functools import partial
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any, TypeVar

from . import defs
from ._arena import _Arena
from ._cache_iterator import cache_iterator
from ._run_protocol import (
    _close_queue,
    _Cmd,
    _execute_iterable,
    _interpreters_unavailable,
    _normalize_initializers,
    _ParentLink,
    _start_interp,
    _Worker,
)
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


class _Handle:
    """The parent's hold on one worker (a process or a subinterpreter): its queues, its arena, and its bounded
    shutdown."""

    def __init__(self, worker: _Worker, cmd_q: Any, data_q: Any, timeout: float | None, arena: Any = None) -> None:
        self.worker = worker
        self.cmd_q = cmd_q
        self.data_q = data_q
        self.arena = arena
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self.link = _ParentLink(
            data_q,
            float("inf") if timeout is None else timeout,
            worker.kind,
            is_alive=worker.alive,
            exit_info=worker.exit_text,
            should_stop=self.closed.is_set,
        )

    def start(self) -> _Handle:
        """Waits for the worker's initialization; on failure, stops it and raises."""
        try:
            self.link.wait_for_init()
        except BaseException:
            # An initializer that blocks cannot read ABORT: terminate a process at once.
            self.terminate(force=True)
            raise
        return self

    def terminate(self, *, force: bool = False) -> None:
        """Stops the worker (``ABORT``, then, for a process, SIGTERM, then SIGKILL, each bounded) and releases
        the queues and the arena. Idempotent; never raises."""
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        try:
            if self.worker.alive():
                if force and self.worker.interp is None:
                    self.worker.runner.terminate()
                else:
                    try:
                        self.cmd_q.put_nowait(int(_Cmd.ABORT))
                    except Exception:  # noqa: BLE001 (the queue may be closed: terminate below)
                        _LG.debug("Could not send ABORT to the worker.", exc_info=True)
            if self.arena is not None and (shutdown := getattr(self.arena, "shutdown_arena", None)) is not None:
                try:
                    shutdown()
                except Exception:  # noqa: BLE001
                    _LG.debug("Could not wake the arena's writer.", exc_info=True)
            self.worker.stop(_JOIN_TIMEOUT, drain=(self.data_q,))
        finally:
            _close_queue(self.cmd_q)
            _close_queue(self.data_q)
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


class _WorkerIterable(Iterable[T]):
    """Iterates the worker's iterable; each ``iter()`` starts a new iteration in the same worker."""

    def __init__(self, handle: _Handle) -> None:
        self._handle: _Handle | None = handle
        if handle.worker.interp is None:
            # Runs on garbage collection, and at interpreter exit before multiprocessing joins its children. The
            # priority is above the queues' own exit finalizers (10), which close their feeder threads: run after
            # them, the ABORT would never be sent and the worker would be terminated only after the join timeout.
            self._finalizer: Callable[[], Any] = Finalize(self, handle.terminate, exitpriority=100)
        else:
            self._finalizer = weakref.finalize(self, handle.terminate)
        self._gone = "worker process" if handle.worker.interp is None else "subinterpreter"
        self._arena: Any = None if handle.arena is None else _Arena(handle.arena)

    def __iter__(self) -> Iterator[T]:
        if (h := self._handle) is None:
            raise RuntimeError(f"The {self._gone} is shutdown. Cannot iterate again.")
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
                yield pickle.loads(payload) if arena is None else arena.restore(payload)
        except GeneratorExit:
            return
        except BaseException:
            self._handle = None
            self._finalizer()
            raise


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
    handle = _Handle(_Worker(process), cmd_q, data_q, timeout, arena)
    try:
        process.start()
    except BaseException:
        handle.terminate(force=True)
        raise
    return _WorkerIterable(handle.start())


################################################################################
# Subinterpreters
################################################################################


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
    # The worker runs the protocol module loaded by path: the spdl_rs package cannot be imported there.
    worker = _start_interp(
        "_interp_main(cmd_q, data_q, payload)", "spdl_rs-subinterpreter", cmd_q=cmd_q, data_q=data_q, payload=payload
    )
    return _WorkerIterable(_Handle(worker, cmd_q, data_q, timeout).start())


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
