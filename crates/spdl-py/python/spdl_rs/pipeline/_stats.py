"""Per-stage performance statistics, as the engine measures them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _native

__all__ = ["TaskPerfStats", "QueuePerfStats", "StageStats"]


@dataclass(frozen=True)
class TaskPerfStats:
    """How the calls of one stage went (times in seconds)."""

    num_tasks: int
    """Calls completed (successful or not)."""
    num_failures: int
    """Calls that failed (their items were dropped)."""
    ave_time: float
    """Mean time of a call."""
    p90_time: float
    """90th percentile of the call time."""
    p99_time: float
    """99th percentile of the call time."""
    p50_time: float = 0.0
    """(spdl_rs only) Median time of a call."""


@dataclass(frozen=True)
class QueuePerfStats:
    """How the queue after one stage was used (times in seconds)."""

    elapsed: float
    """Seconds since the pipeline started."""
    num_items: int
    """Items the stage put into the queue."""
    ave_put_time: float
    """Mean time the stage waited for room in the queue, per item (downstream is slower: blocked)."""
    ave_get_time: float
    """Mean time the stage waited for its input, per item (upstream is slower: starved)."""
    p90_put_time: float = 0.0
    """90th percentile of the time a ``put`` waited (measured by :py:class:`StatsQueue`; 0 in the engine's
    stats, which time waits in total only)."""
    p99_put_time: float = 0.0
    """99th percentile of the time a ``put`` waited (as ``p90_put_time``)."""
    p90_get_time: float = 0.0
    """90th percentile of the time a ``get`` waited (as ``p90_put_time``)."""
    p99_get_time: float = 0.0
    """99th percentile of the time a ``get`` waited (as ``p90_put_time``)."""
    occupancy_rate: float = 0.0
    """Share of the time the queue held at least one item (near 1: the downstream stage always had input
    ready; near 0: it starved). The engine estimates it from the time the next stage waited for input."""
    queue_len: int = 0
    """(spdl_rs only) Items in the queue at the snapshot."""
    capacity: int = 0
    """(spdl_rs only) The queue's capacity."""

    @property
    def qps(self) -> float:
        """Items per second: ``num_items / elapsed``."""
        if self.elapsed <= 0:
            return 0
        return self.num_items / self.elapsed


@dataclass(frozen=True)
class StageStats:
    """One row of :py:meth:`Pipeline.get_stats`."""

    name: str
    """The stage's name (``source``, the op's name, ``aggregate(32)``, ``sink`` ...)."""
    kind: str
    """``source``, ``blocking``, ``async``, ``aggregate``, ``disaggregate`` or ``sink``."""
    concurrency: int
    """The stage's concurrency."""
    busy: float
    """Fraction of the elapsed time the stage's workers were running its function (the bottleneck has the
    highest)."""
    task: TaskPerfStats
    """The stage's calls."""
    queue: QueuePerfStats
    """The stage's output queue."""
    item_bytes: int | None = None
    """The memory one of the stage's items holds, as the auto-tuner's budget counts it: measured on a sample
    of the stage's outputs (``nbytes`` of arrays and tensors, the length of bytes and strings, summed over
    lists, tuples and dicts); ``None`` until measured, or for rows that are not ops."""


def from_raw(raw: dict[str, Any], next_raw: dict[str, Any] | None = None) -> StageStats:
    """Builds a :py:class:`StageStats` from one dict of ``PipelineCore.stats()`` (and the next stage's, for
    the occupancy of the queue between them: see ``_native.pipeline._stage_figures``)."""
    name, kind, concurrency, busy, task, queue, item_bytes = _native.pipeline._stage_figures(raw, next_raw)
    return StageStats(name, kind, concurrency, busy, TaskPerfStats(*task), QueuePerfStats(*queue), item_bytes)
