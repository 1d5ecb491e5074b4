"""Task hooks, custom queues, background tasks, ``create_task`` and ``spdl_rs.pipeline.config`` on real pipelines."""

import asyncio
import logging
import threading
from contextlib import asynccontextmanager
from fractions import Fraction

import pytest

from spdl_rs.pipeline import (
    AsyncQueue,
    BackgroundTask,
    PipelineBuilder,
    PipelineFailure,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskStatsHook,
    build_pipeline,
    config,
    create_task,
    is_eof,
)
from spdl_rs.pipeline.defs import Pipe, PipelineConfig, SinkConfig, SourceConfig


@pytest.fixture(autouse=True)
def _reset_config():
    yield
    config.set_default_hook_class()
    config.set_default_queue_class()
    config.set_default_build_callback(None)
    config.set_default_background_tasks(None)
    config.set_compact_log(None)


class Recorder(TaskHook):
    """Records every hook call (shared list), with the input and the exception type."""

    events: list = []

    def __init__(self, info, interval=-1):
        self.info = info
        self.interval = interval

    @asynccontextmanager
    async def stage_hook(self):
        self.events.append(("stage_enter", self.info.stage_name))
        try:
            yield
        except BaseException as e:
            self.events.append(("stage_error", self.info.stage_name, type(e).__name__))
            raise
        self.events.append(("stage_exit", self.info.stage_name))

    @asynccontextmanager
    async def task_hook(self, input_item=None):
        self.events.append(("task_enter", self.info.stage_name, input_item))
        try:
            yield
        except StopAsyncIteration:
            raise
        except Exception as e:
            self.events.append(("task_error", self.info.stage_name, input_item, type(e).__name__))
            raise
        self.events.append(("task_exit", self.info.stage_name, input_item))


@pytest.fixture
def recorder():
    events: list = []

    class R(Recorder):
        pass

    R.events = events
    return R


def drain(p):
    with p.auto_stop():
        return list(p)


def test_custom_hook_sees_stages_tasks_inputs_and_failures(recorder):
    def fail_on_two(x):
        if x == 2:
            raise ValueError("two")
        return x * 10

    async def add_one(x):
        await asyncio.sleep(0)
        return x + 1

    p = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(fail_on_two, concurrency=2, name="f")
        .pipe(add_one, name="g")
        .aggregate(2)
        .disaggregate()
        .add_sink(3)
        .build(num_threads=2, task_hook_factory=lambda info: [recorder(info)])
    )
    assert sorted(drain(p)) == [1, 11, 31]
    ev = recorder.events
    stages = ["f", "g", "aggregate(op=collate(2), drop_last=False)", "disaggregate"]
    assert sorted(e[1] for e in ev if e[0] == "stage_enter") == sorted(stages)
    assert [e[1] for e in ev if e[0] == "stage_exit"] == stages  # upstream first
    assert sorted(e[2] for e in ev if e[0] == "task_enter" and e[1] == "f") == [0, 1, 2, 3]
    assert sorted(e[2] for e in ev if e[0] == "task_exit" and e[1] == "f") == [0, 1, 3]
    assert [e for e in ev if e[0] == "task_error"] == [("task_error", "f", 2, "ValueError")]
    assert sorted(e[2] for e in ev if e[0] == "task_exit" and e[1] == "g") == [0, 10, 30]
    agg = [e[2] for e in ev if e[0] == "task_exit" and e[1] == stages[2]]
    assert sorted(agg[:-1]) == [1, 11, 31] and is_eof(agg[-1])  # the final flush runs with EOF as input
    # A generator op's hooks run per step: two items and the end of [1, 11], one item and the end of [31].
    dis = [e for e in ev if e[1] == "disaggregate" and e[0] == "task_enter"]
    assert len(dis) == 5
    # Every task is inside its stage's hooks.
    for name in stages:
        idx = [i for i, e in enumerate(ev) if e[1] == name]
        assert ev[idx[0]][0] == "stage_enter" and ev[idx[-1]][0] == "stage_exit"


def test_generator_ops_and_hooks_that_fail(recorder):
    class Failing(recorder):
        @asynccontextmanager
        async def task_hook(self, input_item=None):
            if input_item == 1:
                raise RuntimeError("hook refuses 1")
            yield

    def twice(x):
        yield x
        yield x

    async def agen(x):
        yield -x

    p = (
        PipelineBuilder()
        .add_source(range(3))
        .pipe(twice, name="twice")
        .pipe(agen, name="neg")
        .add_sink(10)
        .build(num_threads=1, task_hook_factory=lambda info: [Failing(info)])
    )
    # A failing task hook drops that task's item only; the rest go on.
    assert sorted(drain(p)) == [-2, -2, 0, 0]


