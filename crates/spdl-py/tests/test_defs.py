"""spdl_rs.pipeline.defs + build_pipeline (SPDL's config API) and custom Aggregators."""

import logging
from fractions import Fraction

import pytest

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure, build_pipeline
from spdl_rs.pipeline.defs import (
    Aggregate,
    Aggregator,
    Collate,
    Disaggregate,
    Merge,
    PathVariants,
    Pipe,
    PipelineConfig,
    SinkConfig,
    SourceConfig,
)


class JoinUntil(Aggregator):
    """SPDL's documented example: joins strings until they reach a size."""

    def __init__(self, threshold):
        self.threshold, self.buffer, self.size = threshold, [], 0

    def accumulate(self, item):
        self.buffer.append(item)
        self.size += len(item)
        if self.size >= self.threshold:
            out = "".join(self.buffer)
            self.buffer, self.size = [], 0
            return out
        return None

    def flush(self):
        if self.buffer:
            out = "".join(self.buffer)
            self.buffer, self.size = [], 0
            return out
        return None


def drain(p):
    with p.auto_stop():
        return list(p)


def test_build_pipeline_from_a_config():
    async def plus_one(x):
        return x + 1

    def twice(x):
        yield x
        yield x

    table = {i: -i for i in range(100)}
    cfg = PipelineConfig(
        src=SourceConfig(range(50)),
        pipes=[
            Pipe(plus_one, concurrency=4, output_order="input"),
            Pipe(twice, name="twice"),
            Pipe(table),  # a container: looked up with __getitem__
            Aggregate(8, drop_last=True),
            Pipe(lambda b: [x * 10 for x in b]),
            Disaggregate(),
        ],
        sink=SinkConfig(buffer_size=2),
    )
    assert "Pipes:" in repr(cfg)
    out = drain(build_pipeline(cfg, num_threads=3))
    want = [-(x + 1) * 10 for x in range(50) for _ in range(2)][: 96]
    assert out == want
    stats = {s.name for s in build_pipeline(cfg, num_threads=1).get_stats()}
    assert "twice" in stats


def test_aggregate_with_a_custom_aggregator_matches_spdl_docs():
    src = ["a", "bb", "ccc", "dddd", "e", "ff"]
    out = drain(PipelineBuilder().add_source(src).aggregate(JoinUntil(10)).add_sink(3).build(num_threads=2))
    assert out == ["abbcccdddd", "eff"]
    out = drain(
        PipelineBuilder().add_source(src).aggregate(JoinUntil(10), drop_last=True).add_sink(3).build(num_threads=2)
    )
    assert out == ["abbcccdddd"]
    cfg = PipelineConfig(src=SourceConfig(src), pipes=[Aggregate(JoinUntil(6))], sink=SinkConfig(3))
    assert drain(build_pipeline(cfg, num_threads=1)) == ["abbccc", "ddddeff"]


def test_collate_runs_natively_and_a_subclass_runs_its_own_methods():
    assert drain(PipelineBuilder().add_source(range(7)).aggregate(Collate(3)).add_sink(3).build(num_threads=1)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]

    class Tagged(Collate):
        def flush(self):
            rest = super().flush()
            return None if rest is None else ("rest", rest)

    out = drain(PipelineBuilder().add_source(range(7)).aggregate(Tagged(3)).add_sink(3).build(num_threads=1))
    assert out == [[0, 1, 2], [3, 4, 5], ("rest", [6])]


def test_aggregator_is_flushed_at_each_epoch_end():
    p = (
        PipelineBuilder()
        .add_source(["ab", "cde", "f"], continuous=True)
        .aggregate(JoinUntil(5))
        .add_sink(2)
        .build(num_threads=2)
    )
    with p.auto_stop():
        for _ in range(3):
            assert list(p.get_iterator(timeout=30)) == ["abcde", "f"]


def test_aggregator_output_can_be_disaggregated():
    class Pairs(Aggregator):
        def __init__(self):
            self.held = None

        def accumulate(self, x):
            if self.held is None:
                self.held = x
                return None
            out, self.held = [self.held, x, self.held + x], None
            return out

        def flush(self):
            out, self.held = self.held, None
            return None if out is None else [out]

    out = drain(PipelineBuilder().add_source(range(5)).aggregate(Pairs()).disaggregate().add_sink(3).build(num_threads=1))
    assert out == [0, 1, 1, 2, 3, 5, 4]


