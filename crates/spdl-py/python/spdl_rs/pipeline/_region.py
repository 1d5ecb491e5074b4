"""``.to()`` regions: stages run as one nested pipeline in each worker of a process (or subinterpreter) pool.

The builder turns the stages between a worker-pool marker and the next marker into one engine step,
a ``ThroughStep(name, region)``. The engine calls ``region(inputs)`` once per epoch (once for a one-pass
source) on a thread of its own; ``inputs`` iterates that epoch's items, and what the returned iterator yields
goes downstream.

Per epoch, a feeder thread packs the inputs into transfers of up to the opening marker's ``buffer_size``
items and deals them round-robin to the workers' input queues, then sends each worker the epoch's end. Each
worker runs one session per epoch: a nested spdl_rs pipeline of the region's stages whose source reads its
input queue until that end; its outputs go back on the shared output queue in transfers of up to the closing
marker's ``buffer_size`` items, followed by a ``done`` message. The epoch is over when every worker is done.
Only the region's inputs and outputs cross the boundary, pickled (with ``ForkingPickler``, so shared-memory
reducers such as PyTorch's apply); the stage configs travel once per worker as the process's start arguments
(pickled by ``spawn``/``forkserver``, inherited by ``fork``), as in SPDL.

The pool starts on the first epoch and is kept for the next ones. A worker that dies, an error a worker
reports (its initializer raised, or its pipeline failed: with ``build(max_failures=0)`` a failed item does),
or an item that cannot be pickled ends the epoch with an exception (one failure of the region's stage) and
the pool is shut down; the next epoch starts a new one. The pipeline's stop shuts the pool down.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .. import _native
from . import defs
from ._core import _STAGE_BUFFER_SIZE, _build, _Conversion, _convert_steps
from ._op import _op_kind
from ._run_protocol import (
    _IN_END,
    _IN_ITEMS,
    _IN_SHUTDOWN,
    _OUT_DONE,
    _OUT_ERROR,
    _OUT_ITEMS,
    _POLL,
    _Aborted,
    _close_queue,
    _describe,
    _drain,
    _dumps,
    _get,
    _interp_worker_main,
    _interpreters_unavailable,
    _parent_watch,
    _put,
    _start_interp,
    _Worker,
)

__all__ = ["Region", "check_interpreters_available", "region_step", "strip_executor"]

_LG = logging.getLogger("spdl_rs.pipeline")

#: How long a pool being shut down waits for its workers to exit before terminating them.
_GRACE = 0.5
#: The nested pipeline's sink: small, the worker sends its outputs on at once.
_WORKER_SINK = 3


def check_interpreters_available() -> None:
    """Raises ``RuntimeError`` unless subinterpreters (``concurrent.interpreters``, CPython 3.14+) exist."""
    if (error := _interpreters_unavailable("A subinterpreter region (`to(InterpreterPoolExecutorConfig(...))`)")):
        raise error


def strip_executor(cfg: Any) -> Any:
    """The stage config without its ``executor`` (recursively in path variants): in a region, ops run on the
    worker's own threads, and a live executor does not cross the process boundary."""

    if isinstance(cfg, defs.PipeConfig) and cfg.executor is not None:
        return dataclasses.replace(cfg, executor=None)
    if isinstance(cfg, defs.PathVariantsConfig):
        return dataclasses.replace(cfg, paths=tuple(tuple(strip_executor(s) for s in p) for p in cfg.paths))
    return cfg


def _threads_needed(cfg: Any) -> int:
    """Threads a stage keeps busy in the worker's pool (SPDL's sizing: sync pipes' concurrency, a sync router)."""

    if isinstance(cfg, defs.PipeConfig):
        kind, _ = _op_kind(cfg.op)
        return 0 if kind in ("async", "asyncgen") else cfg.concurrency
    if isinstance(cfg, defs.PathVariantsConfig):
        kind, _ = _op_kind(cfg.router)
        return (0 if kind == "async" else 1) + sum(_threads_needed(s) for p in cfg.paths for s in p)
    return 0


