"""Shared-memory arenas that carry the large binary fields of items from a worker process to its parent
without pickling them (SPDL's ``SharedMemoryRingBuffer`` and ``SharedMemorySegmentPool``, in
``_native.pipeline``).

Pass one to :py:func:`iterate_in_subprocess` (``arena=``). In the worker, each item is pickled with a
``persistent_id`` hook: a large ``bytes``/``bytearray``/``memoryview``, NumPy array or CPU PyTorch tensor is
copied once into shared memory and replaced in the pickle stream by a small marker ``(offset, nbytes, kind,
meta)``. What crosses the pipe is ``<8-byte unit span><small pickle>``; the parent's ``persistent_load``
rebuilds the fields from shared memory. One item is one *unit*: its binaries are reserved and released
together. The segments, counters, waiting and copies are native; this module picks the binaries of an item.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any, Protocol

from .._native.pipeline import ArenaInterrupted as _ArenaInterrupted
from .._native.pipeline import SharedMemoryRingBuffer, SharedMemorySegmentPool, _arena_envelope, _arena_open_envelope

__all__ = ["SharedMemoryRingBuffer", "SharedMemorySegmentPool"]

#: Fields smaller than this are pickled inline.
_OFFLOAD_THRESHOLD = 4096


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

    def persistent_id(o: object) -> tuple[int, int, str, tuple[object, ...]] | None:
        for h in _HANDLERS:
            if h.matches(o, threshold):
                src, meta = h.get_buffer(o)
                offset, nbytes = writer.write_binary(src)
                return (offset, nbytes, h.kind, meta)
        return None

    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    try:
        pickler.dump(obj)
    except BaseException:
        writer.abort_unit()
        raise
    return _arena_envelope(writer.commit_unit(), out.getvalue())


def _restore(blob: bytes, reader: Any) -> object:
    """Rebuilds the object of an envelope made by :py:func:`_offload`."""
    span, body = _arena_open_envelope(blob)
    pinned: list[object] = []
    unpickler = pickle.Unpickler(io.BytesIO(body))

    def persistent_load(marker: Any) -> object:
        if not (isinstance(marker, tuple) and len(marker) == 4):
            raise pickle.UnpicklingError(f"unexpected persistent id {marker!r} in an arena envelope")
        offset, nbytes, kind, meta = marker
        handler = _BY_KIND.get(kind)
        if handler is None:
            raise pickle.UnpicklingError(f"no arena handler for kind {kind!r}")
        obj, anchor = handler.from_buffer(reader.read_binary(offset, nbytes), meta, reader.zero_copy)
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
        reader.end_unit(_arena_open_envelope(blob)[0], [])


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
