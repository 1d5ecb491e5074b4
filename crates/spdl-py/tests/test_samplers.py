"""spdl_rs.source.DistributedRandomSampler and DistributedDeterministicSampler.

The expected index sequences and messages were produced by the same calls on SPDL 0.8.0's ``spdl.source``
(NumPy 2.4); they are hard-coded so that the suite runs without SPDL.
"""

import pickle
import re
import warnings

import pytest

import spdl_rs.source
from spdl_rs.source import DistributedDeterministicSampler, DistributedRandomSampler, SizedIterable
from spdl_rs.source.utils import embed_shuffle


def shares(n, world_size, **kwargs):
    return [list(DistributedRandomSampler(n, rank=r, world_size=world_size, **kwargs)) for r in range(world_size)]


def test_exported():
    for name in ("DistributedRandomSampler", "DistributedDeterministicSampler"):
        assert name in spdl_rs.source.__all__
        assert hasattr(spdl_rs.source, name)


# --- DistributedRandomSampler: sequences --------------------------------------------------------------


def test_random_default_seed_per_rank():
    assert shares(9, 3) == [[0, 7, 4], [8, 2, 6], [3, 5, 1]]


def test_random_ranks_cover_dataset_disjointly():
    got = shares(9, 3)
    assert sorted(i for share in got for i in share) == list(range(9))


def test_random_yields_python_ints():
    assert all(type(i) is int for i in DistributedRandomSampler(5, rank=0, world_size=1))


def test_random_same_sequence_without_shuffle():
    s = DistributedRandomSampler(12, rank=0, world_size=2, seed=4)
    assert list(s) == list(s)


def test_random_shuffle_by_epoch():
    s = DistributedRandomSampler(10, rank=1, world_size=3, seed=7)
    out = []
    for epoch in range(3):
        s.shuffle(seed=epoch)
        out.append(list(s))
    assert out == [[2, 9, 0], [8, 5, 7], [0, 1, 7]]
    assert len(s) == 3


def test_random_shuffle_is_history_free():
    a = DistributedRandomSampler(10, rank=1, world_size=3, seed=7)
    a.shuffle(seed=5)
    a.shuffle(seed=1)
    b = DistributedRandomSampler(10, rank=1, world_size=3)
    b.shuffle(seed=1)
    assert list(a) == list(b) == [8, 5, 7]


def test_random_drop_last_round():
    assert shares(11, 4, seed=3) == [[6, 1], [9, 0], [8, 10], [7, 3]]
    assert [len(DistributedRandomSampler(11, rank=r, world_size=4)) for r in range(4)] == [2, 2, 2, 2]


def test_random_keep_last_round():
    got = shares(11, 4, seed=3, ddp_drop_last_distributed_round=False)
    assert got == [[6, 7, 5], [9, 0, 4], [8, 1, 3], [2, 10]]
    assert sorted(i for share in got for i in share) == list(range(11))
    lens = [
        len(DistributedRandomSampler(11, rank=r, world_size=4, ddp_drop_last_distributed_round=False))
        for r in range(4)
    ]
    assert lens == [3, 3, 3, 2]


def test_random_keep_last_round_fewer_items_than_ranks():
    s = DistributedRandomSampler(3, rank=3, world_size=4, ddp_drop_last_distributed_round=False)
    assert len(s) == 0 and list(s) == []
    assert len(DistributedRandomSampler(3, rank=0, world_size=4, ddp_drop_last_distributed_round=False)) == 1


def test_random_num_draws_without_weights():
    assert list(DistributedRandomSampler(10, rank=0, world_size=1, num_draws=4, seed=5)) == [4, 0, 8, 6]


def test_random_larger_dataset():
    s = DistributedRandomSampler(100, rank=2, world_size=8, seed=123)
    assert list(s) == [50, 12, 22, 6, 43, 7, 61, 31, 41, 23, 98, 15]
    assert len(s) == 12


def test_random_weighted():
    s = DistributedRandomSampler(5, rank=0, world_size=1, weights=[0, 0, 1, 1, 1], num_draws=10)
    assert list(s) == [3, 2, 2, 2, 4, 4, 3, 4, 3, 4]
    assert len(s) == 10


def test_random_weighted_default_draws():
    s = DistributedRandomSampler(5, rank=0, world_size=1, weights=[0, 0, 1, 1, 1])
    assert list(s) == [3, 2, 2, 2, 4]


def test_random_weighted_keep_last_round():
    got = shares(3, 2, weights=[1, 2, 3], num_draws=7, seed=42, ddp_drop_last_distributed_round=False)
    assert got == [[2, 2, 0, 2], [1, 2, 2]]


def test_random_weighted_dataset_smaller_than_world():
    assert shares(2, 4, weights=[1, 1], num_draws=8, seed=1) == [[1, 0], [1, 0], [0, 1], [1, 0]]


