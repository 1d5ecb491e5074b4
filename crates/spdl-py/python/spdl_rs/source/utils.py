"""Helpers that combine or repeat data sources, with the behaviour of ``spdl.source.utils`` (SPDL 0.8.0).

For the same arguments and seed, each yields the same items in the same order as SPDL's, and
``shuffle`` is called with the same seeds at the same moments.

.. code-block:: python

    from spdl_rs.source.utils import MergeIterator, embed_shuffle, repeat_source

    print(list(MergeIterator([[0, 1], [10, 11, 12]])))  # [0, 10, 1, 11, 12]
"""

import logging
import math
import random
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence, Sized
from fractions import Fraction
from itertools import accumulate
from typing import TypeVar, overload

from ._types import IterableWithShuffle, SizedIterable, SizedIterableWithShuffle

__all__ = ["MergeIterator", "repeat_source", "embed_shuffle"]

T = TypeVar("T")

_LG: logging.Logger = logging.getLogger(__name__)

# `stop_after` value that ends the merge as soon as any source runs out.
_STOP_ON_FIRST_EXHAUSTION = -1
# Totals up to this many bits are drawn with one `randrange`; larger ones bit by bit.
_RANDRANGE_LIMIT_BITS = 256

_WEIGHT_ERROR = (
    "Weights must be finite and non-negative; NaN, infinity, and negative values are not supported."
)


def _limit_reached(count: int, stop_after: float) -> bool:
    return stop_after > 0 and count >= stop_after


def _round_robin(iterators: list[Iterator[T]], stop_after: float) -> Iterator[T]:
    """One item from each live iterator in turn; exhausted ones leave after the round."""
    count = 0
    while iterators:
        survivors = []
        for it in iterators:
            try:
                item = next(it)
            except StopIteration:
                if stop_after == _STOP_ON_FIRST_EXHAUSTION:
                    return
                continue
            yield item
            survivors.append(it)
            count += 1
            if _limit_reached(count, stop_after):
                return
        iterators = survivors


