"""spdl_rs.dataloader: DataLoader, CacheDataLoader, PyTorchDataLoader, get_pytorch_dataloader.

The expected outputs and messages were produced by the same calls on SPDL 0.8.0's ``spdl.dataloader`` (and,
for the PyTorch loader, PyTorch 2.15); they are hard-coded so that the suite runs without SPDL. The tests
that need PyTorch are skipped without it.
"""

import asyncio
import gc
import multiprocessing as mp
import re
import time
import warnings

import pytest

import spdl_rs.dataloader
from spdl_rs.dataloader import CacheDataLoader, DataLoader, PyTorchDataLoader, get_pytorch_dataloader
from spdl_rs.dataloader import _pytorch


def test_exported():
    assert sorted(spdl_rs.dataloader.__all__) == [
        "CacheDataLoader",
        "DataLoader",
        "PyTorchDataLoader",
        "get_pytorch_dataloader",
    ]


# --- DataLoader ---------------------------------------------------------------------------------------


def square(x):
    return x * x


async def slow_square(x):
    await asyncio.sleep(0.001 * (10 - x % 10))
    return x * x


def plus_minus(x):
    yield x
    yield -x


def fails_on_3(x):
    if x == 3:
        raise ValueError("three")
    return x


def test_source_only():
    assert list(DataLoader(range(5))) == [0, 1, 2, 3, 4]


def test_preprocessor():
    assert sorted(DataLoader(range(10), preprocessor=square)) == [x * x for x in range(10)]


def test_async_preprocessor_input_order():
    assert list(DataLoader(range(10), preprocessor=slow_square, output_order="input")) == [x * x for x in range(10)]


def test_generator_preprocessor():
    assert sorted(DataLoader(range(3), preprocessor=plus_minus)) == [-2, -1, 0, 0, 1, 2]


def test_batches():
    got = list(DataLoader(range(10), batch_size=3, preprocessor=square, output_order="input"))
    assert got == [[0, 1, 4], [9, 16, 25], [36, 49, 64], [81]]


def test_batches_drop_last():
    got = list(DataLoader(range(10), batch_size=3, drop_last=True, num_threads=1))
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_batch_size_zero_means_no_batching():
    assert list(DataLoader(range(3), batch_size=0, num_threads=1)) == [0, 1, 2]


def test_aggregator():
    assert list(DataLoader(range(10), batch_size=4, aggregator=sum, num_threads=1)) == [6, 22, 17]


def test_aggregator_without_batching():
    assert list(DataLoader(range(4), aggregator=lambda x: [x], num_threads=1)) == [[0], [1], [2], [3]]


def test_transfer():
    dl = DataLoader(range(4), batch_size=2, aggregator=sum, transfer_fn=lambda x: x + 100, num_threads=1)
    assert list(dl) == [101, 105]


def test_failing_item_is_left_out():
    assert sorted(DataLoader(range(6), preprocessor=fails_on_3)) == [0, 1, 2, 4, 5]


def test_every_iteration_is_a_new_run():
    dl = DataLoader([1, 2, 3], preprocessor=square, output_order="input")
    assert list(dl) == list(dl) == [1, 4, 9]


def test_async_source():
    async def numbers():
        for i in range(4):
            yield i

    assert list(DataLoader(numbers(), num_threads=1)) == [0, 1, 2, 3]


def test_timeout():
    def slow(x):
        time.sleep(1)
        return x

    with pytest.raises(TimeoutError):
        list(DataLoader(range(2), preprocessor=slow, timeout=0.1))


def test_abandoned_iteration_stops_pipeline():
    it = iter(DataLoader(range(1000), preprocessor=square, output_order="input"))
    assert next(it) == 0
    it.close()


# --- CacheDataLoader ----------------------------------------------------------------------------------


def test_cache_replay():
    c = CacheDataLoader(DataLoader(range(10), num_threads=1), num_caches=2, return_caches_after=4, stop_after=9)
    assert list(c) == [0, 1, 2, 3, 0, 1, 0, 1, 0]
    assert list(c) == [0, 1, 2, 3, 0, 1, 0, 1, 0]


def test_cache_without_end():
    got = [x for _, x in zip(range(10), CacheDataLoader(list(range(10)), 3, 5))]
    assert got == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]


def test_cache_empty_source():
    assert list(CacheDataLoader([], 2, 2)) == []


