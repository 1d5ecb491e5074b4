"""Pool executors that run the work of downstream stages first (SPDL's ``PriorityThreadPoolExecutor``,
``PriorityProcessPoolExecutor``, ``PriorityInterpreterPoolExecutor`` and ``PriorityExecutorEntrypoint``).

Each stage gets its own entrypoint from :py:meth:`get_executor`; entrypoints made later have higher priority
(or pass ``priority=N``, higher first). Submitted calls wait in one priority heap ordered by
``(-priority, the entrypoint's submission count)``; at most ``max_workers`` of them are handed to the underlying
stdlib pool at a time, so the pool's own FIFO queue never decides the order. Owners and entrypoints pickle as
their constructor arguments (for ``run_pipeline_in_subprocess``): in the receiving process, the entrypoints of
one owner share one rebuilt owner.

.. code-block:: python

    pool = PriorityThreadPoolExecutor(max_workers=4)
    builder.pipe(load, executor=pool.get_executor(), concurrency=4)
    builder.pipe(decode, executor=pool.get_executor(), concurrency=4)  # runs before pending loads
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from .._native.pipeline import PriorityScheduler

__all__ = [
    "PriorityExecutorEntrypoint",
    "PriorityInterpreterPoolExecutor",
    "PriorityProcessPoolExecutor",
    "PriorityThreadPoolExecutor",
]

_OWNERS: weakref.WeakValueDictionary[tuple[int, int], Any] = weakref.WeakValueDictionary()
_OWNER_COUNTER = itertools.count()


def _lookup(owner_id: tuple[int, int]) -> Any:
    """The live owner with this id made in this process, or ``None``."""
    owner = _OWNERS.get(owner_id)
    return owner if owner is not None and owner._pid == os.getpid() else None


def _new_owner_id() -> tuple[int, int]:
    # The process id keeps owners made here apart from owners unpickled from the parent.
    return (os.getpid(), next(_OWNER_COUNTER))


class _PriorityExecutorBase:
    """The priority heap (:py:class:`spdl_rs._native.pipeline.PriorityScheduler`) in front of a stdlib pool of
    ``_pool_executor_class``."""

    _pool_executor_class: type[Executor]

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        kwargs = {"thread_name_prefix": thread_name_prefix, "initializer": initializer, "initargs": initargs}
        self._setup({"max_workers": max_workers, **kwargs}, None, 0)

    def _setup(self, kwargs: dict[str, Any], owner_id: tuple[int, int] | None, counter: int) -> None:
        self._kwargs = kwargs
        pool: Any = self._pool_executor_class(**kwargs)
        self._pool = pool
        self._scheduler = PriorityScheduler(pool, max(1, int(pool._max_workers)))
        self._priority_counter: int = counter
        self._id: tuple[int, int] = owner_id if owner_id is not None else _new_owner_id()
        # A forked child inherits copies of the owners, whose pools' threads did not survive the fork: an owner
        # is used only in the process that made it (elsewhere a new one is made from its arguments).
        self._pid = os.getpid()
        _OWNERS[self._id] = self

    @property
    def _max_workers(self) -> int | None:
        value: int | None = self._kwargs.get("max_workers")
        return value

    def get_executor(self, *, priority: int | None = None) -> PriorityExecutorEntrypoint:
        """An executor for one pipeline stage.

        Args:
            priority: Higher runs first. ``None``: higher than every entrypoint made before without one.
        """
        if priority is None:
            self._priority_counter -= 1
            return PriorityExecutorEntrypoint(self, self._priority_counter)
        return PriorityExecutorEntrypoint(self, -priority)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Accepts no more calls; runs (or, with ``cancel_futures``, cancels) the waiting ones; with ``wait``,
        returns once every call is done and the pool's workers have exited. Without ``wait``, the pool is shut
        down when its last call ends."""
        self._scheduler.shutdown(wait, cancel_futures)
        _OWNERS.pop(self._id, None)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *args: object) -> None:
        self.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"id": self._id, "kwargs": self._kwargs, "priority_counter": self._priority_counter}

    def __setstate__(self, state: dict[str, Any]) -> None:
        existing = _lookup(state["id"])
        if existing is not None:
            self.__dict__.update(existing.__dict__)
            return
        self._setup(state["kwargs"], state["id"], state["priority_counter"])


