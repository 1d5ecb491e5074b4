"""How task hooks, custom queues and background tasks run around the engine's native stages.

The engine runs every stage natively; these extension points are Python objects on the pipeline's event loop:

- A stage with task hooks becomes an async stage whose op enters the hooks (``_task_hooks``) around each call:
  a sync or native op is run in a thread pool inside the hooks (as SPDL runs it in its executor), an async op
  is awaited, and a generator op is stepped once per hook entry (as SPDL does). An aggregate's
  ``accumulate``/``flush`` are run inside the hooks on the event loop; a disaggregate becomes an async
  generator stage.
- A custom queue class is instantiated for each connection SPDL has a queue for (after the source, after
  each stage, and the sink's output); a relay stage after the producer ``put``-s each item into it and
  ``get``-s it back on the event loop, so the queue sees every item (and ``EOF`` at the end).
- Stage hooks (of the hooks and of the queues) are entered when the pipeline starts, before the first item,
  and exited when it ends (exhausted, failed or stopped), upstream stage first, with the exception the stage
  ended with (the failing stage's error, ``CancelledError`` for the stages upstream of it or for a stop).
- Background tasks start and stop with the pipeline on the same loop.

With the defaults (``TaskStatsHook`` as the default hook class, ``StatsQueue`` as the default queue class, no
factory, no background task) none of this is set up: the stages stay native and the stats they log come from
the engine's counters.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

from . import _hooks, _queues, _stats
from ._failure import EOF
from ._hooks import StageInfo, TaskHook, TaskStatsHook, _ShieldedHook, _stage_hooks, _task_hooks, create_task

_LG = logging.getLogger("spdl_rs.pipeline")

#: How often a thread waiting for the event loop checks that the loop is still running (seconds).
_LOOP_CHECK = 0.5

#: Incremented by each build, as SPDL numbers its pipelines (the first is 0).
_PIPELINE_ID = -1


def _next_pipeline_id() -> int:
    global _PIPELINE_ID
    _PIPELINE_ID += 1
    return _PIPELINE_ID


class _Stage:
    """One stage as the extensions see it: its identity, its hooks and its output queue (if custom)."""

    def __init__(self, info: StageInfo, native_name: str | None) -> None:
        self.info = info
        self.native_name = native_name
        self.hooks: list[TaskHook] = []
        self.queue: Any = None
        self.stack: AsyncExitStack | None = None


class Extensions:
    """The hooks, custom queues and background tasks of one pipeline, and their life on its event loop."""

    def __init__(
        self,
        *,
        pipeline_id: int,
        stage_id: int,
        report_stats_interval: float,
        queue_class: Any,
        task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None,
        background_tasks: Sequence[Callable[[], Any]],
        num_threads: int,
    ) -> None:
        self.pipeline_id = pipeline_id
        self._next_stage_id = stage_id
        self.interval = report_stats_interval
        if queue_class is None:
            default_q: Any = _queues.get_default_queue_class()
            self._queue_factory: Callable[[StageInfo, int], Any] | None = (
                None
                if default_q in (_queues.StatsQueue, _queues.AsyncQueue)
                else (lambda info, n: default_q(info, buffer_size=n, interval=report_stats_interval))
            )
        else:
            if not (isinstance(queue_class, type) and issubclass(queue_class, _queues.AsyncQueue)):
                raise TypeError(f"queue_class must be a class that inherits AsyncQueue, got {queue_class!r}")
            self._queue_factory = (
                None if queue_class is _queues.AsyncQueue else (lambda info, n: queue_class(info, buffer_size=n))
            )
        if task_hook_factory is None:
            hook_class = _hooks.get_default_hook_class()
            self._hook_factory: Callable[[StageInfo], list[TaskHook]] | None = (
                None
                if hook_class in (TaskStatsHook, None)
                else (lambda info: [hook_class(info, interval=report_stats_interval)])  # type: ignore[call-arg]
            )
        else:
            self._hook_factory = task_hook_factory
        #: Whether the default hook (``TaskStatsHook``) and the default queue (``StatsQueue``) are in place: the
        #: engine's counters stand for them and their reports are logged from those.
        self.native_task_stats = task_hook_factory is None and _hooks.get_default_hook_class() is TaskStatsHook
        self.native_queue_stats = queue_class is None and _queues.get_default_queue_class() is _queues.StatsQueue
        self.native_stats = self.native_task_stats or self.native_queue_stats
        self.background_factories = list(background_tasks)
        self.num_threads = num_threads
        #: Whether the source is continuous (set by the builder).
        self.continuous = False
        self.stages: list[_Stage] = []
        self.event_loop: Any = None  # the pipeline's _EventLoop, set by the builder
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._bg_tasks: list[asyncio.Task[Any]] = []
        self._lock = threading.Lock()
        self._entered = False
        self._finished = False
        self._reported = False
        self._lap_rows: dict[int, dict[str, Any]] = {}
        self._report_lock = threading.Lock()

    # Build time.

    def stage_info(self, name: str, concurrency: int | None = None) -> StageInfo:
        """The next stage's identity (stage ids count up from ``build``'s ``stage_id``)."""
        info = StageInfo(
            pipeline_id=self.pipeline_id,
            stage_id=str(self._next_stage_id),
            stage_name=name,
            concurrency=concurrency if concurrency is not None and concurrency > 1 else None,
        )
        self._next_stage_id += 1
        return info

    def add_stage(self, info: StageInfo, native_name: str | None, *, hooked: bool) -> _Stage:
        stage = _Stage(info, native_name)
        if hooked and self._hook_factory is not None:
            hooks = self._hook_factory(info)
            stage.hooks = list(hooks) if hooks else []
            # As SPDL does at build: a stage_hook that is not an async context manager is a ValueError now,
            # not a failure of the running pipeline (making the managers runs none of their code).
            _stage_hooks(stage.hooks)
        self.stages.append(stage)
        return stage

    def make_queue(self, stage: _Stage, buffer_size: int) -> Any:
        """The stage's output queue: a custom queue class's instance, or ``None`` (the engine's own queue)."""
        if self._queue_factory is None:
            return None
        stage.queue = self._queue_factory(stage.info, buffer_size)
        return stage.queue

    @property
    def needs_loop(self) -> bool:
        return bool(self.background_factories) or any(s.hooks or s.queue is not None for s in self.stages)

    # Wrappers (ops that run on the event loop).

    def executor(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.num_threads, thread_name_prefix="spdl_rs-hooked"
                )
            return self._executor

    def hooked_op(self, kind: str, fn: Any, hooks: list[TaskHook]) -> tuple[str, Any]:
        """``fn`` (of engine kind ``kind``) as an async op (or async generator op) that runs inside ``hooks``."""
        if kind in ("sync", "native"):

            async def call_sync(item: Any) -> Any:
                loop = asyncio.get_running_loop()
                async with _task_hooks(hooks, item):
                    result = await loop.run_in_executor(self.executor(), fn, item)
                return result

            return "async", call_sync
        if kind == "async":

            async def call_async(item: Any) -> Any:
                async with _task_hooks(hooks, item):
                    result = await fn(item)
                return result

            return "async", call_async
        if kind == "gen":

            async def step_sync_gen(item: Any) -> Any:
                loop = asyncio.get_running_loop()
                it = iter(fn(item))
                end = object()
                try:
                    while True:
                        value = await _hooked_step(
                            hooks, item, lambda: loop.run_in_executor(self.executor(), next, it, end), end
                        )
                        if value is end:
                            return
                        yield value
                finally:
                    close = getattr(it, "close", None)
                    if close is not None:
                        close()

            return "asyncgen", step_sync_gen
        if kind == "asyncgen":

            async def step_async_gen(item: Any) -> Any:
                agen = fn(item)
                end = object()

                async def anext_or_end() -> Any:
                    try:
                        return await agen.__anext__()
                    except StopAsyncIteration:
                        return end

                try:
                    while True:
                        value = await _hooked_step(hooks, item, anext_or_end, end)
                        if value is end:
                            return
                        yield value
                finally:
                    aclose = getattr(agen, "aclose", None)
                    if aclose is not None:
                        await aclose()

            return "asyncgen", step_async_gen
        raise ValueError(f"[InternalError] unexpected op kind {kind!r}")

    def hooked_disaggregate(self, hooks: list[TaskHook]) -> Any:
        """The disaggregate stage as an async generator op stepping inside ``hooks`` (SPDL's shape)."""

        async def disaggregate(items: Any) -> Any:
            it = iter(items)
            end = object()

            async def step() -> Any:
                return next(it, end)

            while True:
                value = await _hooked_step(hooks, items, step, end)
                if value is end:
                    return
                yield value

        return disaggregate

    def hooked_aggregator(self, name: str, aggregator: Any, hooks: list[TaskHook], drop_last: bool) -> Any:
        """The aggregator of stage ``name`` whose ``accumulate`` (and final ``flush``, with ``EOF`` as the
        input) run inside ``hooks`` on the event loop; the engine calls it from its threads."""
        return _HookedAggregator(self, name, aggregator, hooks, drop_last)

    def relay(self, queue: Any) -> Any:
        """The op of the relay stage after a custom queue's producer: the item goes through ``put``/``get``."""

        async def relay(item: Any) -> Any:
            await queue.put(item)
            return await queue.get()

        return relay

    def run_on_loop(self, coro: Any) -> Any:
        """Runs ``coro`` on the pipeline's event loop from another thread and waits for its result.

        Whatever ``coro`` raises is raised here, in the calling thread (a hooked aggregator's on an engine
        thread, which records it; a stage hook's in the thread that starts or stops the pipeline): a
        ``KeyboardInterrupt`` or ``SystemExit`` never escapes the task on the loop, where asyncio would
        re-raise it out of ``run_forever`` and end the loop thread."""
        event_loop = self.event_loop
        loop = None if event_loop is None else event_loop._loop
        thread = None if event_loop is None else event_loop._thread
        if loop is None or thread is None or not thread.is_alive() or loop.is_closed():
            coro.close()
            raise RuntimeError("the pipeline's event loop is not running")
        future = asyncio.run_coroutine_threadsafe(_boxed(coro), loop)
        if threading.current_thread() is thread:
            # Called on the loop's own thread (a finalizer run there): it cannot wait for itself; the
            # coroutine runs when this callback returns.
            return None
        while True:
            try:
                return _unbox(future.result(timeout=_LOOP_CHECK))
            except concurrent.futures.TimeoutError:
                if not thread.is_alive():
                    future.cancel()
                    raise RuntimeError("the pipeline's event loop stopped") from None

    # The pipeline's life.

    def enter(self) -> None:
        """Starts the background tasks and enters every stage hook (on the event loop); called by
        ``Pipeline.start`` before the engine starts. A failing stage hook fails the start."""
        with self._lock:
            if self._entered or not self.needs_loop:
                return
            self._entered = True
        self.run_on_loop(self._enter())

    async def _enter(self) -> None:
        for factory in self.background_factories:
            try:
                task = factory()
                self._bg_tasks.append(create_task(_boxed(task.run()), name="background_task"))
            except Exception:
                _LG.exception("Failed to start a background task.")
        if self._bg_tasks:
            await asyncio.sleep(0)  # each runs up to its first wait before the engine starts
        try:
            # Downstream first, as SPDL starts its stage tasks from the sink up.
            for stage in reversed(self.stages):
                if not stage.hooks and stage.queue is None:
                    continue
                stack = AsyncExitStack()
                await stack.__aenter__()
                stage.stack = stack
                if stage.queue is not None:
                    await stack.enter_async_context(_ShieldedHook(stage.queue.stage_hook()))
                if stage.hooks:
                    await stack.enter_async_context(_stage_hooks(stage.hooks))
        except BaseException as e:
            await self._exit_all(e)
            raise

    def finish(self, error: tuple[str, str | None] | None, *, stopped: bool) -> None:
        """Exits every stage hook (upstream first) and cancels the background tasks; called once, when the
        pipeline is exhausted or stopped. ``error`` is the engine's ``(message, stage)`` if it failed."""
        with self._lock:
            if not self._entered or self._finished:
                return
            self._finished = True
        try:
            self.run_on_loop(self._finish(error, stopped))
        finally:
            self.close()

    async def _finish(self, error: tuple[str, str | None] | None, stopped: bool) -> None:
        failed_at = None
        if error is not None:
            message, name = error
            for i, stage in enumerate(self.stages):
                if name is not None and stage.native_name == name:
                    failed_at = i
        for i, stage in enumerate(self.stages):
            exc: BaseException | None
            if failed_at is not None and i < failed_at:
                exc = asyncio.CancelledError()
            elif failed_at is not None and i == failed_at:
                exc = RuntimeError(error[0] if error is not None else "")
            elif failed_at is None and error is not None:
                exc = RuntimeError(error[0])
            elif stopped:
                exc = asyncio.CancelledError()
            else:
                exc = None
            await self._exit_stage(stage, exc)
        await self._stop_background()

    async def _exit_stage(self, stage: _Stage, exc: BaseException | None) -> None:
        stack, stage.stack = stage.stack, None
        if stack is None:
            return
        if exc is None or not isinstance(exc, asyncio.CancelledError):
            # As SPDL's stages do, unless cancelled: the end of stream goes through the queue (the sink's
            # output queue excepted: the sink keeps it from the consumer).
            if stage.queue is not None and stage is not self.stages[-1]:
                try:
                    await stage.queue.put(EOF)
                    await stage.queue.get()
                except Exception:
                    _LG.exception("[%s] Failed to pass EOF through the queue.", stage.info)
        try:
            if exc is None:
                await stack.__aexit__(None, None, None)
            else:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
        except (Exception, asyncio.CancelledError) as e:
            if e is not exc:
                _LG.error("[%s] A stage hook failed at the end of the stage: %r", stage.info, e, exc_info=e)

    async def _exit_all(self, exc: BaseException) -> None:
        for stage in self.stages:
            await self._exit_stage(stage, exc)
        await self._stop_background()

    async def _stop_background(self) -> None:
        tasks, self._bg_tasks = self._bg_tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
            for task in tasks:
                if task.cancelled():
                    continue
                exc = task.exception()
                if exc is None and isinstance(task.result(), _Escaped):
                    exc = task.result().exc  # a KeyboardInterrupt or SystemExit of the task, kept off the loop
                if exc is not None:
                    _LG.error("Background task failed: %s", exc, exc_info=exc)

    def _native_rows(self, core: Any) -> tuple[list[Any], list[dict[str, Any]]] | None:
        """The engine's stats rows of the stages SPDL has (custom queues' relays left out), and their names."""
        try:
            rows = core.stats()
        except Exception:  # noqa: BLE001 (stats are best effort)
            return None
        if self._queue_factory is not None:  # the relay rows of custom queues are not stages
            rows = [r for r in rows if not (r["kind"] == "async" and str(r["name"]).endswith("_queue"))]
        if len(rows) == len(self.stages):
            names: list[Any] = [stage.info for stage in self.stages]
        else:  # path variants, merges and regions show more rows than SPDL has stages
            names = [f"{self.pipeline_id}:{i}:{r['name']}" for i, r in enumerate(rows)]
        return names, rows

    def _log_native(self, names: list[Any], rows: list[dict[str, Any]]) -> None:
        for i, (name, row) in enumerate(zip(names, rows)):
            st = _stats.from_raw(row, rows[i + 1] if i + 1 < len(rows) else None)
            if self.native_task_stats and st.kind not in ("source", "sink"):
                _LG.info(*_hooks._task_stats_line(name, st.task))
            if self.native_queue_stats:
                _LG.info(*_queues._queue_stats_line(f"{name}_queue", st.queue))

    def report_native_stats(self, core: Any) -> None:
        """Logs, once, what the default ``TaskStatsHook`` and ``StatsQueue`` log at the end of each stage (in
        SPDL's words), from the engine's own counters."""
        with self._report_lock:
            if self._reported or not self.native_stats or not _LG.isEnabledFor(logging.INFO):
                return
            self._reported = True
            got = self._native_rows(core)
            if got is not None:
                self._log_native(*got)

    def report_native_interval(self, core: Any) -> None:
        """Logs what the default ``TaskStatsHook`` and ``StatsQueue`` log every ``report_stats_interval``: the
        counts, mean times and queue occupancy since the previous report (the percentiles are the engine's,
        over the whole run), from the engine's counters. Called by the pipeline's stats reporter thread."""
        with self._report_lock:
            if self._reported or not self.native_stats or not _LG.isEnabledFor(logging.INFO):
                return  # nothing after the final report
            got = self._native_rows(core)
            if got is not None:
                self._log_native_lap(*got)

    def _log_native_lap(self, names: list[Any], rows: list[dict[str, Any]]) -> None:
        deltas = []
        for i, row in enumerate(rows):
            prev = self._lap_rows.get(i)
            d = dict(row)
            if prev is not None:
                for key in ("items_in", "items_out", "items_failed", "task_time_total", "starved", "blocked",
                            "elapsed"):
                    d[key] = max(0, row[key] - prev[key])
            calls = int(d["items_in"])
            d["task_mean"] = d["task_time_total"] / calls if calls else 0.0
            deltas.append(d)
            self._lap_rows[i] = row
        self._log_native(names, deltas)

    def close(self) -> None:
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


class _Escaped:
    """A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``), carried out
    of a task on the event loop as its result (see :py:func:`_boxed`)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _boxed(coro: Any) -> Any:
    """Awaits ``coro``; a ``BaseException`` that is not an ``Exception`` nor the task's cancellation becomes
    the result, as an :py:class:`_Escaped` (:py:func:`_unbox` raises it again in the waiting thread)."""
    try:
        return await coro
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as e:  # noqa: BLE001 (kept off the loop, raised again by the waiter)
        return _Escaped(e)


def _unbox(result: Any) -> Any:
    if isinstance(result, _Escaped):
        raise result.exc
    return result


async def _hooked_step(hooks: list[TaskHook], item: Any, step: Callable[[], Any], end: object) -> Any:
    """One step of a generator op inside ``hooks``; ``end`` when the generator is exhausted. The end is
    raised as ``StopAsyncIteration`` inside the hooks (so that they see it, as in SPDL) unless a hook
    absorbs it."""
    exhausted = False
    try:
        async with _task_hooks(hooks, item):
            value = await step()
            if value is end:
                exhausted = True
                raise StopAsyncIteration
    except StopAsyncIteration:
        return end
    return end if exhausted else value


class _HookedAggregator:
    """An aggregator whose calls run inside task hooks on the pipeline's event loop."""

    def __init__(self, ext: Extensions, name: str, aggregator: Any, hooks: list[TaskHook], drop_last: bool) -> None:
        self._ext = ext
        self._agg = aggregator
        self._hooks = hooks
        self._drop_last = drop_last
        #: The stage's name (what the engine names the step by).
        self.name = name

    async def _call(self, fn: Callable[[Any], Any], arg: Any, item: Any) -> Any:
        async with _task_hooks(self._hooks, item):
            result = fn(arg)
        return result

    def accumulate(self, item: Any) -> Any:
        return self._ext.run_on_loop(self._call(self._agg.accumulate, item, item))

    def flush(self) -> Any:
        if self._ext.continuous:
            # A continuous source's flushes are all at epoch ends, where SPDL runs no task hooks.
            return self._agg.flush()
        return self._ext.run_on_loop(self._call(lambda _: self._agg.flush(), None, EOF))


__all__ = ["Extensions"]
