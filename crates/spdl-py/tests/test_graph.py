"""Pipelines that are not a single chain: SPDL's ``Merge`` (with the default and a custom op) and
``PathVariants``/``path_variants`` (per item, batched, nested), with one-pass and continuous sources.

The expected values are SPDL 0.8.0's for the same pipelines, except where a test says otherwise.
"""

import asyncio

import pytest

from spdl_rs.pipeline import EPOCH_END, PipelineBuilder, PipelineFailure, build_pipeline, is_eof, is_epoch_end
from spdl_rs.pipeline.defs import (
    Aggregate,
    Merge,
    MergeConfig,
    PathVariants,
    PathVariantsConfig,
    Pipe,
    PipelineConfig,
    SinkConfig,
    SourceConfig,
)


def run(pipeline):
    with pipeline.auto_stop():
        return list(pipeline)


def epochs(pipeline, n):
    """The items of ``n`` epochs of a continuous pipeline, one list per epoch."""
    with pipeline.auto_stop():
        return [list(pipeline.get_iterator(timeout=30)) for _ in range(n)]


def plc(source, *pipes, continuous=False):
    return PipelineConfig(src=SourceConfig(source, continuous=continuous), pipes=list(pipes), sink=SinkConfig(1))


def times10(x):
    return x * 10


def plus1(x):
    return x + 1


################################################################################
# Merge
################################################################################


def test_merge_passes_every_input_item():
    cfg = PipelineConfig(src=Merge([plc(range(3)), plc(range(10, 12), Pipe(plus1))]), pipes=[], sink=SinkConfig(10))
    assert sorted(run(build_pipeline(cfg, num_threads=2))) == [0, 1, 2, 11, 12]


def test_merge_then_stages_and_inputs_in_stats():
    cfg = PipelineConfig(
        src=Merge([plc(range(5), Pipe(times10)), plc(range(100, 103))]), pipes=[Aggregate(4)], sink=SinkConfig(10)
    )
    pipeline = build_pipeline(cfg, num_threads=2)
    out = run(pipeline)
    assert sorted(x for batch in out for x in batch) == [0, 10, 20, 30, 40, 100, 101, 102]
    assert sorted(len(b) for b in out) == [4, 4]
    names = [s.name for s in pipeline.get_stats()]
    assert any(n.startswith("merge[0]/") and "times10" in n for n in names), names


def test_merge_of_a_merge():
    inner = PipelineConfig(src=Merge([plc([1, 2]), plc([3])]), pipes=[Pipe(times10)], sink=SinkConfig(1))
    cfg = PipelineConfig(src=Merge([inner, plc([4, 5])]), pipes=[], sink=SinkConfig(3))
    assert sorted(run(build_pipeline(cfg, num_threads=2))) == [4, 5, 10, 20, 30]


def test_merge_continuous_epochs_end_once_every_input_ended_them():
    cfg = PipelineConfig(
        src=Merge([plc(range(3), continuous=True), plc(range(10, 12), Pipe(plus1), continuous=True)]),
        pipes=[Aggregate(2)],
        sink=SinkConfig(10),
    )
    for items in epochs(build_pipeline(cfg, num_threads=2), 3):
        assert sorted(x for batch in items for x in batch) == [0, 1, 2, 11, 12]


def test_merge_inputs_must_agree_on_continuous():
    cfg = PipelineConfig(src=Merge([plc(range(3), continuous=True), plc(range(3))]), pipes=[], sink=SinkConfig(1))
    with pytest.raises(ValueError, match="Mixed continuous mode is not supported"):
        build_pipeline(cfg, num_threads=1)


async def round_robin(name, input_queues, output_queue):
    """SPDL's documented custom merge."""
    round_robin.names.append(name)
    active = list(input_queues)
    while active:
        for q in list(active):
            item = await q.get()
            if is_eof(item):
                active.remove(q)
            else:
                await output_queue.put(item)


round_robin.names = []


def test_merge_with_a_custom_op():
    round_robin.names.clear()
    cfg = PipelineConfig(
        src=Merge([plc([1, 2, 3], Pipe(times10)), plc([4, 5, 6, 7, 8])], op=round_robin),
        pipes=[Aggregate(3)],
        sink=SinkConfig(10),
    )
    assert run(build_pipeline(cfg, num_threads=2)) == [[10, 4, 20], [5, 30, 6], [7, 8]]
    # SPDL passes its StageInfo, which prints as "0:0:merge".
    assert [str(n) for n in round_robin.names] == ["0:0:merge"]
    assert round_robin.names[0].stage_name == "merge"


