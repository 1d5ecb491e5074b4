"""Resource usage of this process's process group, read from ``/proc`` (Linux): SPDL's
``ProcessGroupResourceUsage`` and ``ProcessGroupStatsMonitor``.

A snapshot sums, over every process whose ``/proc/<pid>/stat`` names this process group: CPU time
(``utime + stime``), RSS (``stat``), PSS and private memory (``smaps_rollup``), and storage IO (``io``);
network bytes come from ``/proc/net/dev`` (host-wide, loopback excluded). The monitor collects one per interval
in a subprocess of its own and hands it to an async callback there.
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

from ._bg_task import BackgroundTask

__all__ = ["ProcessGroupResourceUsage", "ProcessGroupStatsMonitor"]

_LG = logging.getLogger(__name__)

_PGRP_INTERVAL_SEC = 60.0

_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        _LG.warning(msg, *args)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _kb_fields(content: str, names: tuple[str, ...], what: str) -> dict[str, int]:
    """``Name: <n> kB`` lines of ``content`` as bytes."""
    out: dict[str, int] = {}
    for line in content.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in names and parts[0].endswith(":"):
            try:
                out[parts[0][:-1]] = int(parts[1]) * (1024 if len(parts) > 2 else 1)
            except ValueError:
                raise RuntimeError(f"Failed to parse {what}: {line.strip()[:80]}") from None
    return out


def _stat_fields(content: str) -> tuple[int, int, int, int]:
    """``(pgrp, utime, stime, rss pages)`` of a ``/proc/<pid>/stat`` (the command name may hold spaces and
    parentheses: fields are counted after its last ``)``)."""
    end = content.rfind(")")
    if end < 0:
        raise RuntimeError(f"Unexpected /proc/[pid]/stat format: missing closing paren: {content[:80]}")
    fields = content[end + 2 :].split()
    if len(fields) < 22:
        raise RuntimeError(f"Unexpected /proc/[pid]/stat format: expected >=22 fields after comm, got {len(fields)}")
    try:
        return int(fields[2]), int(fields[11]), int(fields[12]), int(fields[21])
    except ValueError:
        raise RuntimeError(f"Failed to parse /proc/[pid]/stat: {content[:80]}") from None


@dataclass
class _Totals:
    cpu_usec: int
    rss_bytes: int
    pss_bytes: int | None
    private_bytes: int | None
    disk_read_bytes: int
    disk_write_bytes: int
    num_procs: int


def _read_pgrp_totals(pgid: int) -> _Totals:
    ticks = 0
    rss_pages = 0
    pss = 0
    private = 0
    has_smaps = False
    read_bytes = 0
    write_bytes = 0
    procs = 0
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError as e:
        raise RuntimeError(f"Failed to scan /proc: {e}") from e
    for pid in entries:
        content = _read(f"/proc/{pid}/stat")
        if content is None:
            continue  # exited meanwhile
        try:
            pgrp, utime, stime, rss = _stat_fields(content)
        except RuntimeError as e:
            _warn_once("proc_stat", "%s", e)
            continue
        if pgrp != pgid:
            continue
        procs += 1
        ticks += utime + stime
        rss_pages += rss
        if (smaps := _read(f"/proc/{pid}/smaps_rollup")) is not None:
            try:
                f = _kb_fields(smaps, ("Pss", "Private_Clean", "Private_Dirty"), "/proc/[pid]/smaps_rollup")
            except RuntimeError as e:
                _warn_once("smaps_rollup", "%s", e)
            else:
                has_smaps = True
                pss += f.get("Pss", 0)
                private += f.get("Private_Clean", 0) + f.get("Private_Dirty", 0)
        if (io := _read(f"/proc/{pid}/io")) is not None:
            try:
                f = _kb_fields(io, ("read_bytes", "write_bytes"), "/proc/[pid]/io")
            except RuntimeError as e:
                _warn_once("proc_io", "%s", e)
            else:
                read_bytes += f.get("read_bytes", 0)
                write_bytes += f.get("write_bytes", 0)
    return _Totals(
        cpu_usec=ticks * 1_000_000 // os.sysconf("SC_CLK_TCK"),
        rss_bytes=rss_pages * os.sysconf("SC_PAGE_SIZE"),
        pss_bytes=pss if has_smaps else None,
        private_bytes=private if has_smaps else None,
        disk_read_bytes=read_bytes,
        disk_write_bytes=write_bytes,
        num_procs=procs,
    )


def _read_network_bytes() -> tuple[int, int]:
    """Received and sent bytes over every interface but ``lo`` (``/proc/net/dev``)."""
    rx = tx = 0
    content = _read("/proc/net/dev")
    for line in (content or "").splitlines()[2:]:
        name, _, counters = line.partition(":")
        parts = counters.split()
        if name.strip() == "lo" or len(parts) < 9:
            continue
        try:
            rx += int(parts[0])
            tx += int(parts[8])
        except ValueError:
            raise RuntimeError(f"Failed to parse /proc/net/dev line: {line.strip()[:80]}") from None
    return rx, tx


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
    prev_cpu_usec: int | None = None,
    prev_time_usec: int | None = None,
    prev_net_rx_bytes: int | None = None,
    prev_net_tx_bytes: int | None = None,
) -> tuple[ProcessGroupResourceUsage, int | None, int, int | None, int | None]:
    """One snapshot, with the deltas against the previous one's counters.

    Returns ``(usage, cpu_usec, time_usec, net_rx_bytes, net_tx_bytes)``: the counters to pass to the next call
    (the CPU and network ones are ``None`` when they could not be read).
    """
    now_usec = int(time.monotonic() * 1_000_000)
    usage = ProcessGroupResourceUsage(pid=os.getpid(), pgid=os.getpgrp())
    cpu_usec: int | None = None
    rx: int | None = None
    tx: int | None = None
    try:
        t = _read_pgrp_totals(usage.pgid)
    except RuntimeError as e:
        _warn_once("pgrp_stats", "%s", e)
    else:
        cpu_usec = t.cpu_usec
        if prev_cpu_usec is not None and prev_time_usec is not None and now_usec > prev_time_usec:
            usage.cpu_percent = (t.cpu_usec - prev_cpu_usec) / (now_usec - prev_time_usec) * 100.0
        usage.rss_bytes = t.rss_bytes
        usage.pss_bytes = t.pss_bytes
        usage.private_bytes = t.private_bytes
        usage.disk_read_bytes = t.disk_read_bytes
        usage.disk_write_bytes = t.disk_write_bytes
        usage.num_procs = t.num_procs
    try:
        rx, tx = _read_network_bytes()
    except RuntimeError as e:
        _warn_once("net_dev", "%s", e)
    else:
        if prev_net_rx_bytes is not None and prev_net_tx_bytes is not None:
            usage.net_rx_bytes = rx - prev_net_rx_bytes
            usage.net_tx_bytes = tx - prev_net_tx_bytes
    return usage, cpu_usec, now_usec, rx, tx


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
