"""``profile_pipeline`` on real pipelines: every stage, every concurrency, hooks and callbacks."""

import logging
from contextlib import contextmanager

import pytest

from spdl_rs.pipeline import ProfileHook, ProfileResult, config, profile_pipeline
from spdl_rs.pipeline.defs import Aggregate, Disaggregate, Merge, Pipe, PipelineConfig, SinkConfig, SourceConfig


@pytest.fixture(autouse=True)
def _reset():
    yield
    config.set_default_profile_hook(None)
    config.set_default_profile_callback(None)


class RecordingHook(ProfileHook):
    def __init__(self):
        self.calls = []

    @contextmanager
    def stage_profile_hook(self, stage, concurrency):
        self.calls.append(("stage", stage, concurrency))
        yield

    @contextmanager
    def pipeline_profile_hook(self):
        self.calls.append(("pipeline",))
        yield
        self.calls.append(("pipeline_end",))


def cfg_of(src):
    async def double(x):
        return 2 * x

    return PipelineConfig(
        src=src,
        pipes=[Pipe(str, concurrency=3, name="str"), Aggregate(4), Disaggregate(), Pipe(double, name="double")],
        sink=SinkConfig(2),
    )


def test_profile_each_stage_at_each_concurrency(caplog):
    caplog.set_level(logging.INFO, logger="spdl_rs.pipeline")
    hook = RecordingHook()
    seen = []
    results = profile_pipeline(cfg_of(SourceConfig(range(1000))), num_inputs=50, callback=seen.append, hook=hook)
    assert [r.name for r in results] == ["str", "aggregate(op=collate(4), drop_last=False)", "disaggregate", "double"]
    assert all(isinstance(r, ProfileResult) for r in results) and seen == list(results)
    assert [s.concurrency for s in results[0].stats] == [32, 16, 8, 4, 1]
    assert [s.concurrency for s in results[1].stats] == [1]
    assert [s.concurrency for s in results[2].stats] == [1]
    assert [s.concurrency for s in results[3].stats] == [32, 16, 8, 4, 1]
    for r in results:
        for s in r.stats:
            assert s.qps > 0 and 0.0 <= s.occupancy_rate <= 1.0
    assert hook.calls[0] == ("pipeline",) and hook.calls[-1] == ("pipeline_end",)
    assert ("stage", "str", 32) in hook.calls and ("stage", "disaggregate", 1) in hook.calls
    assert "Fetched 50 input samples." in caplog.text and " - Concurrency: 32" in caplog.text


def test_profile_defaults_merge_and_rank(monkeypatch):
    hook = RecordingHook()
    seen = []
    config.set_default_profile_hook(hook)
    config.set_default_profile_callback(seen.append)
    assert config.get_default_profile_hook() is hook and config.get_default_profile_callback() == seen.append
    sub = PipelineConfig(src=SourceConfig(range(10)), pipes=[Pipe(lambda x: x + 1, name="inc")], sink=SinkConfig(1))
    cfg = PipelineConfig(src=Merge([sub, sub]), pipes=[Pipe(str, name="str")], sink=SinkConfig(1))
    results = profile_pipeline(cfg, num_inputs=5)
    assert [r.name for r in results] == ["inc", "inc", "str"] and [r.name for r in seen] == ["inc", "inc", "str"]
    assert hook.calls[0] == ("pipeline",)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert profile_pipeline(cfg, num_inputs=5) == []


def test_profile_errors():
    with pytest.raises(RuntimeError, match="No input samples are fetched."):
        profile_pipeline(PipelineConfig(src=SourceConfig([]), pipes=[Pipe(str)], sink=SinkConfig(1)))


# The figures come from the engine's window over each stage's run (``Pipeline.stats_window``): counts and
# shares are checked, not times.


def _shares(s):
    return (s.busy, s.starved, s.blocked, s.occupancy_rate)