def test_a_custom_merge_op_may_return_early():
    async def first_three(name, input_queues, output_queue):
        for _ in range(3):
            await output_queue.put(await input_queues[0].get())

    endless = plc(iter(range(10**9)))
    cfg = PipelineConfig(src=Merge([endless, plc([4, 5])], op=first_three), pipes=[], sink=SinkConfig(10))
    assert run(build_pipeline(cfg, num_threads=2)) == [0, 1, 2]


def test_a_failing_custom_merge_op_fails_the_pipeline():
    async def boom(name, input_queues, output_queue):
        await output_queue.put(await input_queues[0].get())
        raise ValueError("boom")

    cfg = PipelineConfig(src=Merge([plc([1, 2]), plc([3])], op=boom), pipes=[], sink=SinkConfig(10))
    pipeline = build_pipeline(cfg, num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        with pipeline.auto_stop():
            list(pipeline)
    assert any(isinstance(e, ValueError) and str(e) == "boom" for e in info.value.exceptions)


def test_a_custom_merge_op_with_continuous_inputs():
    async def forward_epochs(name, input_queues, output_queue):
        ended = 0
        while True:
            for q in input_queues:
                item = await q.get()
                if is_epoch_end(item):
                    ended += 1
                    if ended == len(input_queues):
                        ended = 0
                        await output_queue.put(EPOCH_END)
                    continue
                await output_queue.put(item)

    cfg = PipelineConfig(
        src=Merge([plc([1, 2], continuous=True), plc([10, 20], continuous=True)], op=forward_epochs),
        pipes=[],
        sink=SinkConfig(10),
    )
    for items in epochs(build_pipeline(cfg, num_threads=2), 3):
        assert sorted(items) == [1, 2, 10, 20]


def test_merge_config_validation_and_repr():
    with pytest.raises(ValueError, match="at least one upstream pipeline"):
        Merge([])
    cfg = Merge([plc([1])], op=round_robin)
    assert isinstance(cfg, MergeConfig) and cfg.pipeline_configs == (plc([1]),)
    text = repr(PipelineConfig(src=cfg, pipes=[], sink=SinkConfig(2)))
    assert text.startswith("PipelineConfig\n - Source:\n   MergeConfig(\n     op=round_robin at ")
    assert "     Pipeline 1:\n       PipelineConfig\n" in text


################################################################################
# PathVariants
################################################################################


def negate(x):
    return -x


def minus1(x):
    return x - 1


def test_path_variants_routes_each_item():
    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .path_variants(lambda x: x % 2, [[Pipe(times10)], [Pipe(negate), Pipe(minus1)]])
        .add_sink(3)
        .build(num_threads=2)
    )
    assert sorted(run(pipeline)) == [-10, -8, -6, -4, -2, 0, 20, 40, 60, 80]
    names = [s.name for s in pipeline.get_stats()]
    assert "path_variants[1]/minus1" in names, names


def tagger(tag):
    def tag_batch(batch):
        return [(tag, x) for x in batch]

    return tag_batch


def test_batched_path_variants_split_and_concatenate_in_path_order():
    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .aggregate(4)
        .path_variants(
            lambda batch: [x % 3 for x in batch],
            [[Pipe(tagger(0))], [Pipe(tagger(1))], [Pipe(tagger(2))]],
            batched=True,
        )
        .add_sink(3)
        .build(num_threads=1)
    )
    assert sorted(run(pipeline)) == [
        [(0, 0), (0, 3), (1, 1), (2, 2)],
        [(0, 6), (1, 4), (1, 7), (2, 5)],
        [(0, 9), (2, 8)],
    ]


def test_batched_path_variants_give_each_path_a_list_and_skip_empty_results():
    seen = []

    def record(batch):
        seen.append(list(batch))
        return batch

    pipeline = (
        PipelineBuilder()
        .add_source(range(6))
        .aggregate(3)
        .path_variants(lambda b: [0] * len(b), [[Pipe(lambda b: [])], [Pipe(record)]], batched=True)
        .add_sink(3)
        .build(num_threads=1)
    )
    assert run(pipeline) == []
    assert seen == [[], []]  # path 1 got an empty list for each batch


