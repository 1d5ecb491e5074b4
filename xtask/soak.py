"""The soak test of the ``spdl_rs`` Python package (``cargo xtask soak [SECONDS]``).

For ``--seconds`` seconds, builds random pipelines (sync, async, generator and async-generator ops,
aggregate/disaggregate, concurrency 1-4, num_threads 1-4, sources from ranges, lists and generators; ops that
sometimes raise and sometimes sleep), iterates a random number of items and ends each in one of these ways:

- ``exhaust``: iterated to the end inside ``auto_stop``;
- ``stop``: ``stop(timeout=...)`` at a random point (a ``TimeoutError`` from a short timeout is expected);
- ``op_failure``: an op (or the source) raises past a budget of 0: ``PipelineFailure`` is expected;
- ``drop``: break out of the iteration and drop the pipeline without stopping it, then ``gc.collect()``;
- ``cycle``: the op is a bound method of the object that owns the pipeline (a reference cycle), dropped while
  running; the owner must be collected within a few seconds;
- ``sigint``: SIGINT sent to this process from a timer thread while iterating; the ``KeyboardInterrupt`` is
  caught here;
- ``fork``: a child made with ``os.fork()`` or a ``multiprocessing`` fork context while a pipeline runs in this
  process; the child exits at once (``os._exit(0)``) or runs a small pipeline of its own, decodes an image and
  exits normally (``sys.exit(0)``, interpreter finalization); it must exit 0 within 30 s;
- ``subprocess``: ``python -c`` that starts a pipeline (or daemon threads decoding in a loop) and exits while
  the work is in flight: exit code 0 and no ``FATAL``/``Fatal Python error``/``Aborted``/``panicked`` in stderr.

A watcher samples this process's threads, open fds and RSS every second. At the end (after ``gc.collect()`` and
a settle) the run fails if a child or subprocess crashed or hung, threads or fds exceed the baseline plus a
slack, RSS grew by more than ``--rss-slack-mb`` over its level in the first 10% of the run, or an unexpected
exception escaped (also in a thread or a finalizer). Prints a summary table and one line of JSON (``--json
PATH`` writes it to a file too).

Replay: every iteration draws its own seed from the run's ``--seed``; a failure names both, and
``--replay ITER_SEED`` runs that one iteration again (``--repeat K`` times).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections import Counter
from typing import Any, Callable

SLACK_THREADS = 8
SLACK_FDS = 16
CHILD_TIMEOUT_S = 30.0
SUBPROCESS_TIMEOUT_S = 60.0
ITEM_TIMEOUT_S = 30.0
ITERATION_WATCHDOG_S = 180.0
CRASH_MARKERS = ("FATAL", "Fatal Python error", "Aborted", "panicked at", "Segmentation fault")

WEIGHTS = {
    "exhaust": 18,
    "stop": 15,
    "op_failure": 10,
    "drop": 14,
    "cycle": 10,
    "sigint": 9,
    "fork": 14,
    "subprocess": 7,
}


# ---------------------------------------------------------------------------------------------------------
# Measurements


def os_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return len(os.listdir("/proc/self/task"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Watcher(threading.Thread):
    """Samples (t, threads, fds, rss KiB) every second; names the iteration that runs too long."""

    def __init__(self) -> None:
        super().__init__(name="soak-watcher", daemon=True)
        self.samples: list[tuple[float, int, int, int]] = []
        self.t0 = time.monotonic()
        self.halt = threading.Event()
        self.current: tuple[float, str] | None = None  # (started, description)
        self.warned_for: str | None = None

    def sample(self) -> tuple[float, int, int, int]:
        s = (time.monotonic() - self.t0, os_threads(), open_fds(), rss_kib())
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                self.sample()
            except OSError:
                pass
            cur = self.current
            if cur is not None and time.monotonic() - cur[0] > ITERATION_WATCHDOG_S / 2 and self.warned_for != cur[1]:
                self.warned_for = cur[1]
                print(f"soak: WATCHDOG: {cur[1]} has run {time.monotonic() - cur[0]:.0f} s", file=sys.stderr,
                      flush=True)
                faulthandler.dump_traceback(all_threads=True)


# ---------------------------------------------------------------------------------------------------------
# State


class Stats:
    def __init__(self) -> None:
        self.pipelines = 0
        self.items = 0
        self.iterations = 0
        self.endings: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # finer: "stop:timeout", "sigint:caught", ...
        self.children: Counter[str] = Counter()  # "os.fork/exit_now:ok", ...
        self.subprocesses: Counter[str] = Counter()
        self.failures: list[dict[str, Any]] = []
        self.unraisable: list[str] = []
        self.unraisable_kbi = 0
        self.thread_exceptions: list[str] = []

    def fail(self, ctx: "Ctx", what: str, detail: str = "") -> None:
        entry = {"iteration": ctx.index, "iter_seed": ctx.seed, "scenario": ctx.scenario, "what": what}
        if detail:
            entry["detail"] = detail[-4000:]
        self.failures.append(entry)
        print(f"soak: FAILURE in iteration {ctx.index} (--replay {ctx.seed}, {ctx.scenario}): {what}",
              file=sys.stderr, flush=True)
        if detail:
            print("  " + detail.strip().replace("\n", "\n  ")[-4000:], file=sys.stderr, flush=True)


STATS = Stats()
IMAGE_BYTES: bytes | None = None
IMAGE_PATH: str | None = None
IMAGE_SHAPE: tuple[int, ...] | None = None
TMPDIR = ""
PARENT_PID = os.getpid()
CURRENT = ["setup"]  # the iteration running, for reports of exceptions raised outside it


class Ctx:
    def __init__(self, index: int, seed: int, scenario: str) -> None:
        self.index = index
        self.seed = seed
        self.scenario = scenario


# SIGINT: raises KeyboardInterrupt only when a scenario armed it, so a late signal cannot hit the driver
# anywhere else.
class _Sigint:
    armed = False
    delivered = False
    stray = 0
    swallowed: list[str] = []


def _on_sigint(signum: int, frame: Any) -> None:
    if _Sigint.armed:
        _Sigint.armed = False
        _Sigint.delivered = True
        raise KeyboardInterrupt
    _Sigint.stray += 1


def _unraisable(args: Any) -> None:
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    if isinstance(args.exc_value, KeyboardInterrupt):
        # Our SIGINT, raised where it could only be ignored: the scenario reports it as swallowed.
        STATS.unraisable_kbi += 1
        _Sigint.swallowed.append(f"{args.err_msg or 'Exception ignored'}: {_describe(args.object)}\n{text}"[-3000:])
        return
    STATS.unraisable.append(f"in {CURRENT[0]}: {args.err_msg or 'Exception ignored'}: {args.object!r}\n{text}"[-3000:])


def _describe(obj: Any) -> str:
    """``obj``, and for a ``WeakSet``'s removal callback, which set it belongs to."""
    text = repr(obj)
    try:
        owner = obj.__defaults__[0]() if getattr(obj, "__qualname__", "").startswith("WeakSet.") else None
    except Exception:  # noqa: BLE001
        owner = None
    if owner is not None:
        names = [f"{m.__name__}.{n}" for m in list(sys.modules.values()) if m is not None
                 for n, v in list(getattr(m, "__dict__", {}).items()) if v is owner]
        if not names:
            import gc as _gc

            for r in _gc.get_referrers(owner):
                if not isinstance(r, (dict, list, tuple)) and not callable(r):
                    names += [f"{type(r).__module__}.{type(r).__qualname__}.{k}"
                              for k, v in getattr(r, "__dict__", {}).items() if v is owner]
                if isinstance(r, dict):
                    for o in _gc.get_referrers(r):
                        if getattr(o, "__dict__", None) is r:
                            names += [f"{type(o).__module__}.{type(o).__qualname__}.{k}" for k, v in r.items()
                                      if v is owner]
        text += f" (removal callback of the WeakSet {', '.join(names) or hex(id(owner))})"
    return text


