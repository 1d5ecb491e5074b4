"""The queue classes of ``spdl.pipeline`` (:py:class:`AsyncQueue`, :py:class:`StatsQueue`) and the default
queue class setting.

With the default (:py:class:`StatsQueue`, or plain :py:class:`AsyncQueue`) the engine's own native queues
connect the stages and its counters serve the stats. A custom queue class (``build(queue_class=...)`` or
:py:func:`set_default_queue_class`) is instantiated once per connection, as in SPDL, and every item crossing
that connection goes through its ``put`` and ``get`` on the pipeline's event loop (see ``_extensions.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .. import _native
from ._hooks import StageInfo, _reporting
from ._stats import QueuePerfStats

__all__ = ["AsyncQueue", "StatsQueue", "get_default_queue_class", "set_default_queue_class"]

_LG = logging.getLogger("spdl_rs.pipeline")


class AsyncQueue(asyncio.Queue[object]):
    """An :py:class:`asyncio.Queue` with a stage hook: the queue that carries one stage's output to the next.

    ``stage_hook`` is entered when the producing stage starts and exited when it ends; ``put`` is called for
    each item the stage outputs (and for the end-of-stream marker, :py:func:`spdl_rs.pipeline.is_eof`), and
    ``get`` by the next stage for each of them. Subclass it to observe the traffic (see :py:class:`StatsQueue`).

    Args:
        info: The producing stage.
        buffer_size: The queue's capacity.
    """

    def __init__(self, info: StageInfo, *, buffer_size: int = 1) -> None:
        super().__init__(buffer_size)
        self.info = info

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs around the producing stage's life (nothing by default)."""
        yield


class StatsQueue(AsyncQueue):
    """An :py:class:`AsyncQueue` that measures how long ``put`` and ``get`` wait and how often the queue is
    empty, and logs it at the end of the stage (and every ``interval`` seconds if ``interval > 0``).

    It is the default queue class. As the default, the engine's native queues and counters stand for it (no
    Python call per item); given as ``queue_class`` it runs as written here, its measurements kept natively.

    Args:
        info: The producing stage.
        buffer_size: The queue's capacity.
        interval: Seconds between periodic reports (``<= 0``: none; the final report is always logged).
    """

    def __init__(self, info: StageInfo, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(info, buffer_size=buffer_size)
        self.interval = interval
        self._stats = _native.pipeline._QueueStats()
        self._getc, self._putc = self._stats.getc, self._stats.putc

    async def get(self) -> object:
        """Takes the next item, timing the wait."""
        t0 = time.monotonic()
        item = await super().get()
        self._stats.got(time.monotonic() - t0, self.qsize())
        return item

    async def put(self, item: object) -> None:
        """Adds an item, timing the wait for room."""
        self._stats.putting(self.qsize())
        t0 = time.monotonic()
        await super().put(item)
        self._putc.update(time.monotonic() - t0)

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs the periodic report (if any) during the stage, and logs the final stats at its end."""
        self._stats.start()
        async with _reporting(self, f"{self.info}_queue_periodic_report"):
            yield

    def _final_stats(self) -> QueuePerfStats:
        return QueuePerfStats(*self._stats.total(self.qsize(), self.maxsize))

    def _get_lap_stats(self) -> QueuePerfStats:
        return QueuePerfStats(*self._stats.lap(self.qsize(), self.maxsize))

    async def _log_interval_stats(self) -> None:
        await self.interval_stats_callback(self._get_lap_stats())

    async def interval_stats_callback(self, stats: QueuePerfStats) -> None:
        """Called every ``interval`` seconds with the stats since the previous call; logs them. Override it to
        send them elsewhere."""
        self._log_stats(stats)

    def _log_stats(self, stats: QueuePerfStats) -> None:
        _LG.info(*_queue_stats_line(f"{self.info}_queue", stats), stacklevel=2)


def _queue_stats_line(name: str, stats: QueuePerfStats) -> tuple[str, str]:
    """The arguments of the log call of :py:class:`StatsQueue`'s line for ``stats``."""
    return ("%s", _native.pipeline._queue_stats_line(name, stats))


_DEFAULT_QUEUE_CLASS: type[AsyncQueue] = StatsQueue


def set_default_queue_class(queue_class: type[AsyncQueue] = StatsQueue) -> None:
    """Sets the queue class that connects stages when ``build`` has no ``queue_class``.

    Args:
        queue_class: A subclass of :py:class:`AsyncQueue` (called as ``queue_class(info, buffer_size=n,
            interval=report_stats_interval)``). Default (and ``None``): :py:class:`StatsQueue`.
    """
    global _DEFAULT_QUEUE_CLASS
    _DEFAULT_QUEUE_CLASS = StatsQueue if queue_class is None else queue_class


def get_default_queue_class() -> type[AsyncQueue]:
    """The default queue class."""
    return _DEFAULT_QUEUE_CLASS
