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

from ._hooks import StageInfo, _periodic_dispatch, _StatsCounter, _time_str, create_task
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
    Python call per item); given as ``queue_class`` it runs as written here.

    Args:
        info: The producing stage.
        buffer_size: The queue's capacity.
        interval: Seconds between periodic reports (``<= 0``: none; the final report is always logged).
    """

    def __init__(self, info: StageInfo, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(info, buffer_size=buffer_size)
        self.interval = interval
        self._getc = _StatsCounter()
        self._putc = _StatsCounter()
        self._empty_t0 = 0.0
        self._dur_empty = 0.0
        self._lap_t0 = 0.0
        self._lap_num_get = 0
        self._lap_num_put = 0
        self._lap_ave_get_time = 0.0
        self._lap_ave_put_time = 0.0
        self._lap_dur_empty = 0.0

    async def get(self) -> object:
        """Takes the next item, timing the wait."""
        with self._getc.count():
            item = await super().get()
        if self.qsize() == 0:
            self._empty_t0 = time.monotonic()
        return item

    async def put(self, item: object) -> None:
        """Adds an item, timing the wait for room."""
        if self.qsize() == 0:
            self._dur_empty += time.monotonic() - self._empty_t0
        with self._putc.count():
            await super().put(item)

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Runs the periodic report (if any) during the stage, and logs the final stats at its end."""
        t0 = self._lap_t0 = self._empty_t0 = time.monotonic()
        done = asyncio.Event()
        report: asyncio.Task[None] | None = None
        if self.interval > 0:
            report = create_task(
                _periodic_dispatch(self._log_interval_stats, done, self.interval),
                name=f"{self.info}_queue_periodic_report",
                log_cancelled=False,
            )
        try:
            yield
        finally:
            if report is not None:
                done.set()
                await report
            now = time.monotonic()
            elapsed = now - t0
            occupancy = 0.0 if elapsed <= 0 else 1 - self._empty_duration(now) / elapsed
            self._log_stats(
                QueuePerfStats(
                    elapsed=elapsed,
                    num_items=self._getc.num_items,
                    ave_put_time=self._putc.ave_time,
                    ave_get_time=self._getc.ave_time,
                    p90_put_time=self._putc.p90_time,
                    p99_put_time=self._putc.p99_time,
                    p90_get_time=self._getc.p90_time,
                    p99_get_time=self._getc.p99_time,
                    occupancy_rate=max(0.0, occupancy),
                    queue_len=self.qsize(),
                    capacity=self.maxsize,
                )
            )

    def _empty_duration(self, now: float) -> float:
        # Counts the empty period still open, if the queue is empty now.
        return self._dur_empty + (now - self._empty_t0 if self.empty() else 0.0)

    def _get_lap_stats(self) -> QueuePerfStats:
        now = time.monotonic()
        num_put, ave_put = self._putc.num_items, self._putc.ave_time
        num_get, ave_get = self._getc.num_items, self._getc.ave_time
        dur_empty = self._empty_duration(now)
        elapsed = max(0.0, now - self._lap_t0)
        d_put = max(0, num_put - self._lap_num_put)
        d_get = max(0, num_get - self._lap_num_get)
        d_ave_put = 0.0 if d_put <= 0 else (ave_put * num_put - self._lap_ave_put_time * self._lap_num_put) / d_put
        d_ave_get = 0.0 if d_get <= 0 else (ave_get * num_get - self._lap_ave_get_time * self._lap_num_get) / d_get
        occupancy = 0.0 if elapsed <= 0 else 1 - (dur_empty - self._lap_dur_empty) / elapsed
        put_p90, put_p99 = self._putc.consume_lap_percentiles()
        get_p90, get_p99 = self._getc.consume_lap_percentiles()
        self._lap_t0 = now
        self._lap_num_put, self._lap_num_get = num_put, num_get
        self._lap_ave_put_time, self._lap_ave_get_time = ave_put, ave_get
        self._lap_dur_empty = dur_empty
        return QueuePerfStats(
            elapsed=elapsed,
            num_items=d_get,
            ave_put_time=d_ave_put,
            ave_get_time=d_ave_get,
            p90_put_time=put_p90,
            p99_put_time=put_p99,
            p90_get_time=get_p90,
            p99_get_time=get_p99,
            occupancy_rate=max(0.0, occupancy),
            queue_len=self.qsize(),
            capacity=self.maxsize,
        )

    async def _log_interval_stats(self) -> None:
        await self.interval_stats_callback(self._get_lap_stats())

    async def interval_stats_callback(self, stats: QueuePerfStats) -> None:
        """Called every ``interval`` seconds with the stats since the previous call; logs them. Override it to
        send them elsewhere."""
        self._log_stats(stats)

    def _log_stats(self, stats: QueuePerfStats) -> None:
        _LG.info(*_queue_stats_line(f"{self.info}_queue", stats), stacklevel=2)


def _queue_stats_line(name: str, stats: QueuePerfStats) -> tuple[object, ...]:
    return (
        "[%s]\tProcessed %5d items in %s (QPS: %6.1f) Ave wait time: put: %s, get (by next stage): %s. "
        "P90: put: %s, get: %s. P99: put: %s, get: %s. Occupancy rate: %d%%",
        name,
        stats.num_items,
        _time_str(stats.elapsed),
        stats.qps,
        _time_str(stats.ave_put_time),
        _time_str(stats.ave_get_time),
        _time_str(stats.p90_put_time),
        _time_str(stats.p90_get_time),
        _time_str(stats.p99_put_time),
        _time_str(stats.p99_get_time),
        100 * stats.occupancy_rate,
    )


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