def test_stage_hook_failure_fails_the_pipeline(recorder):
    class Broken(recorder):
        @asynccontextmanager
        async def stage_hook(self):
            raise RuntimeError("no stage for you")
            yield

    p = PipelineBuilder().add_source(range(3)).pipe(str).add_sink(1).build(
        num_threads=1, task_hook_factory=lambda info: [Broken(info)]
    )
    with pytest.raises(PipelineFailure) as info:
        next(iter(p))
    assert "no stage for you" in repr(info.value.exceptions)


def test_stage_hook_sees_the_stage_failure(recorder):
    def boom(x):
        raise ValueError(x)

    p = PipelineBuilder().add_source(range(10)).pipe(boom, name="boom").add_sink(1).build(
        num_threads=1, max_failures=0, task_hook_factory=lambda info: [recorder(info)]
    )
    with pytest.raises(PipelineFailure):
        drain(p)
    assert ("stage_error", "boom", "RuntimeError") in recorder.events


def test_stop_early_cancels_the_stage_hooks(recorder):
    p = PipelineBuilder().add_source(range(1000)).pipe(str, name="s").add_sink(1).build(
        num_threads=1, task_hook_factory=lambda info: [recorder(info)]
    )
    with p.auto_stop():
        next(iter(p))
    assert ("stage_error", "s", "CancelledError") in recorder.events


def test_factory_gets_spdls_stage_infos():
    seen = []

    def factory(info):
        seen.append(info)
        return []

    p = PipelineBuilder().add_source(range(3)).pipe(str, concurrency=3, name="s").pipe(str).add_sink(1)
    assert drain(p.build(num_threads=1, task_hook_factory=factory, stage_id=5)) == ["0", "1", "2"]
    assert [i.stage_id for i in seen] == ["6", "7"]
    assert seen[0].stage_name == "s" and seen[0].concurrency == 3 and seen[1].concurrency is None
    assert str(seen[0]) == f"{seen[0].pipeline_id}:6:s[3]"
    assert str(StageInfo(pipeline_id=1, stage_id="2", stage_name="x")) == "1:2:x"


def test_empty_factory_and_defaults_stay_native():
    """With the default hook and queue (or a factory returning no hooks) the ops run on the engine's threads."""
    threads = set()

    def op(x):
        threads.add(threading.current_thread().name)
        return x

    for kwargs in ({}, {"task_hook_factory": lambda info: []}):
        p = PipelineBuilder().add_source(range(5)).pipe(op, name="op").add_sink(1).build(num_threads=1, **kwargs)
        assert drain(p) == [0, 1, 2, 3, 4]
        assert p._loop is None  # no event loop: nothing runs through Python hooks
        assert [s.kind for s in p.get_stats()] == ["source", "blocking", "sink"]


def test_default_hook_class_takes_effect_and_resets(recorder):
    config.set_default_hook_class(recorder)
    assert config.get_default_hook_class() is recorder
    assert drain(PipelineBuilder().add_source(range(2)).pipe(str, name="s").add_sink(1).build(num_threads=1)) == [
        "0",
        "1",
    ]
    assert [e[0] for e in recorder.events if e[0].startswith("task")] == ["task_enter", "task_exit"] * 2
    config.set_default_hook_class()
    assert config.get_default_hook_class() is TaskStatsHook
    recorder.events.clear()
    drain(PipelineBuilder().add_source(range(2)).pipe(str).add_sink(1).build(num_threads=1))
    assert recorder.events == []
    config.set_default_hook_class(None)
    assert config.get_default_hook_class() is None
    assert drain(PipelineBuilder().add_source(range(2)).pipe(str).add_sink(1).build(num_threads=1)) == ["0", "1"]


class RecordingQueue(AsyncQueue):
    log: list = []

    async def put(self, item):
        self.log.append(("put", self.info.stage_name, item))
        await super().put(item)

    async def get(self):
        item = await super().get()
        self.log.append(("get", self.info.stage_name, item))
        return item

    @asynccontextmanager
    async def stage_hook(self):
        self.log.append(("enter", self.info.stage_name, self.maxsize))
        yield
        self.log.append(("exit", self.info.stage_name, None))


