"""spdl_rs.source.utils: MergeIterator, embed_shuffle, repeat_source, and the source protocols.

The expected values were produced by running the same calls with SPDL 0.8.0's ``spdl.source.utils``;
they are hard-coded so that the suite runs without SPDL installed.
"""

import itertools
import pickle
import random
from collections import Counter

import pytest

from spdl_rs.source import IterableWithShuffle, SizedIterable, SizedIterableWithShuffle
from spdl_rs.source.utils import MergeIterator, embed_shuffle, repeat_source

UNEVEN = [[0, 1, 2], [10, 11], [20, 21, 22]]
THREE = [list(range(0, 5)), list(range(100, 110)), list(range(200, 203))]
WEIGHT_ERROR = "Weights must be finite and non-negative; NaN, infinity, and negative values are not supported."


class Shufflable:
    """A sized source with ``shuffle`` that records the seeds it was given."""

    def __init__(self, n):
        self.items = list(range(n))
        self.seeds = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)

    def shuffle(self, seed):
        self.seeds.append(seed)
        random.Random(seed).shuffle(self.items)


class UnsizedShufflable:
    def __iter__(self):
        return iter([1, 2])

    def shuffle(self, seed):
        pass


# ---------------------------------------------------------------------------------------------------
# MergeIterator: round robin
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stop_after, expected",
    [
        (0, [0, 10, 20, 1, 11, 21, 2, 22]),  # until every source is exhausted
        (-1, [0, 10, 20, 1, 11, 21, 2]),  # until the first exhaustion
        (5, [0, 10, 20, 1, 11]),  # n items
        (9, [0, 10, 20, 1, 11, 21, 2, 22]),  # n larger than the total: every item
        (1, [0]),
    ],
)
def test_round_robin_stop_after(stop_after, expected):
    merged = MergeIterator(UNEVEN, stop_after=stop_after)
    assert list(merged) == expected
    assert list(merged) == expected  # each iter() starts over


def test_round_robin_default_and_empty_sources():
    assert list(MergeIterator([[0, 1, 2], [10, 11, 12], [20, 21, 22]])) == [0, 10, 20, 1, 11, 21, 2, 12, 22]
    assert list(MergeIterator([[0, 1], [], [20, 21, 22]])) == [0, 20, 1, 21, 22]
    assert list(MergeIterator([[0, 1], [], [20]], stop_after=-1)) == [0]


def test_plain_iterables_and_iterators_are_accepted():
    assert list(MergeIterator((iter("ab"), (c for c in "xyz")))) == ["a", "x", "b", "y", "z"]
    assert list(MergeIterator([range(2), "xyz"], weights=[0, 1])) == ["x", "y", "z"]
    it = repeat_source(range(3))
    assert [next(it) for _ in range(8)] == [0, 1, 2, 0, 1, 2, 0, 1]


# ---------------------------------------------------------------------------------------------------
# MergeIterator: weights
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stop_after, expected",
    [
        (0, [200, 201, 0, 100, 202, 101, 102, 103, 104, 105, 1, 106, 2, 107, 3, 4, 108, 109]),
        (-1, [200, 201, 0, 100, 202]),
        (7, [200, 201, 0, 100, 202, 101, 102]),
    ],
)
def test_weighted_order_matches_spdl(stop_after, expected):
    merged = MergeIterator(THREE, weights=[1, 2, 3], stop_after=stop_after, seed=0)
    assert list(merged) == expected
    assert list(merged) == expected  # the generator is re-seeded on each iter()


def test_weighted_seed_and_float_weights():
    assert list(MergeIterator(THREE, weights=[1, 2, 3], seed=42)) == [
        200, 0, 1, 201, 100, 101, 102, 103, 202, 2, 104, 105, 3, 106, 107, 4, 108, 109,
    ]  # fmt: skip
    assert list(MergeIterator(THREE, weights=[0.1, 0.2, 0.7], seed=3)) == [
        200, 100, 201, 202, 101, 102, 0, 103, 104, 105, 106, 1, 107, 2, 3, 4, 108, 109,
    ]  # fmt: skip


def test_weights_are_exact_ratios():
    # Same ratios, same draws.
    ref = list(MergeIterator(THREE, weights=[1, 2, 3], seed=0))
    assert list(MergeIterator(THREE, weights=[0.5, 1.0, 1.5], seed=0)) == ref
    assert list(MergeIterator(THREE, weights=[4, 8, 12], seed=0)) == ref
    # Weights whose exact integer total exceeds 256 bits take the bit-by-bit path.
    assert list(MergeIterator(THREE, weights=[1e-300, 1.0, 1e300], seed=3)) == [
        200, 201, 202, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 0, 1, 2, 3, 4,
    ]  # fmt: skip
    assert list(MergeIterator(THREE, weights=[5e-324, 1, 1], seed=3)) == [
        200, 100, 201, 202, 101, 102, 103, 104, 105, 106, 107, 108, 109, 0, 1, 2, 3, 4,
    ]  # fmt: skip