def _thread_exception(args: Any) -> None:
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    STATS.thread_exceptions.append(f"in {CURRENT[0]}: thread {args.thread.name if args.thread else '?'}:\n{text}"[-3000:])


# ---------------------------------------------------------------------------------------------------------
# Ops and sources


class Boom(Exception):
    """What the flaky ops raise."""


def mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def key(x: Any) -> int:
    if type(x) is int:
        return x
    if isinstance(x, (list, tuple)):
        return hash(tuple(key(e) for e in x)) & 0xFFFFFFFFFFFFFFFF
    return hash(x) & 0xFFFFFFFFFFFFFFFF


class OpSpec:
    """What an op does with an item: raise with probability fail_pct %, sleep up to max_sleep s with
    probability sleep_pct %, decided by a hash of the item and the op's salt (deterministic per item)."""

    def __init__(self, rng: random.Random, *, fail: bool) -> None:
        self.salt = rng.getrandbits(48)
        self.fail_pct = rng.choice([0, 0, 1, 5, 20]) if fail else 0
        self.sleep_pct = rng.choice([0, 5, 20, 50])
        self.max_sleep = rng.choice([0.0, 0.0005, 0.002, 0.01])

    def decide(self, x: Any) -> tuple[bool, float]:
        h = mix(key(x) ^ self.salt)
        raise_it = (h % 100) < self.fail_pct
        s = 0.0
        if ((h >> 8) % 100) < self.sleep_pct:
            s = self.max_sleep * (((h >> 16) % 1000) / 1000.0)
        return raise_it, s


def make_op(kind: str, spec: OpSpec) -> Callable[..., Any]:
    if kind == "sync":

        def sync_op(x: Any) -> Any:
            r, s = spec.decide(x)
            if s:
                time.sleep(s)
            if r:
                raise Boom(f"sync op: item {x!r}")
            return x

        return sync_op
    if kind == "async":

        async def async_op(x: Any) -> Any:
            r, s = spec.decide(x)
            await asyncio.sleep(s)
            if r:
                raise Boom(f"async op: item {x!r}")
            return x

        return async_op
    if kind == "gen":

        def gen_op(x: Any) -> Any:
            r, s = spec.decide(x)
            yield x
            if s:
                time.sleep(s)
            if r:
                raise Boom(f"generator op: item {x!r}")
            if key(x) % 3 == 0:
                yield x

        return gen_op
    if kind == "asyncgen":

        async def asyncgen_op(x: Any) -> Any:
            r, s = spec.decide(x)
            yield x
            await asyncio.sleep(s)
            if r:
                raise Boom(f"async generator op: item {x!r}")

        return asyncgen_op
    raise ValueError(kind)


def endless(start: int = 0) -> Any:
    i = start
    while True:
        yield i
        i += 1