def test_custom_queue_class_sees_every_item():
    RecordingQueue.log = log = []
    p = PipelineBuilder().add_source(range(3)).pipe(lambda x: x + 1, name="inc").add_sink(4)
    assert drain(p.build(num_threads=1, queue_class=RecordingQueue)) == [1, 2, 3]
    for name, items in (("src", [0, 1, 2]), ("inc", [1, 2, 3]), ("sink", [1, 2, 3])):
        puts = [e[2] for e in log if e[0] == "put" and e[1] == name]
        gets = [e[2] for e in log if e[0] == "get" and e[1] == name]
        assert puts[:3] == items and gets[:3] == items
        # EOF goes through every queue but the sink's (as in SPDL).
        assert (len(puts), len(gets)) == ((3, 3) if name == "sink" else (4, 4))
        if name != "sink":
            assert is_eof(puts[-1]) and is_eof(gets[-1])
    assert sorted(e[1:] for e in log if e[0] == "enter") == [("inc", 2), ("sink", 4), ("src", 2)]
    assert [e[1] for e in log if e[0] == "exit"] == ["src", "inc", "sink"]


def test_default_queue_class_takes_effect_and_resets():
    class Q(RecordingQueue):
        def __init__(self, info, *, buffer_size=1, interval=-1):
            super().__init__(info, buffer_size=buffer_size)
            self.interval = interval

    Q.log = []
    config.set_default_queue_class(Q)
    assert config.get_default_queue_class() is Q
    assert drain(PipelineBuilder().add_source(range(2)).add_sink(1).build(num_threads=1)) == [0, 1]
    assert [e[2] for e in Q.log if e[0] == "put" and e[1] == "src"][:2] == [0, 1]
    config.set_default_queue_class()
    assert config.get_default_queue_class() is StatsQueue
    n = len(Q.log)
    drain(PipelineBuilder().add_source(range(2)).add_sink(1).build(num_threads=1))
    assert len(Q.log) == n
    with pytest.raises(TypeError, match="queue_class"):
        PipelineBuilder().add_source(range(3)).build(num_threads=1, queue_class=dict)


def test_stats_hook_and_queue_used_explicitly_log_spdls_lines(caplog):
    caplog.set_level(logging.INFO, logger="spdl_rs.pipeline")
    p = PipelineBuilder().add_source(range(5)).pipe(str, name="s").add_sink(1)
    built = p.build(num_threads=1, queue_class=StatsQueue, task_hook_factory=lambda info: [TaskStatsHook(info)])
    assert drain(built) == ["0", "1", "2", "3", "4"]
    text = caplog.text
    assert "Completed     5 tasks (  0 failed)" in text
    assert ":s_queue]\tProcessed     6 items" in text  # 5 items and EOF


def test_default_stats_are_logged_from_the_engine(caplog):
    caplog.set_level(logging.INFO, logger="spdl_rs.pipeline")
    drain(PipelineBuilder().add_source(range(7)).pipe(str, name="s").add_sink(1).build(num_threads=1))
    assert ":s]\tCompleted     7 tasks (  0 failed)" in caplog.text
    assert ":s_queue]\tProcessed     7 items" in caplog.text


def test_stats_hook_and_queue_directly():
    info = StageInfo(pipeline_id=0, stage_id="0", stage_name="direct")

    async def main():
        hook = TaskStatsHook(info, interval=0.01)
        q = StatsQueue(info, buffer_size=2, interval=0.01)
        reported = []

        async def keep(stats):
            reported.append(stats)

        hook.interval_stats_callback = keep
        async with hook.stage_hook(), q.stage_hook():
            for i in range(3):
                async with hook.task_hook(i):
                    await q.put(i)
                assert await q.get() == i
            with pytest.raises(ValueError):
                async with hook.task_hook(3):
                    raise ValueError
            await asyncio.sleep(0.05)
        return hook, q, reported

    hook, q, reported = asyncio.run(main())
    assert (hook.num_tasks, hook.num_success) == (4, 3)
    assert q._getc.num_items == 3 and q._putc.num_items == 3
    assert reported and reported[0].num_tasks == 4 and reported[0].num_failures == 1
    stats = q._get_lap_stats()
    assert stats.num_items == 0 and 0.0 <= stats.occupancy_rate <= 1.0