################################################################################
# The worker side
################################################################################


def _worker_main(
    in_q: Any,
    out_q: Any,
    worker: int,
    stages: Sequence[Any],
    build_kwargs: dict[str, Any],
    output_buffer_size: int,
    initializer: Any,
    initargs: tuple[Any, ...],
) -> None:
    """A worker process's body: the initializer, then one session per epoch until told to exit (or until the
    parent process is gone)."""
    gone = _parent_watch(True)
    try:
        if initializer is not None:
            try:
                initializer(*initargs)
            except BaseException as e:  # noqa: BLE001 (relayed; the worker cannot serve)
                _put(out_q, (_OUT_ERROR, worker, _describe(e, "the worker's initializer")), gone)
                return
        while (msg := _get(in_q, gone))[0] != _IN_SHUTDOWN:
            end = _session(msg, in_q, out_q, worker, stages, build_kwargs, output_buffer_size, gone)
            if end[0] == _IN_SHUTDOWN:
                return
            _put(out_q, (_OUT_DONE, worker, end[1]), gone)
    except _Aborted:
        return


def _session(
    first: tuple[int, Any],
    in_q: Any,
    out_q: Any,
    worker: int,
    stages: Sequence[Any],
    build_kwargs: dict[str, Any],
    output_buffer_size: int,
    gone: Any,
) -> tuple[int, Any]:
    """One epoch: runs the stages over the items up to the epoch's end; returns the message that ended them
    (``(_IN_END, epoch)`` or a shutdown)."""
    state: dict[str, Any] = {"end": None if first[0] == _IN_ITEMS else first}

    def items() -> Iterator[Any]:
        msg = first
        while msg[0] == _IN_ITEMS:
            yield from pickle.loads(msg[1])
            msg = _get(in_q, gone)
        state["end"] = msg

    if state["end"] is None:
        try:
            pipeline = _build(
                defs.SourceConfig(items()), stages, buffer_size=_WORKER_SINK, region_step=region_step, **build_kwargs
            )
            with pipeline.auto_stop():
                ended = False
                while not ended:
                    chunk = []
                    try:
                        chunk.append(pipeline.get_item())
                        while len(chunk) < output_buffer_size:
                            chunk.append(pipeline.get_item(timeout=0))
                    except EOFError:
                        ended = True
                    except TimeoutError:
                        pass
                    if chunk:
                        _put(out_q, (_OUT_ITEMS, worker, _dumps(chunk)), gone)
                        del chunk
        except BaseException as e:  # noqa: BLE001 (relayed to the main process)
            _put(out_q, (_OUT_ERROR, worker, _describe(e, "the region's pipeline")), gone)
            # Read on to the epoch's end, so that the next session starts at the next epoch.
            while state["end"] is None or state["end"][0] == _IN_ITEMS:
                state["end"] = _get(in_q, gone)
    end: tuple[int, Any] = state["end"]
    return end


################################################################################
# The main side
################################################################################


class _ProcessBackend:
    """Workers as processes of a ``multiprocessing`` context."""

    def __init__(self, mp_context: str | None) -> None:
        import multiprocessing

        self._ctx = multiprocessing.get_context(mp_context)

    def make_queue(self, maxsize: int) -> Any:
        return self._ctx.Queue(maxsize=maxsize)

    def spawn(self, args: tuple[Any, ...]) -> _Worker:
        proc = self._ctx.Process(target=_worker_main, args=args, daemon=True, name="spdl_rs-region")
        proc.start()
        return _Worker(proc)

    def stop(self, w: _Worker, out_q: Any) -> None:
        """Stops a worker that did not exit in the pool's grace period."""
        w.stop(0.0, (out_q,), log=_LG.debug)