def test_zero_weights_are_skipped():
    merged = MergeIterator(THREE, weights=[0, 1, 1], seed=0)
    assert merged.weights == [1.0, 1.0] and merged.iterables == THREE[1:]
    assert list(merged) == [200, 201, 100, 202, 101, 102, 103, 104, 105, 106, 107, 108, 109]
    # A single non-zero weight: that source alone, in order.
    assert list(MergeIterator(THREE, weights=[0, 2.5, 0])) == list(range(100, 110))
    assert list(MergeIterator(THREE, weights=[0, 2.5, 0], stop_after=4)) == [100, 101, 102, 103]


def test_exhausted_weighted_source_is_removed():
    sources = [[0, 1, 2], list(range(100, 120))]
    # The heavy source runs out after 3 items; the rest come from the light one, without re-drawing it.
    assert list(MergeIterator(sources, weights=[100, 1], seed=1)) == [0, 1, 2, *range(100, 120)]
    assert list(MergeIterator(sources, weights=[100, 1], seed=1, stop_after=-1)) == [0, 1, 2]


def test_weighted_proportions():
    weights = [0.5, 0.3, 0.2]
    n = 100_000
    merged = MergeIterator([itertools.repeat(i) for i in range(3)], weights=weights, stop_after=n, seed=0)
    items = list(merged)
    assert items[:30] == [
        1, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 2, 0, 0, 1, 0, 0, 0, 0, 2, 1, 1, 0, 1, 0, 1,
    ]  # fmt: skip
    counts = Counter(items)
    assert len(items) == n
    assert sorted(counts.items()) == [(0, 49973), (1, 30057), (2, 19970)]
    for i, w in enumerate(weights):
        assert abs(counts[i] / n - w) <= 0.02 * w

    merged = MergeIterator([itertools.repeat(i) for i in range(3)], weights=[1, 1, 2], stop_after=n, seed=123)
    assert sorted(Counter(merged).items()) == [(0, 25039), (1, 24857), (2, 50104)]


# ---------------------------------------------------------------------------------------------------
# MergeIterator: validation
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "iterables, kwargs, message",
    [
        ([], {}, "iterables cannot be empty."),
        ((), {"weights": [1]}, "iterables cannot be empty."),
        ([[1]], {"stop_after": -2}, "`stop_after` must be greater than or equal to -1. Found: -2"),
        ([[1]], {"stop_after": float("nan")}, "`stop_after` must be greater than or equal to -1. Found: nan"),
        ([[1], [2]], {"weights": [1]}, "The number of probabilities (1) and iterables (2) must match."),
        ([[1]], {"weights": [float("nan")]}, WEIGHT_ERROR),
        ([[1]], {"weights": [float("inf")]}, WEIGHT_ERROR),
        ([[1]], {"weights": [-1]}, WEIGHT_ERROR),
        ([[1]], {"weights": ["x"]}, WEIGHT_ERROR),
        ([[1]], {"weights": [None]}, WEIGHT_ERROR),
        ([[1]], {"weights": [10**400]}, WEIGHT_ERROR),
        ([[1], [2]], {"weights": [1e308, 1e308]}, "The sum of weights must be positive and finite."),
        ([[1], [2]], {"weights": [0, 0.0]}, "The sum of weights must be positive and finite."),
    ],
)
def test_merge_iterator_value_errors(iterables, kwargs, message):
    with pytest.raises(ValueError) as info:
        MergeIterator(iterables, **kwargs)
    assert str(info.value) == message


def test_merge_iterator_keyword_only():
    with pytest.raises(TypeError):
        MergeIterator(UNEVEN, [1, 1, 1])  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------
# embed_shuffle
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shuffle_last, epoch, passes, first_of_abandoned, seeds",
    [
        (False, 0, [[4, 2, 1, 0, 5, 3], [1, 0, 3, 4, 5, 2], [3, 4, 0, 5, 2, 1]], 3, [0, 1, 2, 3]),
        (False, 5, [[1, 0, 3, 5, 2, 4], [3, 4, 0, 5, 1, 2], [1, 3, 2, 5, 4, 0]], 0, [5, 6, 7, 8]),
        (True, 0, [[0, 1, 2, 3, 4, 5], [4, 2, 1, 0, 5, 3], [1, 0, 3, 4, 5, 2]], 3, [0, 1, 2, 3]),
        (True, 5, [[0, 1, 2, 3, 4, 5], [1, 0, 3, 5, 2, 4], [3, 4, 0, 5, 1, 2]], 1, [5, 6, 7, 8]),
    ],
)
def test_embed_shuffle_epochs(shuffle_last, epoch, passes, first_of_abandoned, seeds):
    src = Shufflable(6)
    wrapped = embed_shuffle(src, shuffle_last=shuffle_last, epoch=epoch)
    assert [list(wrapped) for _ in range(3)] == passes
    it = iter(wrapped)
    assert next(it) == first_of_abandoned
    it.close()  # an abandoned pass still shuffles when shuffle_last=True
    assert src.seeds == seeds
    assert len(wrapped) == 6
    assert isinstance(wrapped, SizedIterable)