def slow_gen(n: int, every: int, pause: float) -> Any:
    for i in range(n):
        if every and i % every == 0:
            time.sleep(pause)
        yield i


def raising_source(n: int, at: int) -> Any:
    for i in range(n):
        if i == at:
            raise Boom(f"source fails at {i}")
        yield i


def make_source(rng: random.Random, *, finite: bool) -> tuple[Any, str]:
    if not finite:
        if rng.random() < 0.5:
            return endless(), "endless generator"
        return slow_gen(10**9, rng.choice([0, 10, 50]), 0.001), "slow endless generator"
    n = rng.choice([0, 1, 7, 50, 200, 1000])
    kind = rng.choice(["range", "list", "randlist", "generator"])
    if kind == "range":
        return range(n), f"range({n})"
    if kind == "list":
        return list(range(n)), f"list({n})"
    if kind == "randlist":
        return [rng.randrange(1 << 40) for _ in range(n)], f"random list({n})"
    return slow_gen(n, rng.choice([0, 25, 100]), 0.001), f"generator({n})"


def add_stages(b: Any, rng: random.Random, *, fail: bool) -> tuple[Any, list[str]]:
    shape = []
    for _ in range(rng.randint(1, 4)):
        choice = rng.choice(["sync", "sync", "async", "async", "gen", "asyncgen", "agg"])
        if choice == "agg":
            n = rng.randint(1, 8)
            drop_last = rng.random() < 0.2
            b = b.aggregate(n, drop_last=drop_last)
            shape.append(f"aggregate({n}{', drop_last' if drop_last else ''})")
            if rng.random() < 0.7:
                b = b.disaggregate()
                shape.append("disaggregate")
            continue
        c = rng.randint(1, 4)
        order = rng.choice(["completion", "input"])
        b = b.pipe(make_op(choice, OpSpec(rng, fail=fail)), concurrency=c, output_order=order)
        shape.append(f"{choice}(c={c},{order[0]})")
    return b, shape


def random_pipeline(rng: random.Random, *, finite: bool, fail: bool = True, source: Any = None) -> tuple[Any, str]:
    from spdl_rs.pipeline import PipelineBuilder

    if source is None:
        src, src_desc = make_source(rng, finite=finite)
    else:
        src, src_desc = source
    b = PipelineBuilder().add_source(src)
    b, shape = add_stages(b, rng, fail=fail)
    sink = rng.randint(1, 8)
    threads = rng.randint(1, 4)
    p = b.add_sink(sink).build(num_threads=threads)
    STATS.pipelines += 1
    return p, f"{src_desc} | {' | '.join(shape)} | sink({sink}), threads={threads}"


def take(p: Any, k: int | None) -> int:
    """Up to ``k`` items (all if None); each must come within ITEM_TIMEOUT_S."""
    n = 0
    it = p.get_iterator(timeout=ITEM_TIMEOUT_S)
    while k is None or n < k:
        try:
            next(it)
        except StopIteration:
            break
        n += 1
        STATS.items += 1
    return n


def quiet_stop(p: Any, timeout: float | None = 10.0) -> None:
    try:
        p.stop(timeout=timeout)
    except Exception:  # noqa: BLE001 (cleanup after the scenario's own outcome)
        pass


# ---------------------------------------------------------------------------------------------------------
# Scenarios: each returns normally on an expected outcome and records failures itself; any exception that
# escapes one is an unexpected one.


def sc_exhaust(ctx: Ctx, rng: random.Random) -> None:
    p, _ = random_pipeline(rng, finite=True)
    with p.auto_stop():
        take(p, None)
    STATS.outcomes["exhaust:ok"] += 1


def sc_stop(ctx: Ctx, rng: random.Random) -> None:
    p, _ = random_pipeline(rng, finite=rng.random() < 0.4)
    how = rng.choice(["start", "get_item", "never started"])
    if how == "start":
        p.start()
    if how != "never started":
        take(p, rng.choice([0, 1, 3, 10, 100]))
    timeout = rng.choice([None, 0.0, 0.01, 0.5, 5.0])
    try:
        p.stop(timeout=timeout)
        STATS.outcomes["stop:ok"] += 1
    except TimeoutError:
        STATS.outcomes["stop:timeout"] += 1
    if rng.random() < 0.3:
        p.stop()  # idempotent
        STATS.outcomes["stop:twice"] += 1
    del p


def sc_op_failure(ctx: Ctx, rng: random.Random) -> None:
    from spdl_rs.pipeline import PipelineBuilder, PipelineFailure

    n = rng.choice([5, 50, 500])
    at = rng.randrange(n)
    where = rng.choice(["op", "op", "async op", "source"])
    if where == "source":
        b = PipelineBuilder().add_source(raising_source(n, at))
    else:
        b = PipelineBuilder().add_source(range(n))

        if where == "op":

            def fails(x: Any) -> Any:
                if x == at:
                    raise Boom(f"op fails at {x}")
                return x

        else:

            async def fails(x: Any) -> Any:  # type: ignore[misc]
                await asyncio.sleep(0)
                if x == at:
                    raise Boom(f"async op fails at {x}")
                return x

        b = b.pipe(fails, concurrency=rng.randint(1, 4), max_failures=0)
    b, _ = add_stages(b, rng, fail=False)
    p = b.add_sink(rng.randint(1, 8)).build(num_threads=rng.randint(1, 4))
    STATS.pipelines += 1
    try:
        with p.auto_stop():
            take(p, None)
    except PipelineFailure as e:
        if not any(isinstance(x, Boom) for x in _exceptions_of(e)):
            STATS.fail(ctx, f"PipelineFailure without the op's exception ({where})", repr(e))
        STATS.outcomes[f"op_failure:{where.replace(' ', '_')}"] += 1
        return
    STATS.fail(ctx, f"a {where} raised with max_failures=0 but no PipelineFailure came (n={n}, at={at})")


