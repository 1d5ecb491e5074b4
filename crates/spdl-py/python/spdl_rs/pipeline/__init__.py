"""A drop-in for ``spdl.pipeline`` on the spdl-rs engine.

Build with :py:class:`PipelineBuilder`, iterate the :py:class:`Pipeline` it returns. Sync Python ops run on
the engine's Rust thread pool and hold the GIL only while Python code runs; async ops run on an asyncio loop
the pipeline owns; native ops (:py:mod:`spdl_rs.io.ops`) never take the GIL.
"""

from . import defs
from ._builder import PipelineBuilder, build_pipeline
from ._failure import EOF, EPOCH_END, PipelineFailure, is_eof, is_epoch_end
from ._pipeline import Pipeline, PipelineIterator
from ._stats import QueuePerfStats, StageStats, TaskPerfStats

__all__ = [
    "EOF",
    "EPOCH_END",
    "Pipeline",
    "PipelineBuilder",
    "PipelineFailure",
    "PipelineIterator",
    "QueuePerfStats",
    "StageStats",
    "TaskPerfStats",
    "build_pipeline",
    "defs",
    "is_eof",
    "is_epoch_end",
]
