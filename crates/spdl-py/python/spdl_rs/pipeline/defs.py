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

Covered: ``SourceConfig``, ``Pipe``/``PipeConfig``, ``Aggregate``/``AggregateConfig`` (a size or an
:py:class:`Aggregator`), ``Collate``, ``Disaggregate``/``DisaggregateConfig``, ``SinkConfig`` and
``PipelineConfig``. SPDL's ``Merge``, ``PathVariants`` and subprocess/interpreter placements are not:
they raise ``NotImplementedError`` naming the alternative.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Generic, TypeVar

from ._builder import _op_name

__all__ = [
    "Aggregate",
    "AggregateConfig",
    "Aggregator",
    "Collate",
    "Disaggregate",
    "DisaggregateConfig",
    "Merge",
    "PathVariants",
    "Pipe",
    "PipeConfig",
    "PipelineConfig",
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


def _aggregator_step(op: Any, drop_last: bool) -> tuple[Any, ...]:
    """The engine step for a batch size, a plain :py:class:`Collate`, or any object with
    ``accumulate``/``flush``."""
    if isinstance(op, bool):
        raise TypeError("aggregate needs a positive integer or an Aggregator, got a bool")
    if isinstance(op, int):
        if not 1 <= op <= 2**48:
            raise ValueError(f"aggregate needs a positive integer (at most 2**48), got {op!r}")
        return ("aggregate", op, drop_last)
    if type(op) is Collate:
        return ("aggregate", op.n, drop_last)
    if callable(getattr(op, "accumulate", None)) and callable(getattr(op, "flush", None)):
        name = getattr(op, "name", None)
        name = name if isinstance(name, str) else f"aggregate({type(op).__name__})"
        return ("aggregator", name, op, drop_last)
    raise TypeError(
        f"aggregate needs a positive integer or an Aggregator (accumulate/flush), got {type(op).__name__}"
    )


def Aggregate(input: int | Aggregator, /, *, drop_last: bool = False) -> AggregateConfig[Any]:
    """Batches of ``input`` items (the last one of each epoch shorter unless ``drop_last``), or a custom
    :py:class:`Aggregator`."""
    op = Collate(input) if isinstance(input, int) and not isinstance(input, bool) else input
    _aggregator_step(op, drop_last)  # validates
    return AggregateConfig(name=f"aggregate({op!r}, drop_last={drop_last})", op=op, drop_last=drop_last)


@dataclass(frozen=True)
class DisaggregateConfig(Generic[T]):
    """A disaggregation step; made by :py:func:`Disaggregate`."""

    name: str = "disaggregate"


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
class PipelineConfig(Generic[U]):
    """A whole pipeline: a source, the steps in order, and a sink; built by
    :py:func:`spdl_rs.pipeline.build_pipeline`."""

    src: SourceConfig[Any]
    pipes: Sequence[PipeConfig[Any, Any] | AggregateConfig[Any] | DisaggregateConfig[Any]] = field(
        default_factory=list
    )
    sink: SinkConfig[U] = field(default_factory=lambda: SinkConfig(3))

    def __repr__(self) -> str:
        lines = ["PipelineConfig", f" - Source: {self.src!r}"]
        if self.pipes:
            lines.append(" - Pipes:")
            lines.extend(f"   - {p!r}" for p in self.pipes)
        lines.append(f" - Sink: {self.sink!r}")
        return "\n".join(lines)


def Merge(*_args: Any, **_kwargs: Any) -> Any:
    """Not in spdl-rs: merging pipelines is not supported by its engine yet."""
    raise NotImplementedError(
        "spdl_rs.pipeline.defs.Merge is not supported: interleave the sources in one iterable "
        "(e.g. itertools.chain or a round-robin generator) given to SourceConfig"
    )


def PathVariants(*_args: Any, **_kwargs: Any) -> Any:
    """Not in spdl-rs: routing items between alternative paths is not supported by its engine yet."""
    raise NotImplementedError(
        "spdl_rs.pipeline.defs.PathVariants is not supported: branch inside one op (a function that "
        "dispatches on the item) instead"
    )
