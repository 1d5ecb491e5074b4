"""SPDL's ``spdl.io.utils``: the FFmpeg in use, what this build has, and tracing.

- :py:func:`get_ffmpeg_versions`, :py:func:`get_ffmpeg_filters`, :py:func:`get_ffmpeg_log_level`,
  :py:func:`set_ffmpeg_log_level`: the FFmpeg libraries loaded at run time (the first of these calls loads
  them; without FFmpeg they raise ``RuntimeError`` saying what was looked for and how to install it).
- :py:func:`built_with_cuda`, :py:func:`built_with_nvcodec`, :py:func:`built_with_nvjpeg`: what the build has
  and can use here.
- :py:func:`tracing`, :py:func:`trace_event`, :py:func:`trace_counter`, :py:func:`trace_gc`: a trace of named
  slices and counters, written as Chrome trace-event JSON (open it in https://ui.perfetto.dev or
  ``chrome://tracing``). SPDL writes Perfetto's protobuf format instead; the events are the same.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from .. import _native

__all__ = [
    "built_with_cuda",
    "built_with_nvcodec",
    "built_with_nvjpeg",
    "get_ffmpeg_filters",
    "get_ffmpeg_log_level",
    "get_ffmpeg_versions",
    "set_ffmpeg_log_level",
    "trace_counter",
    "trace_event",
    "trace_gc",
    "tracing",
]

_NUM_COUNTERS = 8


def _ffmpeg_status() -> dict[str, Any]:
    status = dict(_native._ffmpeg_status())
    if not status["available"]:
        error = str(status["error"])
        prefix = "FFmpeg is not available: "
        raise RuntimeError(error if error.startswith(prefix) else prefix + error)
    return status


def get_ffmpeg_versions() -> dict[str, tuple[int, int, int]]:
    """The versions of the FFmpeg libraries in use: ``{"libavcodec": (59, 37, 100), ...}`` (``libavutil``,
    ``libavcodec``, ``libavformat``, ``libavfilter``, ``libswscale``, ``libswresample``).

    Raises:
        RuntimeError: FFmpeg is not available on this machine (the message says why and how to install it).
    """
    out: dict[str, tuple[int, int, int]] = {}
    for lib, version in _ffmpeg_status()["libraries"].items():
        if not lib.startswith("lib"):
            continue  # FFmpeg's own release string ("5.1.9-0+deb12u1"), not a library
        parts = [int(p) for p in str(version).split(".")[:3]]
        major, minor, micro = (parts + [0, 0, 0])[:3]
        out[lib] = (major, minor, micro)
    return out


def get_ffmpeg_filters() -> list[str]:
    """The names of the filters the FFmpeg in use has (``"scale"``, ``"aresample"``, ...), sorted.

    Raises:
        RuntimeError: FFmpeg is not available on this machine.
    """
    return list(_native._ffmpeg_filters())


def get_ffmpeg_log_level() -> int:
    """FFmpeg's log level. spdl_rs keeps it at ``8`` (fatal) so that damaged files in a dataset do not print,
    unless ``SPDL_FFMPEG_LOG`` or :py:func:`set_ffmpeg_log_level` says otherwise.

    Raises:
        RuntimeError: FFmpeg is not available on this machine.
    """
    return int(_native._ffmpeg_log_level())


def set_ffmpeg_log_level(val: int, /) -> None:
    """Sets FFmpeg's log level, for the whole process: ``-8`` quiet, ``0`` panic, ``8`` fatal, ``16`` error,
    ``24`` warning, ``32`` info, ``40`` verbose, ``48`` debug, ``56`` trace (as ``ffmpeg -loglevel``).

    Raises:
        TypeError: ``val`` is not an integer.
        RuntimeError: FFmpeg is not available on this machine.
    """
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"the log level must be an int, got {type(val).__name__}")
    _native._set_ffmpeg_log_level(val)


def built_with_cuda() -> bool:
    """True when this build has CUDA support and a CUDA driver with a device was found (transfers to the GPU
    work)."""
    cuda = dict(_native._build_info()).get("cuda", {})
    return bool(cuda.get("built")) and int(cuda.get("devices", 0)) > 0


def built_with_nvcodec() -> bool:
    """False: spdl_rs has no NVDEC decoder (video decodes on the CPU; see the README's list of what is not
    carried over)."""
    return False


def built_with_nvjpeg() -> bool:
    """False: spdl_rs has no nvJPEG decoder (JPEGs decode on the CPU with libjpeg-turbo or zune-jpeg)."""
    return False


class _Session:
    """One trace being written: events are buffered and streamed to the output as a JSON array."""

    def __init__(self, out: IO[str], buffer_bytes: int) -> None:
        self._out = out
        self._buffer: list[str] = []
        self._buffered = 0
        self._limit = max(buffer_bytes, 1)
        self._lock = threading.Lock()
        self._first = True
        self._pid = os.getpid()
        self._t0 = time.perf_counter_ns()
        out.write("[\n")

    def add(self, event: dict[str, Any]) -> None:
        event.setdefault("pid", self._pid)
        event.setdefault("tid", threading.get_native_id())
        event.setdefault("ts", (time.perf_counter_ns() - self._t0) / 1000.0)
        text = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._buffer.append(text)
            self._buffered += len(text) + 2
            if self._buffered >= self._limit:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        sep = "" if self._first else ",\n"
        self._out.write(sep + ",\n".join(self._buffer))
        self._first = False
        self._buffer.clear()
        self._buffered = 0

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            self._out.write("\n]\n")
            self._out.flush()


_session: _Session | None = None
_session_lock = threading.Lock()


@contextmanager
def tracing(
    output: int | str | os.PathLike[str],
    buffer_size: int = 4096,
    process_name: str | None = None,
    enable: bool = True,
) -> Iterator[None]:
    """Records the :py:func:`trace_event` slices, :py:func:`trace_counter` values and (after
    :py:func:`trace_gc`) garbage collections of every thread while the block runs, into ``output``.

    Args:
        output: A path, or an open file descriptor (left open).
        buffer_size: KiB of events buffered between writes.
        process_name: The process's name in the trace (default: ``sys.argv[0]``).
        enable: ``False`` records nothing (the block just runs).

    Raises:
        RuntimeError: A trace is already being recorded in this process.

    .. code-block:: python

        with tracing("/tmp/trace.json"):
            with trace_event("load"):
                load()
    """
    global _session
    if not enable:
        yield
        return
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
        raise ValueError(f"buffer_size must be a positive number of KiB, got {buffer_size!r}")
    out: IO[str] = (
        os.fdopen(output, "w", closefd=False) if isinstance(output, int) else open(output, "w", encoding="utf-8")
    )
    try:
        session = _Session(out, buffer_size * 1024)
        with _session_lock:
            if _session is not None:
                raise RuntimeError("a trace is already being recorded in this process")
            _session = session
        session.add({"name": "process_name", "ph": "M", "ts": 0,
                     "args": {"name": sys.argv[0] if process_name is None else process_name}})
        try:
            yield
        finally:
            with _session_lock:
                _session = None
            session.close()
    finally:
        out.close()


@contextmanager
def trace_event(name: str) -> Iterator[None]:
    """A named slice of the current thread, from entering the block to leaving it (nothing outside
    :py:func:`tracing`)."""
    session = _session
    if session is not None:
        session.add({"name": str(name), "ph": "B"})
    try:
        yield
    finally:
        if session is not None:
            session.add({"name": str(name), "ph": "E"})


def trace_counter(i: int, val: int | float) -> None:
    """Records counter ``i`` (``0`` to ``7``) at ``val`` (nothing outside :py:func:`tracing`).

    Raises:
        ValueError: ``i`` is not in ``[0, 7]``.
    """
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < _NUM_COUNTERS:
        raise ValueError(f"the counter index must be in [0, {_NUM_COUNTERS - 1}], got {i!r}")
    session = _session
    if session is not None:
        session.add({"name": f"counter_{i}", "ph": "C", "args": {"value": val}})


def trace_gc() -> None:
    """Records each garbage collection as a ``gc`` slice while a trace is recorded (from now on)."""

    def _on_gc(phase: str, _info: dict[str, Any]) -> None:
        session = _session
        if session is not None:
            session.add({"name": "gc", "ph": "B" if phase == "start" else "E"})

    gc.callbacks.append(_on_gc)
