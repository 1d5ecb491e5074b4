"""``PipelineBuilder``: the ``spdl.pipeline.PipelineBuilder`` API over the spdl-rs engine."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, Callable, Iterable
from concurrent.futures import Executor
from fractions import Fraction
from typing import Any, Generic, TypeVar

from .. import _native
from ._pipeline import Pipeline, _EventLoop

__all__ = ["PipelineBuilder", "build_pipeline"]

T = TypeVar("T")
U = TypeVar("U")

_I64 = (-(2**63), 2**63 - 1)

#: Default capacity of the queues between stages: SPDL's (``_BUFFER_SIZE``, fixed there).
_STAGE_BUFFER_SIZE = 2
#: The largest queue or batch size taken (queues allocate as they fill, so a large one costs nothing until
#: it holds items).
_MAX_SIZE = 2**48


def _check_size(what: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _MAX_SIZE:
        raise ValueError(f"{what} must be an integer in [{minimum}, 2**48], got {value!r}")


def _budget(max_failures: int | Fraction | None, what: str) -> tuple[str, Any] | None:
    """``None``/-1: unlimited; an int n >= 0: stop after more than n failures; a Fraction in (0, 1]: stop when
    more than that share of the calls failed (judged after 100 calls)."""
    if max_failures is None:
        return None
    if isinstance(max_failures, bool):
        raise TypeError(f"{what} must be an int or a fractions.Fraction, got a bool")
    if isinstance(max_failures, Fraction):
        if not (0 < max_failures <= 1):
            raise ValueError(f"{what} as a Fraction must be in (0, 1], got {max_failures}")
        return ("fraction", float(max_failures))
    if isinstance(max_failures, int):
        if max_failures == -1:
            return None
        if max_failures < 0:
            raise ValueError(f"{what} must be -1 (unlimited) or >= 0, got {max_failures}")
        return ("count", max_failures)
    raise TypeError(f"{what} must be an int or a fractions.Fraction, got {type(max_failures).__name__}")


def _op_kind(op: Any) -> tuple[str, Any]:
    """How the engine calls ``op``: ``native``, ``asyncgen``, ``async``, ``gen`` or ``sync``."""
    if isinstance(op, _native.NativeOp):
        return "native", op
    if not callable(op):
        if hasattr(op, "__getitem__"):  # a dict, list, ... : look the item up
            return "sync", op.__getitem__
        raise TypeError(f"op must be callable (or a container with __getitem__), got {type(op).__name__}")
    call = op if inspect.isfunction(op) or inspect.ismethod(op) else getattr(op, "__call__", op)
    for target in (op, call):
        if inspect.isasyncgenfunction(target):
            return "asyncgen", op
        if inspect.iscoroutinefunction(target):
            return "async", op
        if inspect.isgeneratorfunction(target):
            return "gen", op
    return "sync", op


def _in_executor(kind: str, fn: Any, executor: Any) -> tuple[str, Any]:
    """A sync op made into an async one that runs each call in ``executor`` (``pipe(..., executor=...)``)."""
    if not callable(getattr(executor, "submit", None)):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}")
    if kind != "sync":
        what = {"native": "a native op", "gen": "a generator function", "async": "an async function",
                "asyncgen": "an async generator function"}.get(kind, kind)
        raise ValueError(
            f"executor applies to sync functions only; this op is {what} (native ops run without the GIL on the "
            "pipeline's threads, async ones on its event loop)"
        )

    async def call_in_executor(item: Any) -> Any:
        return await asyncio.wrap_future(executor.submit(fn, item))

    return "async", call_in_executor


def _op_name(op: Any) -> str:
    for attr in ("name", "__name__"):
        n = getattr(op, attr, None)
        if isinstance(n, str):
            return n
    func = getattr(op, "func", None)  # functools.partial
    if func is not None:
        return _op_name(func)
    return type(op).__name__


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
        self._source: tuple[Any, ...] | None = None
        self._steps: list[tuple[Any, ...]] = []
        self._sink: int | None = None
        self._needs_loop = False

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
        if self._source is not None:
            raise ValueError("Source is already set.")
        if hasattr(source, "__aiter__"):
            if continuous:
                raise ValueError("continuous=True needs a sync iterable (an async iterator cannot be restarted)")
            self._source = ("aiter", source)
            self._needs_loop = True
        elif isinstance(source, range) and not continuous and all(
            _I64[0] <= v <= _I64[1] for v in (source.start, source.stop, source.step)
        ):
            self._source = ("range", source.start, source.stop, source.step)
        elif isinstance(source, (list, tuple)) and not continuous:
            self._source = ("list", source)
        elif hasattr(source, "__iter__"):
            self._source = ("iter", source, bool(continuous))
        else:
            raise TypeError(f"source must be an iterable or an async iterable, got {type(source).__name__}")
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
            concurrency: Items processed at the same time.
            executor: ``None`` (sync ops run on the pipeline's own thread pool, without an event loop), or a
                ``concurrent.futures`` executor to run a sync ``op`` in instead, as SPDL does (e.g. a
                ``ProcessPoolExecutor`` for GIL-bound Python code; ``op`` and items must then pickle). Each call
                is awaited on the pipeline's event loop, ``concurrency`` at a time.
            name: The stage's name in stats, logs and errors (default: the op's name).
            output_order: ``"completion"`` (as soon as each is done) or ``"input"`` (in input order).
            max_failures: This stage's failure budget: an int (count) or a ``Fraction`` in (0, 1] (rate, judged
                after 100 calls); ``None`` for none of its own.
        """
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        if output_order not in ("completion", "input"):
            raise ValueError(f'output_order must be "completion" or "input", got {output_order!r}')
        kind, fn = _op_kind(op)
        if executor is not None:
            kind, fn = _in_executor(kind, fn, executor)
        if kind in ("async", "asyncgen"):
            self._needs_loop = True
        stage = name if name is not None else _op_name(op)
        self._steps.append(("pipe", stage, kind, fn, concurrency, output_order, _budget(max_failures, "max_failures")))
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
        from .defs import _aggregator_step

        self._steps.append(_aggregator_step(num_items, bool(drop_last)))
        return self

    def disaggregate(self) -> PipelineBuilder[T, U]:
        """Splits each item (a list, tuple or other iterable) into its elements."""
        self._steps.append(("disaggregate",))
        return self

    def path_variants(self, *_args: Any, **_kwargs: Any) -> PipelineBuilder[T, U]:
        """SPDL's routing of items between alternative paths: not supported by spdl_rs (raises
        ``NotImplementedError``); branch inside one op instead."""
        raise NotImplementedError(
            "PipelineBuilder.path_variants is not supported by spdl_rs: branch inside one op (a function that "
            "dispatches on the item) instead"
        )

    def to(self, *_args: Any, **_kwargs: Any) -> PipelineBuilder[T, U]:
        """SPDL's placement of the following stages in a subprocess or subinterpreter: not supported by spdl_rs
        (raises ``NotImplementedError``)."""
        raise NotImplementedError(
            "PipelineBuilder.to is not supported by spdl_rs: native ops (spdl_rs.io.ops) already run without the "
            "GIL; for GIL-bound Python code pass executor=ProcessPoolExecutor(...) to pipe()"
        )

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder[T, U]:
        """Sets the output buffer: how many finished items wait for the consumer (0: a large buffer)."""
        if self._sink is not None:
            raise ValueError("Sink is already set.")
        _check_size("buffer_size", buffer_size, minimum=0)
        self._sink = buffer_size
        return self

    def build(
        self,
        *,
        num_threads: int,
        max_failures: int | Fraction = -1,
        report_stats_interval: float = -1,
        stage_buffer_size: int = _STAGE_BUFFER_SIZE,
        **spdl_only: Any,
    ) -> Pipeline[U]:
        """Builds the pipeline (it starts on the first ``get_item``, or with ``start``/``auto_stop``).

        Args:
            num_threads: Threads of the pool that runs the source and the sync and native ops.
            max_failures: The whole pipeline's failure budget, over all stages: an int (count; -1 for none)
                or a ``Fraction`` in (0, 1] (rate, judged after 100 calls).
            report_stats_interval: Log the stats table through ``logging`` (logger ``spdl_rs.pipeline``, level
                INFO) this often, in seconds, and once at the end; -1 for never.
            stage_buffer_size: (spdl_rs only) Capacity of each queue between two stages, in items (batches
                after an ``aggregate``); SPDL's is fixed at 2, the default. Items alive at once are bounded by
                about ``sum over stages of (stage_buffer_size + concurrency + 1)`` plus the sink's
                ``buffer_size`` (each counting batches as one item after an ``aggregate``, plus the batch being
                filled). Larger values cost memory and gain throughput for trivial ops (fewer thread wake-ups
                per item).
            spdl_only: SPDL's ``stage_id`` and ``use_thread_output_queue`` are accepted and ignored;
                ``queue_class``, ``task_hook_factory`` and ``background_tasks`` hook into SPDL's asyncio
                internals and raise ``TypeError`` unless ``None``.
        """
        _check_spdl_only("build", spdl_only)
        if self._source is None:
            raise RuntimeError("Source is not set.")
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        _check_size("stage_buffer_size", stage_buffer_size, minimum=1)
        source = self._source
        if source[0] == "aiter":
            source = ("aiter", source[1].__aiter__())
        loop = _EventLoop() if self._needs_loop else None
        core = _native.PipelineCore(
            source,
            list(self._steps),
            buffer_size=3 if self._sink is None else self._sink,
            num_threads=num_threads,
            max_failures=_budget(max_failures, "max_failures"),
            bridge=loop.bridge if loop is not None else None,
            stage_buffer_size=stage_buffer_size,
        )
        return Pipeline(core, event_loop=loop, report_stats_interval=report_stats_interval)


