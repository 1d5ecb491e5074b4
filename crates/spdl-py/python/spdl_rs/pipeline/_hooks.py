"""Task hooks (``spdl.pipeline.TaskHook`` and friends), the stage identity, and ``create_task``.

With the defaults in place (:py:class:`TaskStatsHook` as the default hook class, no ``task_hook_factory``), a
pipeline stays fully native: the engine measures every stage itself and the stats are logged from its
counters. Only a custom hook class or a ``task_hook_factory`` makes a stage run through a Python wrapper that
enters the hooks around each task, on the pipeline's event loop (see ``_extensions.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncContextManager, TypeVar

from .. import _native
from ._stats import TaskPerfStats

__all__ = [
    "StageInfo",
    "TaskHook",
    "TaskStatsHook",
    "create_task",
    "get_default_hook_class",
    "set_default_hook_class",
]

_LG = logging.getLogger("spdl_rs.pipeline")

T = TypeVar("T")


################################################################################
# Stage identity
################################################################################


@dataclass(frozen=True)
class StageInfo:
    """The identity of one pipeline stage, given to hooks and queues.

    Its text form, ``"{pipeline_id}:{stage_id}:{stage_name}"`` (with ``[concurrency]`` appended when the
    stage runs more than one task at a time), is how logs name the stage.
    """

    pipeline_id: int
    stage_id: str
    stage_name: str
    concurrency: int | None = None

    def __str__(self) -> str:
        name = self.stage_name if self.concurrency is None else f"{self.stage_name}[{self.concurrency}]"
        return f"{self.pipeline_id}:{self.stage_id}:{name}"


################################################################################
# Environment and logging helpers
################################################################################

#: The boolean value of an environment variable (``_get_env_bool(name, default=False)``).
_get_env_bool = _native.pipeline._get_env_bool
_set_compact_log = _native.pipeline.set_compact_log


def create_task(
    coro: Coroutine[Any, Any, T],
    name: str | None = None,
    log_cancelled: bool = False,
    suppress_repeated_logs: bool = False,
    suppression_threshold: int = 5,
    suppression_warning_interval: int = 100,
) -> asyncio.Task[T]:
    """:py:func:`asyncio.create_task`, plus a callback that logs how the task ended.

    A failure is logged with its traceback (``"Task [name] failed."``), or on one line in compact mode
    (:py:func:`spdl_rs.pipeline.config.set_compact_log`); a timeout as ``"Task [name] timeout."``.

    Args:
        coro: The coroutine to run.
        name: The task's name (``None``: asyncio's default).
        log_cancelled: Log a warning when the task is cancelled.
        suppress_repeated_logs: After ``suppression_threshold`` failures raised at the same place, stop
            logging them, except for a count every ``suppression_warning_interval`` failures.
        suppression_threshold: See ``suppress_repeated_logs``.
        suppression_warning_interval: See ``suppress_repeated_logs``.

    Returns:
        The task.
    """
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(
        lambda t: _native.pipeline._log_task_result(
            t,
            log_cancelled=log_cancelled,
            suppress_repeated_logs=suppress_repeated_logs,
            suppression_threshold=suppression_threshold,
            suppression_warning_interval=suppression_warning_interval,
        )
    )
    return task


async def _periodic_dispatch(
    afun: Callable[[], Coroutine[None, None, None]], done: asyncio.Event, interval: float
) -> None:
    """Calls ``afun()`` every ``interval`` seconds until ``done`` is set (each call as a task of its own)."""
    if not interval > 0:
        raise ValueError(f"[InternalError] `interval` must be greater than 0. Got: {interval}")
    pending: set[asyncio.Task[None]] = set()
    target = time.monotonic() + interval
    while True:
        wait_for = target - time.monotonic()
        if wait_for > 0:
            waiter = asyncio.ensure_future(done.wait())
            await asyncio.wait([waiter], timeout=wait_for)
            waiter.cancel()
        if done.is_set():
            break
        target = time.monotonic() + interval
        pending.add(create_task(afun()))
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    if pending:
        await asyncio.wait(pending)


async def _drive_to_completion(coro: Coroutine[Any, Any, T]) -> tuple[T, asyncio.CancelledError | None]:
    """Runs ``coro`` to its end even if the caller is cancelled (any number of times); returns its result and
    the first cancellation that arrived meanwhile, for the caller to re-raise."""
    task = asyncio.ensure_future(coro)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
            if task.done():
                if task.cancelled():
                    raise
                return task.result(), cancelled


class _ShieldedHook:
    """A stage hook whose enter and exit run to completion even when the stage is cancelled (so that final
    stats are not lost); the cancellation is re-raised afterwards."""

    def __init__(self, cm: AsyncContextManager[Any]) -> None:
        self._cm = cm

    async def __aenter__(self) -> Any:
        result, cancelled = await _drive_to_completion(self._cm.__aenter__())
        if cancelled is None:
            return result
        await _drive_to_completion(self._cm.__aexit__(None, None, None))
        raise cancelled

    async def __aexit__(self, *exc_info: Any) -> Any:
        result, cancelled = await _drive_to_completion(self._cm.__aexit__(*exc_info))
        if cancelled is not None and (exc_info[0] is None or result):
            raise cancelled
        return result


################################################################################
# Hooks
################################################################################


class TaskHook(ABC):
    """The base class of hooks that run custom code around a pipeline's stages and tasks.

    A hook has two async context managers: :py:meth:`stage_hook`, entered once when the stage starts and
    exited when it ends, and :py:meth:`task_hook`, entered around every task (one call of the stage's op on
    one input; one step of a generator op). Subclass it, implement ``task_hook`` (and optionally
    ``stage_hook``), decorated with :py:func:`contextlib.asynccontextmanager`, and give instances through
    ``build(task_hook_factory=...)`` or make the class the default with
    :py:func:`spdl_rs.pipeline.config.set_default_hook_class`.

    The code before ``yield`` runs before the task, the code after it when the task succeeded; an ``except``
    around ``yield`` sees the task's failure. Let ``StopAsyncIteration`` through: it ends a generator op.

    An exception from ``stage_hook`` fails the pipeline; one from ``task_hook`` fails that task only (its
    item is dropped and counted as a failure).
    """

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs around the stage's whole life: before its first task and after its last one."""
        yield

    @abstractmethod
    @asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        """Runs around each task.

        Args:
            input_item: The input the task processes (so that a hook can report it on failure).
        """
        yield


