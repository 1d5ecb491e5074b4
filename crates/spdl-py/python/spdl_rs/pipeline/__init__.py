"""A drop-in for ``spdl.pipeline`` on the spdl-rs engine.

Build with :py:class:`PipelineBuilder`, iterate the :py:class:`Pipeline` it returns. Sync Python ops run on
the engine's Rust thread pool and hold the GIL only while Python code runs; async ops run on an asyncio loop
the pipeline owns; native ops (:py:mod:`spdl_rs.io.ops`) never take the GIL.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes as _lazy_attributes
from . import defs
from ._failure import EOF, EPOCH_END, PipelineFailure, is_eof, is_epoch_end
from ._pipeline import Pipeline, PipelineIterator
from ._stats import QueuePerfStats, StageStats, TaskPerfStats

if TYPE_CHECKING:
    from ._builder import PipelineBuilder, build_pipeline

# Names whose modules load on first use (the builder with its region, profiling and hook machinery, subprocess
# and shared-memory machinery): importing ``spdl_rs.pipeline`` stays cheap, and ``from spdl_rs.pipeline import
# X`` works as in SPDL.
_LAZY: dict[str, str] = {
    # building
    "PipelineBuilder": "._builder",
    "build_pipeline": "._builder",
    # hooks, queues, background tasks
    "TaskHook": "._hooks",
    "TaskStatsHook": "._hooks",
    "StageInfo": "._hooks",
    "create_task": "._hooks",
    "AsyncQueue": "._queues",
    "StatsQueue": "._queues",
    "BackgroundTask": "._bg_task",
    "BackgroundTaskFactory": "._bg_task",
    # profiling
    "profile_pipeline": "._profile",
    "ProfileHook": "._profile",
    "ProfileResult": "._profile",
    # running elsewhere
    "iterate_in_subprocess": "._subprocess",
    "run_pipeline_in_subprocess": "._subprocess",
    "iterate_in_subinterpreter": "._subprocess",
    "run_pipeline_in_subinterpreter": "._subprocess",
    "cache_iterator": "._cache_iterator",
    "SharedMemoryRingBuffer": "._arena",
    "SharedMemorySegmentPool": "._arena",
    "PriorityExecutorEntrypoint": "._priority",
    "PriorityThreadPoolExecutor": "._priority",
    "PriorityProcessPoolExecutor": "._priority",
    "PriorityInterpreterPoolExecutor": "._priority",
    "ProcessGroupResourceUsage": "._pgrp_stats",
    "ProcessGroupStatsMonitor": "._pgrp_stats",
}


__getattr__, __dir__ = _lazy_attributes(__name__, globals(), _LAZY)


__all__ = [
    "EOF",
    "EPOCH_END",
    "Pipeline",
    "PipelineFailure",
    "PipelineIterator",
    "QueuePerfStats",
    "StageStats",
    "TaskPerfStats",
    "defs",
    *_LAZY,
    "is_eof",
    "is_epoch_end",
]