_SPDL_IGNORED = ("stage_id", "use_thread_output_queue")
_SPDL_HOOKS = ("queue_class", "task_hook_factory", "background_tasks")


def _check_spdl_only(func: str, kwargs: dict[str, Any]) -> None:
    """SPDL's ``build`` keywords without a counterpart: ignored ones pass, its asyncio hooks must be ``None``,
    anything else is a ``TypeError`` as for any unknown keyword."""
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
    stage_buffer_size: int = _STAGE_BUFFER_SIZE,
    **spdl_only: Any,
) -> Pipeline[Any]:
    """Builds a :py:class:`Pipeline` from a :py:class:`spdl_rs.pipeline.defs.PipelineConfig` (SPDL's
    ``spdl.pipeline.build_pipeline``); the keywords are those of :py:meth:`PipelineBuilder.build`.

    SPDL's ``queue_class``, ``task_hook_factory`` and ``background_tasks`` hook into its asyncio internals and
    have no counterpart here: passing one raises ``TypeError``; ``stage_id`` and ``use_thread_output_queue``
    are accepted and ignored.
    """
    from . import defs

    _check_spdl_only("build_pipeline", spdl_only)
    if not isinstance(pipeline_cfg, defs.PipelineConfig):
        raise TypeError(f"build_pipeline needs a spdl_rs.pipeline.defs.PipelineConfig, got {type(pipeline_cfg).__name__}")
    src = pipeline_cfg.src
    if not isinstance(src, defs.SourceConfig):
        raise NotImplementedError(f"build_pipeline: a {type(src).__name__} source is not supported; use SourceConfig")
    builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(src.source, continuous=src.continuous)
    for step in pipeline_cfg.pipes:
        if isinstance(step, defs.PipeConfig):
            builder.pipe(
                step.op,
                concurrency=step.concurrency,
                executor=step.executor,
                name=step.name,
                output_order=step.output_order,
                max_failures=step.max_failures,
            )
        elif isinstance(step, defs.AggregateConfig):
            builder.aggregate(step.op, drop_last=step.drop_last)
        elif isinstance(step, defs.DisaggregateConfig):
            builder.disaggregate()
        else:
            raise NotImplementedError(
                f"build_pipeline: a {type(step).__name__} step is not supported (Pipe, Aggregate and Disaggregate are)"
            )
    builder.add_sink(pipeline_cfg.sink.buffer_size)
    return builder.build(
        num_threads=num_threads,
        max_failures=max_failures,
        report_stats_interval=report_stats_interval,
        stage_buffer_size=stage_buffer_size,
    )
