"""``build(autotune=True)``: a waiting stage left at its default concurrency is raised while it pays, a stage
given a concurrency is left alone, and the changes are visible in the stats and the decision log."""

import asyncio
import time

from spdl_rs.pipeline import PipelineBuilder


def _wait(x: int) -> int:
    time.sleep(0.002)
    return x


def _double(x: int) -> int:
    return 2 * x


def test_a_waiting_stage_is_raised_and_a_fixed_one_is_not() -> None:
    n = 2000
    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(_double, concurrency=2)
        .pipe(_wait)
        .add_sink(4)
        .build(num_threads=2, autotune=True)
    )
    with pipeline.auto_stop():
        got = sorted(pipeline)
    assert got == [2 * i for i in range(n)]
    decisions = pipeline.autotune_decisions()
    assert decisions is not None
    assert any(d["to"] > d["from"] for d in decisions if "_wait" in d["stage"]), decisions
    assert all("_double" not in d["stage"] for d in decisions)
    assert {d["knob"] for d in decisions} <= {"concurrency", "queue_capacity", "threads"}, decisions
    assert all((d["knob"] == "threads") == (d["stage"] == "pool") for d in decisions), decisions
    raw = {d["name"]: d for d in pipeline._core.stats()}
    wait = next(v for k, v in raw.items() if "_wait" in k)
    double = next(v for k, v in raw.items() if "_double" in k)
    assert wait["concurrency_bounds"] is not None
    assert double["concurrency_bounds"] is None and double["concurrency"] == 2
    assert "autotune" in pipeline.stats_table()


def test_async_stage_keeps_input_order_while_tuned() -> None:
    async def fetch(x: int) -> int:
        await asyncio.sleep(0.002)
        return x

    n = 1500
    pipeline = PipelineBuilder().add_source(range(n)).pipe(fetch, output_order="input").add_sink(4).build(
        num_threads=1, autotune=True
    )
    with pipeline.auto_stop():
        got = list(pipeline)
    assert got == list(range(n))
    decisions = pipeline.autotune_decisions()
    assert decisions is not None and any(d["to"] > d["from"] for d in decisions), decisions


def test_without_autotune_nothing_is_tuned() -> None:
    pipeline = PipelineBuilder().add_source(range(10)).pipe(_double).add_sink(2).build(num_threads=1)
    with pipeline.auto_stop():
        assert list(pipeline) == [2 * i for i in range(10)]
    assert pipeline.autotune_decisions() is None
    assert all(d["concurrency_bounds"] is None for d in pipeline._core.stats())
