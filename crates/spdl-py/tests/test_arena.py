"""SharedMemoryRingBuffer / SharedMemorySegmentPool: NumPy arrays and bytes from a real worker process arrive
intact without their payload being pickled, and no shared-memory segment is left behind."""

import gc
import os
import pickle

import numpy as np
import pytest
from conftest import wait_for

from spdl_rs.pipeline import SharedMemoryRingBuffer, SharedMemorySegmentPool, iterate_in_subprocess
from spdl_rs.pipeline._arena import _offload, _restore

pytestmark = pytest.mark.usefixtures("watchdog")


class NoPickle(np.ndarray):
    """An array that fails if pickled: proves the payload goes through shared memory."""

    def __reduce_ex__(self, protocol):
        raise AssertionError("the array payload was pickled")


def make_item(i: int) -> dict:
    arr = (np.arange(64 * 1024, dtype=np.float32).reshape(256, 256) + i).view(NoPickle)
    return {"i": i, "array": arr, "blob": bytes([i % 256]) * 50_000, "small": b"x" * 10, "ints": np.arange(3)}


class Items:
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield make_item(i)


def items(n=6):
    return Items(n)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def check_item(item: dict, i: int, *, zero_copy: bool) -> None:
    assert item["i"] == i
    assert type(item["array"]) is np.ndarray
    assert item["array"].shape == (256, 256) and item["array"].dtype == np.float32
    np.testing.assert_array_equal(item["array"], np.arange(64 * 1024, dtype=np.float32).reshape(256, 256) + i)
    assert bytes(item["blob"]) == bytes([i % 256]) * 50_000
    assert type(item["blob"]) is (memoryview if zero_copy else bytes)
    assert item["small"] == b"x" * 10  # below the threshold: pickled inline
    np.testing.assert_array_equal(item["ints"], np.arange(3))


@pytest.mark.parametrize("kind", ["ring", "pool"])
@pytest.mark.parametrize("mp_context", [None, "forkserver"])
def test_arrays_cross_processes_through_shared_memory(kind, mp_context):
    before = shm_entries()
    arena = SharedMemoryRingBuffer(4 << 20) if kind == "ring" else SharedMemorySegmentPool(1 << 20, 8)
    names = shm_entries() - before
    assert names, "the arena made its segments"
    src = iterate_in_subprocess(items, arena=arena, buffer_size=2, timeout=30, mp_context=mp_context)
    for _ in range(2):  # re-iteration reuses the arena
        for i, item in enumerate(src):
            check_item(item, i, zero_copy=kind == "pool")
            del item
    del src
    gc.collect()
    assert not (shm_entries() & names), "segments left in /dev/shm"


def test_pool_items_are_checked_and_dropped_on_other_threads():
    # The zero-copy views of one segment must not share a memoryview's export count across threads (free-threaded
    # CPython updates it without synchronisation: views came out "released").
    import queue
    import threading

    before = shm_entries()
    src = iterate_in_subprocess(
        lambda: Items(40), arena=SharedMemorySegmentPool(1 << 20, 8), buffer_size=2, timeout=30
    )
    work: queue.Queue = queue.Queue(maxsize=8)
    failures: list[BaseException] = []

    def consume():
        while (job := work.get()) is not None:
            i, item = job
            try:
                check_item(item, i, zero_copy=True)
                for _ in range(20):
                    assert bytes(item["blob"][:4]) == bytes([i % 256]) * 4
                    assert memoryview(item["blob"]).nbytes == 50_000
            except BaseException as e:  # noqa: BLE001 - keep draining, reported below
                failures.append(e)
            del job, item

    threads = [threading.Thread(target=consume) for _ in range(8)]
    for t in threads:
        t.start()
    count = 0
    for i, item in enumerate(src):
        work.put((i, item))
        del item
        count += 1
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    assert failures == []
    assert count == 40
    del src
    gc.collect()
    assert shm_entries() <= before


