"""SPDL 0.8.0's failure semantics, as spdl_rs carries them over: a stage's own ``max_failures`` replaces the
pipeline's for that stage, failures surface as ``PipelineFailure`` whose message starts with SPDL's words, and
invalid sizes are refused in SPDL's words. The expectations are SPDL's on the same pipelines."""

from __future__ import annotations

from fractions import Fraction

import pytest

from spdl_rs.pipeline import PipelineBuilder, PipelineFailure


def _odd_fails(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def _run(p):
    with p.auto_stop():
        return list(p)


def test_a_stages_own_budget_replaces_the_pipelines():
    # The pipeline allows none, the stage ten: the stage's budget judges it (SPDL: no failure).
    p = PipelineBuilder().add_source(range(10)).pipe(_odd_fails, max_failures=10).add_sink(10)
    assert _run(p.build(num_threads=1, max_failures=0)) == [0, 2, 4, 6, 8]
    # -1 on the stage: unlimited there, whatever the pipeline's.
    p = PipelineBuilder().add_source(range(10)).pipe(_odd_fails, max_failures=-1).add_sink(10)
    assert _run(p.build(num_threads=1, max_failures=0)) == [0, 2, 4, 6, 8]
    # A stricter stage budget fails where the pipeline's would not.
    p = PipelineBuilder().add_source(range(10)).pipe(_odd_fails, max_failures=1).add_sink(10)
    with pytest.raises(PipelineFailure, match=r"^pipeline stages failed"):
        _run(p.build(num_threads=1, max_failures=-1))
    # Stages without their own budget are judged by the pipeline's, over all stages' failures.
    p = (PipelineBuilder().add_source(range(200)).pipe(_odd_fails, max_failures=-1)
         .pipe(lambda x: x // 0 if x % 4 == 0 else x).add_sink(10))
    with pytest.raises(PipelineFailure):
        _run(p.build(num_threads=1, max_failures=Fraction(1, 10)))


def test_failures_start_with_spdls_words():
    def source():
        yield 1
        raise RuntimeError("source broke")

    p = PipelineBuilder().add_source(source()).pipe(lambda x: x).add_sink(10).build(num_threads=1)
    with pytest.raises(PipelineFailure, match=r"^pipeline stages failed: .*source broke") as info:
        _run(p)
    assert any("source broke" in str(e) for e in info.value.exceptions)
    p = PipelineBuilder().add_source(range(10)).pipe(_odd_fails).add_sink(10).build(num_threads=1, max_failures=2)
    with pytest.raises(PipelineFailure, match=r"^pipeline stages failed: .*failure budget") as info:
        _run(p)
    assert all(isinstance(e, ValueError) for e in info.value.exceptions)


def test_invalid_sizes_in_spdls_words():
    with pytest.raises(ValueError, match=r"^`buffer_size` must be greater than 0\. Found: -1"):
        PipelineBuilder().add_source(range(3)).add_sink(-1)