def _exceptions_of(e: Any) -> list[BaseException]:
    out = []
    for x in getattr(e, "exceptions", []) or []:
        out.append(x[1] if isinstance(x, tuple) else x)
    if e.__cause__ is not None:
        out.append(e.__cause__)
    return out


def sc_drop(ctx: Ctx, rng: random.Random) -> None:
    p, _ = random_pipeline(rng, finite=rng.random() < 0.5)
    it = p.get_iterator(timeout=ITEM_TIMEOUT_S)
    k = rng.choice([0, 1, 2, 10, 50])
    for _ in range(k):
        try:
            next(it)
            STATS.items += 1
        except StopIteration:
            break
    ref = weakref.ref(p)
    del it, p
    gc.collect()
    if ref() is not None:
        STATS.fail(ctx, "a dropped pipeline (no cycle) is still alive after gc.collect()")
        quiet_stop(ref())
    STATS.outcomes["drop:ok"] += 1


class Owner:
    """Owns a pipeline whose op is its own bound method: owner -> pipeline -> op -> owner."""

    def __init__(self, rng: random.Random) -> None:
        from spdl_rs.pipeline import PipelineBuilder

        self.seen = 0
        self.spec = OpSpec(rng, fail=True)
        b = PipelineBuilder().add_source(endless())
        if rng.random() < 0.5:
            b = b.pipe(self.process, concurrency=rng.randint(1, 4))
        else:
            b = b.pipe(self.aprocess, concurrency=rng.randint(1, 4))
        b, _ = add_stages(b, rng, fail=False) if rng.random() < 0.5 else (b, [])
        self.pipeline = b.add_sink(rng.randint(1, 4)).build(num_threads=rng.randint(1, 4))
        STATS.pipelines += 1

    def process(self, x: Any) -> Any:
        self.seen += 1
        r, s = self.spec.decide(x)
        if s:
            time.sleep(s)
        if r:
            raise Boom(f"bound method: {x}")
        return x

    async def aprocess(self, x: Any) -> Any:
        self.seen += 1
        r, s = self.spec.decide(x)
        await asyncio.sleep(s)
        if r:
            raise Boom(f"bound async method: {x}")
        return x


def sc_cycle(ctx: Ctx, rng: random.Random) -> None:
    owner = Owner(rng)
    how = rng.choice(["iterate", "start", "never started"])
    if how == "iterate":
        take(owner.pipeline, rng.choice([1, 5, 30]))
    elif how == "start":
        owner.pipeline.start()
        time.sleep(rng.choice([0.0, 0.01, 0.05]))
    ref = weakref.ref(owner)
    pref = weakref.ref(owner.pipeline)
    del owner
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        if ref() is None and pref() is None:
            break
        if time.monotonic() > deadline:
            STATS.fail(ctx, f"a pipeline in a reference cycle ({how}) was not collected 5 s after it was dropped")
            o = ref()
            if o is not None:
                quiet_stop(o.pipeline)
                o.pipeline = None
            break
        time.sleep(0.05)
    STATS.outcomes[f"cycle:{how.replace(' ', '_')}"] += 1


def sc_sigint(ctx: Ctx, rng: random.Random) -> None:
    p, _ = random_pipeline(rng, finite=False)
    delay = rng.choice([0.0, 0.005, 0.05, 0.2])
    use_raise = rng.random() < 0.5
    where = rng.choice(["iterating", "auto_stop"])

    def send() -> None:
        if use_raise:
            signal.raise_signal(signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay, send)
    _Sigint.delivered = False
    _Sigint.swallowed.clear()
    _Sigint.armed = True
    sent = time.monotonic()
    caught = False
    try:
        if where == "auto_stop":
            with p.auto_stop():
                timer.start()
                it = p.get_iterator(timeout=ITEM_TIMEOUT_S)
                for _ in it:
                    STATS.items += 1
                    if time.monotonic() - sent > 10.0:
                        break
        else:
            timer.start()
            it = p.get_iterator(timeout=ITEM_TIMEOUT_S)
            for _ in it:
                STATS.items += 1
                if time.monotonic() - sent > 10.0:
                    break
        # Not delivered while items came: wait for it outside the pipeline.
        while time.monotonic() - sent < 12.0 and not _Sigint.delivered:
            time.sleep(0.01)
    except KeyboardInterrupt:
        caught = True
    finally:
        _Sigint.armed = False
        timer.join()
    sender = "signal.raise_signal" if use_raise else "os.kill"
    if caught:
        STATS.outcomes[f"sigint:caught_{where}"] += 1
    elif _Sigint.delivered:
        STATS.outcomes[f"sigint:swallowed_{where}"] += 1
        STATS.fail(ctx, f"SIGINT ({sender}, {where}, after {delay} s): the KeyboardInterrupt was raised where it "
                        "was ignored (unraisable) instead of reaching the consumer",
                   "\n".join(_Sigint.swallowed) or "(no unraisable record: swallowed by an except clause)")
    else:
        STATS.fail(ctx, f"SIGINT sent {'by raise_signal' if use_raise else 'by os.kill'} ({where}) raised no "
                        "KeyboardInterrupt within 12 s")
    # The pipeline after the interrupt: stopping it must work (auto_stop may have been interrupted itself).
    try:
        p.stop(timeout=10)
    except TimeoutError:
        STATS.outcomes["sigint:stop_timeout"] += 1
    del p
    gc.collect()


