"""The core build: a pipeline's configs (``defs``) turned into the engine's steps and a :py:class:`Pipeline`.

Below the modules that build nested pipelines (:py:mod:`._region` in its workers, :py:mod:`._profile` per
stage) and the public builder (:py:mod:`._builder`), which import it. A ``.to()`` region's step is made by the
``region_step`` function the caller passes (:py:func:`._region.region_step`): this module does not import
the region machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _native
from . import _bg_task, _checkpoint, defs
from ._extensions import Extensions, _next_pipeline_id
from ._failure import EOF, EPOCH_END, is_eof, is_epoch_end
from ._op import _op_kind
from ._pipeline import Pipeline, _EventLoop

_LG = logging.getLogger("spdl_rs.pipeline")

#: Makes the engine step of one ``.to()`` region: ``region_step(stages, target, input_buffer_size,
#: output_buffer_size, conv)`` (:py:func:`._region.region_step`).
RegionStep = Callable[[list[Any], Any, int, int, "_Conversion"], Any]

#: Default capacity of the queues between stages: SPDL's (``_BUFFER_SIZE``, fixed there), declared by the
#: native module. The pipeline-wide values are checked there too, once (``CoreOptions``; sizes up to 2**48:
#: queues allocate as they fill, so a large one costs nothing until it holds items).
_STAGE_BUFFER_SIZE: int = _native.pipeline.DEFAULT_STAGE_BUFFER_SIZE


def _generator_to_list(fn: Any, item: Any) -> list[Any]:
    """Runs a generator op to its end (in a process pool's worker: only the whole result crosses back)."""
    return list(fn(item))


def _in_executor(kind: str, fn: Any, executor: Any) -> tuple[str, Any]:
    """A sync op (function or generator function) made into an async one whose work runs in ``executor``
    (``pipe(..., executor=...)``), as SPDL does: a function's call; a generator's each step (in a thread pool)
    or whole run (in a process pool, where only the finished list can cross back)."""
    if not callable(getattr(executor, "submit", None)):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}")
    if kind == "gen":
        from concurrent.futures import ProcessPoolExecutor

        if isinstance(executor, ProcessPoolExecutor):

            async def gen_in_process(item: Any) -> Any:
                for value in await asyncio.wrap_future(executor.submit(_generator_to_list, fn, item)):
                    yield value

            return "asyncgen", gen_in_process

        async def gen_in_executor(item: Any) -> Any:
            done = object()
            it = await asyncio.wrap_future(executor.submit(fn, item))
            while (value := await asyncio.wrap_future(executor.submit(next, it, done))) is not done:
                yield value

        return "asyncgen", gen_in_executor
    if kind != "sync":
        what = {"native": "a native op", "async": "an async function",
                "asyncgen": "an async generator function"}.get(kind, kind)
        raise ValueError(
            f"`executor` cannot be specified when op is async (or native): this op is {what}; native ops run "
            "without the GIL on the pipeline's threads, async ones on its event loop"
        )

    async def call_in_executor(item: Any) -> Any:
        return await asyncio.wrap_future(executor.submit(fn, item))

    return "async", call_in_executor


def _pipe_config(cfg: Any, hooks: list[Any] | None = None, ext: Extensions | None = None) -> tuple[Any, bool]:
    """``cfg`` as the engine runs it (its executor and ``hooks`` applied around the op), and whether it needs
    the event loop. The values are checked where the engine reads them (``_native.pipeline.check``)."""
    _native.pipeline.check(cfg)
    kind, fn = _op_kind(cfg.op)
    if cfg.executor is not None:
        kind, fn = _in_executor(kind, fn, cfg.executor)
    if hooks and ext is not None:
        kind, fn = ext.hooked_op(kind, fn, hooks)
    if fn is not cfg.op:
        cfg = dataclasses.replace(cfg, op=fn, executor=None)
    return cfg, kind in ("async", "asyncgen")


