"""``PipelineBuilder`` and ``build_pipeline``: the ``spdl.pipeline`` API over the spdl-rs engine.

The public layer of the build: it checks the builder's calls, runs diagnostic mode (:py:mod:`._profile`) and
the build callback, and hands the config to the core build (:py:mod:`._core`) with ``.to()`` regions made by
:py:mod:`._region`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from fractions import Fraction
from typing import Any, Generic, TypeVar

from .. import _native
from . import _profile, _region, defs
from ._bg_task import BackgroundTaskFactory
from ._core import (
    _STAGE_BUFFER_SIZE,
    _build,
    _check_buffer_size,
    _Conversion,
    _convert_step,
    _pipe_config,
)
from ._hooks import StageInfo, TaskHook
from ._op import _op_name
from ._pipeline import Pipeline
from ._queues import AsyncQueue

__all__ = ["PipelineBuilder", "build_pipeline"]

_LG = logging.getLogger("spdl_rs.pipeline")

T = TypeVar("T")
U = TypeVar("U")


def _config_of(src: Any, pipes: Sequence[Any], buffer_size: int) -> Any:
    """The ``PipelineConfig`` of a builder's parts (what SPDL's ``build`` hands the build callback)."""

    sink = defs.SinkConfig(buffer_size) if buffer_size > 0 else _UnboundedSink()
    return defs.PipelineConfig(src=src, pipes=list(pipes), sink=sink)


def _run_build_callback(cfg: Any) -> None:
    """Calls the default build callback (``config.set_default_build_callback``), logging its failure."""
    callback = _DEFAULT_BUILD_CALLBACK
    if callback is None:
        return
    try:
        callback(cfg)
    except Exception:
        _LG.exception("Build callback failed.")


_DEFAULT_BUILD_CALLBACK: Callable[[Any], None] | None = None


def get_default_build_callback() -> Callable[[Any], None] | None:
    """The function called with each ``PipelineConfig`` before it is built (``None`` when unset)."""
    return _DEFAULT_BUILD_CALLBACK


def set_default_build_callback(callback: Callable[[Any], None] | None) -> None:
    """Sets a function called with the ``PipelineConfig`` of every pipeline about to be built (by
    :py:func:`build_pipeline` and :py:meth:`PipelineBuilder.build`); its failure is logged, not raised.

    Args:
        callback: The function, or ``None`` to unset.
    """
    global _DEFAULT_BUILD_CALLBACK
    _DEFAULT_BUILD_CALLBACK = callback


class PipelineBuilder(Generic[T, U]):
    """Builds a :py:class:`Pipeline`: a source, stages, and a sink.

    The same calls as ``spdl.pipeline.PipelineBuilder``, so that switching is an import change:

    .. code-block:: python

        from spdl_rs.pipeline import PipelineBuilder

        pipeline = (
            PipelineBuilder()
            .add_source(range(1000))
            .pipe(lambda x: x * 2, concurrency=4)
            .aggregate(32)
            .add_sink(3)
            .build(num_threads=4)
        )
        with pipeline.auto_stop():
            for batch in pipeline:
                ...

    Sync ops run on the pipeline's Rust thread pool and hold the GIL only while Python code runs; async ops
    run on an asyncio loop the pipeline owns; native ops (``spdl_rs.io.ops``) never take the GIL.
    """

    def __init__(self) -> None:
        self._src: Any = None
        self._pipes: list[Any] = []
        self._sink: int | None = None

    def add_source(self, source: Iterable[T] | AsyncIterable[T], *, continuous: bool = False) -> PipelineBuilder[T, U]:
        """Sets the source: an iterable or an async iterable.

        A ``list``, ``tuple`` or ``range`` is taken into Rust at build time and iterated without the GIL; any
        other iterable is iterated lazily (a few items per GIL acquisition) on the pipeline's thread pool.

        Args:
            source: The items.
            continuous: Iterate the source again after its end, forever; each end of an epoch ends the
                current :py:meth:`Pipeline.get_iterator` (``get_item`` raises ``EOFError``). Not for async
                iterables.
        """

        if self._src is not None:
            raise ValueError("Source is already set.")
        _native.pipeline.check_source(source, continuous)
        self._src = defs.SourceConfig(source, continuous=bool(continuous))
        return self

    def pipe(
        self,
        op: Callable[[Any], Any] | Any,
        /,
        *,
        concurrency: int = 1,
        executor: Executor | None = None,
        name: str | None = None,
        output_order: str = "completion",
        max_failures: int | Fraction | None = None,
    ) -> PipelineBuilder[T, U]:
        """Adds a stage that applies ``op`` to each item.

        Args:
            op: A function, an async function, a generator function or an async generator function (each
                yielded value is an output), a container with ``__getitem__``, or a native op from
                :py:mod:`spdl_rs.io.ops`. A result of ``None`` is dropped. An exception drops that item and
                is logged with its traceback.
            concurrency: Items processed at the same time (in a ``.to()`` region: within each worker).
            executor: ``None`` (sync ops run on the pipeline's own thread pool, without an event loop), or a
                ``concurrent.futures`` executor to run a sync ``op`` in instead, as SPDL does (e.g. a
                ``ProcessPoolExecutor`` for GIL-bound Python code; ``op`` and items must then pickle). Each call
                is awaited on the pipeline's event loop, ``concurrency`` at a time. Ignored inside a ``.to()``
                region (the op runs on the worker's own threads).
            name: The stage's name in stats, logs and errors (default: the op's name).
            output_order: ``"completion"`` (as soon as each is done) or ``"input"`` (in input order).
            max_failures: This stage's failure budget: an int (count; -1: unlimited) or a ``Fraction`` in (0, 1]
                (rate, judged after 100 calls). As in SPDL it replaces ``build``'s ``max_failures`` for this
                stage (whose failures still count towards that total); ``None``: ``build``'s judges it.
        """

        if not callable(op) and hasattr(op, "__getitem__"):
            op = op.__getitem__
        cfg = defs.PipeConfig(
            name=name if name is not None else _op_name(op),
            op=op,
            concurrency=concurrency,
            executor=executor,
            output_order=output_order,
            max_failures=max_failures,
        )
        _pipe_config(cfg)  # validates
        self._pipes.append(cfg)
        return self

    def aggregate(self, num_items: int | Any, /, *, drop_last: bool = False) -> PipelineBuilder[T, U]:
        """Groups items into lists of ``num_items`` (the last one of each epoch shorter unless ``drop_last``), or
        runs a custom aggregator.

        Args:
            num_items: The batch size, or an aggregator: an object with ``accumulate(item)`` and ``flush()``
                (:py:class:`spdl_rs.pipeline.defs.Aggregator`, or SPDL's), each returning an output or
                ``None`` for none. ``accumulate`` is called for every item in arrival order, one call at a time;
                ``flush`` at each epoch end and at the end of the input. An exception fails that call (logged,
                counted against ``build``'s ``max_failures``).
            drop_last: Drop the incomplete last batch; for an aggregator, ``flush``'s result at an epoch end
                is discarded and ``flush`` is not called at the end of the input.
        """

        _native.pipeline.check_aggregate(num_items)
        op = defs.Collate(num_items) if isinstance(num_items, int) and not isinstance(num_items, bool) else num_items
        self._pipes.append(
            defs.AggregateConfig(
                name=f"aggregate(op={op!r}, drop_last={bool(drop_last)})", op=op, drop_last=bool(drop_last)
            )
        )
        return self

    def disaggregate(self) -> PipelineBuilder[T, U]:
        """Splits each item (a list, tuple or other iterable) into its elements."""

        self._pipes.append(defs.Disaggregate())
        return self

    def path_variants(
        self,
        router: Callable[[Any], Any],
        paths: Sequence[Sequence[Any]],
        name: str | None = None,
        batched: bool = False,
        *,
        output_order: str = "completion",
    ) -> PipelineBuilder[T, U]:
        """Sends each item down one of several paths, chosen by ``router``, and merges the paths' outputs.

        Args:
            router: ``router(item) -> int``, the path's index (sync or async). With ``batched``,
                ``router(batch) -> sequence of int``, one index per element. A router exception or an index out
                of range fails the pipeline (``PipelineFailure``), as in SPDL, whatever ``max_failures``.
            paths: Each path a non-empty sequence of :py:func:`~spdl_rs.pipeline.defs.Pipe`,
                :py:func:`~spdl_rs.pipeline.defs.Aggregate`, :py:func:`~spdl_rs.pipeline.defs.Disaggregate` or
                nested :py:func:`~spdl_rs.pipeline.defs.PathVariants` configs; their stages show in the stats as
                ``"{name}[i]/{stage}"``.
            name: The stage's name (default ``"path_variants"``).
            batched: Route the elements of each incoming batch (a list): each path gets one (possibly empty)
                sub-list per batch, and the paths' results are concatenated back, in path order, into one batch
                (an empty one is dropped). See :py:func:`spdl_rs.pipeline.defs.PathVariants`.
            output_order: (spdl_rs only) ``"completion"`` (default, SPDL's) or ``"input"``.
        """

        cfg = defs.PathVariants(router, paths, name=name, batched=batched, output_order=output_order)
        _convert_step(
            cfg, _Conversion(num_threads=1, max_failures=-1, report_stats_interval=-1, stage_buffer_size=_STAGE_BUFFER_SIZE)
        )  # validates
        self._pipes.append(cfg)
        return self

    def to(self, target: Any, /, *, buffer_size: int = 1) -> PipelineBuilder[T, U]:
        """Sets where the stages added after this call run, up to the next ``to``.

        ``to(ProcessPoolExecutorConfig(...))`` (or ``InterpreterPoolExecutorConfig``, CPython 3.14+) opens a
        region and ``to(MAIN_PROCESS)`` closes it. The region's stages (pipes, aggregates, disaggregates,
        path variants) run together as one nested pipeline in each of the pool's workers: only the items
        entering and leaving the region cross the boundary (pickled), what one stage hands the next stays in
        the worker. Inputs are spread over the workers, so outputs come in completion order. Each stage's
        ``concurrency`` applies within each worker. The pool is started on the first item, kept across
        epochs, and shut down when the pipeline stops. A worker that dies fails the epoch (a failure of the
        region's stage), and the pool is restarted for the next one; with ``build(max_failures=0)`` a
        failure inside a worker fails the pipeline (otherwise it is logged by the worker, as in SPDL).

        Args:
            target: ``ProcessPoolExecutorConfig``, ``InterpreterPoolExecutorConfig`` or ``MAIN_PROCESS``.
            buffer_size: At most this many items per transfer at this marker (into the workers for the
                marker opening a region, back out for the one closing it). A partial transfer is sent at the
                end of the input and of each epoch; stages still see single items.
        """

        if isinstance(target, Executor):
            raise TypeError(
                "`to()` takes a serializable execution target (ProcessPoolExecutorConfig, "
                "InterpreterPoolExecutorConfig, or MAIN_PROCESS), not a live Executor. To run a single stage on a "
                "custom executor, pass it to `pipe(executor=...)` instead."
            )
        if not isinstance(
            target, (defs.ProcessPoolExecutorConfig, defs.InterpreterPoolExecutorConfig, defs._MainProcess)
        ):
            raise TypeError(
                "`to()` target must be a ProcessPoolExecutorConfig, InterpreterPoolExecutorConfig, or MAIN_PROCESS. "
                f"Got: {type(target).__name__}."
            )
        _check_buffer_size(buffer_size)
        self._pipes.append(defs.PlacementConfig(target=target, buffer_size=buffer_size))
        return self

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder[T, U]:
        """Sets the output buffer: how many finished items wait for the consumer (0: a large buffer)."""
        if self._sink is not None:
            raise ValueError("Sink is already set.")
        _native._check_pipeline_size("buffer_size", buffer_size, 0)
        self._sink = buffer_size
        return self

    def get_config(self) -> Any:
        """The pipeline as a :py:class:`spdl_rs.pipeline.defs.PipelineConfig` (for
        :py:func:`build_pipeline`).

        Raises:
            RuntimeError: The source or the sink is not set, or a subinterpreter region is used before
                CPython 3.14.
            ValueError: A ``to()`` region is empty, holds an ``output_order="input"`` stage, or is not
                closed with ``to(MAIN_PROCESS)``.
        """

        if self._src is None:
            raise RuntimeError("Source is not set. Did you call `add_source`?")
        if self._sink is None:
            raise RuntimeError("Sink is not set. Did you call `add_sink`?")
        _native.pipeline.check_regions(self._pipes)
        # SinkConfig needs a positive size; 0 (a large buffer) is spdl_rs's own and kept as such.
        sink = defs.SinkConfig(self._sink) if self._sink > 0 else _UnboundedSink()
        return defs.PipelineConfig(src=self._src, pipes=list(self._pipes), sink=sink)

    def build(
        self,
        *,
        num_threads: int,
        max_failures: int | Fraction = -1,
        report_stats_interval: float = -1,
        queue_class: type[AsyncQueue] | None = None,
        task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
        stage_id: int = 0,
        use_thread_output_queue: bool = False,
        stage_buffer_size: int = _STAGE_BUFFER_SIZE,
        autotune: bool = False,
        max_memory_bytes: int | None = None,
    ) -> Pipeline[U]:
        """Builds the pipeline (it starts on the first ``get_item``, or with ``start``/``auto_stop``).

        Args:
            num_threads: Threads of the pool that runs the source and the sync and native ops.
            max_failures: The whole pipeline's failure budget, over all stages: an int (count; -1 for none)
                or a ``Fraction`` in (0, 1] (rate, judged after 100 calls). 0 also applies inside ``to()``
                regions' workers (as in SPDL).
            report_stats_interval: Log the stats table through ``logging`` (logger ``spdl_rs.pipeline``, level
                INFO) this often, in seconds, and once at the end; -1 for never. Also given to a custom default
                hook class or queue class as ``interval``.
            queue_class: A subclass of :py:class:`~spdl_rs.pipeline.AsyncQueue` to connect the stages with
                (one instance per connection, called as ``queue_class(info, buffer_size=n)``); every item goes
                through its ``put`` and ``get`` on the pipeline's event loop. ``None``: the default queue class
                (:py:class:`~spdl_rs.pipeline.StatsQueue`, served by the engine's native queues).
            task_hook_factory: ``factory(stage_info) -> list of TaskHook`` for each pipe, aggregate and
                disaggregate stage; a stage with hooks runs its op inside them on the event loop. ``None``: the
                default hook class (:py:class:`~spdl_rs.pipeline.TaskStatsHook`, served by the engine's own
                stats). A factory that returns ``[]`` disables hooks.
            stage_id: The id of the first stage in stage names (``StageInfo``).
            use_thread_output_queue: Accepted for SPDL compatibility; the engine's output queue is already a
                thread-safe queue read without the event loop.
            stage_buffer_size: (spdl_rs only) Capacity of each queue between two stages, in items (batches
                after an ``aggregate``); SPDL's is fixed at 2, the default. Items alive at once are bounded by
                about ``sum over stages of (stage_buffer_size + concurrency + 1)`` plus the sink's
                ``buffer_size`` (each counting batches as one item after an ``aggregate``, plus the batch being
                filled). Larger values cost memory and gain throughput for trivial ops (fewer thread wake-ups
                per item).
            autotune: (spdl_rs only) Tune the pipeline while it runs: the concurrency of every ``pipe``
                left at its default (1) is raised while throughput improves and lowered where it does not pay
                (within 1..=4x the cores for sync ops, 1..=256 for async ones), and the pool grows with it;
                the controller then settles, and probes again only when throughput moves by more than 20%.
                Stages given a ``concurrency`` stay as set. Each change is logged and shown in the stats
                (``concurrency``, ``tune_reason``), in ``Pipeline.autotune_decisions()`` and in
                ``Pipeline.autotune_report()`` (when it settled, the pool's threads, the memory budget).
            max_memory_bytes: (spdl_rs only) The auto-tuner's memory budget, in bytes (``None``: half of the
                memory available when the pipeline starts). Before it raises a stage's concurrency or grows a
                queue, it counts each tuned stage's calls in flight and queued items at the size the stage's
                items are measured at (``StageStats.item_bytes``, sampled from its outputs), and it lowers
                what it raised when the process's resident memory goes over the budget.
        """
        del use_thread_output_queue
        if self._src is None:
            raise RuntimeError("Source is not set.")
        _native.pipeline.check_regions(self._pipes)
        sink_size = 3 if self._sink is None else self._sink
        return _build_with_defaults(
            _config_of(self._src, self._pipes, sink_size),
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_class=queue_class,
            task_hook_factory=task_hook_factory,
            stage_id=stage_id,
            background_tasks=None,
            stage_buffer_size=stage_buffer_size,
            autotune=autotune,
            max_memory_bytes=max_memory_bytes,
        )


def _build_with_defaults(
    cfg: Any,
    *,
    num_threads: int,
    max_failures: Any,
    report_stats_interval: float,
    queue_class: Any,
    task_hook_factory: Any,
    stage_id: int,
    background_tasks: Any,
    stage_buffer_size: int,
    autotune: bool = False,
    max_memory_bytes: int | None = None,
) -> Pipeline[Any]:
    """SPDL's ``build_pipeline`` path: diagnostic mode, the build callback, then the build."""

    if _profile.is_diagnostic_mode_enabled():
        return _profile._build_pipeline_diagnostic_mode(cfg)
    _run_build_callback(cfg)
    return _build(
        cfg.src,
        cfg.pipes,
        buffer_size=cfg.sink.buffer_size,
        num_threads=num_threads,
        max_failures=max_failures,
        report_stats_interval=report_stats_interval,
        stage_buffer_size=stage_buffer_size,
        queue_class=queue_class,
        task_hook_factory=task_hook_factory,
        background_tasks=background_tasks,
        stage_id=stage_id,
        autotune=autotune,
        max_memory_bytes=max_memory_bytes,
        region_step=_region.region_step,
    )


class _UnboundedSink:
    """The sink of ``add_sink(0)`` in a config: SPDL's ``SinkConfig`` refuses 0."""

    buffer_size = 0

    def __repr__(self) -> str:
        return "SinkConfig(buffer_size=0)"


_SPDL_IGNORED = ("stage_id", "use_thread_output_queue")
_SPDL_HOOKS = ("queue_class", "task_hook_factory", "background_tasks")


def _check_spdl_only(func: str, kwargs: dict[str, Any]) -> None:
    """For entry points that do not take hooks (``run_pipeline_in_subprocess``, ...): SPDL's ignored keywords
    pass, its hook keywords must be ``None``, anything else is a ``TypeError`` as for any unknown keyword."""
    unknown = sorted(k for k in kwargs if k not in _SPDL_IGNORED + _SPDL_HOOKS)
    if unknown:
        raise TypeError(f"{func}() got unexpected keyword arguments: {', '.join(unknown)}")
    hooks = sorted(k for k in _SPDL_HOOKS if kwargs.get(k) is not None)
    if hooks:
        raise TypeError(
            f"{func}: {', '.join(hooks)} not supported by spdl_rs (SPDL's asyncio hooks); stats are in "
            "Pipeline.get_stats() and report_stats_interval"
        )


def build_pipeline(
    pipeline_cfg: Any,
    /,
    *,
    num_threads: int,
    max_failures: int | Fraction = -1,
    report_stats_interval: float = -1,
    queue_class: type[AsyncQueue] | None = None,
    task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
    stage_id: int = 0,
    background_tasks: list[BackgroundTaskFactory] | None = None,
    use_thread_output_queue: bool = False,
    stage_buffer_size: int = _STAGE_BUFFER_SIZE,
) -> Pipeline[Any]:
    """Builds a :py:class:`Pipeline` from a :py:class:`spdl_rs.pipeline.defs.PipelineConfig` (SPDL's
    ``spdl.pipeline.build_pipeline``); the keywords are those of :py:meth:`PipelineBuilder.build`, plus
    ``background_tasks``.

    The source is a ``SourceConfig`` or a ``Merge`` of pipelines; the pipes may hold ``PathVariants`` and
    ``PlacementConfig`` markers (``.to()`` regions).

    With ``SPDL_PIPELINE_DIAGNOSTIC_MODE=1`` in the environment, the pipeline returned profiles each stage
    (:py:func:`~spdl_rs.pipeline.profile_pipeline`) on its first item and exits the program.

    Args:
        background_tasks: :py:class:`~spdl_rs.pipeline.BackgroundTaskFactory` callables (after the defaults of
            :py:func:`spdl_rs.pipeline.config.set_default_background_tasks`); each task's ``run()`` runs on the
            pipeline's event loop while the pipeline runs, and is cancelled when it ends. Failures are logged.
    """

    del use_thread_output_queue
    if not isinstance(pipeline_cfg, defs.PipelineConfig):
        raise TypeError(
            f"build_pipeline needs a spdl_rs.pipeline.defs.PipelineConfig, got {type(pipeline_cfg).__name__}"
        )
    return _build_with_defaults(
        pipeline_cfg,
        num_threads=num_threads,
        max_failures=max_failures,
        report_stats_interval=report_stats_interval,
        queue_class=queue_class,
        task_hook_factory=task_hook_factory,
        stage_id=stage_id,
        background_tasks=background_tasks,
        stage_buffer_size=stage_buffer_size,
    )
