"""Background tasks: coroutines that run on a pipeline's event loop alongside its stages."""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "BackgroundTask",
    "BackgroundTaskFactory",
    "get_default_background_tasks",
    "set_default_background_tasks",
]


class BackgroundTask:
    """A coroutine that runs alongside a pipeline's stages (a monitor, a metrics exporter, ...).

    Subclass it and implement :py:meth:`run`. It is started on the pipeline's event loop when the pipeline
    starts, and cancelled when the pipeline ends (its input is exhausted, or it is stopped). A failure is
    logged and does not affect the pipeline.

    .. code-block:: python

        class Monitor(BackgroundTask):
            async def run(self) -> None:
                while True:
                    report()
                    await asyncio.sleep(60)

        pipeline = build_pipeline(cfg, num_threads=4, background_tasks=[Monitor])
    """

    async def run(self) -> None:
        """The task's work; catch :py:class:`asyncio.CancelledError` to clean up when the pipeline ends."""
        raise NotImplementedError(f"{type(self).__name__} must implement `run()`")


#: What ``background_tasks=`` takes: callables (usually :py:class:`BackgroundTask` subclasses) that make one.
BackgroundTaskFactory = Callable[[], BackgroundTask]

_DEFAULT_BACKGROUND_TASKS: list[BackgroundTaskFactory] | None = None


def get_default_background_tasks() -> list[BackgroundTaskFactory] | None:
    """The background task factories every pipeline gets (``None`` when unset)."""
    return _DEFAULT_BACKGROUND_TASKS


def set_default_background_tasks(tasks: list[BackgroundTaskFactory] | None) -> None:
    """Sets the background task factories every pipeline gets, before those given to ``build``.

    Each factory is called once per pipeline; the :py:class:`BackgroundTask` it returns runs on the pipeline's
    event loop while the pipeline runs and is cancelled when it ends. Failures are logged, not raised.

    Args:
        tasks: The factories, or ``None`` to unset.
    """
    global _DEFAULT_BACKGROUND_TASKS
    _DEFAULT_BACKGROUND_TASKS = tasks