class _Conversion:
    """What turning configs into engine steps collects: whether an event loop is needed, and the objects
    (``.to()`` regions, custom merges) the pipeline must stop and close with it."""

    def __init__(
        self,
        *,
        num_threads: int,
        max_failures: Any,
        report_stats_interval: float,
        stage_buffer_size: int,
        ext: Extensions | None = None,
        region_step: RegionStep | None = None,
    ) -> None:
        self.needs_loop = False
        #: Relay steps of the source's custom queue, to put first in the pipeline's steps.
        self.source_relays: list[Any] = []
        #: Hooks, custom queues and background tasks (``None``: only validating).
        self.ext = ext
        self.resources: list[Any] = []
        self.num_threads = num_threads
        self.max_failures = max_failures
        self.report_stats_interval = report_stats_interval
        self.stage_buffer_size = stage_buffer_size
        #: Makes a ``.to()`` region's step (``None``: a region is refused).
        self.region_step = region_step

    @property
    def fail_fast(self) -> bool:
        m = self.max_failures
        return isinstance(m, int) and not isinstance(m, bool) and m == 0


def _source_continuity(src: Any) -> set[bool]:
    """The ``continuous`` settings of the sources (a merge's inputs checked to be ``PipelineConfig``-s)."""
    if isinstance(src, defs.MergeConfig):
        for cfg in src.pipeline_configs:
            if not isinstance(cfg, defs.PipelineConfig):
                raise TypeError(f"Merge takes PipelineConfig inputs, got {type(cfg).__name__}")
        return set().union(*(_source_continuity(c.src) for c in src.pipeline_configs))
    return {bool(getattr(src, "continuous", False))}


def _convert_source(src: Any, conv: _Conversion) -> Any:
    """The source config as the engine runs it: a custom merge becomes a ``SourceConfig`` of its output; a
    merge's inputs get their stages' hooks and queues."""
    if isinstance(src, defs.SourceConfig):
        conv.needs_loop |= hasattr(src.source, "__aiter__")
        if conv.ext is not None:
            stage = conv.ext.add_stage(conv.ext.stage_info("src"), "source", hooked=False)
            conv.source_relays.extend(_relay_steps(stage, _STAGE_BUFFER_SIZE, conv))
        return src
    if isinstance(src, defs.MergeConfig):
        continuity = _source_continuity(src)
        if len(continuity) > 1:
            raise ValueError(
                "Mixed continuous mode is not supported. All sources in a pipeline (including merged "
                "sub-pipelines) must have the same continuous setting."
            )
        if src.op is None:
            # As SPDL numbers them: the merge first, then the merged pipelines' stages. The merge gets the
            # factory's hooks for their stage hooks (SPDL's merge runs no task hooks).
            merge_stage = None
            if conv.ext is not None:
                merge_stage = conv.ext.add_stage(conv.ext.stage_info("merge"), "merge", hooked=True)
            inputs: list[Any] = []
            for c in src.pipeline_configs:
                sub_source = _convert_source(c.src, conv)
                relays, conv.source_relays = conv.source_relays, []
                inputs.append(defs.PipelineConfig(sub_source, relays + _convert_steps(c.pipes, conv)))
            conv.source_relays.extend(_relay_steps(merge_stage, _STAGE_BUFFER_SIZE, conv))
            return defs.MergeConfig(tuple(inputs))
        merge = _CustomMerge(src.op, src.pipeline_configs, continuous=continuity == {True}, conv=conv)
        conv.resources.append(merge)
        return defs.SourceConfig(merge, continuous=continuity == {True})
    raise TypeError(f"the source must be a SourceConfig or a MergeConfig, got {type(src).__name__}")


def _relay_steps(stage: Any, buffer_size: int, conv: _Conversion) -> list[Any]:
    """The relay stage that passes a stage's output through its custom queue (none for the engine's own)."""
    ext = conv.ext
    if ext is None or stage is None:
        return []
    q = ext.make_queue(stage, buffer_size)
    if q is None:
        return []
    conv.needs_loop = True
    return [defs.PipeConfig(f"{stage.info.stage_name}_queue", ext.relay(q))]