class PriorityThreadPoolExecutor(_PriorityExecutorBase):
    """A thread pool whose waiting calls run in priority order; make one executor per stage with
    :py:meth:`get_executor` (later ones run first). Arguments as :py:class:`concurrent.futures.ThreadPoolExecutor`.
    """

    _pool_executor_class: type[Executor] = ThreadPoolExecutor


class PriorityProcessPoolExecutor(_PriorityExecutorBase):
    """A process pool whose waiting calls are dispatched in priority order; make one executor per stage with
    :py:meth:`get_executor`. Arguments as :py:class:`concurrent.futures.ProcessPoolExecutor`."""

    _pool_executor_class: type[Executor] = ProcessPoolExecutor

    def __init__(self, max_workers: int | None = None, **kwargs: Any) -> None:
        self._setup({"max_workers": max_workers, **kwargs}, None, 0)


if sys.version_info >= (3, 14):
    from concurrent.futures import InterpreterPoolExecutor  # type: ignore[attr-defined, unused-ignore]

    class PriorityInterpreterPoolExecutor(_PriorityExecutorBase):
        """A subinterpreter pool (Python 3.14+) whose waiting calls run in priority order; make one executor
        per stage with :py:meth:`get_executor`."""

        _pool_executor_class: type[Executor] = InterpreterPoolExecutor

else:

    class PriorityInterpreterPoolExecutor(Executor):  # type: ignore[no-redef, unused-ignore]
        """Needs Python 3.14 or later (``concurrent.interpreters``): here it raises ``RuntimeError``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(
                "PriorityInterpreterPoolExecutor requires Python 3.14 or later. "
                f"Current version: {sys.version_info.major}.{sys.version_info.minor}"
            )

        def get_executor(self, *, priority: int | None = None) -> PriorityExecutorEntrypoint:
            """Raises ``RuntimeError``: needs Python 3.14 or later."""
            raise RuntimeError("PriorityInterpreterPoolExecutor requires Python 3.14 or later.")


class PriorityExecutorEntrypoint(Executor):
    """The executor of one stage: submits to its owner's pool with the stage's fixed priority (made by
    ``get_executor`` of a priority pool). Pickles as its owner's constructor arguments; in the receiving process,
    the first entrypoint of an owner rebuilds it and the others share it."""

    def __init__(self, owner: _PriorityExecutorBase, priority: int) -> None:
        self._owner_id = owner._id
        self._owner_class: type[_PriorityExecutorBase] = type(owner)
        self._owner_kwargs = owner._kwargs
        self._priority = priority
        self._counter = 0
        self._owner_ref: _PriorityExecutorBase | None = owner

    @property
    def _owner(self) -> _PriorityExecutorBase:
        owner = self.__dict__.get("_owner_ref")
        if owner is None or owner._pid != os.getpid():
            owner = _lookup(self._owner_id)
            if owner is None:
                owner = self._owner_class.__new__(self._owner_class)
                owner._setup(dict(self._owner_kwargs), self._owner_id, 0)
            self._owner_ref = owner
        return owner

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Submits ``fn(*args, **kwargs)`` with this stage's priority (FIFO among its own calls)."""
        priority = (self._priority, self._counter)
        self._counter += 1
        return self._owner._scheduler.submit(priority, fn, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_owner_ref", "_owner_id", "_owner_class", "_owner_kwargs"):
            raise AttributeError(name)
        return getattr(self._owner, name)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "owner_id": self._owner_id,
            "owner_class": self._owner_class,
            "owner_kwargs": self._owner_kwargs,
            "priority": self._priority,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._owner_id = state["owner_id"]
        self._owner_class = state["owner_class"]
        self._owner_kwargs = state["owner_kwargs"]
        self._priority = state["priority"]
        self._counter = 0
        self._owner_ref = None
