"""``get_pytorch_dataloader``: a map-style PyTorch dataset served by worker processes through an spdl_rs
pipeline, with the arguments of ``torch.utils.data.DataLoader``.

PyTorch is imported only when :py:func:`get_pytorch_dataloader` is called.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.context
import os
import pickle
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from multiprocessing.shared_memory import SharedMemory
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .. import _native
from ..pipeline import Pipeline, PipelineBuilder

if TYPE_CHECKING:
    import torch

__all__ = ["PyTorchDataLoader", "get_pytorch_dataloader"]

K = TypeVar("K")
T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")

_LG: logging.Logger = logging.getLogger(__name__)


def _import_torch() -> ModuleType:
    try:
        import torch
    except ImportError as e:
        raise ModuleNotFoundError(
            "spdl_rs.dataloader.get_pytorch_dataloader needs PyTorch (the `torch` package), which could not be "
            f"imported: {e}",
            name="torch",
        ) from e
    return torch


################################################################################
# What runs in the worker processes
################################################################################

# Set in each worker by `_init_worker`.
_DATASET: Any = None
_COLLATE_FN: Callable[[Any], Any] | None = None


def _get_item(index: Any) -> Any:
    """Worker side: one sample, through the collate function."""
    assert _COLLATE_FN is not None
    return _COLLATE_FN(_DATASET[index])


def _get_items(indices: list[Any]) -> Any:
    """Worker side: one batch (``__getitems__`` when the dataset has it), through the collate function."""
    assert _COLLATE_FN is not None
    if hasattr(_DATASET, "__getitems__"):
        return _COLLATE_FN(_DATASET.__getitems__(indices))
    return _COLLATE_FN([_DATASET[i] for i in indices])


def _init_worker(shm_name: str, collate_fn: Callable[[Any], Any], init_semaphore: Any | None) -> None:
    """Worker side: load the dataset from the shared memory (``init_semaphore`` bounds how many at a time)."""
    global _DATASET, _COLLATE_FN
    _LG.info("[%s] Initializing dataset.", os.getpid())
    shm = SharedMemory(name=shm_name)
    try:
        guard: AbstractContextManager[Any] = nullcontext() if init_semaphore is None else init_semaphore
        buf = shm.buf
        assert buf is not None
        with guard:
            _DATASET = pickle.loads(buf)
        del buf
    finally:
        shm.close()
    _COLLATE_FN = collate_fn


################################################################################
# Main process
################################################################################


def _serialize_dataset(dataset: Any) -> SharedMemory:
    """The pickled dataset, in a new shared-memory block."""
    _LG.info("Serializing dataset.")
    t0 = time.monotonic()
    data = pickle.dumps(dataset)
    shm = SharedMemory(create=True, size=len(data))
    buf = shm.buf
    assert buf is not None
    buf[: len(data)] = data
    del buf
    _LG.info(
        "Written dataset into shared memory %s (%s MB) in %.2f seconds",
        shm.name,
        f"{len(data) // 1_000_000:_d}",
        time.monotonic() - t0,
    )
    return shm


def _release_shared_memory(shm: SharedMemory) -> None:
    try:
        shm.close()
        shm.unlink()
    except (FileNotFoundError, BufferError):  # already gone, or a view is still alive
        pass


class PyTorchDataLoader(Iterable[V]):
    """PyTorchDataLoader()

    A near drop-in for ``torch.utils.data.DataLoader`` over a map-style dataset; make one with
    :py:func:`get_pytorch_dataloader`.

    It works differently from PyTorch's:

    - The dataset is pickled once into shared memory; each worker process loads it from there. The collate
      function goes to the workers too; the sampler and the generator stay in the main process.
    - The sampler runs in the main process (as the source of an spdl_rs pipeline) and the indices (or lists
      of indices) are sent to the workers, which share one input and one output queue.
    - Each iteration starts a new pool of worker processes and stops it at the end.

    Every worker holds a copy of the dataset, as with PyTorch, but start-up and the traffic between processes
    cost less. The shared memory is released when the loader is garbage-collected.

    Attributes:
        dataset: The dataset.

    Args:
        dataset: The map-style dataset.
        shmem: The shared memory that holds the pickled dataset.
        sampler: Yields the keys (or lists of keys) to fetch, in the main process.
        fetch_fn: Worker side: a key (or a list of keys) to an output.
        collate_fn: Worker side: what ``fetch_fn`` applies to the sample(s).
        transfer_fn: Applied to each output in the main process (e.g. pinning memory), or ``None``.
        mp_ctx: The multiprocessing context that starts the workers.
        num_workers: Worker processes.
        timeout: Seconds to wait for each output, or ``None``.
        buffer_size: Outputs kept ready for the consumer.
        output_order: ``"completion"`` or ``"input"`` (the sampler's order).
        worker_init_concurrency: Workers allowed to load the dataset at the same time (``None``: all).
    """

    def __init__(
        self,
        *,
        dataset: torch.utils.data.Dataset[T],
        shmem: SharedMemory,
        sampler: Iterable[K],
        fetch_fn: Callable[[K], U],
        collate_fn: Callable[[list[U]], V],
        transfer_fn: Callable[[V], V] | None,
        mp_ctx: multiprocessing.context.BaseContext,
        num_workers: int,
        timeout: float | None,
        buffer_size: int,
        output_order: str = "completion",
        worker_init_concurrency: int | None = None,
    ) -> None:
        self.dataset = dataset
        self._shmem = shmem
        self._sampler = sampler
        self._fetch_fn = fetch_fn
        self._collate_fn = collate_fn
        self._transfer_fn = transfer_fn
        self._mp_ctx = mp_ctx
        self._num_workers = num_workers
        self._timeout = timeout
        self._buffer_size = buffer_size
        self._output_order = output_order
        self._worker_init_concurrency = worker_init_concurrency
        self._release = weakref.finalize(self, _release_shared_memory, shmem)

    def __len__(self) -> int:
        """The number of outputs (samples or batches) per iteration: the sampler's length."""
        return len(cast(Sized, self._sampler))

    def _get_executor(self) -> ProcessPoolExecutor:
        semaphore = (
            None
            if self._worker_init_concurrency is None
            else self._mp_ctx.BoundedSemaphore(self._worker_init_concurrency)
        )
        return ProcessPoolExecutor(
            max_workers=self._num_workers,
            mp_context=self._mp_ctx,
            initializer=_init_worker,
            initargs=(self._shmem.name, self._collate_fn, semaphore),
        )

    def _get_pipeline(self) -> tuple[ProcessPoolExecutor, Pipeline[V]]:
        executor = self._get_executor()
        # The pool starts its workers at its first submit. Made here, on the caller's thread before the
        # pipeline's threads run, a forked worker copies no engine thread's held lock; the no-op's result is
        # not awaited, so a worker that fails to start fails the first fetch, as it would otherwise.
        executor.submit(int)
        builder: PipelineBuilder[Any, V] = PipelineBuilder()
        builder.add_source(self._sampler)
        builder.pipe(
            self._fetch_fn,
            executor=executor,
            output_order=self._output_order,
            concurrency=self._num_workers,
        )
        if self._transfer_fn:
            builder.pipe(self._transfer_fn, output_order=self._output_order)
        return executor, builder.add_sink(self._buffer_size).build(num_threads=1)

    def __iter__(self) -> Iterator[V]:
        """Starts the workers and yields the outputs; the workers are stopped when the iteration ends or is
        abandoned."""
        executor, pipeline = self._get_pipeline()
        with executor, pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=self._timeout)