class _InterpreterBackend(_ProcessBackend):
    """Workers as subinterpreters (``concurrent.interpreters``, CPython 3.14+), each run on a thread.

    spdl_rs's native module cannot be loaded in a subinterpreter (PyO3 does not support them), so these
    workers run the region's stages with the pure-Python runner of :py:mod:`._run_protocol`
    (:py:func:`_interp_worker_main`): that file is loaded there by path, without the ``spdl_rs`` package, and the
    stages travel as plain tuples (:py:func:`_plain_stages`).
    """

    def __init__(self) -> None:
        check_interpreters_available()
        import concurrent.interpreters as interpreters  # type: ignore[import-not-found, unused-ignore]

        self._interpreters = interpreters

    def make_queue(self, maxsize: int) -> Any:
        return self._interpreters.create_queue(maxsize=maxsize)

    @staticmethod
    def worker_args(args: tuple[Any, ...]) -> tuple[Any, Any, int, bytes]:
        """The arguments of :py:func:`_interp_worker_main` for the pool's arguments of :py:func:`_worker_main`."""
        in_q, out_q, worker, stages, build_kwargs, output_buffer_size, initializer, initargs = args
        fail_fast = build_kwargs.get("max_failures") == 0
        payload = pickle.dumps((_plain_stages(stages), output_buffer_size, initializer, tuple(initargs), fail_fast))
        return in_q, out_q, worker, payload

    def spawn(self, args: tuple[Any, ...]) -> _Worker:
        in_q, out_q, worker, payload = self.worker_args(args)
        return _start_interp(
            "_interp_worker_main(in_q, out_q, worker, payload)",
            "spdl_rs-region-interp",
            in_q=in_q,
            out_q=out_q,
            worker=worker,
            payload=payload,
        )