def _child_work() -> None:
    """What a forked child does with spdl_rs: its own small pipeline, and an image decode."""
    from spdl_rs.pipeline import PipelineBuilder

    async def sq(x: int) -> int:
        return x * x

    def inc(x: int) -> int:
        return x + 1

    p = PipelineBuilder().add_source(range(64)).pipe(inc, concurrency=2).pipe(sq, concurrency=2).add_sink(4).build(
        num_threads=2
    )
    with p.auto_stop():
        got = sorted(p.get_iterator(timeout=20))
    if got != sorted((x + 1) ** 2 for x in range(64)):
        raise AssertionError(f"child pipeline gave {len(got)} wrong items")
    if IMAGE_BYTES is not None:
        import numpy

        import spdl_rs.io

        buf = spdl_rs.io.load_image(IMAGE_BYTES)
        if tuple(numpy.asarray(buf).shape) != IMAGE_SHAPE:
            raise AssertionError(f"child decoded {numpy.asarray(buf).shape}, want {IMAGE_SHAPE}")


def _redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _mp_child(log: str, behaviour: str) -> None:
    _redirect_output(log)
    if behaviour == "exit_now":
        os._exit(0)
    _child_work()
    sys.exit(0)


class ChildExit(SystemExit):
    """Raised in an os.fork() child to leave through the driver's frames to the interpreter's own exit."""