################################################################################
# Sampler, fetch and collate, as torch.utils.data.DataLoader resolves them
################################################################################


def _default_sampler(dataset: Any, shuffle: bool, generator: Any) -> Any:
    from torch.utils.data.sampler import RandomSampler, SequentialSampler

    assert hasattr(dataset, "__len__")
    return RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)


def _resolve_sampler(
    dataset: Any,
    batch_size: int | None,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    collate_fn: Callable[[Any], Any] | None,
    drop_last: bool,
    generator: Any,
) -> tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]:
    from torch.utils.data.dataloader import default_collate, default_convert
    from torch.utils.data.sampler import BatchSampler

    if sampler is not None and batch_sampler is not None:
        raise ValueError("`sampler` and `batch_sampler` are mutually exclusive.")
    if batch_size is not None and batch_sampler is not None:
        raise ValueError("`batch_size` and `batch_sampler` are mutually exclusive.")
    if shuffle and (sampler is not None or batch_sampler is not None):
        raise ValueError("`shuffle` must be False when `batch_sampler` or `sampler` is provided.")
    if batch_sampler is not None and drop_last:
        raise ValueError("`drop_last` must be False when `batch_sampler` is provided.")
    if batch_size is None and drop_last:
        raise ValueError("`drop_last` must be False when `batch_size` is None.")

    if batch_sampler is not None:
        return batch_sampler, _get_items, collate_fn or default_collate
    if batch_size is not None:
        base = sampler if sampler is not None else _default_sampler(dataset, shuffle, generator)
        return BatchSampler(base, batch_size, drop_last), _get_items, collate_fn or default_collate
    if sampler is not None:
        return sampler, _get_item, collate_fn or default_convert
    return _default_sampler(dataset, shuffle, generator), _get_item, collate_fn or default_convert


