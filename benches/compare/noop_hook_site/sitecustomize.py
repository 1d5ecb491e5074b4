"""Measurement aid for docs/benchmarks.md ("Hooks and queues"): with this directory on ``PYTHONPATH``, every
spdl_rs pipeline built in the process (and in the benchmark's worker subprocesses, which inherit the
environment) gets a no-op :py:class:`spdl_rs.pipeline.TaskHook` as its default hook class, so each stage runs
through the Python hook wrapper.

    PYTHONPATH=benches/compare/noop_hook_site .venv/bin/python benches/compare/py_pipeline.py --impl spdl_rs --only trivial
"""

from contextlib import asynccontextmanager

try:
    from spdl_rs.pipeline import TaskHook, config
except ImportError:  # another implementation's venv: nothing to set
    pass
else:

    class NoOpHook(TaskHook):
        """Enters and leaves around each task, doing nothing."""

        def __init__(self, info, interval=-1):
            self.info = info

        @asynccontextmanager
        async def task_hook(self, input_item=None):
            yield

    config.set_default_hook_class(NoOpHook)
