"""Failed items, failure budgets and PipelineFailure."""

import logging
import sys
from fractions import Fraction

import pytest

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure


class Boom(ValueError):
    pass


def fail_on(bad):
    def op(x):
        if bad(x):
            raise Boom(f"bad item {x}")
        return x

    return op


def test_failed_items_are_dropped_and_logged_with_traceback(caplog):
    p = PipelineBuilder().add_source(range(20)).pipe(fail_on(lambda x: x % 5 == 0), name="check").add_sink(3).build(
        num_threads=2
    )
    with caplog.at_level(logging.ERROR, logger="spdl_rs.pipeline"):
        with p.auto_stop():  # unlimited budget: no PipelineFailure
            out = list(p)
    assert sorted(out) == [x for x in range(20) if x % 5]
    failed = [r for r in caplog.records if r.exc_info]
    assert len(failed) == 4
    assert "check" in failed[0].getMessage()
    assert failed[0].exc_info[0] is Boom
    assert failed[0].exc_info[2] is not None  # the traceback


def test_stage_count_budget_raises_from_stop():
    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_on(lambda x: x % 2 == 0), name="half", max_failures=3)
        .add_sink(3)
        .build(num_threads=2)
    )
    p.start()
    items = list(p)  # ends early with StopIteration, not an exception
    assert len(items) < 500
    with pytest.raises(PipelineFailure) as info:
        p.stop()
    assert info.value.stage == "half"
    assert "half" in str(info.value)
    assert all(isinstance(e, Boom) for e in info.value.exceptions)
    assert len(info.value.exceptions) >= 4
    p.stop()  # raised once; stopping again is quiet


def test_fraction_budget_is_judged_after_100_calls():
    # 5% failures stay under a 10% budget ...
    p = (
        PipelineBuilder()
        .add_source(range(400))
        .pipe(fail_on(lambda x: x % 20 == 0), max_failures=Fraction(1, 10))
        .add_sink(3)
        .build(num_threads=2)
    )
    with p.auto_stop():
        assert len(list(p)) == 380
    # ... 50% failures do not, but only after the probation of 100 calls.
    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_on(lambda x: x % 2 == 0), max_failures=Fraction(1, 10), output_order="input")
        .add_sink(3)
        .build(num_threads=1)
    )
    with pytest.raises(PipelineFailure):
        with p.auto_stop():
            n = len(list(p))
    assert 40 <= n < 500


def test_pipeline_wide_budget_from_build_and_auto_stop():
    p = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_on(lambda x: x % 10 == 1), name="a")
        .pipe(fail_on(lambda x: x % 10 == 2), name="b")
        .add_sink(3)
        .build(num_threads=2, max_failures=5)
    )
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop():
            list(p)
    assert info.value.stage in ("a", "b")
    if sys.version_info >= (3, 11):
        assert isinstance(info.value, ExceptionGroup)  # noqa: F821
        matched, rest = info.value.split(Boom)
        assert matched is not None and rest is None
        assert any("Pipeline stage:" in n for n in getattr(info.value.exceptions[0], "__notes__", []))


def test_async_op_failures_count_too():
    async def op(x):
        if x % 2:
            raise Boom(str(x))
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(op, max_failures=2).add_sink(3).build(num_threads=1)
    with pytest.raises(PipelineFailure):
        with p.auto_stop():
            list(p)


def test_generator_failure_keeps_what_was_yielded_and_drops_the_rest():
    # Generators stream, as in SPDL: what an item yielded before it raised is already downstream; the rest of
    # that item is lost and the item counts as one failure.
    def gen(x):
        yield x
        if x == 3:
            raise Boom("in generator")
        yield -x

    p = PipelineBuilder().add_source(range(5)).pipe(gen, output_order="input").add_sink(3).build(num_threads=1)
    with p.auto_stop():
        out = list(p)
    assert out == [0, 0, 1, -1, 2, -2, 3, 4, -4]


def test_source_exception_is_a_pipeline_failure():
    def source():
        yield 1
        yield 2
        raise Boom("source broke")

    p = PipelineBuilder().add_source(source()).add_sink(3).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop():
            assert list(p) == [1, 2]
    assert info.value.stage == "source"
    assert isinstance(info.value.exceptions[0], Boom)


def test_budget_validation():
    b = PipelineBuilder().add_source(range(3))
    with pytest.raises(ValueError):
        b.pipe(str, max_failures=Fraction(3, 2))
    with pytest.raises(ValueError):
        b.pipe(str, max_failures=-5)
    with pytest.raises(TypeError):
        b.pipe(str, max_failures=0.5)
