"""Per-stage performance statistics, as the engine measures them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    p50_time: float
    """Median time of a call."""
    p90_time: float
    """90th percentile of the call time."""
    p99_time: float
    """99th percentile of the call time."""


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
    queue_len: int
    """Items in the queue at the snapshot."""
    capacity: int
    """The queue's capacity."""


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


def _per_item(total: float, n: int) -> float:
    return total / n if n else 0.0


def from_raw(raw: dict[str, Any]) -> StageStats:
    """Builds a :py:class:`StageStats` from one dict of ``PipelineCore.stats()``."""
    calls = int(raw["items_in"])
    return StageStats(
        name=raw["name"],
        kind=raw["kind"],
        concurrency=int(raw["concurrency"]),
        busy=float(raw["busy"]),
        task=TaskPerfStats(
            num_tasks=calls,
            num_failures=int(raw["items_failed"]),
            ave_time=float(raw["task_mean"]),
            p50_time=float(raw["task_p50"]),
            p90_time=float(raw["task_p90"]),
            p99_time=float(raw["task_p99"]),
        ),
        queue=QueuePerfStats(
            elapsed=float(raw["elapsed"]),
            num_items=int(raw["items_out"]),
            ave_put_time=_per_item(float(raw["blocked"]), int(raw["items_out"])),
            ave_get_time=_per_item(float(raw["starved"]), calls),
            queue_len=int(raw["queue_len"]),
            capacity=int(raw["queue_capacity"]),
        ),
    )