def test_an_abandoned_iteration_frees_the_pool_for_the_next_one():
    before = shm_entries()
    src = iterate_in_subprocess(
        items, arena=SharedMemorySegmentPool(1 << 20, 3, acquire_timeout=10), buffer_size=1, timeout=30
    )
    for i, item in enumerate(src):
        del item
        if i == 1:
            break
    got = [item["i"] for item in src]  # unread units of the abandoned iteration are accounted for
    assert got == list(range(6))
    del src
    gc.collect()
    assert shm_entries() <= before


class Chunks:
    def __iter__(self):
        for i in range(10):
            yield np.full(100_000, i, dtype=np.uint8)


def chunks():
    return Chunks()


def test_a_writer_waiting_for_ring_space_obeys_the_next_iteration():
    # Room for two items while the queue holds three: after the break, the worker waits for space that the
    # abandoned items will never free; the next iteration's STOP must end that wait (not acquire_timeout).
    ring = SharedMemoryRingBuffer(250_000, acquire_timeout=30)
    src = iterate_in_subprocess(chunks, arena=ring, buffer_size=3, timeout=30)
    for _ in src:
        break
    wait_for(lambda: ring.head - ring.tail >= 200_000, timeout=20, what="the ring to fill")
    assert [int(a[0]) for a in src] == list(range(10))
    assert [int(a[-1]) for a in src] == list(range(10))


def test_the_envelope_holds_only_metadata():
    ring = SharedMemoryRingBuffer(1 << 20)
    try:
        item = make_item(3)
        blob = _offload(item, ring.open_writer())
        assert len(blob) < 1024, "the envelope is small: payloads are in shared memory"
        with pytest.raises(AssertionError, match="pickled"):
            pickle.dumps(item)
        check_item(_restore(blob, ring.open_reader()), 3, zero_copy=False)
        assert ring.head == ring.tail  # the unit was released
    finally:
        ring.close()
        ring.unlink()


def test_a_slice_of_a_pool_view_outlives_its_item_and_the_closed_pool():
    pool = SharedMemorySegmentPool(1 << 20, 2)
    blob = _offload({"blob": bytes(range(256)) * 200}, pool.open_writer())
    item = _restore(blob, pool.open_reader())
    tail = memoryview(item["blob"])[1000:1010]
    del item
    gc.collect()
    pool.close()
    pool.unlink()
    gc.collect()
    # The slice still holds the memory it points to: reading it is safe after everything else is gone.
    assert bytes(tail) == (bytes(range(256)) * 200)[1000:1010]


def test_a_unit_larger_than_the_arena_is_an_error_in_the_parent():
    src = iterate_in_subprocess(items, arena=SharedMemoryRingBuffer(100_000, acquire_timeout=0), timeout=30)
    with pytest.raises(RuntimeError, match="exceeds ring capacity"):
        list(src)


def test_a_full_pool_fails_after_acquire_timeout():
    pool = SharedMemorySegmentPool(1 << 20, 2, acquire_timeout=0.3)
    src = iterate_in_subprocess(items, arena=pool, timeout=30)
    held = []
    with pytest.raises(RuntimeError, match="segment pool exhausted"):
        for item in src:
            held.append(item)  # holding every view: no segment comes back
    assert len(held) == 2


def test_close_and_unlink_without_a_worker():
    before = shm_entries()
    for arena in (SharedMemoryRingBuffer(4096), SharedMemorySegmentPool(4096, 2)):
        arena.close()
        arena.close()
        arena.unlink()
        arena.unlink()
    assert shm_entries() <= before


def test_bad_sizes():
    with pytest.raises(ValueError, match="capacity must be positive"):
        SharedMemoryRingBuffer(0)
    with pytest.raises(ValueError, match="acquire_timeout must be non-negative"):
        SharedMemoryRingBuffer(10, acquire_timeout=-1)
    with pytest.raises(ValueError, match="segment_size must be positive"):
        SharedMemorySegmentPool(0, 1)
    with pytest.raises(ValueError, match="count must be positive"):
        SharedMemorySegmentPool(10, 0)
