"""Process-wide settings of ``spdl_rs.pipeline`` (SPDL's ``spdl.pipeline.config``): default hook and queue
classes, profiling defaults, the build callback, default background tasks, and log compaction.

Each setting lives with the code that uses it; this module only gathers them.
"""

from ._bg_task import get_default_background_tasks, set_default_background_tasks
from ._builder import get_default_build_callback, set_default_build_callback
from ._hooks import _set_compact_log as set_compact_log
from ._hooks import get_default_hook_class, set_default_hook_class
from ._profile import (
    diagnostic_mode_num_sources,
    get_default_profile_callback,
    get_default_profile_hook,
    is_diagnostic_mode_enabled,
    set_default_profile_callback,
    set_default_profile_hook,
)
from ._queues import get_default_queue_class, set_default_queue_class

__all__ = [
    "is_diagnostic_mode_enabled",
    "diagnostic_mode_num_sources",
    "set_default_hook_class",
    "get_default_hook_class",
    "set_default_queue_class",
    "get_default_queue_class",
    "set_default_profile_hook",
    "get_default_profile_hook",
    "set_default_profile_callback",
    "get_default_profile_callback",
    "get_default_build_callback",
    "set_default_build_callback",
    "get_default_background_tasks",
    "set_default_background_tasks",
    "set_compact_log",
]