@asynccontextmanager
async def _enter_all(hooks: Sequence[AsyncContextManager[None]]) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for hook in hooks:
            await stack.enter_async_context(hook)
        yield


def _stage_hooks(hooks: Sequence[TaskHook]) -> AsyncContextManager[None]:
    """All the hooks' ``stage_hook()``, entered in order (shielded from cancellation)."""
    cms: list[Any] = [hook.stage_hook() for hook in hooks]
    if not all(hasattr(h, "__aenter__") and hasattr(h, "__aexit__") for h in cms):
        raise ValueError(
            "`stage_hook()` must return an object that has `__aenter__` and `__aexit__` method. "
            "Make sure that `stage_hook()` is decorated with `asynccontextmanager`."
        )
    return _enter_all([_ShieldedHook(h) for h in cms])


def _task_hooks(hooks: Sequence[TaskHook], input_item: Any = None) -> AsyncContextManager[None]:
    """All the hooks' ``task_hook(input_item)``, entered in order."""
    cms: list[Any] = [hook.task_hook(input_item) for hook in hooks]
    if not all(hasattr(h, "__aenter__") or hasattr(h, "__aexit__") for h in cms):
        raise ValueError(
            "`task_hook()` must return an object that has `__aenter__` and `__aexit__` method. "
            "Make sure that `task_hook()` is decorated with `asynccontextmanager`."
        )
    return _enter_all(cms)