def _plain_stages(stages: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The stage configs as tuples of plain Python objects, for a worker that cannot import spdl_rs."""

    out: list[tuple[Any, ...]] = []
    for cfg in stages:
        if isinstance(cfg, defs.PipeConfig):
            kind, fn = _op_kind(cfg.op)
            if kind == "native":
                raise ValueError(
                    f"stage `{cfg.name}`: a native op (spdl_rs.io.ops) cannot run in a subinterpreter region; use "
                    "ProcessPoolExecutorConfig"
                )
            out.append(("pipe", cfg.name, kind, fn))
        elif isinstance(cfg, defs.AggregateConfig):
            if isinstance(cfg.op, int) or type(cfg.op) is defs.Collate:
                n = cfg.op if isinstance(cfg.op, int) else cfg.op.n
                out.append(("aggregate", cfg.name, n, bool(cfg.drop_last)))
            else:
                out.append(("aggregator", cfg.name, cfg.op, bool(cfg.drop_last)))
        elif isinstance(cfg, defs.DisaggregateConfig):
            out.append(("disaggregate", cfg.name))
        elif isinstance(cfg, defs.PathVariantsConfig):
            kind, router = _op_kind(cfg.router)
            paths = [_plain_stages(p) for p in cfg.paths]
            out.append(("path_variants", cfg.name, kind, router, paths, bool(cfg.batched)))
        else:
            raise TypeError(f"a {type(cfg).__name__} step cannot run in a to() region")
    return out


class _Pool:
    """The workers of a region, with one input queue each and a shared output queue."""

    def __init__(self, region: Region) -> None:
        target = region.target
        self.region_name = region.name
        self.backend: Any = (
            _ProcessBackend(getattr(target, "mp_context", None))
            if region.backend_kind == "process"
            else _InterpreterBackend()
        )
        n = target.max_workers or os.cpu_count() or 1
        capacity = max(4, 2 * n)
        self.in_qs = [self.backend.make_queue(capacity) for _ in range(n)]
        self.out_q = self.backend.make_queue(capacity)
        self.workers: list[_Worker] = []
        self.closed = False
        self.lock = threading.RLock()  # re-entrant: a finalizer (GC) may close this on a thread holding it
        try:
            for i in range(n):
                args = (
                    self.in_qs[i],
                    self.out_q,
                    i,
                    region.stages,
                    region.build_kwargs,
                    region.output_buffer_size,
                    target.initializer,
                    tuple(target.initargs),
                )
                self.workers.append(self.backend.spawn(args))
        except BaseException:
            self.shutdown()
            raise

    def check_alive(self) -> None:
        for w in self.workers:
            if not w.alive():
                why = (
                    "worker subinterpreter exited unexpectedly"
                    if w.interp is not None
                    else f"worker process {w.runner.pid} exited unexpectedly (exit code {w.runner.exitcode})"
                )
                raise RuntimeError(
                    f"{self.region_name}: a {why}; this epoch's remaining items are dropped and the worker pool is "
                    "restarted for the next epoch"
                )

    def put(self, i: int, msg: tuple[int, Any], abort: threading.Event) -> bool:
        """Puts ``msg`` on worker ``i``'s queue; ``False`` if ``abort`` was set first."""
        def gone() -> bool:
            self.check_alive()
            return abort.is_set()

        try:
            _put(self.in_qs[i], msg, gone)
        except _Aborted:
            return False
        return True

    def shutdown(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for q in self.in_qs:
            # Nothing more is sent: what a worker has not taken yet is dropped, so that the shutdown message
            # fits (a subinterpreter worker cannot be terminated, it must read it).
            _drain(q)
            try:
                q.put_nowait((_IN_SHUTDOWN, None))
            except Exception:  # noqa: BLE001 (full again, or closed: a process worker is terminated instead)
                pass
        # Give the workers a moment to exit on their own, taking what they may be blocked putting.
        deadline = time.monotonic() + _GRACE
        while time.monotonic() < deadline and any(w.alive() for w in self.workers):
            try:
                self.out_q.get(timeout=0.01)
            except Exception:  # noqa: BLE001 (empty, or broken by a killed worker)
                pass
        for w in self.workers:
            self.backend.stop(w, self.out_q)
        for q in (*self.in_qs, self.out_q):
            _close_queue(q)
        self.workers = []
        self.in_qs = []


class Region:
    """The ``func`` of a ``ThroughStep(name, func)``: runs ``stages`` in a pool described by ``target``."""

    def __init__(
        self,
        stages: Sequence[Any],
        target: Any,
        *,
        input_buffer_size: int,
        output_buffer_size: int,
        fail_fast: bool,
        report_stats_interval: float,
        stage_buffer_size: int,
    ) -> None:

        self.stages = list(stages)
        self.target = target
        self.backend_kind = "subinterpreter" if isinstance(target, defs.InterpreterPoolExecutorConfig) else "process"
        self.input_buffer_size = input_buffer_size
        self.output_buffer_size = output_buffer_size
        self.build_kwargs: dict[str, Any] = {
            "num_threads": max(1, sum(_threads_needed(s) for s in self.stages)) + 1,
            "max_failures": 0 if fail_fast else -1,
            "report_stats_interval": report_stats_interval,
            "stage_buffer_size": stage_buffer_size,
        }
        name = "subprocess_pipeline(" + "+".join(getattr(s, "name", type(s).__name__) for s in self.stages) + ")"
        sizes = [f"{k}={v}" for k, v in (("in", input_buffer_size), ("out", output_buffer_size)) if v != 1]
        if sizes:
            name += "[buffer_size " + " ".join(sizes) + "]"
        self.name = name
        self._lock = threading.RLock()  # re-entrant: a finalizer (GC) may close this on a thread holding it
        self._pool: _Pool | None = None
        self._stop = threading.Event()
        self._epoch = 0

    def __repr__(self) -> str:
        return f"<to() region {self.name}>"

    def __call__(self, inputs: Iterator[Any]) -> Iterator[Any]:
        return self._run_epoch(inputs)

    def _get_pool(self) -> _Pool:
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError(f"{self.name}: the pipeline is stopped")
            if self._pool is None:
                self._pool = _Pool(self)
            return self._pool

    def _discard_pool(self, pool: _Pool) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown()

    def _feed(
        self, pool: _Pool, inputs: Iterator[Any], epoch: int, abort: threading.Event, errors: list[BaseException]
    ) -> None:
        n = len(pool.in_qs)
        sent = 0
        buf: list[Any] = []
        try:
            for item in inputs:
                buf.append(item)
                del item
                if len(buf) >= self.input_buffer_size:
                    chunk, buf = _dumps(buf), []
                    if not pool.put(sent % n, (_IN_ITEMS, chunk), abort):
                        return
                    sent += 1
                if abort.is_set():
                    return
            if buf:
                if not pool.put(sent % n, (_IN_ITEMS, _dumps(buf)), abort):
                    return
                buf = []
            for i in range(n):
                if not pool.put(i, (_IN_END, epoch), abort):
                    return
        except BaseException as e:  # noqa: BLE001 (raised by the epoch's iterator)
            errors.append(e)

    def _run_epoch(self, inputs: Iterator[Any]) -> Iterator[Any]:
        pool = self._get_pool()
        epoch = self._epoch
        self._epoch += 1
        abort = threading.Event()
        errors: list[BaseException] = []
        feeder = threading.Thread(
            target=self._feed, args=(pool, inputs, epoch, abort, errors), name="spdl_rs-region-feed", daemon=True
        )
        feeder.start()
        done: set[int] = set()
        clean = False
        try:
            while len(done) < len(pool.workers):
                if errors:
                    raise errors[0]
                try:
                    msg = pool.out_q.get(timeout=_POLL)
                except queue.Empty:
                    if self._stop.is_set():
                        return
                    if errors:
                        raise errors[0]
                    pool.check_alive()
                    continue
                kind, worker, payload = msg
                del msg
                if kind == _OUT_ITEMS:
                    outputs = pickle.loads(payload)
                    del payload
                    outputs.reverse()
                    while outputs:
                        yield outputs.pop()
                elif kind == _OUT_DONE:
                    if payload != epoch:
                        raise RuntimeError(f"{self.name}: worker {worker} ended epoch {payload} during epoch {epoch}")
                    done.add(worker)
                else:
                    raise RuntimeError(f"{self.name}: worker {worker}: {payload}")
            feeder.join()
            if errors:
                raise errors[0]
            clean = True
        finally:
            abort.set()
            if not clean:
                self._discard_pool(pool)

    # The pipeline's stop.

    def signal_stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()


def region_step(
    stages: list[Any], target: Any, input_buffer_size: int, output_buffer_size: int, conv: _Conversion
) -> Any:
    """The engine step of one ``.to()`` region (the core build's ``region_step``): a ``ThroughStep`` running
    ``stages`` in a pool described by ``target``; the region is added to ``conv``'s resources."""
    if isinstance(target, defs.InterpreterPoolExecutorConfig):
        check_interpreters_available()
    elif not isinstance(target, defs.ProcessPoolExecutorConfig):
        raise TypeError(f"unexpected to() target: {target!r}")
    stages = [strip_executor(s) for s in stages]
    # Checked here, in the main process, so that a bad stage fails the build rather than every worker.
    _convert_steps(
        stages,
        _Conversion(
            num_threads=1,
            max_failures=-1,
            report_stats_interval=-1,
            stage_buffer_size=_STAGE_BUFFER_SIZE,
            region_step=region_step,
        ),
    )
    region = Region(
        stages,
        target,
        input_buffer_size=input_buffer_size,
        output_buffer_size=output_buffer_size,
        fail_fast=conv.fail_fast,
        report_stats_interval=conv.report_stats_interval,
        stage_buffer_size=conv.stage_buffer_size,
    )
    conv.resources.append(region)
    return _native.pipeline.ThroughStep(region.name, region)
