"""Zero-copy slices of one byte buffer that other threads may use and drop.

On free-threaded CPython, the views of one ``memoryview`` share a managed buffer whose export count is updated
without synchronisation (CPython issues gh-155606, gh-127716): slicing a shared ``memoryview`` while another thread
slices or drops a view of it can lose an update, release the buffer early, and make every view of it raise
"operation forbidden on released memoryview object" (the export counts of ``mmap`` and ``bytearray`` race the same
way). :py:class:`SliceSource` gives each slice a managed buffer of its own. On a build with the GIL, it slices the
shared view as before.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any


def free_threaded() -> bool:
    """Whether this interpreter runs without the GIL now."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return is_gil_enabled is not None and not is_gil_enabled()


@functools.lru_cache(maxsize=1)
def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


class SliceSource:
    """Slices of ``mv`` (a flat, C-contiguous ``"B"`` view of ``data``), safe to hand to other threads.

    On free-threaded builds, in order of preference:

    - for ``bytes`` (or a view of all of a ``bytes``), each slice comes from a fresh export of the ``bytes``
      (which has no export count): no copy, and the slice's ``obj`` is the ``bytes``;
    - with NumPy, one ``uint8`` array holds a single export of ``mv`` and each slice is a ``memoryview`` of a
      view of it (NumPy arrays count their bases by reference, which is thread-safe): no copy;
    - otherwise each slice is copied, under a lock that keeps the shared view's count consistent.
    """

    __slots__ = ("_array", "_bytes", "_lock", "_mv")

    def __init__(self, data: Any, mv: memoryview) -> None:
        self._mv = mv
        self._array: Any = None
        self._bytes: bytes | None = None
        self._lock: threading.Lock | None = None
        if not free_threaded():
            return
        base = data.obj if isinstance(data, memoryview) else data
        if type(base) is bytes and len(base) == mv.nbytes:
            self._bytes = base
            return
        np = _numpy()
        if np is not None and mv.nbytes > 0:
            self._array = np.frombuffer(mv, dtype=np.uint8)
            return
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._mv.nbytes

    def slice(self, start: int, stop: int) -> memoryview:
        """``mv[start:stop]``, with a managed buffer of its own on free-threaded builds."""
        if self._array is not None:
            return memoryview(self._array[start:stop])
        if self._bytes is not None:
            return memoryview(self._bytes)[start:stop]
        if self._lock is None:
            return self._mv[start:stop]
        with self._lock:
            part = self._mv[start:stop]
            copy = bytes(part) if self._mv.readonly else bytearray(part)
            part.release()
        return memoryview(copy)
