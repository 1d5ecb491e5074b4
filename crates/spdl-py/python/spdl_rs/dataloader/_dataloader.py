"""``DataLoader``: source, concurrent preprocessing, batching, aggregation and transfer on one pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, TypeAlias, TypeVar

from .. import _native
from ..pipeline import Pipeline, PipelineBuilder

__all__ = ["DataLoader"]

Source = TypeVar("Source")
Output = TypeVar("Output")
T = TypeVar("T")

# What the preprocessor may be: a function, a generator function, or their async forms.
Preprocessor: TypeAlias = (
    Callable[[Source], T]
    | Callable[[Source], Iterable[T]]
    | Callable[[Source], Awaitable[T]]
    | Callable[[Source], AsyncIterable[T]]
)
# What the aggregator may be: a function or an async function.
Aggregator: TypeAlias = Callable[[list[T]], Output] | Callable[[list[T]], Awaitable[Output]]


class DataLoader(Generic[Source, Output]):
    """A ready-made pipeline: source, preprocessing, batching, aggregation, transfer, buffer.

    Each iteration builds and runs a new :py:class:`spdl_rs.pipeline.Pipeline` of these stages (each one
    only when its argument is given):

    1. ``preprocessor`` on each source item, ``num_threads`` at a time;
    2. batching into lists of ``batch_size`` items (the last one shorter unless ``drop_last``);
    3. ``aggregator`` on each batch, ``num_threads`` at a time;
    4. ``transfer_fn`` on each output, one at a time (device copies do not run concurrently);
    5. a buffer of ``buffer_size`` finished outputs.

    An item whose function raises is logged and left out, as in every spdl_rs pipeline.

    .. code-block:: python

        from spdl_rs.dataloader import DataLoader

        loader = DataLoader(
            paths,
            preprocessor=decode,         # path -> array
            batch_size=32,
            aggregator=np.stack,         # list of arrays -> batch
            transfer_fn=to_device,
            num_threads=8,
        )
        for epoch in range(epochs):
            for batch in loader:
                ...

    Args:
        src: An iterable or async iterable of source items (e.g. paths or keys). Iterated once per
            iteration of the loader, so give a re-iterable object (not a one-shot generator) to run epochs.
        preprocessor: Applied to each source item: a function, an async function, or a (async) generator
            function whose every yielded value is an output.
        batch_size: Group this many preprocessed items into a list before ``aggregator``; ``None`` (or 0)
            for no batching.
        drop_last: Leave out the last, shorter batch.
        aggregator: Applied to each batch (or to each item without ``batch_size``): a function or an async
            function.
        transfer_fn: Applied to each aggregated output, one call at a time (e.g. a copy to a GPU).
        buffer_size: Outputs kept ready for the consumer.
        num_threads: Threads of the pipeline, and the concurrency of ``preprocessor`` and ``aggregator``.
        timeout: Seconds to wait for each output (``None``: as long as it takes); ``TimeoutError`` after.
        output_order: ``"completion"`` (each stage's outputs as soon as they are done) or ``"input"`` (in
            source order).
    """

    def __init__(
        self,
        src: Iterable[Source] | AsyncIterable[Source],
        *,
        preprocessor: Preprocessor[Source, Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        aggregator: Aggregator[Any, Output] | None = None,
        transfer_fn: Callable[[Output], Output] | None = None,
        buffer_size: int = 3,
        num_threads: int = 8,
        timeout: float | None = None,
        output_order: str = "completion",
    ) -> None:
        limits = _native.ARG_LIMITS
        # Checked here, with the module's one message, rather than when the first iteration builds the pipeline.
        _native._check_count("num_threads", num_threads, 1, limits["threads"])
        _native._check_count("buffer_size", buffer_size, 0, limits["queue"])
        if batch_size is not None:
            _native._check_count("batch_size", batch_size, 0, limits["items"])
        if timeout is not None:
            _native._check_duration("timeout", timeout, 0.0, float("inf"))
        self._src = src
        self._preprocessor = preprocessor
        self._aggregator = aggregator
        self._transfer_fn = transfer_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._buffer_size = buffer_size
        self._num_threads = num_threads
        self._timeout = timeout
        self._output_order = output_order

    def _get_pipeline(self) -> Pipeline[Output]:
        builder: PipelineBuilder[Source, Output] = PipelineBuilder()
        builder.add_source(self._src)
        if self._preprocessor:
            builder.pipe(self._preprocessor, concurrency=self._num_threads, output_order=self._output_order)
        if self._batch_size:
            builder.aggregate(self._batch_size, drop_last=self._drop_last)
        if self._aggregator:
            builder.pipe(self._aggregator, concurrency=self._num_threads, output_order=self._output_order)
        if self._transfer_fn is not None:
            builder.pipe(self._transfer_fn)
        builder.add_sink(self._buffer_size)
        return builder.build(num_threads=self._num_threads)

    def __iter__(self) -> Iterator[Output]:
        """Builds the pipeline, runs it in the background and yields its outputs; the pipeline is stopped
        when the iteration ends or is abandoned (the generator closed)."""
        pipeline = self._get_pipeline()
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=self._timeout)