def _validate_options(
    *,
    worker_init_fn: Any,
    pin_memory_device: str | None,
    persistent_workers: bool,
    timeout: float | None,
    num_workers: int,
    worker_init_concurrency: int | None,
) -> None:
    if worker_init_fn is not None:
        raise ValueError("`worker_init_fn` is not supported.")
    if pin_memory_device is not None:
        raise ValueError("`pin_memory_device` is not supported.")
    if persistent_workers:
        raise ValueError("`persistent_workers` is not supported.")
    if timeout is not None and timeout < 0:
        raise ValueError(f"`timeout` must be positive. Found: {timeout}.")
    if num_workers < 0:
        raise ValueError(f"`num_workers` must be greater than 0. Found: {num_workers}")
    if worker_init_concurrency is not None and worker_init_concurrency < 1:
        raise ValueError(f"`worker_init_concurrency` must be greater than 0. Found: {worker_init_concurrency}.")
    # Beyond SPDL's checks: the module's caps, with its one message (a worker is a process).
    limits = _native.ARG_LIMITS
    _native._check_count("num_workers", num_workers, 0, limits["threads"])
    if worker_init_concurrency is not None:
        _native._check_count("worker_init_concurrency", worker_init_concurrency, 1, limits["threads"])
    if timeout is not None:
        _native._check_duration("timeout", timeout, 0.0, float("inf"))