def test_profile_figures_come_from_the_window():
    results = profile_pipeline(cfg_of(SourceConfig(range(1000))), num_inputs=50)
    by_name = {r.name: r for r in results}
    # Items each stage put out over its window: every input once; an aggregate of 4 makes ceil(50 / 4).
    expected = {"str": 50, "aggregate(op=collate(4), drop_last=False)": 13, "disaggregate": 50, "double": 50}
    for name, n in expected.items():
        for s in by_name[name].stats:
            assert s.num_items == n, (name, s)
            assert s.duration > 0 and s.qps > 0 and s.throughput > 0 and s.task_mean >= 0
            assert all(0.0 <= x <= 1.0 for x in _shares(s)), (name, s)
            # One window: the rate times its length is the count, and the source's is the inputs profiled.
            inputs = 13 if name == "disaggregate" else 50
            assert round(s.qps * s.duration) == n and round(s.throughput * s.duration) == inputs


def test_profile_merge_counts_every_merged_input():
    sub = PipelineConfig(src=SourceConfig(range(10)), pipes=[Pipe(lambda x: x + 1, name="inc")], sink=SinkConfig(1))
    cfg = PipelineConfig(src=Merge([sub, sub]), pipes=[Pipe(str, name="str")], sink=SinkConfig(1))
    inc_a, inc_b, str_ = profile_pipeline(cfg, num_inputs=5)
    assert [s.num_items for s in inc_a.stats] == [5] * 5 and [s.num_items for s in inc_b.stats] == [5] * 5
    # The merged pipelines' outputs, together, are the next stage's inputs.
    assert [s.num_items for s in str_.stats] == [10] * 5


def test_profile_slow_stage_rises_with_concurrency():
    import time

    def slow(x):
        time.sleep(0.02)
        return x

    cfg = PipelineConfig(src=SourceConfig(range(32)), pipes=[Pipe(slow, name="slow")], sink=SinkConfig(2))
    (result,) = profile_pipeline(cfg, num_inputs=32)
    by_c = {s.concurrency: s for s in result.stats}
    assert all(s.num_items == 32 for s in result.stats)
    # Sleep-bound: 8 workers put out the same 32 items in about an eighth of the time of 1.
    assert by_c[8].qps > 2 * by_c[1].qps
    # The consumer waits on a sleep-bound stage: its output queue is empty for part of the window.
    assert by_c[1].occupancy_rate < 1.0


def test_stats_window_and_anchor():
    import time

    from spdl_rs.pipeline import PipelineBuilder

    def slow(x):
        time.sleep(0.005)
        return x

    p = PipelineBuilder().add_source(range(40)).pipe(slow, concurrency=2, name="slow").add_sink(2).build(num_threads=2)
    other = PipelineBuilder().add_source(range(3)).add_sink(1).build(num_threads=1)
    before = p.stats_anchor()
    assert before.elapsed == 0.0
    got = []
    with p.auto_stop():
        for x in p:
            got.append(x)
            if len(got) == 20:
                mid = p.stats_anchor()
        whole = p.stats_window()
        since_start = p.stats_window(before)
        second_half = p.stats_window(mid)
    assert sorted(got) == list(range(40))
    assert [r["name"] for r in whole["stages"]] == ["source", "slow", "sink"]
    assert [r["kind"] for r in whole["stages"]] == ["source", "blocking", "sink"]
    assert whole["items"] == 40 and since_start["items"] == 40
    assert round(whole["throughput"] * whole["duration"]) == 40
    slow_row = whole["stages"][1]
    assert slow_row["concurrency"] == 2 and round(slow_row["rate"] * whole["duration"]) == 40
    assert slow_row["task_mean"] > 0
    for w in (whole, since_start, second_half):
        for r in w["stages"]:
            assert all(0.0 <= r[k] <= 1.0 for k in ("busy", "starved", "blocked")), r
    # The consumer waited for the sleeping stage: the sink row's starved share, which get_stats() reads too
    # (the occupancy of the queue before the sink).
    assert whole["stages"][2]["starved"] > 0
    assert p.get_stats()[1].queue.occupancy_rate < 1.0
    # The anchor taken after 20 items: the window since then holds the rest (the source may have run ahead
    # of the consumer by the queues' capacity).
    assert 0 < second_half["duration"] < whole["duration"]
    assert 0 <= second_half["items"] <= 20
    assert round(second_half["stages"][2]["rate"] * second_half["duration"]) == 20
    with pytest.raises(ValueError, match="another pipeline"):
        other.stats_window(mid)
    other.stop()
