"""Pipeline definitions: ``spdl.pipeline.defs`` for the spdl-rs engine.

Describe a pipeline as data, then build it with :py:func:`spdl_rs.pipeline.build_pipeline`:

.. code-block:: python

    from spdl_rs.pipeline import build_pipeline
    from spdl_rs.pipeline.defs import Aggregate, Pipe, PipelineConfig, SinkConfig, SourceConfig

    cfg = PipelineConfig(
        src=SourceConfig(range(100)),
        pipes=[Pipe(lambda x: x * 2, concurrency=4), Aggregate(8)],
        sink=SinkConfig(buffer_size=3),
    )
    pipeline = build_pipeline(cfg, num_threads=4)
    with pipeline.auto_stop():
        batches = list(pipeline)

Covered: ``SourceConfig``, ``Merge``/``MergeConfig`` (several pipelines feeding one, with SPDL's custom
merge ``op``), ``Pipe``/``PipeConfig``, ``Aggregate``/``AggregateConfig`` (a size or an
:py:class:`Aggregator`), ``Collate``, ``Disaggregate``/``DisaggregateConfig``,
``PathVariants``/``PathVariantsConfig`` (routing items between alternative paths), the ``.to()`` placement
markers (``PlacementConfig`` with ``ProcessPoolExecutorConfig``, ``InterpreterPoolExecutorConfig`` or
``MAIN_PROCESS``), ``SinkConfig`` and ``PipelineConfig``.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Generic, TypeVar

from .. import _native
from ._op import _op_name

__all__ = [
    "MAIN_PROCESS",
    "Aggregate",
    "AggregateConfig",
    "Aggregator",
    "Collate",
    "Disaggregate",
    "DisaggregateConfig",
    "ExecutorConfig",
    "InterpreterPoolExecutorConfig",
    "Merge",
    "MergeConfig",
    "PathVariants",
    "PathVariantsConfig",
    "Pipe",
    "PipeConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ProcessPoolExecutorConfig",
    "SinkConfig",
    "SourceConfig",
]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class SourceConfig(Generic[T]):
    """The source: an iterable or an async iterable; ``continuous`` re-iterates it each epoch (see
    :py:meth:`spdl_rs.pipeline.PipelineBuilder.add_source`)."""

    source: Iterable[T] | AsyncIterable[T]
    continuous: bool = False

    def __post_init__(self) -> None:
        if not (hasattr(self.source, "__aiter__") or hasattr(self.source, "__iter__")):
            raise ValueError(f"source must be an iterable or an async iterable, got {type(self.source).__name__}")

    def __repr__(self) -> str:
        return f"SourceConfig(source=<{type(self.source).__name__}>, continuous={self.continuous})"


@dataclass(frozen=True)
class PipeConfig(Generic[T, U]):
    """One ``pipe`` stage; made by :py:func:`Pipe`."""

    name: str
    op: Callable[[T], U] | Any
    concurrency: int = 1
    executor: Executor | None = None
    output_order: str = "completion"
    max_failures: int | Fraction | None = None

    def __post_init__(self) -> None:
        if self.executor is not None:
            target = self.op if inspect.isfunction(self.op) or inspect.ismethod(self.op) else getattr(
                self.op, "__call__", self.op)
            if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
                # SPDL's words.
                raise ValueError("`executor` cannot be specified when op is async.")

    def __repr__(self) -> str:
        args = [f"concurrency={self.concurrency}"]
        if self.executor is not None:
            args.append(f"executor={self.executor!r}")
        if self.output_order == "input":
            args.append("output_order='input'")
        if getattr(self.op, "__code__", None) is not None:
            args.append(f"op={_describe_callable(self.op)}")
        return f"{self.name}({', '.join(args)})"


def Pipe(
    op: Callable[[T], U] | Any,
    /,
    *,
    concurrency: int = 1,
    executor: Executor | None = None,
    name: str | None = None,
    output_order: str = "completion",
    max_failures: int | Fraction | None = None,
) -> PipeConfig[T, U]:
    """A stage applying ``op`` (a function, async function, generator or async generator function, a container
    with ``__getitem__``, or a native op of :py:mod:`spdl_rs.io.ops`): the arguments of
    :py:meth:`spdl_rs.pipeline.PipelineBuilder.pipe`."""
    if output_order not in ("completion", "input"):
        raise ValueError(f'output_order must be "completion" or "input", got {output_order!r}')
    if not callable(op) and hasattr(op, "__getitem__"):
        op = op.__getitem__
    if not callable(op):
        raise TypeError(f"op must be callable (or a container with __getitem__), got {type(op).__name__}")
    return PipeConfig(
        name=name if name is not None else _op_name(op),
        op=op,
        concurrency=concurrency,
        executor=executor,
        output_order=output_order,
        max_failures=max_failures,
    )


class Aggregator(abc.ABC):
    """Custom aggregation, given to :py:func:`Aggregate` or :py:meth:`PipelineBuilder.aggregate
    <spdl_rs.pipeline.PipelineBuilder.aggregate>`.

    ``accumulate`` is called for every item, in arrival order and one call at a time; it returns an output
    when one is complete, else ``None``. ``flush`` is called at each epoch end and at the end of the input
    (with ``drop_last``, its result at an epoch end is discarded and it is not called at the end) and returns
    what is left, or ``None``. Both run on the pipeline's thread pool, holding the GIL only while they run.
    """

    @abc.abstractmethod
    def accumulate(self, item: Any) -> Any | None:
        """Takes one item; returns an output or ``None``."""

    @abc.abstractmethod
    def flush(self) -> Any | None:
        """Returns what is buffered (or ``None``) and empties the buffer."""


class Collate(Aggregator):
    """The aggregator of ``Aggregate(n)``: lists of ``n`` items. Run natively (without Python calls) when given
    as is; a subclass runs its own methods."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"the batch size must be a positive integer, got {n!r}")
        self.n = n
        self._vals: list[Any] = []

    def accumulate(self, item: Any) -> list[Any] | None:
        self._vals.append(item)
        if len(self._vals) >= self.n:
            ret, self._vals = self._vals, []
            return ret
        return None

    def flush(self) -> list[Any] | None:
        if self._vals:
            ret, self._vals = self._vals, []
            return ret
        return None

    def __repr__(self) -> str:
        return f"collate({self.n})"