def get_pytorch_dataloader(
    dataset: torch.utils.data.Dataset[T],
    batch_size: int | None = 1,
    shuffle: bool = False,
    sampler: torch.utils.data.Sampler[K] | None = None,
    batch_sampler: torch.utils.data.Sampler[list[K]] | None = None,
    num_workers: int = 1,
    collate_fn: Callable[[list[T]], U] | None = None,
    pin_memory: bool = False,
    drop_last: bool = False,
    timeout: float | None = None,
    worker_init_fn: None = None,
    multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
    generator: torch.Generator | None = None,
    *,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory_device: str | None = None,
    in_order: bool = False,
    worker_init_concurrency: int | None = None,
) -> PyTorchDataLoader[U]:
    """A :py:class:`PyTorchDataLoader` for a map-style dataset, with ``torch.utils.data.DataLoader``'s arguments.

    Samplers, batching and the default collate functions are PyTorch's, chosen as ``torch.utils.data.DataLoader``
    chooses them: ``BatchSampler`` over ``sampler`` (or a sequential / random sampler) with ``default_collate``
    when ``batch_size`` is set, ``default_convert`` per sample when it is ``None``.

    .. code-block:: python

        from spdl_rs.dataloader import get_pytorch_dataloader

        loader = get_pytorch_dataloader(dataset, batch_size=32, shuffle=True, num_workers=8,
                                        worker_init_concurrency=2)
        for batch in loader:
            ...

    Args:
        dataset: A map-style dataset (``__getitem__`` and ``__len__``; ``__getitems__`` is used for batches
            when present). It must pickle.
        batch_size: Samples per batch, or ``None`` for single samples.
        shuffle: Random order (a ``RandomSampler`` with ``generator``).
        sampler: Yields the dataset keys; not with ``batch_sampler`` or ``shuffle=True``.
        batch_sampler: Yields lists of keys; not with ``sampler``, ``batch_size``, ``shuffle`` or ``drop_last``.
        num_workers: Worker processes; 0 is taken as 1 (with a warning).
        collate_fn: Turns the samples of a batch (or one sample) into the output; runs in the workers.
        pin_memory: Copy outputs into pinned memory (when an accelerator is available).
        drop_last: Leave out the last, shorter batch.
        timeout: Seconds to wait for each output, or ``None``.
        worker_init_fn: Not supported; must be ``None``.
        multiprocessing_context: A start method name or a multiprocessing context (``None``: the default).
        generator: The generator of the random sampler.
        prefetch_factor: Outputs buffered per worker.
        persistent_workers: Not supported; must be ``False``.
        pin_memory_device: Not supported; must be ``None``.
        in_order: Outputs in sampler order (``True``) or as soon as each is ready (``False``).
        worker_init_concurrency: At most this many workers load (unpickle) the dataset at the same time, e.g.
            when that contends for a file system or a database; ``None`` for no limit. Fetching is not limited.

    Raises:
        ModuleNotFoundError: PyTorch is not installed.
        ValueError: The dataset is an ``IterableDataset``, an unsupported option is set, a number is out of
            range, or the sampler arguments conflict.
    """
    torch = _import_torch()
    from torch.utils.data.dataloader import IterableDataset

    if isinstance(dataset, IterableDataset):
        raise ValueError("IterableDataset is not supported.")
    _validate_options(
        worker_init_fn=worker_init_fn,
        pin_memory_device=pin_memory_device,
        persistent_workers=persistent_workers,
        timeout=timeout,
        num_workers=num_workers,
        worker_init_concurrency=worker_init_concurrency,
    )
    _native._check_count("prefetch_factor", prefetch_factor, 1, _native.ARG_LIMITS["batch"])
    if batch_size is not None:
        _native._check_count("batch_size", batch_size, 1, _native.ARG_LIMITS["items"])
    if num_workers == 0:
        warnings.warn(
            "`num_workers` is 0. Setting `num_workers` to 1 for single process dataloading.",
            stacklevel=2,
        )
        num_workers = 1
    buffer_size = prefetch_factor * num_workers

    sampler_, fetch_fn, collate = _resolve_sampler(
        dataset, batch_size, shuffle, sampler, batch_sampler, collate_fn, drop_last, generator
    )

    from torch.utils.data._utils.pin_memory import pin_memory as pin_memory_fn

    if pin_memory and not torch.cuda.is_available():
        _LG.warning(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used."
        )
    transfer_fn = pin_memory_fn if pin_memory and torch.accelerator.is_available() else None

    mp_ctx = (
        multiprocessing_context
        if isinstance(multiprocessing_context, multiprocessing.context.BaseContext)
        else mp.get_context(multiprocessing_context)
    )
    _LG.info("Using multiprocessing context: %s", mp_ctx.get_start_method())

    return PyTorchDataLoader(
        dataset=dataset,
        shmem=_serialize_dataset(dataset),
        sampler=sampler_,
        fetch_fn=fetch_fn,
        collate_fn=collate,
        transfer_fn=transfer_fn,
        mp_ctx=mp_ctx,
        num_workers=num_workers,
        timeout=timeout,
        buffer_size=buffer_size,
        output_order="input" if in_order else "completion",
        worker_init_concurrency=worker_init_concurrency,
    )
