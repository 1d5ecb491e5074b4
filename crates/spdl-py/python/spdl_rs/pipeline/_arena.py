"""Shared-memory arenas that carry the large binary fields of items from a worker process to its parent
without pickling them (SPDL's ``SharedMemoryRingBuffer`` and ``SharedMemorySegmentPool``).

Pass one to :py:func:`iterate_in_subprocess` (``arena=``). In the worker, each item is pickled with a
``persistent_id`` hook: a large ``bytes``/``bytearray``/``memoryview``, NumPy array or CPU PyTorch tensor is
copied once into shared memory and replaced in the pickle stream by a small marker (offset, size, kind,
dtype/shape). What crosses the pipe is ``<8-byte unit span><small pickle>``; the parent's ``persistent_load``
rebuilds the fields from shared memory. One item is one *unit*: its binaries are reserved and released
together.

* :py:class:`SharedMemoryRingBuffer`: one segment used as a ring; the parent copies each payload out, so the
  space is reusable at once.
* :py:class:`SharedMemorySegmentPool`: one segment per unit, rotating over ``count`` segments; the parent gets
  zero-copy views, and a segment is reused only once every view into it has been garbage-collected.

A full arena blocks the writer on a process-shared condition until the parent frees space, at most
``acquire_timeout`` seconds (then :py:exc:`BufferError`); closing the arena wakes it.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import pickle
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, Protocol

from .._views import SliceSource

__all__ = ["SharedMemoryRingBuffer", "SharedMemorySegmentPool"]

_LG = logging.getLogger(__name__)

_DEFAULT_ACQUIRE_TIMEOUT = 60.0
#: Fields smaller than this are pickled inline.
_OFFLOAD_THRESHOLD = 4096
#: Control block: head/published (u64), tail/reclaimed (u64), shutdown flag (u8).
_CTRL = struct.Struct("<QQB")
_SPAN = struct.Struct("<Q")
_ALIGNMENT = 64


def _attach(name: str) -> shared_memory.SharedMemory:
    """Maps an existing segment without taking ownership: only the creator unlinks it.

    Python 3.13+ attaches untracked. Before 3.13 an attach registers the name with the resource tracker, which
    this process shares with the creator (its parent or itself): the registration is the creator's own, so it
    is left alone (unregistering it here would make the creator's unlink complain).
    """
    if sys.version_info >= (3, 13):
        untracked: dict[str, Any] = {"track": False}
        return shared_memory.SharedMemory(name=name, **untracked)
    return shared_memory.SharedMemory(name=name)


def _unlink_owned(owned: list[shared_memory.SharedMemory]) -> None:
    for shm in owned:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


#: Seconds between checks for a command while the writer waits for space.
_WAIT_STEP = 0.1


class _ArenaInterrupted(Exception):
    """The writer stopped waiting for space because the parent sent a command (the item is dropped)."""


class _Control:
    """The two counters and the shutdown flag in a shared control block, and the condition the writer waits on."""

    def __init__(self, buf: memoryview, cv: Any) -> None:
        self.buf = buf
        self.cv = cv

    def get(self, index: int) -> int:
        return int(_CTRL.unpack_from(self.buf, 0)[index])

    def set(self, index: int, value: int) -> None:
        struct.pack_into("<Q", self.buf, 8 * index, value)

    @property
    def shutdown(self) -> bool:
        return bool(self.buf[16])

    def wait(
        self,
        ready: Any,
        timeout: float,
        full_message: str,
        shutdown_message: str,
        interrupt: Callable[[], bool] | None = None,
    ) -> None:
        """Waits until ``ready()``, in steps of at most :py:data:`_WAIT_STEP` s; between steps, ``interrupt()``
        (the worker has a command waiting) raises :py:class:`_ArenaInterrupted`."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while not (self.shutdown or ready()):
                if interrupt is not None and interrupt():
                    raise _ArenaInterrupted
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferError(full_message)
                self.cv.wait(min(left, _WAIT_STEP))
        if self.shutdown:
            raise BufferError(shutdown_message)

    def notify(self) -> None:
        with self.cv:
            self.cv.notify_all()


################################################################################
# Ring
################################################################################


class SharedMemoryRingBuffer:
    """**[Experimental]** One shared-memory segment used as a ring for the binaries of the items of
    :py:func:`iterate_in_subprocess` (``arena=``); the parent copies each payload out.

    Args:
        capacity: Bytes of payload space; at least the largest item's offloaded binaries together (about
            ``(buffer_size + 2) * largest item`` for a writer that never waits).
        acquire_timeout: Seconds the writer waits for free space before :py:exc:`BufferError` (``0``: fail at
            once when full).

    The segment is created here and removed by :py:meth:`unlink` (done by the iterable that owns it).
    """

    def __init__(self, capacity: int, *, acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        if acquire_timeout < 0:
            raise ValueError("acquire_timeout must be non-negative")
        self._capacity = capacity
        self._acquire_timeout = acquire_timeout
        shm = shared_memory.SharedMemory(create=True, size=_CTRL.size + capacity)
        self._shm_name = shm.name
        self._shm: shared_memory.SharedMemory | None = shm
        self._owned: list[shared_memory.SharedMemory] = [shm]
        self._buf: memoryview | None = shm.buf
        ring_buf: Any = shm.buf
        _CTRL.pack_into(ring_buf, 0, 0, 0, 0)
        self._space_cv = multiprocessing.Condition()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "shm_name": self._shm_name,
            "capacity": self._capacity,
            "acquire_timeout": self._acquire_timeout,
            "space_cv": self._space_cv,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._shm_name = state["shm_name"]
        self._capacity = state["capacity"]
        self._acquire_timeout = state["acquire_timeout"]
        self._space_cv = state["space_cv"]
        self._shm = None
        self._owned = []
        self._buf = None

    @property
    def capacity(self) -> int:
        """Bytes of payload space."""
        return self._capacity

    @property
    def name(self) -> str:
        """The shared-memory segment's name."""
        return self._shm_name

    def _use_context(self, ctx: Any) -> None:
        """Makes the writer's condition with the start method's context (the worker is not started yet)."""
        self._space_cv = ctx.Condition()

    def _view(self) -> memoryview:
        if self._buf is None:
            self._shm = _attach(self._shm_name)
            self._buf = self._shm.buf
        assert self._buf is not None
        return self._buf

    def _control(self) -> _Control:
        return _Control(self._view(), self._space_cv)

    @property
    def head(self) -> int:
        """Bytes published by the writer (a monotonic count)."""
        return self._control().get(0)

    @head.setter
    def head(self, value: int) -> None:
        self._control().set(0, value)

    @property
    def tail(self) -> int:
        """Bytes released by the reader (a monotonic count)."""
        return self._control().get(1)

    @tail.setter
    def tail(self, value: int) -> None:
        c = self._control()
        c.set(1, value)
        c.notify()

    def shutdown_arena(self) -> None:
        """Wakes a writer waiting for space (it raises :py:exc:`BufferError`). Idempotent, from either side."""
        try:
            self._view()[16] = 1
        except Exception:  # noqa: BLE001 (already closed here)
            return
        with self._space_cv:
            self._space_cv.notify_all()

    def open_writer(self) -> _RingWriter:
        """The writer endpoint (in the worker)."""
        return _RingWriter(self)

    def open_reader(self) -> _RingReader:
        """The reader endpoint (in the parent)."""
        return _RingReader(self)

    def close(self) -> None:
        """Releases this process's mapping (after waking a waiting writer)."""
        self.shutdown_arena()
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None

    def unlink(self) -> None:
        """Removes the segment from the system (by the process that created it; elsewhere a no-op)."""
        _unlink_owned(self._owned)


class _RingWriter:
    def __init__(self, ring: SharedMemoryRingBuffer) -> None:
        self._ring = ring
        self._ctrl = ring._control()
        self._cap = ring.capacity
        self._timeout = ring._acquire_timeout
        self._start = 0
        self._pos = 0
        #: Set by the worker: whether a command is waiting (ends a wait for space).
        self.interrupt: Callable[[], bool] | None = None

    def reset(self) -> None:
        """A new iteration: the parent is waiting for it to start, so all space is free."""
        self._ctrl.set(0, 0)
        self._ctrl.set(1, 0)
        self._ctrl.notify()
        self._start = self._pos = 0

    def begin_unit(self) -> None:
        self._start = self._pos = self._ctrl.get(0)

    def write_binary(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        src = memoryview(data).cast("B")
        n = src.nbytes
        if n > self._cap:
            raise BufferError(
                f"binary of {n} bytes exceeds ring capacity {self._cap}; increase SharedMemoryRingBuffer capacity"
            )
        if self._pos - self._start + n > self._cap:
            raise BufferError(
                f"unit would exceed ring capacity ({self._cap}): {self._pos - self._start} already written + {n} "
                "new > capacity. Increase SharedMemoryRingBuffer capacity."
            )

        def fits() -> bool:
            return self._cap - (self._pos - self._ctrl.get(1)) >= n

        if not fits():
            if self._timeout == 0:
                raise BufferError(
                    f"shared-memory arena full: need {n} more bytes and acquire_timeout=0; increase "
                    "SharedMemoryRingBuffer capacity or acquire_timeout"
                )
            self._ctrl.wait(
                fits,
                self._timeout,
                f"shared-memory arena full: need {n} more bytes after waiting {self._timeout:g}s; the consumer "
                "is releasing units too slowly or has stalled. Increase SharedMemoryRingBuffer capacity or "
                "acquire_timeout, or check the consumer.",
                "shared-memory ring shut down while waiting for free space",
                self.interrupt,
            )
        buf = self._ctrl.buf
        base = _CTRL.size
        at = self._pos % self._cap
        first = min(n, self._cap - at)
        buf[base + at : base + at + first] = src[:first]
        if first < n:
            buf[base : base + n - first] = src[first:]
        self._pos += n
        return at, n

    def commit_unit(self) -> int:
        self._ctrl.set(0, self._pos)
        return self._pos - self._start

    def abort_unit(self) -> None:
        self._pos = self._start


class _RingReader:
    zero_copy: bool = False

    def __init__(self, ring: SharedMemoryRingBuffer) -> None:
        self._ring = ring
        self._ctrl = ring._control()
        self._cap = ring.capacity

    def reset(self) -> None:
        """Nothing to do: the writer resets both counters."""

    def read_binary(self, offset: int, nbytes: int) -> memoryview:
        buf = self._ctrl.buf
        base = _CTRL.size
        out = bytearray(nbytes)
        first = min(nbytes, self._cap - offset)
        out[:first] = buf[base + offset : base + offset + first]
        if first < nbytes:
            out[first:] = buf[base : base + nbytes - first]
        return memoryview(out)

    def end_unit(self, span: int, pinned: list[object]) -> None:
        self._ctrl.set(1, self._ctrl.get(1) + span)
        self._ctrl.notify()


################################################################################
# Segment pool
################################################################################


class SharedMemorySegmentPool:
    """**[Experimental]** ``count`` shared-memory segments of ``segment_size`` bytes, one per item in turn, for
    :py:func:`iterate_in_subprocess` (``arena=``); the parent gets zero-copy views into them.

    A segment is reused once every view restored from it is garbage-collected, so holding many restored items
    makes the writer wait (at most ``acquire_timeout`` seconds, then :py:exc:`BufferError`; ``0``: fail at once).
    Restored ``bytes``/``bytearray`` come back as ``memoryview`` (the zero-copy view itself).

    Args:
        segment_size: Bytes per segment; at least one item's offloaded binaries (each aligned to 64 bytes).
        count: Number of segments.
        acquire_timeout: Seconds the writer waits for a free segment.
    """

    def __init__(self, segment_size: int, count: int, *, acquire_timeout: float = _DEFAULT_ACQUIRE_TIMEOUT) -> None:
        if segment_size <= 0:
            raise ValueError("segment_size must be positive")
        if count <= 0:
            raise ValueError("count must be positive")
        if acquire_timeout < 0:
            raise ValueError("acquire_timeout must be non-negative")
        self._segment_size = segment_size
        self._count = count
        self._acquire_timeout = acquire_timeout
        created: list[shared_memory.SharedMemory] = []
        try:
            ctrl = shared_memory.SharedMemory(create=True, size=_CTRL.size)
            created.append(ctrl)
            ctrl_buf: Any = ctrl.buf
            _CTRL.pack_into(ctrl_buf, 0, 0, 0, 0)
            for _ in range(count):
                created.append(shared_memory.SharedMemory(create=True, size=segment_size))
        except BaseException:
            for s in created:
                s.close()
                s.unlink()
            raise
        self._ctrl_name = ctrl.name
        self._seg_names = [s.name for s in created[1:]]
        self._ctrl: shared_memory.SharedMemory | None = ctrl
        self._segs: list[shared_memory.SharedMemory] | None = created[1:]
        self._ctrl_buf: memoryview | None = ctrl.buf
        self._seg_bufs: list[Any] | None = [s.buf for s in created[1:]]
        self._seg_slices: list[SliceSource] | None = None
        self._owned: list[shared_memory.SharedMemory] = created
        self._space_cv = multiprocessing.Condition()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "ctrl_name": self._ctrl_name,
            "seg_names": self._seg_names,
            "segment_size": self._segment_size,
            "count": self._count,
            "acquire_timeout": self._acquire_timeout,
            "space_cv": self._space_cv,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._ctrl_name = state["ctrl_name"]
        self._seg_names = state["seg_names"]
        self._segment_size = state["segment_size"]
        self._count = state["count"]
        self._acquire_timeout = state["acquire_timeout"]
        self._space_cv = state["space_cv"]
        self._ctrl = None
        self._segs = None
        self._ctrl_buf = None
        self._seg_bufs = None
        self._seg_slices = None
        self._owned = []

    @property
    def segment_size(self) -> int:
        """Bytes per segment."""
        return self._segment_size

    @property
    def count(self) -> int:
        """Number of segments."""
        return self._count

    def _use_context(self, ctx: Any) -> None:
        """Makes the writer's condition with the start method's context (the worker is not started yet)."""
        self._space_cv = ctx.Condition()

    def _ctrl_view(self) -> memoryview:
        if self._ctrl_buf is None:
            self._ctrl = _attach(self._ctrl_name)
            self._ctrl_buf = self._ctrl.buf
        assert self._ctrl_buf is not None
        return self._ctrl_buf

    def _control(self) -> _Control:
        return _Control(self._ctrl_view(), self._space_cv)

    def _segment(self, unit: int) -> memoryview:
        if self._seg_bufs is None:
            self._segs = [_attach(n) for n in self._seg_names]
            self._seg_bufs = [s.buf for s in self._segs]
        return self._seg_bufs[unit % self._count]

    def _segment_slice(self, unit: int, start: int, stop: int) -> memoryview:
        """A zero-copy view of part of a segment that the consumer may drop on any thread."""
        if self._seg_slices is None:
            self._seg_slices = [SliceSource(b, b) for b in (self._segment(i) for i in range(self._count))]
        return self._seg_slices[unit % self._count].slice(start, stop)

    @property
    def published(self) -> int:
        """Units published by the writer."""
        return self._control().get(0)

    @published.setter
    def published(self, value: int) -> None:
        self._control().set(0, value)

    @property
    def reclaimed(self) -> int:
        """Units whose segments are free again."""
        return self._control().get(1)

    @reclaimed.setter
    def reclaimed(self, value: int) -> None:
        c = self._control()
        c.set(1, value)
        c.notify()

    def shutdown_arena(self) -> None:
        """Wakes a writer waiting for a segment (it raises :py:exc:`BufferError`). Idempotent."""
        try:
            self._ctrl_view()[16] = 1
        except Exception:  # noqa: BLE001 (already closed here)
            return
        with self._space_cv:
            self._space_cv.notify_all()

    def open_writer(self) -> _PoolWriter:
        """The writer endpoint (in the worker)."""
        return _PoolWriter(self)

    def open_reader(self) -> _PoolReader:
        """The reader endpoint (in the parent)."""
        return _PoolReader(self)

    def close(self) -> None:
        """Releases this process's mappings. A segment still viewed by a restored item stays mapped until that
        item is collected (a warning says so); :py:meth:`unlink` removes the names regardless."""
        self.shutdown_arena()
        if self._ctrl_buf is not None:
            self._ctrl_buf.release()
            self._ctrl_buf = None
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None
        self._seg_slices = None  # their exports of the segments go with them (unless a restored item holds one)
        if self._seg_bufs is not None:
            for b in self._seg_bufs:
                try:
                    b.release()
                except BufferError:
                    pass
            self._seg_bufs = None
        if self._segs is not None:
            stuck = 0
            for s in self._segs:
                try:
                    s.close()
                except BufferError:
                    # A restored view still exports the mapping: leave the mapping to the views (it is unmapped
                    # when the last one is collected) and close only the descriptor.
                    stuck += 1
                    s._buf = None  # type: ignore[attr-defined]
                    s._mmap = None  # type: ignore[attr-defined]
                    s.close()
            self._segs = None
            if stuck:
                _LG.warning(
                    "SharedMemorySegmentPool: %d of %d segments are still viewed by restored items at close(); "
                    "their memory is released when those are garbage-collected.",
                    stuck,
                    self._count,
                )

    def unlink(self) -> None:
        """Removes every segment from the system (by the process that created them; elsewhere a no-op)."""
        _unlink_owned(self._owned)


class _PoolWriter:
    def __init__(self, pool: SharedMemorySegmentPool) -> None:
        self._pool = pool
        self._ctrl = pool._control()
        self._size = pool.segment_size
        self._timeout = pool._acquire_timeout
        self._cursor = 0
        #: Set by the worker: whether a command is waiting (ends a wait for a segment).
        self.interrupt: Callable[[], bool] | None = None

    def reset(self) -> None:
        """Units still viewed from an earlier iteration keep their segments: the counters are not reset."""
        self._cursor = 0

    def begin_unit(self) -> None:
        count = self._pool.count

        def free() -> bool:
            return count - (self._ctrl.get(0) - self._ctrl.get(1)) >= 1

        if not free():
            if self._timeout == 0:
                raise BufferError(
                    "segment pool exhausted: no free segment and acquire_timeout=0. Increase "
                    "SharedMemorySegmentPool count/segment_size or acquire_timeout, or check the consumer."
                )
            self._ctrl.wait(
                free,
                self._timeout,
                f"segment pool exhausted: no free segment after waiting {self._timeout:g}s; the consumer is "
                "releasing views too slowly or has stalled. Increase SharedMemorySegmentPool count/segment_size "
                "or acquire_timeout, or check the consumer.",
                "segment pool shut down while waiting for a free segment",
                self.interrupt,
            )
        self._cursor = 0

    def write_binary(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        src = memoryview(data).cast("B")
        n = src.nbytes
        at = (self._cursor + _ALIGNMENT - 1) & ~(_ALIGNMENT - 1)
        if at + n > self._size:
            raise BufferError(
                f"unit exceeds segment_size ({self._size}); increase SharedMemorySegmentPool segment_size"
            )
        self._pool._segment(self._ctrl.get(0))[at : at + n] = src
        self._cursor = at + n
        return at, n

    def commit_unit(self) -> int:
        self._ctrl.set(0, self._ctrl.get(0) + 1)
        return self._cursor

    def abort_unit(self) -> None:
        self._cursor = 0


class _Lease:
    """Frees a unit's segment once each of its anchors is collected."""

    def __init__(self, reader: _PoolReader, unit: int, count: int) -> None:
        self._reader = reader
        self._unit = unit
        self._left = count
        self._lock = threading.Lock()

    def release_one(self) -> None:
        with self._lock:
            self._left -= 1
            done = self._left == 0
        if done:
            self._reader._released(self._unit)


class _PoolReader:
    zero_copy: bool = True

    def __init__(self, pool: SharedMemorySegmentPool) -> None:
        self._pool = pool
        self._next = 0
        self._watermark = 0
        self._done: set[int] = set()
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Nothing to do: the counters run on across iterations."""

    def read_binary(self, offset: int, nbytes: int) -> memoryview:
        return self._pool._segment_slice(self._next, offset, offset + nbytes)

    def end_unit(self, span: int, pinned: list[object]) -> None:
        unit = self._next
        self._next += 1
        if not pinned:
            self._released(unit)
            return
        lease = _Lease(self, unit, len(pinned))
        for anchor in pinned:
            weakref.finalize(anchor, lease.release_one)

    def _released(self, unit: int) -> None:
        with self._lock:
            self._done.add(unit)
            moved = False
            while self._watermark in self._done:
                self._done.discard(self._watermark)
                self._watermark += 1
                moved = True
            if moved and self._pool._ctrl_buf is not None:  # else closed meanwhile (a view outlived it)
                self._pool.reclaimed = self._watermark


################################################################################
# Offload / restore
################################################################################


@dataclass(frozen=True)
class _ShmMarker:
    """Stands for an offloaded binary in the pickle stream."""

    offset: int
    nbytes: int
    kind: str
    meta: tuple[object, ...]


class _Handler(Protocol):
    kind: str

    def matches(self, obj: object, threshold: int) -> bool: ...

    def get_buffer(self, obj: Any) -> tuple[memoryview, tuple[object, ...]]: ...

    def from_buffer(self, buf: memoryview, meta: tuple[object, ...], zero_copy: bool) -> tuple[object, object]: ...


class _BytesHandler:
    """``bytes``/``bytearray``/``memoryview``: the ring restores the original type; the pool a zero-copy
    ``memoryview`` (its own anchor)."""

    kind = "bytes"

    def matches(self, obj: object, threshold: int) -> bool:
        if isinstance(obj, memoryview):
            return obj.nbytes >= threshold
        return isinstance(obj, (bytes, bytearray)) and len(obj) >= threshold

    def get_buffer(self, obj: Any) -> tuple[memoryview, tuple[object, ...]]:
        mv = memoryview(obj)
        return (mv.cast("B") if mv.contiguous else memoryview(mv.tobytes())), (type(obj),)

    def from_buffer(self, buf: memoryview, meta: tuple[object, ...], zero_copy: bool) -> tuple[object, object]:
        if zero_copy:
            return buf, buf
        kind = meta[0]
        if kind is bytearray:
            return bytearray(buf), None
        if kind is memoryview:
            return buf, None
        return bytes(buf), None


class _NumpyHandler:
    kind = "numpy"

    def matches(self, obj: object, threshold: int) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and isinstance(obj, np.ndarray) and obj.dtype.kind != "O" and obj.nbytes >= threshold

    def get_buffer(self, obj: Any) -> tuple[memoryview, tuple[object, ...]]:
        import numpy as np

        arr = np.ascontiguousarray(obj)
        flat: Any = arr.reshape(-1).view(np.uint8)
        return memoryview(flat), (arr.dtype.str, tuple(arr.shape))

    def from_buffer(self, buf: memoryview, meta: tuple[object, ...], zero_copy: bool) -> tuple[object, object]:
        import numpy as np

        dtype, shape = meta
        flat = np.frombuffer(buf, dtype=np.dtype(str(dtype)))
        return flat.reshape(shape), (flat if zero_copy else None)  # type: ignore[call-overload]


class _TorchHandler:
    kind = "torch"

    def matches(self, obj: object, threshold: int) -> bool:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(obj, torch.Tensor):
            return False
        t: Any = obj
        return bool(t.device.type == "cpu") and int(t.element_size()) * int(t.nelement()) >= threshold

    def get_buffer(self, obj: Any) -> tuple[memoryview, tuple[object, ...]]:
        import torch

        flat = obj.detach().contiguous().reshape(-1).view(torch.uint8)
        return memoryview(flat.numpy()), (str(obj.dtype), tuple(obj.shape))

    def from_buffer(self, buf: memoryview, meta: tuple[object, ...], zero_copy: bool) -> tuple[object, object]:
        import torch

        dtype_name, shape = meta
        dtype = getattr(torch, str(dtype_name).split(".")[-1])
        flat: Any = torch.frombuffer(buf, dtype=torch.uint8).view(dtype)
        return flat.reshape(shape), (flat if zero_copy else None)


class _PacketsHandler:
    """``spdl_rs.io`` packets: their ``__getstate__`` bytes go to the arena. The pool restores packets that
    point into the segment (``deserialize_view``; they are their own anchor), the ring a copy. Matched by
    class name and ``deserialize_view``, so this module needs no import of ``spdl_rs.io``."""

    kind = "packets"
    _NAMES = frozenset(("AudioPackets", "VideoPackets", "ImagePackets"))

    def matches(self, obj: object, threshold: int) -> bool:
        cls = type(obj)
        if cls.__name__ not in self._NAMES or not hasattr(cls, "deserialize_view"):
            return False
        return int(getattr(obj, "nbytes", 0)) >= threshold

    def get_buffer(self, obj: Any) -> tuple[memoryview, tuple[object, ...]]:
        return memoryview(obj.__getstate__()), (type(obj),)

    def from_buffer(self, buf: memoryview, meta: tuple[object, ...], zero_copy: bool) -> tuple[object, object]:
        cls: Any = meta[0]
        if zero_copy:
            obj = cls.deserialize_view(buf)
            return obj, obj
        return cls.deserialize(buf), None


_HANDLERS: tuple[_Handler, ...] = (_BytesHandler(), _NumpyHandler(), _TorchHandler(), _PacketsHandler())
_BY_KIND: dict[str, _Handler] = {h.kind: h for h in _HANDLERS}


def _offload(obj: object, writer: Any, threshold: int = _OFFLOAD_THRESHOLD) -> bytes:
    """Pickles ``obj`` with its large binaries written to the arena; returns the small envelope."""
    writer.begin_unit()
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(o: object) -> _ShmMarker | None:
        for h in _HANDLERS:
            if h.matches(o, threshold):
                src, meta = h.get_buffer(o)
                offset, nbytes = writer.write_binary(src)
                return _ShmMarker(offset, nbytes, h.kind, meta)
        return None

    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    try:
        pickler.dump(obj)
    except BaseException:
        writer.abort_unit()
        raise
    return _SPAN.pack(writer.commit_unit()) + out.getvalue()


def _restore(blob: bytes, reader: Any) -> object:
    """Rebuilds the object of an envelope made by :py:func:`_offload`."""
    span = int(_SPAN.unpack_from(blob, 0)[0])
    pinned: list[object] = []
    unpickler = pickle.Unpickler(io.BytesIO(memoryview(blob)[_SPAN.size :]))

    def persistent_load(marker: Any) -> object:
        if not isinstance(marker, _ShmMarker):
            raise pickle.UnpicklingError(f"unexpected persistent id {marker!r} in an arena envelope")
        handler = _BY_KIND.get(marker.kind)
        if handler is None:
            raise pickle.UnpicklingError(f"no arena handler for kind {marker.kind!r}")
        obj, anchor = handler.from_buffer(reader.read_binary(marker.offset, marker.nbytes), marker.meta, reader.zero_copy)
        if anchor is not None:
            pinned.append(anchor)
        return obj

    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    try:
        return unpickler.load()
    finally:
        reader.end_unit(span, pinned)


def _discard(blob: bytes, reader: Any) -> None:
    """Accounts for an envelope that will not be restored (left from an abandoned iteration)."""
    if reader.zero_copy:
        reader.end_unit(int(_SPAN.unpack_from(blob, 0)[0]), [])


class _Arena:
    """One process's side of an arena: the writer (worker) or reader (parent), opened on first use."""

    #: What the writer raises when a command ends its wait for space.
    interrupted = _ArenaInterrupted

    def __init__(self, arena: Any) -> None:
        self._arena = arena
        self._writer: Any = None
        self._reader: Any = None

    @property
    def writer(self) -> Any:
        if self._writer is None:
            self._writer = self._arena.open_writer()
        return self._writer

    @property
    def reader(self) -> Any:
        if self._reader is None:
            self._reader = self._arena.open_reader()
        return self._reader

    def offload(self, obj: object) -> bytes:
        return _offload(obj, self.writer)

    def restore(self, blob: bytes) -> object:
        return _restore(blob, self.reader)

    def discard(self, blob: bytes) -> None:
        _discard(blob, self.reader)