def _convert_step(cfg: Any, conv: _Conversion) -> list[Any]:
    """The stage configs (not a placement marker) as the engine runs them: the stage's own, with its hooks
    applied, then the relay of its custom output queue, if any."""

    ext = conv.ext
    if isinstance(cfg, defs.PipeConfig):
        stage = None if ext is None else ext.add_stage(ext.stage_info(cfg.name, cfg.concurrency), cfg.name, hooked=True)
        step, loop = _pipe_config(cfg, stage.hooks if stage is not None else None, ext)
        conv.needs_loop |= loop
        return [step, *_relay_steps(stage, _STAGE_BUFFER_SIZE, conv)]
    if isinstance(cfg, defs.AggregateConfig):
        _native.pipeline.check(cfg)
        stage = None if ext is None else ext.add_stage(ext.stage_info(cfg.name), None, hooked=True)
        if ext is not None and stage is not None and stage.hooks:
            agg = defs.Collate(cfg.op.n) if type(cfg.op) is defs.Collate else cfg.op
            hooked = ext.hooked_aggregator(cfg.name, agg, stage.hooks, bool(cfg.drop_last))
            cfg = dataclasses.replace(cfg, op=hooked)
            conv.needs_loop = True
        return [cfg, *_relay_steps(stage, _STAGE_BUFFER_SIZE, conv)]
    if isinstance(cfg, defs.DisaggregateConfig):
        stage = None if ext is None else ext.add_stage(ext.stage_info("disaggregate"), "disaggregate", hooked=True)
        if ext is not None and stage is not None and stage.hooks:
            cfg = defs.PipeConfig("disaggregate", ext.hooked_disaggregate(stage.hooks))
            conv.needs_loop = True
        return [cfg, *_relay_steps(stage, _STAGE_BUFFER_SIZE, conv)]
    if isinstance(cfg, defs.PathVariantsConfig):
        for i, path in enumerate(cfg.paths):
            for j, stage in enumerate(path):
                if isinstance(stage, defs.PlacementConfig):
                    raise ValueError(
                        f"Path {i}, position {j}: a to() placement marker is not allowed inside PathVariants paths."
                    )
        _native.pipeline.check(cfg)
        conv.needs_loop |= _op_kind(cfg.router)[0] == "async"
        # The router and the merge of the paths get the factory's hooks for their stage hooks only (SPDL runs
        # no task hooks around routing and merging).
        router_stage = None
        if ext is not None:
            router_stage = ext.add_stage(ext.stage_info(cfg.name or "path_variants_router"), None, hooked=True)
        paths = [tuple(s for stage in path for s in _convert_step(stage, conv)) for path in cfg.paths]
        merge_stage = None
        if router_stage is not None and ext is not None:
            merge_stage = ext.add_stage(ext.stage_info("path_variants_merge"), None, hooked=True)
        return [dataclasses.replace(cfg, paths=tuple(paths)), *_relay_steps(merge_stage, _STAGE_BUFFER_SIZE, conv)]
    raise TypeError(
        f"a {type(cfg).__name__} step is not supported (Pipe, Aggregate, Disaggregate, PathVariants and "
        "PlacementConfig markers are)"
    )


def _convert_steps(pipes: Sequence[Any], conv: _Conversion) -> list[Any]:
    """The engine steps of a pipeline's ``pipes``: each ``.to()`` region (the stages between a marker with a
    worker-pool target and the next marker, or the end) becomes one ``through`` step running them in the pool."""

    steps: list[Any] = []
    target: Any = defs.MAIN_PROCESS
    input_buffer_size = 1
    region: list[Any] = []

    def close_region(output_buffer_size: int) -> None:
        if region:
            if conv.region_step is None:
                raise TypeError("this pipeline cannot run to() regions (the build was given no region_step)")
            steps.append(conv.region_step(list(region), target, input_buffer_size, output_buffer_size, conv))
            region.clear()

    for p in pipes:
        if isinstance(p, defs.PlacementConfig):
            _check_buffer_size(p.buffer_size)
            close_region(p.buffer_size)
            target = p.target
            input_buffer_size = p.buffer_size
        elif isinstance(target, defs._MainProcess):
            steps.extend(_convert_step(p, conv))
        else:
            region.append(p)
    close_region(1)
    return steps


def _check_buffer_size(buffer_size: Any) -> None:
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"`buffer_size` must be a positive integer. Got: {buffer_size}.")