def test_background_tasks_run_and_stop(caplog):
    started = threading.Event()
    cancelled = threading.Event()

    class Monitor(BackgroundTask):
        async def run(self):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    class Broken(BackgroundTask):
        async def run(self):
            raise RuntimeError("monitor broke")

    config.set_default_background_tasks([Broken])
    assert config.get_default_background_tasks() == [Broken]
    cfg = PipelineConfig(src=SourceConfig(range(3)), pipes=[Pipe(str)], sink=SinkConfig(1))
    p = build_pipeline(cfg, num_threads=1, background_tasks=[Monitor])
    assert drain(p) == ["0", "1", "2"]
    assert started.is_set() and cancelled.is_set()
    assert "Background task failed: monitor broke" in caplog.text


def test_create_task_names_and_logs_failures(caplog):
    async def fail():
        raise ValueError("oops")

    async def forever():
        await asyncio.sleep(3600)

    async def main():
        t = create_task(fail(), name="my_task")
        await asyncio.wait([t])
        config.set_compact_log(True)
        t = create_task(fail(), name="compact")
        await asyncio.wait([t])
        c = create_task(forever(), name="cancelled_one", log_cancelled=True)
        await asyncio.sleep(0)
        c.cancel()
        await asyncio.wait([c])
        for _ in range(7):
            await asyncio.wait([create_task(fail(), name="rep", suppress_repeated_logs=True, suppression_threshold=3)])
        return t.get_name()

    assert asyncio.run(main()) == "compact"
    text = caplog.text
    assert "Task [my_task] failed." in text and "ValueError: oops" in text
    assert "Task [compact]: ValueError: oops (" in text
    assert "Task [cancelled_one] was cancelled." in text
    assert "Errors are repeated at" in text
    assert text.count("Task [rep]") == 2


def test_config_names_and_build_callback(caplog):
    names = {
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
    }
    assert set(config.__all__) == names and all(callable(getattr(config, n)) for n in names)
    import spdl_rs.pipeline.config as same

    assert same is config
    seen = []
    config.set_default_build_callback(seen.append)
    assert config.get_default_build_callback() == seen.append
    cfg = PipelineConfig(src=SourceConfig(range(2)), pipes=[], sink=SinkConfig(1))
    drain(build_pipeline(cfg, num_threads=1))
    drain(PipelineBuilder().add_source(range(2)).pipe(str).add_sink(1).build(num_threads=1))
    assert seen[0] is cfg and isinstance(seen[1], PipelineConfig) and len(seen[1].pipes) == 1

    def broken(cfg):
        raise RuntimeError("callback broke")

    config.set_default_build_callback(broken)
    assert drain(build_pipeline(cfg, num_threads=1, max_failures=Fraction(1, 2))) == [0, 1]
    assert "Build callback failed." in caplog.text


def test_diagnostic_mode(monkeypatch):
    from spdl_rs.pipeline import _profile

    assert not config.is_diagnostic_mode_enabled()
    monkeypatch.setenv("SPDL_PIPELINE_DIAGNOSTIC_MODE", "1")
    monkeypatch.setenv("SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS", "20")
    assert config.is_diagnostic_mode_enabled() and config.diagnostic_mode_num_sources() == 20
    results = []
    monkeypatch.setattr(_profile, "_DEFAULT_PROFILE_CALLBACK", results.append)
    cfg = PipelineConfig(src=SourceConfig(range(100)), pipes=[Pipe(str, name="s")], sink=SinkConfig(1))
    p = build_pipeline(cfg, num_threads=1)
    with pytest.raises(SystemExit) as info:
        for _ in p:
            pass
    assert info.value.code == 0
    assert [r.name for r in results] == ["s"]