@dataclass(frozen=True)
class AggregateConfig(Generic[T]):
    """An aggregation step; made by :py:func:`Aggregate`."""

    name: str
    op: Aggregator | Any
    drop_last: bool = False

    def __repr__(self) -> str:
        return self.name


def Aggregate(input: int | Aggregator, /, *, drop_last: bool = False) -> AggregateConfig[Any]:
    """Batches of ``input`` items (the last one of each epoch shorter unless ``drop_last``), or a custom
    :py:class:`Aggregator`."""
    op = Collate(input) if isinstance(input, int) and not isinstance(input, bool) else input
    _native.pipeline.check_aggregate(op)
    return AggregateConfig(name=f"aggregate(op={op!r}, drop_last={drop_last})", op=op, drop_last=drop_last)


@dataclass(frozen=True)
class DisaggregateConfig(Generic[T]):
    """A disaggregation step; made by :py:func:`Disaggregate`."""

    name: str = "disaggregate"

    def __repr__(self) -> str:
        return self.name or "disaggregate"


def Disaggregate() -> DisaggregateConfig[Any]:
    """Splits each item (a list, tuple or other iterable) into its elements."""
    return DisaggregateConfig()


@dataclass(frozen=True)
class SinkConfig(Generic[T]):
    """The output buffer: how many finished items wait for the consumer."""

    buffer_size: int

    def __post_init__(self) -> None:
        if not isinstance(self.buffer_size, int) or isinstance(self.buffer_size, bool):
            raise ValueError(f"buffer_size must be an int, got {type(self.buffer_size).__name__}")
        if self.buffer_size < 1:
            raise ValueError(f"buffer_size must be greater than 0, got {self.buffer_size}")


@dataclass(frozen=True)
class MergeConfig:
    """Several pipelines feeding one; made by :py:func:`Merge`.

    Each input pipeline runs its own source and steps (its sink is not used); their outputs become the
    source of the pipeline this config is the ``src`` of.
    """

    pipeline_configs: tuple[PipelineConfig[Any], ...]
    """The input pipelines."""

    op: Callable[..., Awaitable[None]] | None = None
    """A custom merge: ``async def op(name, input_queues, output_queue)`` (see :py:func:`Merge`); ``None``
    forwards items in the order they become available."""

    def __post_init__(self) -> None:
        if len(self.pipeline_configs) < 1:
            raise ValueError("MergeConfig must have at least one upstream pipeline configs.")

    def __repr__(self) -> str:
        lines = ["MergeConfig("]
        if self.op is not None:
            lines.append(f"  op={_describe_callable(self.op)}")
        for i, cfg in enumerate(self.pipeline_configs, 1):
            lines.append(f"  Pipeline {i}:")
            lines.extend(f"    {line}" for line in repr(cfg).split("\n"))
        lines.append(")")
        return "\n".join(lines)