def _build(
    src: Any,
    pipes: Sequence[Any],
    *,
    buffer_size: int,
    num_threads: int,
    max_failures: Any,
    report_stats_interval: float,
    stage_buffer_size: int,
    queue_class: Any = None,
    task_hook_factory: Callable[[Any], list[Any]] | None = None,
    background_tasks: Sequence[Callable[[], Any]] | None = None,
    stage_id: int = 0,
    extensions: bool = True,
    autotune: bool = False,
    max_memory_bytes: int | None = None,
    region_step: RegionStep | None = None,
) -> Pipeline[Any]:
    """The pipeline of ``src`` and ``pipes`` (``.to()`` regions made by ``region_step``)."""
    # The boundary: every pipeline-wide value is checked once, by the native options (a pool of 10**9 threads
    # is refused, not attempted), and read back from them.
    options = _native.pipeline.CoreOptions(
        buffer_size=buffer_size,
        num_threads=num_threads,
        max_failures=max_failures,
        stage_buffer_size=stage_buffer_size,
        autotune=autotune,
        max_memory_bytes=max_memory_bytes,
    )
    num_threads, stage_buffer_size = options.num_threads, options.stage_buffer_size
    ext = None
    if extensions:
        ext = Extensions(
            pipeline_id=_next_pipeline_id(),
            stage_id=stage_id,
            report_stats_interval=report_stats_interval,
            queue_class=queue_class,
            task_hook_factory=task_hook_factory,
            background_tasks=[*(_bg_task.get_default_background_tasks() or []), *(background_tasks or [])],
            num_threads=num_threads,
        )
        ext.continuous = True in _source_continuity(src)
    conv = _Conversion(
        num_threads=num_threads,
        max_failures=max_failures,
        report_stats_interval=report_stats_interval,
        stage_buffer_size=stage_buffer_size,
        ext=ext,
        region_step=region_step,
    )
    # Checkpointable sources: items carry their keys, ops pass them on (see _checkpoint.py).
    src, pipes, checkpoint = _checkpoint.instrument(src, pipes)
    try:
        source = _convert_source(src, conv)
        steps = conv.source_relays + _convert_steps(pipes, conv)
        if ext is not None:
            sink = ext.add_stage(ext.stage_info("sink"), "sink", hooked=False)
            steps += _relay_steps(sink, buffer_size, conv)
            conv.needs_loop |= ext.needs_loop
        loop = _EventLoop() if conv.needs_loop else None
        if ext is not None:
            ext.event_loop = loop
        core = _native.pipeline.PipelineCore(source, steps, options, bridge=loop.bridge if loop is not None else None)
    except BaseException:
        for r in conv.resources:
            r.close()
        raise
    return Pipeline(
        core,
        event_loop=loop,
        report_stats_interval=report_stats_interval,
        resources=conv.resources,
        extensions=ext,
        checkpoint=checkpoint,
    )


################################################################################
# Merge with a custom op (SPDL's `Merge(..., op=...)`), run in Python
################################################################################

_MERGE_QUEUE_SIZE = 2  # SPDL's queue size between stages
_POLL = 0.1  # seconds between checks for a stop while waiting

_ITEM, _EPOCH, _END, _ERROR = 0, 1, 2, 3


class _MergeStageInfo(str):
    """What a custom merge op gets as ``name``: ``"0:0:merge"`` as SPDL's ``StageInfo`` prints, with its
    ``pipeline_id``, ``stage_id``, ``stage_name`` and ``concurrency`` attributes."""

    pipeline_id = 0
    stage_id = "0"
    stage_name = "merge"
    concurrency = None

    def __new__(cls) -> _MergeStageInfo:
        return super().__new__(cls, "0:0:merge")


