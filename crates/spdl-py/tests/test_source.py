"""spdl_rs.source: samplers and dataset listings."""

import pytest

import spdl_rs
from spdl_rs.pipeline import PipelineBuilder

pytestmark = pytest.mark.skipif(not spdl_rs._native.HAS_SOURCE, reason="built without the source feature")


def test_samplers_are_deterministic_and_shard_disjointly():
    from spdl_rs.source import Sampler

    s = Sampler.shuffled(100, seed=7)
    assert len(s) == 100 and s.seed == 7
    e0, e1 = s.order(0), s.order(1)
    assert sorted(e0) == list(range(100)) and e0 != e1
    assert Sampler.shuffled(100, seed=7).order(0) == e0
    shards = [set(s.sharded(r, 4, drop_remainder=True).order(0)) for r in range(4)]
    assert sum(len(x) for x in shards) == 100 and set().union(*shards) == set(range(100))
    assert Sampler.sequential(5).order(3) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        s.sharded(4, 4)


def test_list_dataset_feeds_a_pipeline(tmp_path):
    from spdl_rs.source import Sampler, list_dataset

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            (tmp_path / cls / f"{i}.jpg").write_bytes(b"x")
    (tmp_path / "cat" / "notes.txt").write_text("skip me")
    keys, labels, classes = list_dataset(tmp_path, extensions=["jpg"])
    assert classes == ["cat", "dog"] and len(keys) == 6 and labels == [0, 0, 0, 1, 1, 1]
    order = Sampler.shuffled(len(keys), seed=1).order(0)
    p = PipelineBuilder().add_source(order).pipe(lambda i: labels[i]).add_sink(2).build(num_threads=1)
    with p.auto_stop():
        assert sorted(p) == sorted(labels)
