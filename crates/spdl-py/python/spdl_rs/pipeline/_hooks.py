"""Task hooks (``spdl.pipeline.TaskHook`` and friends), the stage identity, and ``create_task``.

With the defaults in place (:py:class:`TaskStatsHook` as the default hook class, no ``task_hook_factory``), a
pipeline stays fully native: the engine measures every stage itself and the stats are logged from its
counters. Only a custom hook class or a ``task_hook_factory`` makes a stage run through a Python wrapper that
enters the hooks around each task, on the pipeline's event loop (see ``_extensions.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, AsyncContextManager, TypeVar

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

_TRUES = ("1", "true", "TRUE", "on", "ON", "yes", "YES")
_FALSES = ("0", "false", "FALSE", "off", "OFF", "no", "NO")


def _get_env_bool(name: str, default: bool = False) -> bool:
    """The boolean value of environment variable ``name`` (a warning for a value that is neither)."""
    if name not in os.environ:
        return default
    value = os.environ[name]
    if value in _TRUES:
        return True
    if value not in _FALSES:
        _LG.warning(
            f"Unexpected environment variable value `{name}={value}`. Expected one of {list(_TRUES + _FALSES)}",
            stacklevel=2,
        )
    return False


_COMPACT_LOG: bool | None = None


def _get_compact_log() -> bool:
    """Whether task failures are logged on one line (``set_compact_log``, else ``SPDL_PIPELINE_COMPACT_LOG``)."""
    global _COMPACT_LOG
    if _COMPACT_LOG is None:
        _COMPACT_LOG = _get_env_bool("SPDL_PIPELINE_COMPACT_LOG", default=False)
    return _COMPACT_LOG


def _set_compact_log(value: bool | None) -> None:
    """Sets the compact logging of task failures.

    In compact mode a failed task logs one line (exception type, message and where it was raised) instead of
    the whole traceback.

    Args:
        value: ``True`` (compact), ``False`` (full tracebacks), or ``None`` to go back to the default: the
            ``SPDL_PIPELINE_COMPACT_LOG`` environment variable, ``False`` when it is unset.
    """
    global _COMPACT_LOG
    _COMPACT_LOG = value


# How often each raise site failed, for ``create_task(..., suppress_repeated_logs=True)``.
_exception_counts: dict[tuple[str, int], int] = defaultdict(int)


def _log_task_result(
    task: asyncio.Task[Any],
    *,
    stacklevel: int,
    log_cancelled: bool,
    suppress_repeated_logs: bool,
    suppression_threshold: int,
    suppression_warning_interval: int,
    compact: bool,
) -> None:
    try:
        task.result()
    except asyncio.CancelledError:
        if log_cancelled:
            _LG.warning("Task [%s] was cancelled.", task.get_name(), stacklevel=stacklevel)
    except (TimeoutError, asyncio.TimeoutError):
        _LG.error("Task [%s] timeout.", task.get_name(), stacklevel=stacklevel)
    except Exception as err:
        frames = traceback.extract_tb(sys.exc_info()[2])
        frame = frames[-1] if frames else None
        filename = frame.filename if frame is not None else "<unknown>"
        lineno = (frame.lineno or 0) if frame is not None else 0
        func = frame.name if frame is not None else "<unknown>"
        if suppress_repeated_logs and frame is not None:
            key = (filename, lineno)
            _exception_counts[key] += 1
            count = _exception_counts[key]
            if count == suppression_threshold:
                _LG.warning("Errors are repeated at %s:%d:%s, holding on logging.", filename, lineno, func)
                return
            if count > suppression_threshold:
                if count % suppression_warning_interval == 0:
                    _LG.warning("%d errors were logged at %s:%d:%s.", count, filename, lineno, func)
                return
        if compact:
            _LG.error(
                "Task [%s]: %s: %s (%s:%d:%s)",
                task.get_name(),
                type(err).__name__,
                err,
                filename,
                lineno,
                func,
                stacklevel=stacklevel,
            )
        else:
            _LG.exception("Task [%s] failed.", task.get_name(), stacklevel=stacklevel)


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
        lambda t: _log_task_result(
            t,
            stacklevel=3,
            log_cancelled=log_cancelled,
            suppress_repeated_logs=suppress_repeated_logs,
            suppression_threshold=suppression_threshold,
            suppression_warning_interval=suppression_warning_interval,
            compact=_get_compact_log(),
        )
    )
    return task


def _time_str(val: float) -> str:
    """A duration for logs: microseconds, milliseconds or seconds, fixed width."""
    if val < 0.0001:
        return f"{val * 1e6:6.1f} [ us]"
    if val < 1:
        return f"{val * 1e3:6.1f} [ ms]"
    return f"{val:6.1f} [sec]"


################################################################################
# Streaming statistics
################################################################################


class _P2Percentile:
    """A streaming percentile estimate (Jain and Chlamtac's P-square algorithm): five markers, O(1) per value."""

    def __init__(self, p: float) -> None:
        self._p = p / 100.0
        self.reset()

    def reset(self) -> None:
        self._count = 0
        self._heights = [0.0] * 5
        self._pos = [0] * 5
        self._want = [0.0] * 5
        self._step = [0.0] * 5

    @property
    def value(self) -> float:
        if self._count == 0:
            return 0.0
        if self._count < 5:
            seen = sorted(self._heights[: self._count])
            return seen[min(int(self._count * self._p), self._count - 1)]
        return self._heights[2]

    def update(self, x: float) -> None:
        self._count += 1
        if self._count <= 5:
            self._heights[self._count - 1] = x
            if self._count == 5:
                self._heights.sort()
                p = self._p
                self._pos = [0, 1, 2, 3, 4]
                self._want = [0.0, 2 * p, 4 * p, 2 + 2 * p, 4.0]
                self._step = [0.0, p / 2, p, (1 + p) / 2, 1.0]
            return
        q, n = self._heights, self._pos
        if x < q[0]:
            q[0] = x
            k = 0
        elif x >= q[4]:
            q[4] = x
            k = 3
        else:
            k = next(i for i in range(4) if q[i] <= x < q[i + 1])
        for i in range(k + 1, 5):
            n[i] += 1
        for i in range(5):
            self._want[i] += self._step[i]
        for i in (1, 2, 3):
            d = self._want[i] - n[i]
            if (d >= 1 and n[i + 1] - n[i] > 1) or (d <= -1 and n[i - 1] - n[i] < -1):
                s = 1 if d > 0 else -1
                cand = q[i] + s / (n[i + 1] - n[i - 1]) * (
                    (n[i] - n[i - 1] + s) * (q[i + 1] - q[i]) / (n[i + 1] - n[i])
                    + (n[i + 1] - n[i] - s) * (q[i] - q[i - 1]) / (n[i] - n[i - 1])
                )
                if not q[i - 1] < cand < q[i + 1]:
                    cand = q[i] + s * (q[i + s] - q[i]) / (n[i + s] - n[i])
                q[i] = cand
                n[i] += s


class _StatsCounter:
    """Count, running mean and percentiles of durations (whole run and since the last lap)."""

    def __init__(self) -> None:
        self._n = 0
        self._t = 0.0
        self._p90 = _P2Percentile(90)
        self._p99 = _P2Percentile(99)
        self._lap_p90 = _P2Percentile(90)
        self._lap_p99 = _P2Percentile(99)

    @property
    def num_items(self) -> int:
        return self._n

    @property
    def ave_time(self) -> float:
        return self._t

    @property
    def p90_time(self) -> float:
        return self._p90.value

    @property
    def p99_time(self) -> float:
        return self._p99.value

    def consume_lap_percentiles(self) -> tuple[float, float]:
        values = self._lap_p90.value, self._lap_p99.value
        self._lap_p90.reset()
        self._lap_p99.reset()
        return values

    def update(self, t: float, n: int = 1) -> None:
        if n <= 0:
            return
        self._n += n
        self._t += (t - self._t) * n / self._n
        for p in (self._p90, self._p99, self._lap_p90, self._lap_p99):
            p.update(t)

    @contextmanager
    def count(self) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.update(time.monotonic() - t0)


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


def _task_stats_line(info: Any, stats: TaskPerfStats) -> tuple[Any, ...]:
    return (
        "[%s]\tCompleted %5d tasks (%3d failed). Ave task time: %s. P90: %s. P99: %s.",
        info,
        stats.num_tasks,
        stats.num_failures,
        _time_str(stats.ave_time),
        _time_str(stats.p90_time),
        _time_str(stats.p99_time),
    )


class TaskStatsHook(TaskHook):
    """Counts a stage's tasks and failures and times the successful ones; logs the stats at the end of the
    stage, and every ``interval`` seconds if ``interval > 0``.

    It is the default hook class. As the default, it is served by the engine's own per-stage counters (no
    Python call per item): given explicitly (through ``task_hook_factory``) it runs as written here.

    Args:
        info: The stage.
        interval: Seconds between periodic reports (``<= 0``: none; the final report is always logged).
    """

    def __init__(self, info: StageInfo, interval: float = -1) -> None:
        self.info = info
        self.interval = interval
        self.num_tasks = 0
        self.num_success = 0
        self.ave_time = 0.0
        self._p50 = _P2Percentile(50)
        self._p90 = _P2Percentile(90)
        self._p99 = _P2Percentile(99)
        self._lap_p50 = _P2Percentile(50)
        self._lap_p90 = _P2Percentile(90)
        self._lap_p99 = _P2Percentile(99)
        self._lap_t0 = 0.0
        self._lap_num_tasks = 0
        self._lap_num_success = 0
        self._lap_ave_time = 0.0

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs the periodic report (if any) during the stage, and logs the final stats at its end."""
        done = asyncio.Event()
        report: asyncio.Task[None] | None = None
        if self.interval > 0:
            self._lap_t0 = time.monotonic()
            report = create_task(
                _periodic_dispatch(self._log_interval_stats, done, self.interval),
                name=f"{self.info}_periodic_report",
                log_cancelled=False,
            )
        try:
            yield
        finally:
            if report is not None:
                done.set()
                await report
            self._log_stats(
                TaskPerfStats(
                    num_tasks=self.num_tasks,
                    num_failures=self.num_tasks - self.num_success,
                    ave_time=self.ave_time,
                    p90_time=self._p90.value,
                    p99_time=self._p99.value,
                    p50_time=self._p50.value,
                )
            )

    @asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        """Times the task and counts it (as a failure if it raised)."""
        t0 = time.monotonic()
        try:
            yield
        except StopAsyncIteration:
            raise
        except Exception:
            self.num_tasks += 1
            raise
        else:
            elapsed = time.monotonic() - t0
            self.num_tasks += 1
            self.num_success += 1
            self.ave_time += (elapsed - self.ave_time) / self.num_success
            for p in (self._p50, self._p90, self._p99, self._lap_p50, self._lap_p90, self._lap_p99):
                p.update(elapsed)

    def _get_lap_stats(self) -> TaskPerfStats:
        num_tasks, num_success, ave = self.num_tasks, self.num_success, self.ave_time
        d_tasks = max(0, num_tasks - self._lap_num_tasks)
        d_success = max(0, num_success - self._lap_num_success)
        if d_success <= 0:
            d_ave = 0.0
        else:
            d_ave = max(0.0, (ave * num_success - self._lap_ave_time * self._lap_num_success) / d_success)
        p50, p90, p99 = self._lap_p50.value, self._lap_p90.value, self._lap_p99.value
        for p in (self._lap_p50, self._lap_p90, self._lap_p99):
            p.reset()
        self._lap_num_tasks, self._lap_num_success, self._lap_ave_time = num_tasks, num_success, ave
        return TaskPerfStats(
            num_tasks=d_tasks,
            num_failures=d_tasks - d_success,
            ave_time=d_ave,
            p90_time=p90,
            p99_time=p99,
            p50_time=p50,
        )

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