def _proportional_integers(weights: Sequence[float]) -> list[int]:
    """The smallest integers whose ratios equal those of the (binary float) ``weights``, exactly."""
    fractions = [Fraction(w) for w in weights]
    scale = math.lcm(*(f.denominator for f in fractions))
    scaled = [f.numerator * (scale // f.denominator) for f in fractions]
    divisor = math.gcd(*scaled)
    return [s // divisor for s in scaled]


def _below_ratio(rng: random.Random, num: int, den: int) -> bool:
    """True with probability ``num / den`` (``0 <= num <= den``), one random bit at a time.

    Compares a uniform binary fraction, drawn lazily, against the binary expansion of ``num / den``.
    """
    rem = num
    while True:
        rem <<= 1
        ratio_bit = 1 if rem >= den else 0
        rem -= den * ratio_bit
        coin = rng.getrandbits(1)
        if coin != ratio_bit:
            return coin < ratio_bit


def _pick(rng: random.Random, weights: list[int], bounds: list[int]) -> int:
    """Index ``i`` with probability ``weights[i] / sum(weights)``; ``bounds`` are the running sums."""
    total = bounds[-1]
    if total.bit_length() <= _RANDRANGE_LIMIT_BITS:
        return bisect_right(bounds, rng.randrange(total))
    left = total
    last = len(weights) - 1
    for i in range(last):
        if _below_ratio(rng, weights[i], left):
            return i
        left -= weights[i]
    return last


def _weighted(
    iterators: list[Iterator[T]], weights: Sequence[float], stop_after: float, seed: int
) -> Iterator[T]:
    """Items from randomly chosen iterators; an exhausted one is dropped, the others keep their ratios."""
    ints = _proportional_integers(weights)
    rng = random.Random(seed)
    count = 0
    while len(iterators) > 1:
        bounds = list(accumulate(ints))
        while True:
            i = _pick(rng, ints, bounds)
            try:
                item = next(iterators[i])
            except StopIteration:
                if stop_after == _STOP_ON_FIRST_EXHAUSTION:
                    return
                del iterators[i]
                del ints[i]
                break
            yield item
            count += 1
            if _limit_reached(count, stop_after):
                return
    # One source left: no choice to make, so no random draws.
    for it in iterators:
        for item in it:
            yield item
            count += 1
            if _limit_reached(count, stop_after):
                return


class MergeIterator(Iterable[T]):
    """Interleave several iterables, in turn or at random by weight.

    Args:
        iterables: The sources to merge (a non-empty sequence).
        weights: One sampling weight per source (finite, non-negative, with a positive finite sum;
            converted with ``float``). The next source is drawn at random in exact proportion to
            these binary-float values; zero-weight sources are never visited, and an exhausted
            source is dropped from later draws. Without weights, the sources are visited in the
            given order, round after round.
        stop_after: When to stop:

            - ``0`` (default): once every source is exhausted.
            - ``n > 0``: after ``n`` items, or earlier if every source is exhausted first.
            - ``-1``: as soon as any source is exhausted.
        seed: Seed of the ``random.Random`` that draws sources when ``weights`` is given.

    Raises:
        ValueError: ``iterables`` is empty, ``stop_after < -1``, or ``weights`` has the wrong
            length, an invalid value, or a sum that is not positive and finite.

    Example:

        >>> list(MergeIterator([[0, 1, 2], [10, 11], [20, 21, 22]]))
        [0, 10, 20, 1, 11, 21, 2, 22]
        >>> list(MergeIterator([[0, 1, 2], [10, 11], [20, 21, 22]], stop_after=-1))
        [0, 10, 20, 1, 11, 21, 2]
        >>> list(MergeIterator([[0, 1, 2], [10, 11], [20, 21, 22]], stop_after=4))
        [0, 10, 20, 1]
        >>> sorted(MergeIterator([[0, 1], [10, 11], [20]], weights=[1, 0, 2]))
        [0, 1, 20]
    """

    def __init__(
        self,
        iterables: Sequence[Iterable[T]],
        *,
        weights: Sequence[float] | None = None,
        stop_after: int = 0,
        seed: int = 0,
    ) -> None:
        if not iterables:
            raise ValueError("iterables cannot be empty.")
        if not stop_after >= -1:
            raise ValueError(
                f"`stop_after` must be greater than or equal to -1. Found: {stop_after}"
            )

        self.iterables = iterables
        self.weights = weights
        if weights is not None:
            if len(weights) != len(iterables):
                raise ValueError(
                    f"The number of probabilities ({len(weights)}) and "
                    f"iterables ({len(iterables)}) must match."
                )
            try:
                values = [float(w) for w in weights]
            except (OverflowError, TypeError, ValueError) as exc:
                raise ValueError(_WEIGHT_ERROR) from exc
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(_WEIGHT_ERROR)
            total = sum(values)
            if not (math.isfinite(total) and total > 0):
                raise ValueError("The sum of weights must be positive and finite.")
            kept = [i for i, v in enumerate(values) if v != 0]
            self.iterables = [iterables[i] for i in kept]
            self.weights = [values[i] for i in kept]

        self.stop_after = stop_after
        self.seed = seed

    def __iter__(self) -> Iterator[T]:
        iterators = [iter(src) for src in self.iterables]
        if self.weights is None:
            yield from _round_robin(iterators, self.stop_after)
        else:
            yield from _weighted(iterators, self.weights, self.stop_after, self.seed)


class _ShuffledEachPass(Iterable[T]):
    """Calls ``src.shuffle(seed=epoch)`` once per pass (before or after it), then ``epoch += 1``."""

    def __init__(
        self,
        src: IterableWithShuffle[T] | SizedIterableWithShuffle[T],
        *,
        epoch: int,
        shuffle_last: bool,
    ) -> None:
        self.src = src
        self._epoch = epoch
        self._shuffle_first: bool = not shuffle_last

    def _shuffle(self) -> None:
        started = time.monotonic()
        self.src.shuffle(seed=self._epoch)
        elapsed = time.monotonic() - started
        if elapsed > 3:
            _LG.warning("Shuffling took %.2f sec.", elapsed)
        self._epoch += 1

    def __iter__(self) -> Iterator[T]:
        if self._shuffle_first:
            self._shuffle()
            yield from self.src
            return
        try:
            yield from self.src
        finally:
            # Also when the pass is abandoned part-way (the generator is closed or collected).
            self._shuffle()

    def __len__(self) -> int:
        if not isinstance(self.src, Sized):
            raise TypeError(
                f"Source iterator of type {type(self.src)} does not support length"
            )
        return len(self.src)


@overload
def embed_shuffle(
    src: SizedIterableWithShuffle[T], /, *, shuffle_last: bool = False, epoch: int = 0
) -> SizedIterable[T]: ...


@overload
def embed_shuffle(
    src: IterableWithShuffle[T], /, *, shuffle_last: bool = False, epoch: int = 0
) -> Iterable[T]: ...


def embed_shuffle(
    src: IterableWithShuffle[T] | SizedIterableWithShuffle[T],
    /,
    *,
    shuffle_last: bool = False,
    epoch: int = 0,
) -> Iterable[T] | SizedIterable[T]:
    """**[Experimental]** Wrap a source with ``shuffle`` so that every ``iter()`` pass shuffles it.

    Each pass calls ``src.shuffle(seed=epoch)`` and then increments ``epoch``: at the start of the
    pass by default, or at its end (also when the pass is stopped early) with ``shuffle_last=True``.
    ``len()`` of the result is ``len(src)``, or ``TypeError`` when ``src`` has no length.

    Args:
        src: A source with a ``shuffle(seed=...)`` method.
        shuffle_last: Shuffle after each pass instead of before it.
        epoch: The seed of the first shuffle.

    Example:

        >>> class Items(list):
        ...     def shuffle(self, seed):
        ...         random.Random(seed).shuffle(self)
        >>> src = embed_shuffle(Items(range(5)), epoch=10)
        >>> first, second = list(src), list(src)  # shuffled with seed 10, then 11
        >>> sorted(first) == sorted(second) == [0, 1, 2, 3, 4]
        True
    """
    return _ShuffledEachPass(src, epoch=epoch, shuffle_last=shuffle_last)


def _epochs(src: Iterable[T] | IterableWithShuffle[T], epoch: int) -> Iterator[T]:
    while True:
        _LG.info("Starting source epoch %d.", epoch)
        started = time.monotonic()
        if isinstance(src, IterableWithShuffle):
            src.shuffle(seed=epoch)
        rows = 0
        for item in src:
            rows += 1
            yield item
        elapsed = time.monotonic() - started
        _LG.info(
            "Finished source epoch %d. (Yielded %d rows in %.2f sec. QPS: %.2f)",
            epoch,
            rows,
            elapsed,
            rows / elapsed if elapsed > 0 else float("nan"),
        )
        epoch += 1


class _Repeater(Iterator[T]):
    """Picklable until the first ``next()``, so it can be handed to a subprocess."""

    def __init__(self, src: Iterable[T], epoch: int) -> None:
        self.src = src
        self.epoch = epoch
        self._iter: Iterator[T] | None = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __getstate__(self) -> dict[str, object]:
        if self._iter is not None:
            raise ValueError("Cannot pickle after iteration is started.")
        return self.__dict__

    def __next__(self) -> T:
        if self._iter is None:
            self._iter = _epochs(self.src, self.epoch)
        return next(self._iter)


def repeat_source(
    src: Iterable[T] | IterableWithShuffle[T],
    /,
    epoch: int = 0,
) -> Iterator[T]:
    """Iterate over ``src`` forever, one full pass per epoch.

    When ``src`` has a ``shuffle`` method (:py:class:`~spdl_rs.source.IterableWithShuffle`),
    ``src.shuffle(seed=epoch)`` is called before each pass, starting with ``epoch`` and counting up.
    The returned iterator can be pickled (e.g. sent to a subprocess) until its first ``next()``.

    Args:
        src: The source to repeat.
        epoch: The first epoch number (the seed of the first shuffle).

    Example:

        >>> it = repeat_source([1, 2, 3])
        >>> [next(it) for _ in range(7)]
        [1, 2, 3, 1, 2, 3, 1]
    """
    return _Repeater(src, epoch)