def test_cache_short_source():
    assert list(CacheDataLoader([1], 2, 3, 6)) == [1, 1, 1, 1, 1, 1]


def test_cache_closes_source_iterator():
    closed = []

    class Source:
        def __iter__(self):
            try:
                yield from range(100)
            finally:
                closed.append(True)

    assert list(CacheDataLoader(Source(), 2, 3, 5)) == [0, 1, 2, 0, 1]
    assert closed == [True]


def test_cache_len_and_attributes():
    class Loader(list):
        extra = 5

    c = CacheDataLoader(Loader([1, 2, 3]), 1, 1)
    assert len(c) == 3
    assert c.extra == 5
    with pytest.raises(AttributeError):
        c.missing  # noqa: B018
    with pytest.raises(TypeError):
        len(CacheDataLoader(iter([1]), 1, 1))


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 1, None), "`num_caches` must be greater than zero. Found: 0"),
        (
            (2, 1, None),
            "When provided, `return_caches_after` must be greater than or equal to `num_caches`. "
            "num_caches=2, return_caches_after=1",
        ),
        (
            (2, 2, 1),
            "When provided, `stop_after` must be greater than or equal to `num_caches`. num_caches=2, stop_after=1",
        ),
        (
            (2, 4, 3),
            "When provided, `stop_after` must be greater than or equal to `return_caches_after`. "
            "return_caches_after=4, stop_after=3",
        ),
    ],
)
def test_cache_validation_on_first_item(args, message):
    it = iter(CacheDataLoader([1, 2, 3], *args))  # checked lazily, as SPDL does
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(it)


# --- PyTorchDataLoader without PyTorch ----------------------------------------------------------------


def test_get_pytorch_dataloader_needs_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("PyTorch is installed")
    with pytest.raises(ImportError, match="torch") as info:
        get_pytorch_dataloader([1, 2, 3])
    assert info.value.name == "torch"


def _loader(dataset, sampler, fetch_fn, collate_fn, **kwargs):
    return PyTorchDataLoader(
        dataset=dataset,
        shmem=_pytorch._serialize_dataset(dataset),
        sampler=sampler,
        fetch_fn=fetch_fn,
        collate_fn=collate_fn,
        transfer_fn=kwargs.pop("transfer_fn", None),
        mp_ctx=mp.get_context("spawn"),
        num_workers=kwargs.pop("num_workers", 2),
        timeout=None,
        buffer_size=4,
        **kwargs,
    )


def test_process_loader_samples(watchdog):
    dl = _loader([10, 20, 30, 40], [3, 0, 2], _pytorch._get_item, str, output_order="input")
    assert len(dl) == 3
    assert list(dl) == ["40", "10", "30"]
    assert list(dl) == ["40", "10", "30"]  # a new pool each iteration


def test_process_loader_batches(watchdog):
    dl = _loader(
        [10, 20, 30, 40],
        [[0, 1], [2], [3, 0]],
        _pytorch._get_items,
        sum,
        transfer_fn=lambda x: -x,
        output_order="input",
        worker_init_concurrency=1,
    )
    assert list(dl) == [-30, -30, -50]


def test_process_loader_releases_shared_memory(watchdog):
    from multiprocessing.shared_memory import SharedMemory

    dl = _loader([1], [0], _pytorch._get_item, str, num_workers=1)
    assert list(dl) == ["1"]
    name = dl._shmem.name
    del dl
    gc.collect()
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)


# --- get_pytorch_dataloader with PyTorch --------------------------------------------------------------