def sc_fork(ctx: Ctx, rng: random.Random) -> None:
    p, _ = random_pipeline(rng, finite=False, fail=rng.random() < 0.5)
    if rng.random() < 0.8:
        take(p, rng.choice([1, 5, 20]))
    method = rng.choice(["os.fork", "multiprocessing"])
    behaviour = rng.choice(["exit_now", "work"])
    log = os.path.join(TMPDIR, f"child-{ctx.index}.log")
    label = f"{method}/{behaviour}"
    # faulthandler's watchdog thread does not exist in a child, and cancelling it there would wait forever.
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()
    if method == "os.fork":
        pid = os.fork()
        if pid == 0:
            _redirect_output(log)
            if behaviour == "exit_now":
                os._exit(0)
            code = 0
            try:
                _child_work()
            except BaseException:  # noqa: BLE001 (the child reports to its log and exits 1)
                traceback.print_exc()
                code = 1
            # sys.exit: unwinds the driver's frames (the parent's pipeline `p` is released on the way) and
            # finalizes the interpreter.
            raise ChildExit(code)
        _arm_watchdog()
        take(p, rng.choice([0, 3, 20]))
        status = _wait_pid(pid, CHILD_TIMEOUT_S)
    else:
        mp = multiprocessing.get_context("fork")
        proc = mp.Process(target=_mp_child, args=(log, behaviour), daemon=False)
        proc.start()
        _arm_watchdog()
        take(p, rng.choice([0, 3, 20]))
        proc.join(CHILD_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
            status = "hang"
        else:
            code = proc.exitcode
            status = "ok" if code == 0 else (f"signal {-code}" if code is not None and code < 0 else f"exit {code}")
        proc.close()
    try:
        p.stop(timeout=10)
    except TimeoutError:
        STATS.outcomes["fork:parent_stop_timeout"] += 1
    out = ""
    try:
        with open(log, errors="replace") as f:
            out = f.read()
        os.unlink(log)
    except OSError:
        pass
    marker = next((m for m in CRASH_MARKERS if m in out), None)
    if status == "ok" and marker:
        status = f"ok but '{marker}' in its output"
    STATS.children[f"{label}:{status if status == 'ok' else 'FAIL'}"] += 1
    if status != "ok":
        STATS.fail(ctx, f"forked child ({label}) {status}" + (f" (after {CHILD_TIMEOUT_S:.0f} s)" if status == "hang" else ""),
                   out)


def _wait_pid(pid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            code = os.waitstatus_to_exitcode(st)
            return "ok" if code == 0 else (f"signal {-code}" if code < 0 else f"exit {code}")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang"
        time.sleep(0.01)


_SUB_PRELUDE = """
import asyncio, sys, threading, time
from spdl_rs.pipeline import PipelineBuilder
def slow(x):
    time.sleep({sleep})
    return x
async def aslow(x):
    await asyncio.sleep({sleep})
    return x
def gen(x):
    yield x
    yield x
def endless():
    i = 0
    while True:
        yield i
        i += 1
def build(op=slow):
    return (PipelineBuilder().add_source(endless()).pipe(op, concurrency={c}).pipe(aslow, concurrency={c})
            .pipe(gen).aggregate(3).add_sink(4).build(num_threads={t}))
"""

_SUB_BODIES = {
    "global_pipeline": """
p = build()
it = p.get_iterator(timeout=30)
for _ in range({k}):
    next(it)
""",
    "started_not_iterated": """
p = build()
p.start()
time.sleep({pause})
""",
    "built_not_started": """
p = build()
""",
    "cycle": """
class Owner:
    def __init__(self):
        self.p = build(self.op)
    def op(self, x):
        time.sleep({sleep})
        return x
o = Owner()
it = o.p.get_iterator(timeout=30)
for _ in range({k}):
    next(it)
""",
    "local_in_function": """
def f():
    p = build()
    it = p.get_iterator(timeout=30)
    for _ in range({k}):
        next(it)
    global keep
    keep = it
f()
""",
    "daemon_thread_pipeline": """
def run():
    p = build()
    for _ in p:
        pass
for _ in range(2):
    threading.Thread(target=run, daemon=True).start()
time.sleep({pause})
""",
    "daemon_thread_decode": """
import spdl_rs.io
data = open({image!r}, "rb").read()
def run():
    while True:
        spdl_rs.io.load_image(data)
        spdl_rs.io.load_image({image!r})
for _ in range(3):
    threading.Thread(target=run, daemon=True).start()
time.sleep({pause})
""",
}

_SUB_EXITS = {"fall_off": "", "sys.exit": "sys.exit(0)", "raise_SystemExit": "raise SystemExit(0)"}


def sc_subprocess(ctx: Ctx, rng: random.Random) -> None:
    names = [n for n in _SUB_BODIES if n != "daemon_thread_decode" or IMAGE_PATH is not None]
    body = rng.choice(names)
    how = rng.choice(list(_SUB_EXITS))
    params = dict(sleep=rng.choice([0.0, 0.001, 0.01, 0.05]), c=rng.randint(1, 4), t=rng.randint(1, 4),
                  k=rng.choice([1, 5, 30]), pause=rng.choice([0.0, 0.05, 0.3]), image=IMAGE_PATH)
    code = (_SUB_PRELUDE + _SUB_BODIES[body] + _SUB_EXITS[how] + "\n").format(**params)
    label = f"{body}/{how}"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace",
                           timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        STATS.subprocesses[f"{label}:FAIL"] += 1
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        STATS.fail(ctx, f"subprocess {label} did not exit within {SUBPROCESS_TIMEOUT_S:.0f} s (killed)",
                   f"params={params}\nstderr:\n{err}")
        return
    marker = next((m for m in CRASH_MARKERS if m in r.stderr), None)
    if r.returncode == 0 and marker is None:
        STATS.subprocesses[f"{label}:ok"] += 1
        return
    STATS.subprocesses[f"{label}:FAIL"] += 1
    what = f"exit {r.returncode}" if r.returncode >= 0 else f"signal {-r.returncode}"
    STATS.fail(ctx, f"subprocess {label}: {what}" + (f", '{marker}' in stderr" if marker else ""),
               f"params={params}\nstderr:\n{r.stderr}")


SCENARIOS: dict[str, Callable[[Ctx, random.Random], None]] = {
    "exhaust": sc_exhaust,
    "stop": sc_stop,
    "op_failure": sc_op_failure,
    "drop": sc_drop,
    "cycle": sc_cycle,
    "sigint": sc_sigint,
    "fork": sc_fork,
    "subprocess": sc_subprocess,
}


def _arm_watchdog() -> None:
    # Last resort for a hang that holds the GIL: dump every thread and exit (the watcher names the iteration
    # at half this time).
    faulthandler.dump_traceback_later(ITERATION_WATCHDOG_S, exit=True)


def run_iteration(index: int, seed: int, weights: dict[str, int], watcher: Watcher | None) -> None:
    rng = random.Random(seed)
    names = list(weights)
    scenario = rng.choices(names, weights=[weights[n] for n in names])[0]
    ctx = Ctx(index, seed, scenario)
    CURRENT[0] = f"iteration {index} (--replay {seed}, {scenario})"
    if watcher is not None:
        watcher.current = (time.monotonic(), f"iteration {index} (--replay {seed}, {scenario})")
    _arm_watchdog()
    try:
        SCENARIOS[scenario](ctx, rng)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 (the soak records and goes on)
        STATS.fail(ctx, f"unexpected {type(e).__name__}: {e}", traceback.format_exc())
    finally:
        if os.getpid() == PARENT_PID:
            faulthandler.cancel_dump_traceback_later()
            if watcher is not None:
                watcher.current = None
    STATS.iterations += 1
    STATS.endings[scenario] += 1


# ---------------------------------------------------------------------------------------------------------
# Setup, the run, the report


def make_image() -> None:
    global IMAGE_BYTES, IMAGE_PATH, IMAGE_SHAPE
    try:
        import numpy

        import spdl_rs.io

        encode = getattr(spdl_rs.io, "encode_image", None)
        if encode is None:
            print("soak: spdl_rs.io.encode_image is missing: no image decoding", file=sys.stderr)
            return
        rng = numpy.random.default_rng(0)
        arr = rng.integers(0, 256, size=(24, 32, 3), dtype=numpy.uint8)
        path = os.path.join(TMPDIR, "soak.png")
        encode(path, arr)
        with open(path, "rb") as f:
            data = f.read()
        got = numpy.asarray(spdl_rs.io.load_image(data))
        if not numpy.array_equal(got, arr):
            print("soak: the PNG does not decode to what was encoded", file=sys.stderr)
        IMAGE_BYTES, IMAGE_PATH, IMAGE_SHAPE = data, path, tuple(got.shape)
    except Exception as e:  # noqa: BLE001
        print(f"soak: cannot make the test image ({type(e).__name__}: {e}): no image decoding", file=sys.stderr)


def warm_up() -> None:
    """One small pipeline of each kind, so that process-wide lazily made state counts in the baseline."""
    from spdl_rs.pipeline import PipelineBuilder

    async def a(x: int) -> int:
        return x

    p = PipelineBuilder().add_source(range(20)).pipe(lambda x: x).pipe(a).aggregate(2).disaggregate().add_sink(
        2
    ).build(num_threads=2)
    with p.auto_stop():
        list(p.get_iterator(timeout=ITEM_TIMEOUT_S))
    if IMAGE_BYTES is not None:
        import spdl_rs.io

        spdl_rs.io.load_image(IMAGE_BYTES)
    del p
    gc.collect()


def settle(base_threads: int, base_fds: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gc.collect()
        if os_threads() <= base_threads and open_fds() <= base_fds:
            return
        time.sleep(0.1)


def main() -> int:
    global TMPDIR
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (default: from the clock; printed)")
    ap.add_argument("--replay", type=int, default=None, metavar="ITER_SEED", help="run one iteration's seed")
    ap.add_argument("--repeat", type=int, default=1, help="with --replay: how many times")
    ap.add_argument("--scenarios", default=None, help=f"comma-separated subset of {','.join(WEIGHTS)}")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the JSON summary to PATH")
    ap.add_argument("--rss-slack-mb", type=float, default=200.0)
    ap.add_argument("--verbose", action="store_true", help="keep spdl_rs's logging (op tracebacks)")
    args = ap.parse_args()

    warnings.simplefilter("ignore")
    if not args.verbose:
        logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _unraisable
    threading.excepthook = _thread_exception

    weights = dict(WEIGHTS)
    if args.scenarios:
        wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in WEIGHTS]
        if unknown:
            ap.error(f"unknown scenarios {unknown}; known: {list(WEIGHTS)}")
        weights = {s: WEIGHTS[s] for s in wanted}

    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    import spdl_rs

    TMPDIR = tempfile.mkdtemp(prefix="spdl-soak-")
    print(f"soak: seed {seed} (replay the run with --seed {seed}); {args.seconds:.0f} s; spdl_rs from "
          f"{os.path.dirname(spdl_rs.__file__)}; python {sys.version.split()[0]}; pid {os.getpid()}", flush=True)

    gc.collect()
    start_threads, start_fds, start_rss = os_threads(), open_fds(), rss_kib()
    make_image()
    warm_up()
    watcher = Watcher()
    watcher.start()
    time.sleep(0.05)
    gc.collect()
    base = watcher.sample()
    _, base_threads, base_fds, base_rss = base

    t0 = time.monotonic()
    if args.replay is not None:
        for i in range(args.repeat):
            run_iteration(i, args.replay, weights, watcher)
        duration = args.seconds = time.monotonic() - t0
    else:
        master = random.Random(seed)
        deadline = t0 + args.seconds
        last_report = t0
        i = 0
        while time.monotonic() < deadline:
            run_iteration(i, master.getrandbits(32), weights, watcher)
            i += 1
            now = time.monotonic()
            if now - last_report >= 10:
                last_report = now
                print(f"soak: {now - t0:5.0f} s: {STATS.iterations} iterations, {STATS.pipelines} pipelines, "
                      f"{STATS.items} items, {len(STATS.failures)} failures; threads {os_threads()}, fds "
                      f"{open_fds()}, RSS {rss_kib() // 1024} MiB", flush=True)
        duration = time.monotonic() - t0

    # The end: collect, let stopped-with-timeout ops finish, then measure.
    settle(base_threads + SLACK_THREADS, base_fds + SLACK_FDS, 15.0)
    settle(base_threads, base_fds, 2.0)
    final = watcher.sample()
    watcher.halt.set()
    watcher.join(5)
    _, final_threads, final_fds, final_rss = final
    # The watcher thread is gone now; it was in the baseline and in every sample.
    samples = watcher.samples
    run_samples = [s for s in samples if s[0] >= base[0]]
    peak_threads = max(s[1] for s in run_samples)
    peak_fds = max(s[2] for s in run_samples)
    peak_rss = max(s[3] for s in run_samples)
    early_end = base[0] + 0.1 * duration
    early = [s[3] for s in run_samples if s[0] <= early_end] or [base_rss]
    early_rss = max(early)
    rss_growth_mb = (final_rss - early_rss) / 1024.0

    checks = []
    if final_threads > base_threads + SLACK_THREADS:
        checks.append(f"threads at the end {final_threads} > baseline {base_threads} + {SLACK_THREADS}")
    if final_fds > base_fds + SLACK_FDS:
        checks.append(f"fds at the end {final_fds} > baseline {base_fds} + {SLACK_FDS}")
    if rss_growth_mb > args.rss_slack_mb:
        checks.append(f"RSS grew {rss_growth_mb:.0f} MB over the first 10% of the run (> {args.rss_slack_mb:.0f})")
    if STATS.unraisable:
        checks.append(f"{len(STATS.unraisable)} exceptions ignored in finalizers/destructors (unraisable)")
    if STATS.thread_exceptions:
        checks.append(f"{len(STATS.thread_exceptions)} exceptions escaped threads")
    if STATS.failures:
        kinds = Counter(f["what"].split(":")[0] if f["what"].startswith("unexpected") else f["scenario"]
                        for f in STATS.failures)
        checks.append(f"{len(STATS.failures)} scenario failures ({dict(kinds)})")
    for text in STATS.unraisable[:5]:
        print("soak: unraisable: " + text.strip().replace("\n", "\n  "), file=sys.stderr)
    for text in STATS.thread_exceptions[:5]:
        print("soak: thread exception: " + text.strip().replace("\n", "\n  "), file=sys.stderr)

    ok = not checks
    summary = {
        "ok": ok,
        "seed": seed,
        "seconds": round(duration, 1),
        "python": sys.version.split()[0],
        "iterations": STATS.iterations,
        "pipelines": STATS.pipelines,
        "items": STATS.items,
        "endings": dict(sorted(STATS.endings.items())),
        "outcomes": dict(sorted(STATS.outcomes.items())),
        "children": dict(sorted(STATS.children.items())),
        "subprocesses": dict(sorted(STATS.subprocesses.items())),
        "threads": {"start": start_threads, "baseline": base_threads, "peak": peak_threads, "final": final_threads},
        "fds": {"start": start_fds, "baseline": base_fds, "peak": peak_fds, "final": final_fds},
        "rss_mib": {"start": start_rss // 1024, "baseline": base_rss // 1024, "first_10pct": early_rss // 1024,
                    "peak": peak_rss // 1024, "final": final_rss // 1024, "growth": round(rss_growth_mb, 1)},
        "stray_sigints": _Sigint.stray,
        "unraisable": len(STATS.unraisable),
        "unraisable_keyboardinterrupt": STATS.unraisable_kbi,
        "thread_exceptions": len(STATS.thread_exceptions),
        "failures": [{k: v for k, v in f.items() if k != "detail"} for f in STATS.failures],
        "checks_failed": checks,
    }

    w = 40
    print("\n" + "=" * 78)
    print(f"spdl_rs soak: {'PASS' if ok else 'FAIL'}   seed {seed}   {duration:.0f} s   python {summary['python']}")
    print("-" * 78)
    print(f"{'':{w}}{'start':>9}{'baseline':>10}{'peak':>9}{'final':>9}{'limit':>10}")
    print(f"{'threads':{w}}{start_threads:>9}{base_threads:>10}{peak_threads:>9}{final_threads:>9}"
          f"{base_threads + SLACK_THREADS:>10}")
    print(f"{'open fds':{w}}{start_fds:>9}{base_fds:>10}{peak_fds:>9}{final_fds:>9}{base_fds + SLACK_FDS:>10}")
    print(f"{'RSS MiB (first 10%: ' + str(early_rss // 1024) + ')':{w}}{start_rss // 1024:>9}{base_rss // 1024:>10}"
          f"{peak_rss // 1024:>9}{final_rss // 1024:>9}{early_rss // 1024 + int(args.rss_slack_mb):>10}")
    print("-" * 78)
    print(f"{'iterations / pipelines / items':{w}}{STATS.iterations} / {STATS.pipelines} / {STATS.items}")
    print(f"{'endings':{w}}" + ", ".join(f"{k} {v}" for k, v in sorted(STATS.endings.items())))
    print(f"{'outcomes':{w}}" + _wrap(", ".join(f"{k} {v}" for k, v in sorted(STATS.outcomes.items())), w))
    nchild = sum(STATS.children.values())
    print(f"{'forked children (' + str(nchild) + ')':{w}}"
          + _wrap(", ".join(f"{k} {v}" for k, v in sorted(STATS.children.items())) or "-", w))
    nsub = sum(STATS.subprocesses.values())
    print(f"{'subprocess exits (' + str(nsub) + ')':{w}}"
          + _wrap(", ".join(f"{k} {v}" for k, v in sorted(STATS.subprocesses.items())) or "-", w))
    print(f"{'unraisable / in threads / stray SIGINT':{w}}{len(STATS.unraisable)} (+{STATS.unraisable_kbi} "
          f"KeyboardInterrupt) / {len(STATS.thread_exceptions)} / {_Sigint.stray}")
    print("-" * 78)
    if STATS.failures:
        print(f"failures ({len(STATS.failures)}; replay one with --replay ITER_SEED):")
        for f in STATS.failures[:40]:
            print(f"  #{f['iteration']} --replay {f['iter_seed']} [{f['scenario']}] {f['what']}")
        if len(STATS.failures) > 40:
            print(f"  ... {len(STATS.failures) - 40} more")
    for c in checks:
        print(f"FAILED: {c}")
    if ok:
        print("all checks passed")
    print("=" * 78)
    line = json.dumps(summary, separators=(",", ":"))
    print("SOAK_JSON " + line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0 if ok else 1


def _wrap(text: str, indent: int, width: int = 78) -> str:
    out, line = [], ""
    for part in text.split(", "):
        piece = part if not line else ", " + part
        if line and indent + len(line) + len(piece) > width:
            out.append(line + ",")
            line = part
        else:
            line += piece
    out.append(line)
    return ("\n" + " " * indent).join(out)


if __name__ == "__main__":
    try:
        rc = main()
    except ChildExit:
        # A forked child leaving through the driver: exit as the child asked (interpreter finalization).
        raise
    sys.stdout.flush()
    sys.exit(rc)
