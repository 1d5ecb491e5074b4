"""Resource usage of this process's process group: SPDL's ``ProcessGroupResourceUsage`` and
``ProcessGroupStatsMonitor``.

``/proc`` is read natively (``_native.pipeline._process_group_sample``, which says what it sums); the monitor
collects one snapshot per interval in a subprocess of its own and hands it to an async callback there.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import _native
from ._bg_task import BackgroundTask

__all__ = ["ProcessGroupResourceUsage", "ProcessGroupStatsMonitor"]

_LG = logging.getLogger(__name__)

_PGRP_INTERVAL_SEC = 60.0

_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        _LG.warning(msg, *args)


@dataclass
class ProcessGroupResourceUsage:
    """Resource usage summed over the processes of one process group (one snapshot of
    :py:class:`ProcessGroupStatsMonitor`).

    Memory has three views: ``rss_bytes`` counts a shared page once per process mapping it (an upper bound);
    ``pss_bytes`` divides each shared page among its sharers (the group's real cost); ``private_bytes`` counts
    only pages of a single process (what exiting would free).
    """

    pid: int
    """The monitoring process."""
    pgid: int
    """The process group."""
    cpu_percent: float | None = None
    """CPU time over the last interval, in percent of one core (200.0: two cores busy); ``None`` the first time."""
    rss_bytes: int | None = None
    """Resident set size summed over the group."""
    pss_bytes: int | None = None
    """Proportional set size summed over the group; ``None`` without ``smaps_rollup``."""
    private_bytes: int | None = None
    """Private_Clean + Private_Dirty summed over the group; ``None`` without ``smaps_rollup``."""
    disk_read_bytes: int | None = None
    """Bytes read from storage (cumulative ``read_bytes``)."""
    disk_write_bytes: int | None = None
    """Bytes written to storage (cumulative ``write_bytes``)."""
    num_procs: int | None = None
    """Processes in the group."""
    net_rx_bytes: int | None = None
    """Network bytes received since the previous snapshot (host-wide, no loopback); ``None`` the first time."""
    net_tx_bytes: int | None = None
    """Network bytes sent since the previous snapshot (host-wide, no loopback); ``None`` the first time."""


def _collect_pgrp_stats(
    *prev: int | None,
) -> tuple[ProcessGroupResourceUsage, int | None, int, int | None, int | None]:
    """One snapshot, with the deltas against the previous one's counters (``prev``: what the previous call
    returned after the usage; none the first time).

    Returns ``(usage, cpu_usec, time_usec, net_rx_bytes, net_tx_bytes)``: the counters to pass to the next call
    (the CPU and network ones are ``None`` when they could not be read).
    """
    pgid = os.getpgrp()
    fields, counters, warnings = _native.pipeline._process_group_sample(pgid, *prev)
    for kind, message in warnings:
        _warn_once(kind, "%s", message)
    return (ProcessGroupResourceUsage(pid=os.getpid(), pgid=pgid, **fields), *counters)


def _monitor_main(interval: float, callback: Callable[[ProcessGroupResourceUsage], Awaitable[None]]) -> None:
    """The monitor subprocess: a snapshot per ``interval`` to ``callback`` until SIGTERM/SIGINT (or the parent's
    exit)."""
    stop = False
    # The process that started this one (its sentinel: right with forkserver too, where os.getppid() is the
    # fork server).
    parent = multiprocessing.parent_process()

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    async def loop() -> None:
        ev = asyncio.get_running_loop()
        prev: tuple[Any, ...] = (None, None, None, None)
        while not stop and (parent is None or parent.is_alive()):
            try:
                usage, *counters = await ev.run_in_executor(None, _collect_pgrp_stats, *prev)
                prev = tuple(counters)
                await callback(usage)
            except Exception:  # noqa: BLE001 (best effort: the monitor keeps going)
                _LG.debug("Process-group stats collection failed.", exc_info=True)
            # Sleep in short steps so a signal or the parent's exit ends the loop promptly.
            deadline = time.monotonic() + interval
            while not stop and time.monotonic() < deadline:
                await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    asyncio.run(loop())


class ProcessGroupStatsMonitor(BackgroundTask):
    """A background task that reports this process group's resource usage from a monitor subprocess.

    Ranks of a training job often share one cgroup but each has its own process group; this reports per group.

    Args:
        callback: An async function called in the monitor subprocess with each
            :py:class:`ProcessGroupResourceUsage` (picklable for the ``spawn``/``forkserver`` start methods).
        interval: Seconds between snapshots.
        mp_context: The multiprocessing context that starts the subprocess (``None``: the default).
    """

    def __init__(
        self,
        callback: Callable[[ProcessGroupResourceUsage], Awaitable[None]],
        interval: float = _PGRP_INTERVAL_SEC,
        mp_context: multiprocessing.context.BaseContext | None = None,
    ) -> None:
        super().__init__()
        self._callback = callback
        self._interval = interval
        self._mp_context = mp_context

    async def run(self) -> None:
        """Starts the monitor subprocess and waits until it exits or this coroutine is cancelled (then it is
        terminated, killed if it does not exit within 5 s, and ``CancelledError`` re-raised). A daemon process
        cannot start one: there this logs a warning and returns."""
        if multiprocessing.current_process().daemon:
            _LG.warning(
                "Skipping process-group stats monitor: a daemon process cannot spawn the monitor subprocess "
                "(pid=%d).",
                os.getpid(),
            )
            return
        ctx: Any = self._mp_context or multiprocessing.get_context()
        proc = ctx.Process(target=_monitor_main, args=(self._interval, self._callback), daemon=True)
        proc.start()
        _LG.info(
            "Process-group stats monitor subprocess started (main_pid=%d, monitor_pid=%d, pgid=%d)",
            os.getpid(),
            proc.pid,
            os.getpgrp(),
        )
        try:
            while proc.is_alive():
                await asyncio.sleep(0.5)
            _LG.warning("Process-group stats monitor subprocess exited unexpectedly (exit code %s)", proc.exitcode)
        except asyncio.CancelledError:
            proc.terminate()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=1)
            _LG.info("Process-group stats monitor subprocess stopped (pid=%d)", proc.pid)
            raise