class _Data:
    """A map-style dataset (any object with ``__getitem__`` and ``__len__`` is one to PyTorch)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * 10


class _DataWithGetItems(_Data):
    def __getitems__(self, indices):
        return [-i for i in indices]


def _as_lists(dl):
    import torch

    return [x.tolist() if isinstance(x, torch.Tensor) else x for x in dl]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_pytorch_default(torch, watchdog):
    dl = get_pytorch_dataloader(_Data(5), num_workers=2, in_order=True)
    assert len(dl) == 5
    assert _as_lists(dl) == [[0], [10], [20], [30], [40]]
    assert isinstance(dl.dataset, _Data)


def test_pytorch_batches(torch, watchdog):
    assert _as_lists(get_pytorch_dataloader(_Data(7), batch_size=3, num_workers=2, in_order=True)) == [
        [0, 10, 20],
        [30, 40, 50],
        [60],
    ]
    dl = get_pytorch_dataloader(_Data(7), batch_size=3, drop_last=True, num_workers=2, in_order=True)
    assert len(dl) == 2
    assert _as_lists(dl) == [[0, 10, 20], [30, 40, 50]]


def test_pytorch_unbatched(torch, watchdog):
    assert list(get_pytorch_dataloader(_Data(4), batch_size=None, num_workers=2, in_order=True)) == [0, 10, 20, 30]


def test_pytorch_getitems_and_collate(torch, watchdog):
    dl = get_pytorch_dataloader(_DataWithGetItems(4), batch_size=2, num_workers=1, in_order=True)
    assert _as_lists(dl) == [[0, -1], [-2, -3]]
    assert list(get_pytorch_dataloader(_Data(4), batch_size=2, collate_fn=sum, num_workers=1)) in (
        [10, 50],
        [50, 10],
    )


def test_pytorch_shuffle_with_generator(torch, watchdog):
    g = torch.Generator()
    g.manual_seed(0)
    dl = get_pytorch_dataloader(_Data(6), batch_size=2, shuffle=True, generator=g, num_workers=1, in_order=True)
    assert _as_lists(dl) == [[20, 50], [30, 0], [10, 40]]


def test_pytorch_samplers(torch, watchdog):
    dl = get_pytorch_dataloader(_Data(6), batch_size=None, sampler=[5, 1, 3], num_workers=1, in_order=True)
    assert list(dl) == [50, 10, 30]
    empty = get_pytorch_dataloader(_Data(6), batch_size=None, sampler=[], num_workers=1)
    assert len(empty) == 0 and list(empty) == []
    dl = get_pytorch_dataloader(_Data(6), batch_size=None, batch_sampler=[[0, 1], [5]], num_workers=1, in_order=True)
    assert len(dl) == 2
    assert _as_lists(dl) == [[0, 10], [50]]


def test_pytorch_spawn_and_init_concurrency(torch, watchdog):
    dl = get_pytorch_dataloader(
        _Data(3), num_workers=2, multiprocessing_context="spawn", in_order=True, worker_init_concurrency=1
    )
    assert _as_lists(dl) == [[0], [10], [20]]


def test_pytorch_zero_workers_warns(torch, watchdog):
    with pytest.warns(UserWarning) as record:
        dl = get_pytorch_dataloader(_Data(3), num_workers=0, in_order=True)
    assert str(record[0].message) == "`num_workers` is 0. Setting `num_workers` to 1 for single process dataloading."
    assert record[0].filename == __file__
    assert _as_lists(dl) == [[0], [10], [20]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(worker_init_fn=lambda: 0), "`worker_init_fn` is not supported."),
        (dict(pin_memory_device="cuda"), "`pin_memory_device` is not supported."),
        (dict(persistent_workers=True), "`persistent_workers` is not supported."),
        (dict(timeout=-1), "`timeout` must be positive. Found: -1."),
        (dict(num_workers=-1), "`num_workers` must be greater than 0. Found: -1"),
        (dict(worker_init_concurrency=0), "`worker_init_concurrency` must be greater than 0. Found: 0."),
        (dict(sampler=[1], batch_sampler=[[1]]), "`sampler` and `batch_sampler` are mutually exclusive."),
        (dict(batch_sampler=[[1]]), "`batch_size` and `batch_sampler` are mutually exclusive."),
        (dict(shuffle=True, sampler=[1]), "`shuffle` must be False when `batch_sampler` or `sampler` is provided."),
        (
            dict(batch_size=None, batch_sampler=[[1]], drop_last=True),
            "`drop_last` must be False when `batch_sampler` is provided.",
        ),
        (dict(batch_size=None, drop_last=True), "`drop_last` must be False when `batch_size` is None."),
    ],
)
def test_pytorch_validation(torch, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        get_pytorch_dataloader(_Data(3), **kwargs)


def test_pytorch_iterable_dataset_rejected(torch):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([1])

    with pytest.raises(ValueError, match=r"^IterableDataset is not supported\.$"):
        get_pytorch_dataloader(Stream())


def test_pytorch_pin_memory_without_accelerator(torch, watchdog, caplog):
    if torch.cuda.is_available():
        pytest.skip("an accelerator is available")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dl = get_pytorch_dataloader(_Data(2), pin_memory=True, num_workers=1, in_order=True)
    assert "'pin_memory' argument is set as true but no accelerator is found" in caplog.text
    assert _as_lists(dl) == [[0], [10]]