def test_random_embed_shuffle():
    src = embed_shuffle(DistributedRandomSampler(5, rank=0, world_size=1))
    assert [list(src) for _ in range(3)] == [[4, 2, 3, 0, 1], [3, 1, 2, 4, 0], [4, 0, 1, 3, 2]]


def test_random_pickles():
    s = DistributedRandomSampler(10, rank=1, world_size=3, seed=7, weights=[1.0] * 10)
    assert list(pickle.loads(pickle.dumps(s))) == list(s)


def test_random_is_sized_iterable():
    assert isinstance(DistributedRandomSampler(4, rank=0, world_size=1), SizedIterable)


# --- DistributedRandomSampler: validation -------------------------------------------------------------


@pytest.mark.parametrize(
    "n, kwargs, message",
    [
        (0, dict(rank=0, world_size=1), "The size of dataset must be larger than 0. Found: 0"),
        (5, dict(rank=0, world_size=0), "`world_size` must be greater than zero. Found: 0"),
        (5, dict(rank=1, world_size=1), "`rank` (1) must be within the range [0, 1)."),
        (5, dict(rank=-1, world_size=1), "`rank` (-1) must be within the range [0, 1)."),
        (5, dict(rank=0, world_size=1, num_draws=0), "`num_draws` must be greater than zero. Found: 0"),
        (
            3,
            dict(rank=0, world_size=4),
            "The number of draws must be greater than or equal to `world_size` when "
            "ddp_drop_last_distributed_round=True. Found: num_draws=3, world_size=4",
        ),
        (
            3,
            dict(rank=0, world_size=4, num_draws=2, weights=[1, 1, 1]),
            "The number of draws must be greater than or equal to `world_size` when "
            "ddp_drop_last_distributed_round=True. Found: num_draws=2, world_size=4",
        ),
        (
            3,
            dict(rank=0, world_size=1, num_draws=4),
            "`num_draws` cannot exceed the dataset size when sampling without replacement. "
            "Found: num_draws=4, dataset size=3",
        ),
        (
            3,
            dict(rank=0, world_size=1, weights=[1, 1]),
            "When provided, the number of elements in `weights` (2) must be same as the size of dataset (3)",
        ),
        (
            3,
            dict(rank=0, world_size=1, weights=[1, -1, 1]),
            "Failed to normalize the sample weight. Some elements are negative or not finite.",
        ),
        (
            3,
            dict(rank=0, world_size=1, weights=[1, float("nan"), 1]),
            "Failed to normalize the sample weight. Some elements are negative or not finite.",
        ),
        (3, dict(rank=0, world_size=1, weights=[0, 0, 0]), "The sum of `weights` must be positive and finite."),
        (2, dict(rank=0, world_size=1, weights=[1e308, 1e308]), "The sum of `weights` must be positive and finite."),
    ],
)
def test_random_validation(n, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        DistributedRandomSampler(n, **kwargs)


def test_random_signature():
    with pytest.raises(TypeError):
        DistributedRandomSampler(n=5, rank=0, world_size=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        DistributedRandomSampler(5, 0, 1)  # type: ignore[misc]


# --- DistributedDeterministicSampler ------------------------------------------------------------------


def test_deterministic_drop_last_round_warns():
    with pytest.warns(UserWarning) as record:
        got = [list(DistributedDeterministicSampler(11, rank=r, world_size=4)) for r in range(4)]
    assert got == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert str(record[0].message) == (
        "The size of dataset (11) is not divisible by the world size (4). Some samples are never visited."
    )
    assert record[0].filename == __file__


def test_deterministic_keep_last_round():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samplers = [
            DistributedDeterministicSampler(11, rank=r, world_size=4, ddp_drop_last_distributed_round=False)
            for r in range(4)
        ]
    assert [list(s) for s in samplers] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7]]
    assert [len(s) for s in samplers] == [3, 3, 3, 2]


def test_deterministic_divisible_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = DistributedDeterministicSampler(8, rank=3, world_size=4)
    assert list(s) == list(s) == [3, 7]
    assert len(s) == 2


@pytest.mark.parametrize(
    "n, kwargs, message",
    [
        (0, dict(rank=0, world_size=1), "The size of dataset must be larger than 0. Found: 0"),
        (
            3,
            dict(rank=0, world_size=4),
            "The size of dataset (3) must be larger than or equal to the world size (4) "
            "when ddp_drop_last_distributed_round=True",
        ),
        (3, dict(rank=3, world_size=3), "`rank` (3) must be within the range [0, 3)."),
        (3, dict(rank=0, world_size=-1), "`world_size` must be greater than zero. Found: -1"),
    ],
)
def test_deterministic_validation(n, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        DistributedDeterministicSampler(n, **kwargs)


def test_deterministic_fewer_items_than_ranks_kept():
    s = DistributedDeterministicSampler(3, rank=3, world_size=4, ddp_drop_last_distributed_round=False)
    assert len(s) == 0 and list(s) == []