class _CustomMerge:
    """The source of a pipeline whose ``src`` is ``Merge(configs, op=op)``.

    Each input config is built as a pipeline of its own. On the first iteration a thread starts an event loop
    that pumps each input pipeline's items into an ``asyncio.Queue`` (its end as ``EOF``, its epoch ends as
    ``EPOCH_END``) and runs ``op(name, input_queues, output_queue)``; what the op puts in ``output_queue`` is
    what this iterable yields (one epoch per ``iter()`` for continuous sources). When the op returns, the
    input pipelines are stopped. An exception of the op or a failed input pipeline is raised by the
    iteration (a source failure of the enclosing pipeline).
    """

    def __init__(self, op: Any, configs: Sequence[Any], *, continuous: bool, conv: _Conversion) -> None:
        self._op = op
        self._continuous = continuous
        self._inputs = [
            _build(
                c.src,
                c.pipes,
                buffer_size=_MERGE_QUEUE_SIZE,
                num_threads=conv.num_threads,
                max_failures=conv.max_failures,
                report_stats_interval=conv.report_stats_interval,
                stage_buffer_size=conv.stage_buffer_size,
                extensions=False,
                region_step=conv.region_step,
            )
            for c in configs
        ]
        self._out: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=_MERGE_QUEUE_SIZE)
        self._stop = threading.Event()
        self._lock = threading.RLock()  # re-entrant: a finalizer (GC) may close this on a thread holding it
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[Any] | None = None
        self._ended = False

    # The source side (engine threads).

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="spdl_rs-merge", daemon=True)
                self._thread.start()
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        while not self._ended:
            try:
                kind, value = self._out.get(timeout=_POLL)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if kind == _ITEM:
                yield value
                del value
            elif kind == _EPOCH:
                if self._continuous:
                    return
            elif kind == _END:
                self._ended = True
            else:
                self._ended = True
                raise value

    # The merge thread.

    def _put(self, msg: tuple[int, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._out.put(msg, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            with self._lock:
                self._loop = loop
                if self._stop.is_set():
                    return
                self._main_task = loop.create_task(self._main())
            loop.run_until_complete(self._main_task)
            self._put((_END, None))
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # noqa: BLE001 (handed to the consumer)
            self._put((_ERROR, e))
        finally:
            for p in self._inputs:
                try:
                    p.stop()
                except Exception as e:  # noqa: BLE001 (already reported, or the pipeline is being stopped)
                    _LG.debug("merge input stopped with %r", e)
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:

        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=len(self._inputs) + 1, thread_name_prefix="spdl_rs-merge")
        in_qs: list[asyncio.Queue[Any]] = [asyncio.Queue(_MERGE_QUEUE_SIZE) for _ in self._inputs]
        out_q: asyncio.Queue[Any] = asyncio.Queue(_MERGE_QUEUE_SIZE)
        failed: list[BaseException] = []

        def next_of(p: Pipeline[Any]) -> tuple[int, Any]:
            while True:
                try:
                    return p._core.get_item(_POLL)
                except TimeoutError:
                    if self._stop.is_set():
                        return (2, None)

        async def pump(p: Pipeline[Any], q: asyncio.Queue[Any]) -> None:
            p.start()
            while True:
                kind, value = await loop.run_in_executor(executor, next_of, p)
                if kind == 0:
                    await q.put(value)
                    del value
                elif kind == 1:
                    await q.put(EPOCH_END)
                else:
                    # The end: raise the input's failure, if any, here.
                    await loop.run_in_executor(executor, p.stop)
                    await q.put(EOF)
                    return

        async def forward() -> None:
            while True:
                item = await out_q.get()
                try:
                    if is_epoch_end(item):
                        msg = (_EPOCH, None)
                    elif is_eof(item):
                        continue
                    else:
                        msg = (_ITEM, item)
                    del item
                    await loop.run_in_executor(executor, self._put, msg)
                    del msg
                finally:
                    out_q.task_done()

        def on_pump_done(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and task.exception() is not None:
                failed.append(task.exception())  # type: ignore[arg-type]
                op_task.cancel()

        pumps = [asyncio.ensure_future(pump(p, q)) for p, q in zip(self._inputs, in_qs)]
        forwarder = asyncio.ensure_future(forward())
        op_task = asyncio.ensure_future(self._op(_MergeStageInfo(), in_qs, out_q))
        for t in pumps:
            t.add_done_callback(on_pump_done)
        try:
            try:
                await op_task
            except asyncio.CancelledError:
                if not failed:
                    raise
            if failed:
                raise failed[0]
            await out_q.join()
        finally:
            for t in (*pumps, forwarder, op_task):
                t.cancel()
            await asyncio.gather(*pumps, forwarder, op_task, return_exceptions=True)
            executor.shutdown(wait=False, cancel_futures=True)

    # The pipeline's stop.

    def signal_stop(self) -> None:
        self._stop.set()
        with self._lock:
            loop, task = self._loop, self._main_task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        self.signal_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_FINALIZE_JOIN)
        for p in self._inputs:
            with contextlib.suppress(Exception):
                p.stop(timeout=_FINALIZE_JOIN)


_FINALIZE_JOIN = 5.0
