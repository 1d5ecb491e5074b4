"""SPDL's ``spdl.io.utils``: the FFmpeg in use, what this build has, and tracing.

- :py:func:`get_ffmpeg_versions`, :py:func:`get_ffmpeg_filters`, :py:func:`get_ffmpeg_log_level`,
  :py:func:`set_ffmpeg_log_level`: the FFmpeg libraries loaded at run time (the first of these calls loads
  them; without FFmpeg they raise ``RuntimeError`` saying what was looked for and how to install it).
- :py:func:`built_with_cuda`, :py:func:`built_with_nvcodec`, :py:func:`built_with_nvjpeg`: what the build has
  and can use here.
- :py:func:`tracing`, :py:func:`trace_event`, :py:func:`trace_counter`, :py:func:`trace_gc`: a trace of named
  slices and counters, written (natively) as Chrome trace-event JSON (open it in https://ui.perfetto.dev or
  ``chrome://tracing``). SPDL writes Perfetto's protobuf format instead; the events are the same.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._native.io import (
    built_with_cuda,
    built_with_nvcodec,
    built_with_nvjpeg,
    get_ffmpeg_filters,
    get_ffmpeg_log_level,
    get_ffmpeg_versions,
    set_ffmpeg_log_level,
    trace,
    trace_counter,
    trace_start,
)

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
    if not enable:
        yield
        return
    session = trace_start(output, buffer_size, sys.argv[0] if process_name is None else process_name)
    try:
        yield
    finally:
        session.close()


@contextmanager
def trace_event(name: str) -> Iterator[None]:
    """A named slice of the current thread, from entering the block to leaving it (nothing outside
    :py:func:`tracing`)."""
    session = trace(str(name), "B")
    try:
        yield
    finally:
        if session is not None:
            trace(str(name), "E", session)


def trace_gc() -> None:
    """Records each garbage collection as a ``gc`` slice while a trace is recorded (from now on)."""

    def _on_gc(phase: str, _info: dict[str, Any]) -> None:
        trace("gc", "B" if phase == "start" else "E")

    gc.callbacks.append(_on_gc)