def _task_stats_line(info: Any, stats: TaskPerfStats) -> tuple[str, str]:
    """The arguments of the log call of :py:class:`TaskStatsHook`'s line for ``stats``."""
    return ("%s", _native.pipeline._task_stats_line(info, stats))


@asynccontextmanager
async def _reporting(owner: Any, name: str) -> AsyncIterator[None]:
    """Runs ``owner._log_interval_stats`` every ``owner.interval`` seconds (if ``> 0``) while the stage runs
    (as the task ``name``), and logs ``owner._final_stats()`` at its end: the stage hook of the stats classes."""
    done = asyncio.Event()
    report: asyncio.Task[None] | None = None
    if owner.interval > 0:
        report = create_task(
            _periodic_dispatch(owner._log_interval_stats, done, owner.interval), name=name, log_cancelled=False
        )
    try:
        yield
    finally:
        if report is not None:
            done.set()
            await report
        owner._log_stats(owner._final_stats())


class TaskStatsHook(TaskHook):
    """Counts a stage's tasks and failures and times the successful ones; logs the stats at the end of the
    stage, and every ``interval`` seconds if ``interval > 0``.

    It is the default hook class. As the default, it is served by the engine's own per-stage counters (no
    Python call per item): given explicitly (through ``task_hook_factory``) it runs as written here, its
    counts and streaming percentiles kept natively.

    Args:
        info: The stage.
        interval: Seconds between periodic reports (``<= 0``: none; the final report is always logged).
    """

    def __init__(self, info: StageInfo, interval: float = -1) -> None:
        self.info = info
        self.interval = interval
        self._stats = _native.pipeline._TaskStats()

    @property
    def num_tasks(self) -> int:
        """Tasks completed (successful or not)."""
        return self._stats.num_tasks

    @property
    def num_success(self) -> int:
        """Tasks that succeeded."""
        return self._stats.num_success

    @property
    def ave_time(self) -> float:
        """Mean time of a successful task."""
        return self._stats.ave_time

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs the periodic report (if any) during the stage, and logs the final stats at its end."""
        async with _reporting(self, f"{self.info}_periodic_report"):
            yield

    @asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        """Times the task and counts it (as a failure if it raised)."""
        t0 = time.monotonic()
        try:
            yield
        except StopAsyncIteration:
            raise
        except Exception:
            self._stats.failure()
            raise
        else:
            self._stats.success(time.monotonic() - t0)

    def _final_stats(self) -> TaskPerfStats:
        return TaskPerfStats(*self._stats.total())

    def _get_lap_stats(self) -> TaskPerfStats:
        return TaskPerfStats(*self._stats.lap())

    async def _log_interval_stats(self) -> None:
        await self.interval_stats_callback(self._get_lap_stats())

    async def interval_stats_callback(self, stats: TaskPerfStats) -> None:
        """Called every ``interval`` seconds with the stats of the tasks since the previous call; logs them.
        Override it to send them elsewhere."""
        self._log_stats(stats)

    def _log_stats(self, stats: TaskPerfStats) -> None:
        _LG.info(*_task_stats_line(self.info, stats), stacklevel=2)


_DEFAULT_HOOK_CLASS: type[TaskHook] | None = TaskStatsHook


def set_default_hook_class(hook_class: type[TaskHook] | None = TaskStatsHook) -> None:
    """Sets the hook class each stage gets when ``build`` has no ``task_hook_factory``.

    Args:
        hook_class: The class (called as ``hook_class(stage_info, interval=report_stats_interval)``), or
            ``None`` for no hook. Default: :py:class:`TaskStatsHook` (served by the engine's own stats).
    """
    global _DEFAULT_HOOK_CLASS
    _DEFAULT_HOOK_CLASS = hook_class


def get_default_hook_class() -> type[TaskHook] | None:
    """The default hook class (``None`` when hooks are disabled)."""
    return _DEFAULT_HOOK_CLASS