def test_embed_shuffle_shuffles_lazily_and_len_needs_a_sized_source():
    src = Shufflable(3)
    it = iter(embed_shuffle(src))
    assert src.seeds == []  # nothing happens until the first item is requested
    next(it)
    assert src.seeds == [0]
    with pytest.raises(TypeError, match="does not support length") as info:
        len(embed_shuffle(UnsizedShufflable()))
    assert str(info.value) == f"Source iterator of type {UnsizedShufflable!r} does not support length"


def test_embed_shuffle_is_positional_and_keyword_only():
    with pytest.raises(TypeError):
        embed_shuffle(src=Shufflable(2))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        embed_shuffle(Shufflable(2), True)  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------
# repeat_source
# ---------------------------------------------------------------------------------------------------


def test_repeat_source_shuffles_every_epoch():
    src = Shufflable(4)
    it = repeat_source(src)
    assert [next(it) for _ in range(14)] == [2, 0, 1, 3, 3, 2, 1, 0, 2, 1, 0, 3, 3, 2]
    assert src.seeds == [0, 1, 2, 3]
    assert iter(it) is it

    src = Shufflable(4)
    it = repeat_source(src, epoch=3)
    assert [next(it) for _ in range(9)] == [3, 0, 2, 1, 2, 3, 1, 0, 2]
    assert src.seeds == [3, 4, 5]


def test_repeat_source_pickles_until_started():
    it = repeat_source([1, 2, 3], 2)
    clone = pickle.loads(pickle.dumps(it))
    assert [next(clone) for _ in range(4)] == [1, 2, 3, 1]
    assert next(it) == 1
    with pytest.raises(ValueError, match=r"^Cannot pickle after iteration is started\.$"):
        pickle.dumps(it)


def test_repeat_source_plain_iterable_is_not_shuffled():
    it = repeat_source([5, 6], epoch=10)
    assert [next(it) for _ in range(5)] == [5, 6, 5, 6, 5]


# ---------------------------------------------------------------------------------------------------
# Protocols
# ---------------------------------------------------------------------------------------------------


def test_protocols_are_runtime_checkable():
    assert isinstance(Shufflable(1), IterableWithShuffle)
    assert isinstance(Shufflable(1), SizedIterableWithShuffle)
    assert isinstance(UnsizedShufflable(), IterableWithShuffle)
    assert not isinstance(UnsizedShufflable(), SizedIterableWithShuffle)
    assert isinstance([1], SizedIterable) and not isinstance([1], IterableWithShuffle)
    assert not isinstance(iter([1]), SizedIterable)
    assert issubclass(SizedIterableWithShuffle, SizedIterable)


def test_exports():
    import spdl_rs.source
    import spdl_rs.source.utils

    assert spdl_rs.source.utils.__all__ == ["MergeIterator", "repeat_source", "embed_shuffle"]
    for name in ("IterableWithShuffle", "SizedIterable", "SizedIterableWithShuffle", "Sampler", "Store", "list_dataset"):
        assert name in spdl_rs.source.__all__ and hasattr(spdl_rs.source, name)


def test_local_directory_lists_sorted_matches_and_shuffles_as_spdl(tmp_path):
    import random

    from spdl_rs.source.local_directory import LocalDirectory

    for rel in ["b/2.mp4", "a/1.mp4", "a/skip.txt", "c/d/3.mp4", "0.mp4"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    src = LocalDirectory(tmp_path, "*/*.mp4")
    want = [tmp_path / "a/1.mp4", tmp_path / "b/2.mp4"]
    assert list(src) == want and len(src) == 2
    deep = LocalDirectory(str(tmp_path), "**/*.mp4")
    assert list(deep) == sorted(tmp_path.glob("**/*.mp4")) and len(deep) == 4
    # SPDL's shuffle: random.Random(seed).shuffle of the sorted list, in place.
    expected = sorted(tmp_path.glob("**/*.mp4"))
    random.Random(7).shuffle(expected)
    deep.shuffle(7)
    assert list(deep) == expected
    assert list(LocalDirectory(tmp_path / "missing", "*")) == []
