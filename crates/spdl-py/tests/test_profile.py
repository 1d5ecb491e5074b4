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