def test_nested_path_variants():
    inner = PathVariants(lambda x: (x // 2) % 2, [[Pipe(lambda x: ("a", x))], [Pipe(lambda x: ("b", x))]], name="inner")
    pipeline = (
        PipelineBuilder()
        .add_source(range(12))
        .path_variants(lambda x: x % 2, [[Pipe(lambda x: x)], [inner]])
        .add_sink(3)
        .build(num_threads=2)
    )
    assert sorted(run(pipeline), key=str) == [
        ("a", 1), ("a", 5), ("a", 9), ("b", 11), ("b", 3), ("b", 7), 0, 10, 2, 4, 6, 8,
    ]


def test_path_variants_with_an_async_router():
    async def router(x):
        await asyncio.sleep(0)
        return x % 2

    pipeline = (
        PipelineBuilder()
        .add_source(range(6))
        .path_variants(router, [[Pipe(lambda x: x)], [Pipe(lambda x: x * 100)]])
        .add_sink(3)
        .build(num_threads=1)
    )
    assert sorted(run(pipeline)) == [0, 2, 4, 100, 300, 500]


def bad_router(x):
    if x == 3:
        raise ValueError("no route")
    return 7 if x == 5 else 0


def test_router_failures_fail_the_pipeline():
    # As in SPDL 0.8.0: a router exception or an index out of range fails the whole pipeline, whatever
    # max_failures (routing is the pipeline's logic, not a property of one item).
    build = PipelineBuilder().add_source(range(8)).path_variants(bad_router, [[Pipe(lambda x: x)]]).add_sink(3).build
    for budget in (-1, 0, 5):
        pipeline = build(num_threads=1, max_failures=budget)
        with pytest.raises(PipelineFailure) as info:
            run(pipeline)
        assert info.value.stage == "path_variants"
        assert any("no route" in str(e) or "Router returned index" in str(e) for e in info.value.exceptions)


def test_path_variants_with_a_continuous_source():
    pipeline = (
        PipelineBuilder()
        .add_source(range(7), continuous=True)
        .path_variants(lambda x: x % 2, [[Aggregate(2)], [Pipe(lambda x: [x])]])
        .add_sink(3)
        .build(num_threads=2)
    )
    for items in epochs(pipeline, 3):
        assert sorted(items) == [[0, 2], [1], [3], [4, 6], [5]]


def test_path_variants_in_a_config():
    cfg = PipelineConfig(
        src=SourceConfig(range(6)),
        pipes=[PathVariants(lambda x: x % 2, [[Pipe(times10)], [Pipe(plus1)]], name="pv"), Aggregate(6)],
        sink=SinkConfig(2),
    )
    (batch,) = run(build_pipeline(cfg, num_threads=2))
    assert sorted(batch) == [0, 2, 4, 6, 20, 40]


def test_path_variants_validation_and_repr():
    with pytest.raises(ValueError, match="router must be callable"):
        PathVariants(3, [[Pipe(str)]])
    with pytest.raises(ValueError, match="at least 1 path"):
        PathVariants(str, [])
    with pytest.raises(ValueError, match="Path 1 is empty"):
        PathVariants(str, [[Pipe(str)], []])
    with pytest.raises(ValueError, match="Path 0, position 1: SourceConfig is not allowed"):
        PathVariants(str, [[Pipe(str), SourceConfig([1])]])
    with pytest.raises(ValueError, match="SinkConfig is not allowed"):
        PipelineBuilder().path_variants(str, [[SinkConfig(1)]])
    cfg = PathVariants(str, [[Aggregate(2)], [Aggregate(3), Aggregate(4)]])
    assert isinstance(cfg, PathVariantsConfig) and cfg.name == "path_variants" and not cfg.batched
    assert repr(cfg) == (
        "PathVariants(path0=[aggregate(op=collate(2), drop_last=False)], "
        "path1=[aggregate(op=collate(3), drop_last=False), aggregate(op=collate(4), drop_last=False)])"
    )


def test_get_config_round_trips():
    builder = (
        PipelineBuilder()
        .add_source(range(4))
        .path_variants(lambda x: x % 2, [[Pipe(times10)], [Pipe(plus1)]])
        .add_sink(2)
    )
    cfg = builder.get_config()
    assert isinstance(cfg.pipes[0], PathVariantsConfig) and cfg.sink == SinkConfig(2)
    assert sorted(run(build_pipeline(cfg, num_threads=1))) == [0, 2, 4, 20]
    with pytest.raises(RuntimeError, match="Sink is not set"):
        PipelineBuilder().add_source(range(3)).get_config()