class Fragile(Aggregator):
    def __init__(self):
        self.items = []

    def accumulate(self, x):
        if x % 10 == 3:
            raise KeyError(f"item {x} has no label")
        self.items.append(x)
        if len(self.items) == 4:
            out, self.items = self.items, []
            return out
        return None

    def flush(self):
        out, self.items = self.items, []
        return out or None


def test_aggregator_failures_are_logged_and_budgeted(caplog):
    with caplog.at_level(logging.ERROR, logger="spdl_rs.pipeline"):
        out = drain(PipelineBuilder().add_source(range(40)).aggregate(Fragile()).add_sink(3).build(num_threads=2))
    assert sum(out, []) == [x for x in range(40) if x % 10 != 3]
    failed = [r for r in caplog.records if "has no label" in r.getMessage()]
    assert len(failed) == 4 and all(r.exc_info for r in failed)

    p = PipelineBuilder().add_source(range(1000)).aggregate(Fragile()).add_sink(3).build(num_threads=2, max_failures=2)
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop():
            got = list(p)
    assert len(got) < 200
    assert "aggregate(Fragile)" in str(info.value)
    assert all(isinstance(e, KeyError) for e in info.value.exceptions)


def test_invalid_definitions_raise_clearly():
    with pytest.raises(ValueError):
        SourceConfig(42)
    with pytest.raises(ValueError):
        SinkConfig(0)
    with pytest.raises(ValueError):
        Pipe(str, output_order="random")
    with pytest.raises(TypeError):
        Aggregate("eight")
    with pytest.raises(ValueError):
        Aggregate(0)
    with pytest.raises(TypeError):
        PipelineBuilder().add_source(range(3)).aggregate(object())
    with pytest.raises(ValueError, match="at least one upstream"):
        Merge([])
    with pytest.raises(ValueError, match="at least 1 path"):
        PathVariants(lambda x: 0, [])
    cfg = PipelineConfig(src=SourceConfig(range(3)), pipes=[], sink=SinkConfig(1))
    assert drain(build_pipeline(cfg, num_threads=1, task_hook_factory=lambda info: [])) == [0, 1, 2]
    assert drain(build_pipeline(cfg, num_threads=1, stage_id=3, max_failures=Fraction(1, 2))) == [0, 1, 2]


def test_graph_spellings_check_their_arguments():
    b = PipelineBuilder().add_source(range(3))
    with pytest.raises(ValueError, match="at least 1 path"):
        b.path_variants(lambda x: 0, [])
    with pytest.raises(TypeError, match="Got: object"):
        b.to(object())


def test_stop_while_an_aggregator_runs_leaves_no_thread(watchdog):
    import itertools
    import time

    from conftest import os_threads, wait_for

    class Slow(JoinUntil):
        def accumulate(self, item):
            time.sleep(0.002)
            return super().accumulate(item)

    baseline = os_threads()
    for _ in range(20):
        p = PipelineBuilder().add_source(itertools.repeat("xy")).aggregate(Slow(6)).add_sink(2).build(num_threads=2)
        with p.auto_stop():
            for i, out in enumerate(p):
                assert out == "xyxyxy"
                if i == 2:
                    break
    wait_for(lambda: os_threads() <= baseline, what="the pipelines' threads to end")


def test_build_takes_spdls_keywords():
    p = PipelineBuilder().add_source(range(3)).add_sink(1).build(
        num_threads=1, stage_id=0, use_thread_output_queue=False, queue_class=None, task_hook_factory=None
    )
    assert drain(p) == [0, 1, 2]
    with pytest.raises(TypeError, match="queue_class"):
        PipelineBuilder().add_source(range(3)).build(num_threads=1, queue_class=object)
    with pytest.raises(TypeError, match="unexpected keyword"):
        PipelineBuilder().add_source(range(3)).build(num_threads=1, num_workers=2)