def test_merge_and_path_variants_stages_as_spdl_numbers_them(recorder):
    from spdl_rs.pipeline.defs import Aggregate, Merge, PathVariants

    infos = []

    def factory(info):
        infos.append(str(info))
        return [recorder(info)]

    def inc(x):
        return x + 1

    def neg(x):
        return -x

    sub = PipelineConfig(src=SourceConfig(range(3)), pipes=[Pipe(inc, name="inc")], sink=SinkConfig(1))
    cfg = PipelineConfig(
        src=Merge([sub, sub]),
        pipes=[PathVariants(lambda x: x % 2, [[Pipe(neg, name="neg")], [Pipe(inc, name="inc2"), Aggregate(2)]])],
        sink=SinkConfig(1),
    )
    p = build_pipeline(cfg, num_threads=1, task_hook_factory=factory)
    out = drain(p)
    # The merge is "as available": which odd numbers are batched together varies.
    assert sorted(x for x in out if not isinstance(x, list)) == [-2, -2]
    batches = [x for x in out if isinstance(x, list)]
    assert [len(b) for b in batches] == [2, 2] and sorted(sum(batches, [])) == [2, 2, 4, 4]
    pid = infos[0].split(":")[0]
    # The same ids and names as SPDL 0.8.0 gives (checked side by side).
    expected = ["0:merge", "2:inc", "4:inc", "5:path_variants", "6:neg", "7:inc2",
                "8:aggregate(op=collate(2), drop_last=False)", "9:path_variants_merge"]
    assert infos == [f"{pid}:{e}" for e in expected]
    ev = recorder.events
    # The merge, the router and the paths' merge have stage hooks only; the stages inside run task hooks.
    for name in ("merge", "path_variants", "path_variants_merge"):
        assert ("stage_enter", name) in ev and ("stage_exit", name) in ev
        assert not any(e[0] == "task_enter" and e[1] == name for e in ev)
    assert sorted(e[2] for e in ev if e[0] == "task_exit" and e[1] == "neg") == [2, 2]
    assert sorted(e[2] for e in ev if e[0] == "task_exit" and e[1] == "inc2") == [1, 1, 3, 3]


def test_dropped_hooked_pipeline_finishes_its_hooks(recorder):
    import gc

    async def slow(x):
        await asyncio.sleep(0.001)
        return x

    p = PipelineBuilder().add_source(range(10_000)).pipe(slow, name="slow", concurrency=4).aggregate(3).add_sink(1)
    built = p.build(num_threads=2, task_hook_factory=lambda info: [recorder(info)])
    it = iter(built)
    next(it)
    del it, built
    gc.collect()
    assert ("stage_error", "slow", "CancelledError") in recorder.events


def test_default_interval_reports_come_from_the_engine(caplog):
    """``report_stats_interval`` with the defaults logs SPDL's per-stage lines (the lap's counts) from the
    engine's counters while the pipeline runs; the op waits for the first one."""
    caplog.set_level(logging.INFO, logger="spdl_rs.pipeline")
    reported = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record):
            if "Completed" in record.getMessage():
                reported.set()

    watch = Watch()
    logging.getLogger("spdl_rs.pipeline").addHandler(watch)
    try:

        def op(x):
            if x == 3:
                assert reported.wait(30)
            return x

        p = PipelineBuilder().add_source(range(6)).pipe(op, name="w").add_sink(1)
        assert drain(p.build(num_threads=1, report_stats_interval=0.01)) == list(range(6))
    finally:
        logging.getLogger("spdl_rs.pipeline").removeHandler(watch)
    lines = [r.getMessage() for r in caplog.records if ":w]\tCompleted" in r.getMessage()]
    assert len(lines) >= 2 and "Completed     6 tasks" in lines[-1]  # the interval ones, then the total


def test_custom_hook_with_the_default_queue_logs_native_queue_stats(recorder, caplog):
    caplog.set_level(logging.INFO, logger="spdl_rs.pipeline")
    config.set_default_hook_class(recorder)
    drain(PipelineBuilder().add_source(range(4)).pipe(str, name="s").add_sink(1).build(num_threads=1))
    assert ":s_queue]\tProcessed     4 items" in caplog.text  # StatsQueue's report, from the engine
    assert "Completed" not in caplog.text  # the custom hook replaced TaskStatsHook
    assert sorted(e[2] for e in recorder.events if e[0] == "task_exit") == [0, 1, 2, 3]


def test_continuous_source_epoch_flushes_run_without_hooks(recorder):
    p = PipelineBuilder().add_source(range(3), continuous=True).aggregate(2).add_sink(2).build(
        num_threads=1, task_hook_factory=lambda info: [recorder(info)]
    )
    with p.auto_stop():
        epochs = [list(p.get_iterator(timeout=30)) for _ in range(2)]
    assert epochs == [[[0, 1], [2]], [[0, 1], [2]]]
    inputs = [e[2] for e in recorder.events if e[0] == "task_enter"]
    assert inputs[:6] == [0, 1, 2, 0, 1, 2] and not any(is_eof(x) for x in inputs)