def _describe_callable(fn: Any) -> str:
    """``name at file:line`` when the code is known, else the name."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__", None)
    if code is not None:
        return f"{name} at {code.co_filename}:{code.co_firstlineno}"
    return name


def Merge(
    pipeline_configs: Sequence[PipelineConfig[Any]], op: Callable[..., Awaitable[None]] | None = None
) -> MergeConfig:
    """Merges the outputs of several pipelines into one stream (SPDL's ``Merge``).

    Args:
        pipeline_configs: The input pipelines (at least one). Their sources must all be continuous or none.
        op: ``None`` (default): items are passed on in the order they become available, and with continuous
            sources an epoch ends once every input has ended it. Or a custom merge,
            ``async def op(name, input_queues, output_queue)``: ``input_queues`` holds one asyncio queue per
            input (each ends with an item for which :py:func:`spdl_rs.pipeline.is_eof` is true, and with
            continuous sources carries :py:data:`spdl_rs.pipeline.EPOCH_END` at each epoch's end);
            whatever the op ``await output_queue.put(...)``-s goes downstream (put ``EPOCH_END`` there to end an
            epoch). The op may return before its inputs end: the inputs are then stopped. It runs on an event
            loop of its own; an exception it raises fails the pipeline as a failing source does.

    Example:

    .. code-block:: python

        async def round_robin(name, input_queues, output_queue):
            active = list(input_queues)
            while active:
                for q in list(active):
                    item = await q.get()
                    if is_eof(item):
                        active.remove(q)
                    else:
                        await output_queue.put(item)

        cfg = PipelineConfig(src=Merge([cfg_a, cfg_b], op=round_robin), pipes=[], sink=SinkConfig(10))
    """
    return MergeConfig(tuple(pipeline_configs), op=op)


################################################################################
# Placement: where the stages after a `.to()` marker run
################################################################################


@dataclass(frozen=True)
class ExecutorConfig:
    """The description of a pool of workers for a ``.to()`` region (see :py:class:`ProcessPoolExecutorConfig`
    and :py:class:`InterpreterPoolExecutorConfig`); the pipeline starts and stops the pool itself."""

    max_workers: int | None = None
    """How many workers (``None``: the number of CPUs)."""

    initializer: Callable[..., object] | None = None
    """Called once in each worker, before it takes any item."""

    initargs: tuple[Any, ...] = ()
    """The arguments of ``initializer``."""


@dataclass(frozen=True)
class ProcessPoolExecutorConfig(ExecutorConfig):
    """Runs a ``.to()`` region in a pool of worker processes: each worker runs the region's stages as one
    nested pipeline, so only the region's inputs and outputs cross the process boundary (pickled); what one
    stage hands the next stays in the worker."""

    mp_context: str | None = None
    """The start method (``"fork"``, ``"spawn"``, ``"forkserver"``) as :py:func:`multiprocessing.get_context`
    takes it; ``None`` for the default."""


@dataclass(frozen=True)
class InterpreterPoolExecutorConfig(ExecutorConfig):
    """Runs a ``.to()`` region in a pool of subinterpreters (:py:mod:`concurrent.interpreters`) of this process.
    Needs CPython 3.14 or later; extension modules that do not support subinterpreters (NumPy, PyTorch)
    cannot be used in the region."""


@dataclass(frozen=True)
class _MainProcess:
    """The type of :py:data:`MAIN_PROCESS`; use that object."""

    def __repr__(self) -> str:
        return "MAIN_PROCESS"


MAIN_PROCESS: _MainProcess = _MainProcess()
"""The ``.to()`` target that closes a worker-pool region: the stages after it run in the main process."""


@dataclass(frozen=True)
class PlacementConfig:
    """A marker among :py:attr:`PipelineConfig.pipes` (what :py:meth:`PipelineBuilder.to
    <spdl_rs.pipeline.PipelineBuilder.to>` appends): the stages after it, up to the next marker, run on
    :py:attr:`target`."""

    target: ProcessPoolExecutorConfig | InterpreterPoolExecutorConfig | _MainProcess
    """Where the following stages run."""

    name: str = "placement"
    """The marker's name (for display)."""

    buffer_size: int = 1
    """At most this many items go in one transfer across the boundary at this marker: the marker opening a
    region sizes what goes into the workers, the one closing it what comes back. A partial transfer is sent
    at the end of the input and at each epoch's end; the stages on both sides still see single items."""

    def __repr__(self) -> str:
        extra = f", buffer_size={self.buffer_size}" if self.buffer_size != 1 else ""
        return f"{self.name}({self.target!r}{extra})"


################################################################################
# PathVariants
################################################################################


@dataclass(frozen=True)
class PathVariantsConfig(Generic[T]):
    """Routing between alternative paths; made by :py:func:`PathVariants`."""

    name: str
    """The stage's name."""

    router: Callable[[Any], Any]
    """Picks the path: ``router(item) -> int`` (``batched``: ``router(batch) -> sequence of int``, one per
    element); may be an async function."""

    paths: tuple[tuple[Any, ...], ...]
    """The paths: each a tuple of :py:class:`PipeConfig`, :py:class:`AggregateConfig`,
    :py:class:`DisaggregateConfig` or (nested) :py:class:`PathVariantsConfig`."""

    batched: bool = False
    """Route the elements of each incoming batch (a list) instead of whole items."""

    output_order: str = "completion"
    """(spdl_rs only) ``"completion"`` (SPDL's): outputs leave as each path produces them; ``"input"``: in the
    order of the inputs."""

    def __post_init__(self) -> None:
        if not callable(self.router):
            raise ValueError("router must be callable.")
        if len(self.paths) < 1:
            raise ValueError("PathVariantsConfig must have at least 1 path.")
        for i, path in enumerate(self.paths):
            if len(path) == 0:
                raise ValueError(f"Path {i} is empty. Each path must have at least one config.")
            for j, cfg in enumerate(path):
                if isinstance(cfg, SourceConfig):
                    raise ValueError(f"Path {i}, position {j}: SourceConfig is not allowed inside PathVariants paths.")
                if isinstance(cfg, SinkConfig):
                    raise ValueError(f"Path {i}, position {j}: SinkConfig is not allowed inside PathVariants paths.")
        if self.output_order not in ("completion", "input"):
            raise ValueError(f'output_order must be "completion" or "input", got {self.output_order!r}')

    def __repr__(self) -> str:
        paths = ", ".join(f"path{i}=[{', '.join(repr(c) for c in path)}]" for i, path in enumerate(self.paths))
        return f"PathVariants({paths})"


def PathVariants(
    router: Callable[[Any], Any],
    paths: Sequence[Sequence[Any]],
    name: str | None = None,
    batched: bool = False,
    *,
    output_order: str = "completion",
) -> PathVariantsConfig[Any]:
    """Sends each item down one of several paths, chosen by ``router``, and merges the paths' outputs into one
    stream (SPDL's ``PathVariants``).

    Args:
        router: ``router(item) -> int``, the index of the path (a sync or async function). With ``batched``,
            ``router(batch) -> sequence of int``: one index per element. A router that raises, or an index
            out of range, fails that item (logged, counted against the failure budgets).
        paths: The paths, each a non-empty sequence of :py:func:`Pipe`, :py:func:`Aggregate`,
            :py:func:`Disaggregate` or nested :py:func:`PathVariants` configs. Their stages show in the stats
            as ``"{name}[i]/{stage}"``.
        name: The stage's name (default ``"path_variants"``).
        batched: Each input is a batch (a list): it is split by the router's indices into one sub-list per path
            (order kept; a path gets an empty list when none of the batch's elements go to it), each path
            processes its list, and the results are concatenated back in path order into one batch (an empty
            result is dropped). Aggregate upstream of this stage.
        output_order: (spdl_rs only) ``"completion"`` (default, SPDL's) or ``"input"``.

    Example:

    .. code-block:: python

        PathVariants(lambda item: 0 if item in cache else 1, [[Pipe(read_cache)], [Pipe(load)]])
    """
    return PathVariantsConfig(
        name=name or "path_variants",
        router=router,
        paths=tuple(tuple(p) for p in paths),
        batched=batched,
        output_order=output_order,
    )


@dataclass(frozen=True)
class PipelineConfig(Generic[U]):
    """A whole pipeline: a source (or a :py:func:`Merge` of pipelines), the steps in order, and a sink; built by
    :py:func:`spdl_rs.pipeline.build_pipeline`."""

    src: SourceConfig[Any] | MergeConfig
    pipes: Sequence[
        PipeConfig[Any, Any]
        | AggregateConfig[Any]
        | DisaggregateConfig[Any]
        | PathVariantsConfig[Any]
        | PlacementConfig
    ] = field(default_factory=list)
    sink: SinkConfig[U] = field(default_factory=lambda: SinkConfig(3))

    def __repr__(self) -> str:
        lines = ["PipelineConfig"]
        if isinstance(self.src, MergeConfig):
            lines.append(" - Source:")
            lines.extend(f"   {line}" for line in repr(self.src).split("\n"))
        else:
            lines.append(f" - Source: {self.src!r}")
        if self.pipes:
            lines.append(" - Pipes:")
            lines.extend(f"   - {p!r}" for p in self.pipes)
        lines.append(f" - Sink: {self.sink!r}")
        return "\n".join(lines)
