"""``Pipeline``: the Python face of a built spdl-rs pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from .. import _native
from ._failure import PipelineFailure
from ._stats import StageStats, from_raw

__all__ = ["Pipeline", "PipelineIterator"]

_LG = logging.getLogger("spdl_rs.pipeline")

T = TypeVar("T")


async def _collect(agen: Any) -> list[Any]:
    return [x async for x in agen]


async def _call(op: Any, arg: Any) -> Any:
    """``op(arg)`` as a task (an async generator function's call, which makes the generator)."""
    return op(arg)


def _task_is_cancelling() -> bool:
    """Whether the running task is being cancelled (a ``CancelledError`` it did not raise itself)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11+
    return cancelling is None or bool(cancelling())


def _fail(reply: Any, e: BaseException) -> None:
    """Hands ``e`` to ``reply`` without ``_guard``'s own frame in its traceback: the engine may keep the
    exception (for ``PipelineFailure``), and that frame holds ``reply``, which holds the engine's failure
    record: a cycle through native objects that the garbage collector cannot see (it kept every stopped
    pipeline's event loop and its sockets alive)."""
    if e.__traceback__ is not None:
        e.__traceback__ = e.__traceback__.tb_next
    reply.fail(e)


async def _guard(awaitable: Any, reply: Any) -> Any:
    """Awaits one job's awaitable so that no exception escapes its task but the cancellation of the task
    itself; the outcome goes to ``reply`` (a result through the task's ``reply.done``, an exception through
    ``reply.fail``).

    asyncio re-raises a ``KeyboardInterrupt`` or ``SystemExit`` that escapes a task out of ``run_forever``,
    which would end the loop thread with every other job still waiting. Handed to ``reply.fail`` instead, an
    ordinary ``Exception`` fails the item, and any other ``BaseException`` becomes the pipeline's fatal
    exception, which stops it and is raised in the consumer. A ``CancelledError`` the op raised itself (the
    task was not cancelled) is the item's failure."""
    try:
        return await awaitable
    except asyncio.CancelledError as e:
        if _task_is_cancelling():
            raise
        _fail(reply, e)
    except BaseException as e:  # noqa: BLE001 (KeyboardInterrupt, SystemExit, ...: the pipeline's fatal exception)
        _fail(reply, e)
    return None


#: How long a pipeline stopped by a fatal exception (``KeyboardInterrupt``, ``SystemExit`` raised by an op)
#: waits for its threads before the exception is re-raised (seconds).
_FATAL_STOP_TIMEOUT = 10.0

#: How long garbage collection or interpreter exit waits for a pipeline's threads (seconds); an op still
#: running then is left to finish on its own thread.
_FINALIZE_TIMEOUT = 1.0


class _EventLoop:
    """The asyncio loop that runs a pipeline's async ops, on a daemon thread the pipeline owns.

    The engine's scheduler submits coroutines through an :py:class:`spdl_rs._native.pipeline.AsyncBridge` without
    the GIL; this loop wakes on the bridge's socket and starts them.
    """

    def __init__(self) -> None:
        self.bridge = _native.pipeline.AsyncBridge()
        # Made on start: a pipeline that is built but never started holds no loop (and no file descriptors).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="spdl_rs-asyncio", daemon=True)

    def start(self) -> None:
        # The loop is made on its own thread: made here, a Ctrl-C landing inside its constructor would leave a
        # half-made loop whose destructor fails later.
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise RuntimeError("could not start the pipeline's event loop") from self._start_error

    def _run(self) -> None:
        try:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.add_reader(self.bridge.fileno(), self._drain)
        except BaseException as e:  # noqa: BLE001 (reported by `start`)
            self._start_error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.remove_reader(self.bridge.fileno())
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _drain(self) -> None:
        loop = self._loop
        assert loop is not None
        for kind, op, arg, reply in self.bridge.take_jobs():
            try:
                if kind == "call":
                    awaitable = op(arg)
                elif kind == "gen":
                    awaitable = _collect(op(arg))
                elif kind == "start":
                    awaitable = _call(op, arg)
                elif kind == "close":
                    # A stage's async generator whose stream was dropped early: finalized here, on the loop.
                    awaitable = op.aclose()
                else:
                    awaitable = op.__anext__()
                task = loop.create_task(_guard(awaitable, reply))
            except BaseException as e:  # noqa: BLE001 (the op's own failure, reported as such)
                reply.fail(e)
                continue
            task.add_done_callback(reply.done)

    def stop(self, timeout: float | None) -> bool:
        """Stops the loop; ``False`` if its thread is still running after ``timeout`` (an async op that
        blocks the loop)."""
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            # Started, maybe still making its loop (a Ctrl-C can end `start` before the loop is ready).
            self._ready.wait(timeout)
        loop = self._loop
        if loop is None or not self._thread.is_alive():
            return True
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is self._thread:  # a finalizer may run on the loop thread itself
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _finalize(
    core_ref: weakref.ref[_native.pipeline.PipelineCore],
    loop: _EventLoop | None,
    resources: Sequence[Any] = (),
    extensions: Any = None,
) -> None:
    """The finalizer (garbage collection, interpreter exit): a bounded stop that never raises.

    It holds the engine core only weakly: a strong reference from the finalizer registry would keep the
    pipeline's ops alive, and with them an owner that the ops refer to (a bound method of the object that
    owns the pipeline), so that the cycle could never be collected. When the core is gone already (collected
    with its cycle), its own destructor has stopped its threads (and its stats reporter); what is left here is
    the event loop and the resources."""
    core = core_ref()
    try:
        if core is not None:
            core.shutdown(_FINALIZE_TIMEOUT, event_loop=loop, resources=resources, extensions=extensions)
            return
        for r in resources:
            r.signal_stop()
        if extensions is not None:
            with contextlib.suppress(Exception):
                extensions.close()
        if loop is not None:
            loop.stop(_FINALIZE_TIMEOUT)
        for r in resources:
            with contextlib.suppress(Exception):
                r.close()
    except TimeoutError as e:
        _LG.warning("A pipeline was garbage-collected or left at exit while running: %s", e)


#: The engine cores of the pipelines alive now, for the shutdown hook.
_LIVE_CORES: weakref.WeakSet[_native.pipeline.PipelineCore] = weakref.WeakSet()


def _stop_all_at_shutdown() -> None:
    """``threading._register_atexit`` hook (as SPDL's): runs when the main thread ends, before non-daemon threads
    are joined and before ``atexit`` handlers. Tells every live pipeline to stop (without waiting), then waits,
    bounded, for the engine threads that are running Python ops to leave them, so that no engine thread is
    inside the interpreter when it finalizes (see ``crates/spdl-py/src/lifecycle.rs``)."""
    for core in list(_LIVE_CORES):
        with contextlib.suppress(Exception):
            core.stop(0)
    with contextlib.suppress(Exception):
        left = _native._wait_engine_threads()
        if left:
            _LG.warning("%d pipeline op(s) were still running Python code at interpreter exit", left)


# A forked child (a process pool's worker, say) inherits the parent's pipeline objects but none of their
# engine threads: their `stop` does nothing there (the native core knows the fork generation it was made in).
with contextlib.suppress(RuntimeError):  # imported while the interpreter shuts down: nothing to register
    threading._register_atexit(_stop_all_at_shutdown)  # type: ignore[attr-defined]


class Pipeline(Generic[T]):
    """A data pipeline built by :py:meth:`PipelineBuilder.build`.

    The first :py:meth:`get_item` (or iteration) starts it; :py:meth:`stop` stops it and joins every thread it
    started. A pipeline that is garbage-collected, or still running when the interpreter exits, is stopped.

    .. code-block:: python

        with pipeline.auto_stop():
            for item in pipeline:
                ...
    """

    def __init__(
        self,
        core: _native.pipeline.PipelineCore,
        *,
        event_loop: _EventLoop | None,
        report_stats_interval: float,
        resources: Sequence[Any] = (),
        extensions: Any = None,
        checkpoint: Any = None,
    ) -> None:
        self._core = core
        # Hooks, custom queues, background tasks (``_extensions.Extensions``), and the SPDL-style final stats.
        self._ext = extensions
        # The checkpoint tracker (_checkpoint.Tracker), or why the pipeline cannot be checkpointed.
        self._checkpoint = checkpoint
        self._unwrap = checkpoint.unwrap if isinstance(checkpoint, _native.pipeline.CheckpointTracker) else None
        self._loop = event_loop
        self._report_interval = report_stats_interval
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._resources = tuple(resources)
        _LIVE_CORES.add(core)
        self._finalizer = weakref.finalize(self, _finalize, weakref.ref(core), event_loop, self._resources, extensions)

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running" if self._started else "ready"
        return f"<spdl_rs.pipeline.Pipeline ({state})>"

    def start(self, *, timeout: float | None = None, **_kwargs: Any) -> None:
        """Starts the pipeline (its scheduler, thread pool, and event loop if an op is async).

        ``timeout`` is accepted for compatibility with ``spdl.pipeline``; starting does not wait.

        Raises:
            RuntimeError: The pipeline was started already.
        """
        with self._lock:
            if self._started:
                raise RuntimeError("The pipeline is already started.")
            self._start_locked()

    def _start_locked(self) -> None:
        self._started = True
        if self._loop is not None:
            self._loop.start()
        if self._ext is not None:
            try:
                self._ext.enter()
            except Exception as e:
                # A stage hook failed: the pipeline fails before its first item, as SPDL's does.
                self._stopped = True
                self._finalizer.detach()
                self._core.shutdown(_FINALIZE_TIMEOUT, event_loop=self._loop, resources=self._resources)
                self._ext.close()
                raise PipelineFailure([("stage_hook", e)], "pipeline stages failed") from e
        self._core.start()
        if self._report_interval > 0:
            self._core.start_reporter(self._report_interval, self._ext)

    def stop(self, *, timeout: float | None = None) -> None:
        """Stops the pipeline: cancels pending work, waits for running ops to return, and joins every thread.

        Idempotent. Pending async ops are cancelled quietly. Waiting can be interrupted with Ctrl-C.

        Args:
            timeout: The most seconds to wait for running ops (``None``: as long as they take).

        Raises:
            TimeoutError: An op was still running at ``timeout``. The pipeline is stopped all the same (no new
                call starts, iteration has ended); the op's thread is left to finish on its own.
            PipelineFailure: (once) A failure budget was spent, or the source raised.
            ValueError: ``timeout`` is NaN or negative (``inf`` waits as long as it takes).
        """
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._finalizer.detach()
                self._shutdown(timeout)
        self._raise_failure()

    def _shutdown(self, timeout: float | None) -> None:
        self._core.shutdown(timeout, event_loop=self._loop, resources=self._resources, extensions=self._ext)

    def _raise_failure(self) -> None:
        failure = self._core.take_failure()
        if failure is not None:
            raise PipelineFailure(*failure)

    @contextlib.contextmanager
    def auto_stop(self, *, timeout: float | None = None) -> Iterator[None]:
        """A context manager that starts the pipeline (if needed) and stops it on exit.

        Raises:
            PipelineFailure: On exit, if a failure budget was spent or the source raised.
        """
        if not self._started:
            self.start(timeout=timeout)
        try:
            yield
        finally:
            self.stop(timeout=timeout)

    def get_item(self, *, timeout: float | None = None) -> T:
        """The next item. Starts the pipeline if it is not started.

        Args:
            timeout: Seconds to wait for the item (``None``: as long as it takes).

        Raises:
            EOFError: The pipeline is exhausted (or stopped, or failed: then :py:meth:`stop` raises
                :py:class:`PipelineFailure`), or an epoch of a continuous source ended.
            TimeoutError: No item came within ``timeout``.
        """
        if not self._started:
            with self._lock:
                if not self._started and not self._stopped:
                    self._start_locked()
        try:
            kind, value = self._core.get_item(timeout)
        except BaseException:
            if self._core.fatal() is not None:
                # An op, the source, an aggregator, a router or a hook raised KeyboardInterrupt, SystemExit
                # or another BaseException: the engine has stopped; stop the rest, then re-raise it here.
                self._stop_after_fatal()
            raise
        if kind == 0:
            return value if self._unwrap is None else self._unwrap(value)
        if kind == 1:
            raise EOFError(f"end of epoch {value}")
        if self._ext is not None:
            # The end of the input: the stages have ended, so do their hooks (as in SPDL).
            try:
                self._ext.finish(self._core.error(), stopped=False)
            except Exception:  # noqa: BLE001 (the end is reported all the same)
                _LG.warning("Failed to finish the pipeline's stage hooks", exc_info=True)
            self._ext.report_native_stats(self._core)
        raise EOFError("the pipeline is exhausted")

    def _get_item_nowait(self) -> T:
        """The next item if one is ready, without waiting (SPDL's internal drain of a burst of results).

        Raises:
            RuntimeError: The pipeline is not started.
            queue.Empty: No item is ready yet.
            EOFError: As :py:meth:`get_item`: exhausted, or an epoch of a continuous source ended.
        """
        if not self._started:
            raise RuntimeError("Pipeline is not started.")
        try:
            return self.get_item(timeout=0)
        except TimeoutError:
            raise queue.Empty from None

    def _stop_after_fatal(self) -> None:
        """Stops everything after a fatal exception (bounded; joins the threads that end in time). The
        fatal exception is what the consumer sees: a later :py:meth:`stop` raises no ``PipelineFailure``."""
        with self._lock:
            self._core.take_failure(discard=True)
            if self._stopped:
                return
            self._stopped = True
            self._finalizer.detach()
            try:
                self._shutdown(_FATAL_STOP_TIMEOUT)
            except Exception:  # noqa: BLE001 (the fatal exception is raised all the same)
                _LG.warning("The pipeline did not stop cleanly after a fatal exception", exc_info=True)

    def state_dict(self) -> dict[str, Any]:
        """What the consumer has received, as a picklable dict (the torchdata ``Stateful`` protocol).

        A pipeline built by :py:func:`load_state_dict`-ing it into a new pipeline of the same shape yields
        exactly the items of the interrupted epoch not delivered yet (then the following epochs, as if never
        interrupted). Per source (per input of a merge): the source's ``state_dict()`` at the start of each
        epoch not fully delivered, a watermark (every position below it delivered or failed), the positions
        delivered above it (as ``[start, end)`` spans), and the failed items (a failed item counts as
        delivered). Its size follows the items in flight, not the dataset.

        Raises:
            RuntimeError: The pipeline cannot be checkpointed: a source does not implement
                ``state_dict``/``load_state_dict``, or a step cannot carry item keys (a native op, a
                ``path_variants``, a ``to()`` region, a custom merge), or a source failed to report its state.
        """
        return self._tracker().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resumes from a :py:meth:`state_dict` of a pipeline of the same shape (call before it starts).

        Raises:
            RuntimeError: The pipeline cannot be checkpointed, or it has started.
            ValueError: ``state_dict`` is not a pipeline state, or has another number of sources.
        """
        if self._checkpoint is not None and self._started:
            raise RuntimeError("load_state_dict must be called before the pipeline starts")
        self._tracker().load_state_dict(state_dict)

    def _tracker(self) -> Any:
        if self._unwrap is None:
            why = self._checkpoint or "it was not built by spdl_rs's builder"
            raise RuntimeError(f"this pipeline cannot be checkpointed: {why}")
        return self._checkpoint

    def get_iterator(self, *, timeout: float | None = None) -> PipelineIterator[T]:
        """An iterator over the items, up to the end (or to the end of the current epoch of a continuous
        source). A new iterator resumes where the previous one stopped.

        Args:
            timeout: Seconds to wait for each item (``None``: as long as it takes); ``TimeoutError`` if none
                comes.
        """
        return PipelineIterator(self, timeout)

    def __iter__(self) -> Iterator[T]:
        """Same as :py:meth:`get_iterator` with no timeout."""
        return self.get_iterator()

    def get_stats(self) -> list[StageStats]:
        """A snapshot of every stage's statistics (source first, sink last)."""
        raw = self._core.stats()
        return [from_raw(d, raw[i + 1] if i + 1 < len(raw) else None) for i, d in enumerate(raw)]

    def stats_table(self) -> str:
        """The statistics as a text table (what ``report_stats_interval`` logs)."""
        return self._core.stats_table()

    def autotune_decisions(self) -> list[dict[str, Any]] | None:
        """(spdl_rs only) The auto-tuner's changes so far, oldest first: dicts with ``at`` (seconds since the
        start), ``stage`` (or ``pool`` for the thread count), ``knob`` (``concurrency``, ``queue_capacity`` of
        the queue after the stage, or ``threads``), ``from``, ``to`` and ``reason``. ``None`` unless built with
        ``autotune=True``."""
        return self._core.autotune_decisions()

    def autotune_report(self) -> dict[str, Any] | None:
        """(spdl_rs only) The auto-tuner's state: ``decisions`` (as :py:meth:`autotune_decisions`),
        ``settled_at`` (seconds from the start when it first settled, or ``None``), ``settled`` (whether it is
        settled now), ``rounds`` (rounds of search started: the first and each re-probe), ``threads`` (the
        pool's thread count now) and ``max_memory_bytes`` (the memory budget in force, or ``None``). ``None``
        unless built with ``autotune=True``."""
        return self._core.autotune_report()

    def stats_anchor(self) -> _native.pipeline.StatsSnapshot:
        """(spdl_rs only) A snapshot of the statistics, to pass to :py:meth:`stats_window` later: the start
        of a measurement window. Opaque; its ``elapsed`` is the seconds since the pipeline started."""
        return self._core.stats_anchor()

    def stats_window(self, anchor: _native.pipeline.StatsSnapshot | None = None) -> dict[str, Any]:
        """(spdl_rs only) What the pipeline did since ``anchor`` (from :py:meth:`stats_anchor` on this
        pipeline; ``None``: since the start), measured exactly as the auto-tuner measures it (the engine's
        ``autotune::Window`` between two snapshots).

        Returns a dict: ``duration`` (seconds), ``items`` (items out of the source), ``throughput`` (source
        items per second) and ``stages``, one dict per row of :py:meth:`get_stats` (source first, sink last)
        with ``name``, ``kind``, ``concurrency``, ``rate`` (items the row put out per second), ``busy`` (share
        of its capacity spent in its function), ``starved`` (share of the window spent waiting for input;
        the sink's: the consumer waiting for an item), ``blocked`` (waiting for room downstream) and
        ``task_mean`` (seconds per call). Shares are 0.0 to 1.0.

        Raises:
            ValueError: ``anchor`` was taken on another pipeline.
        """
        return self._core.stats_window(anchor)


class PipelineIterator(Iterator[T]):
    """Iterates a :py:class:`Pipeline` until ``EOFError`` (end, end of epoch, or failure)."""

    def __init__(self, pipeline: Pipeline[T], timeout: float | None) -> None:
        self._pipeline = pipeline
        self._timeout = timeout
        self._ended = False

    def __iter__(self) -> PipelineIterator[T]:
        return self

    def __next__(self) -> T:
        if self._ended:
            raise StopIteration
        try:
            return self._pipeline.get_item(timeout=self._timeout)
        except EOFError:
            self._ended = True
            raise StopIteration from None
