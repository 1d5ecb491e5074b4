"""Index samplers for distributed training, with the behaviour of SPDL 0.8.0's ``spdl.source`` samplers.

For the same arguments (and seed), each rank gets exactly the indices SPDL's sampler gives it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import _native

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DistributedDeterministicSampler", "DistributedRandomSampler"]


def _check_rank(n: int, rank: int, world_size: int) -> None:
    if n <= 0:
        raise ValueError(f"The size of dataset must be larger than 0. Found: {n}")
    if world_size <= 0:
        raise ValueError(f"`world_size` must be greater than zero. Found: {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"`rank` ({rank}) must be within the range [0, {world_size}).")
    # Beyond SPDL's checks: the module's caps, with its one message.
    _native._check_count("world_size", world_size, 1, _native.ARG_LIMITS["world_size"])


def _share(total: int, rank: int, world_size: int, drop_last_round: bool) -> tuple[int, int]:
    """(this rank's count, the positions handed out over all ranks) for ``total`` positions dealt round-robin."""
    if drop_last_round:
        per_rank = total // world_size
        return per_rank, per_rank * world_size
    return total // world_size + int(rank < total % world_size), total


class DistributedDeterministicSampler:
    """Deals the indices ``0 .. n-1`` out to the ranks round-robin, in the same order at every iteration.

    Rank ``r`` of ``world_size`` gets ``r, r + world_size, r + 2 * world_size, ...``: the ranks' shares are
    disjoint. For a new order at each epoch use :py:class:`DistributedRandomSampler`.

    When ``n`` is not a multiple of ``world_size``, the last round is short. By default it is left out, so
    that every rank gets ``n // world_size`` indices (a warning says that some are never visited); with
    ``ddp_drop_last_distributed_round=False`` every index is handed out and the first ``n % world_size``
    ranks get one more.

    .. code-block:: python

        list(DistributedDeterministicSampler(10, rank=1, world_size=4))  # [1, 5]
        list(DistributedDeterministicSampler(10, rank=1, world_size=4,
                                             ddp_drop_last_distributed_round=False))  # [1, 5, 9]

    Args:
        n: The size of the dataset (positive).
        rank: This process's rank, in ``[0, world_size)`` (e.g. ``torch.distributed.get_rank()``).
        world_size: The number of ranks (e.g. ``torch.distributed.get_world_size()``).
        ddp_drop_last_distributed_round: Leave out the short last round (the default), or hand it out.

    Raises:
        ValueError: ``n`` or ``world_size`` is not positive, ``rank`` is out of range, or the last round is
            dropped while ``n < world_size``.
    """

    def __init__(
        self,
        n: int,
        /,
        *,
        rank: int,
        world_size: int,
        ddp_drop_last_distributed_round: bool = True,
    ) -> None:
        _check_rank(n, rank, world_size)
        if ddp_drop_last_distributed_round:
            if n < world_size:
                raise ValueError(
                    f"The size of dataset ({n}) must be larger than or equal to "
                    f"the world size ({world_size}) when ddp_drop_last_distributed_round=True"
                )
            if n % world_size:
                warnings.warn(
                    f"The size of dataset ({n}) is not divisible by "
                    f"the world size ({world_size}). Some samples are never visited.",
                    stacklevel=2,
                )
        self._rank = rank
        self._world_size = world_size
        self._len, self._total = _share(n, rank, world_size, ddp_drop_last_distributed_round)

    def __len__(self) -> int:
        """The number of indices one iteration yields."""
        return self._len

    def __iter__(self) -> Iterator[int]:
        """Yields this rank's indices."""
        yield from range(self._rank, self._total, self._world_size)


def _normalized_weights(weights: Sequence[float], n: int) -> npt.NDArray[np.float64]:
    import numpy as np

    if (size := len(weights)) != n:
        raise ValueError(
            f"When provided, the number of elements in `weights` ({size}) must be same as the size of dataset ({n})"
        )
    w = np.array(weights, dtype=np.float64)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("Failed to normalize the sample weight. Some elements are negative or not finite.")
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(w)
    if not np.isfinite(total) or total <= 0:
        raise ValueError("The sum of `weights` must be positive and finite.")
    normalized: npt.NDArray[np.float64] = w / total
    return normalized


class DistributedRandomSampler:
    """Draws a random order of dataset indices and deals it out to the ranks round-robin.

    One iteration draws ``num_draws`` indices (default: ``n``) from NumPy's ``default_rng(seed)``; rank ``r``
    gets draws ``r, r + world_size, ...``. Without ``weights`` the draw is a permutation (no index twice, the
    ranks' shares are disjoint); with ``weights`` indices are drawn with replacement, with probability
    proportional to their weight, and ``num_draws`` may exceed ``n``.

    Every iteration yields the same sequence until :py:meth:`shuffle` sets another seed; the sequence depends
    only on the current seed. Call ``sampler.shuffle(seed=epoch)`` before each epoch, or wrap the sampler
    with :py:func:`spdl_rs.source.utils.embed_shuffle` (which also works when the sampler is iterated in a
    subprocess).

    When the number of draws is not a multiple of ``world_size``, the short last round is not drawn by default
    (every rank gets ``num_draws // world_size``); with ``ddp_drop_last_distributed_round=False`` all draws
    are made and the first ``num_draws % world_size`` ranks get one more.

    .. code-block:: python

        list(DistributedRandomSampler(9, rank=0, world_size=3))  # [0, 7, 4]
        list(DistributedRandomSampler(9, rank=1, world_size=3))  # [8, 2, 6]
        sampler = DistributedRandomSampler(5, rank=0, world_size=1, weights=[0, 0, 1, 1, 1], num_draws=10)
        list(sampler)  # [3, 2, 2, 2, 4, 4, 3, 4, 3, 4]

    Indices are yielded as Python ``int`` values (SPDL yields NumPy integers of the same values).

    Args:
        n: The size of the dataset (positive).
        rank: This process's rank, in ``[0, world_size)``.
        world_size: The number of ranks.
        num_draws: Indices drawn per iteration over all ranks (default ``n``); at most ``n`` without
            ``weights``.
        weights: One non-negative, finite weight per index (at least one positive); enables drawing with
            replacement.
        seed: The seed of the first iterations.
        ddp_drop_last_distributed_round: Leave out the short last round (the default), or draw it.

    Raises:
        ValueError: For a non-positive ``n``, ``world_size`` or ``num_draws``, an out-of-range ``rank``, fewer
            draws than ranks while dropping the last round, more draws than ``n`` without weights, or weights
            of the wrong length, negative, not finite, or summing to zero.
    """

    def __init__(
        self,
        n: int,
        /,
        *,
        rank: int,
        world_size: int,
        num_draws: int | None = None,
        weights: Sequence[float] | None = None,
        seed: int = 0,
        ddp_drop_last_distributed_round: bool = True,
    ) -> None:
        _check_rank(n, rank, world_size)
        if num_draws is not None and num_draws <= 0:
            raise ValueError(f"`num_draws` must be greater than zero. Found: {num_draws}")
        # Each iteration draws (and, without replacement, permutes) in memory: sizes within the order cap.
        _native._check_count("n", n, 1, _native.ARG_LIMITS["items"])
        if num_draws is not None:
            _native._check_count("num_draws", num_draws, 1, _native.ARG_LIMITS["items"])
        total = n if num_draws is None else num_draws
        if ddp_drop_last_distributed_round and total < world_size:
            raise ValueError(
                "The number of draws must be greater than or equal to `world_size` "
                "when ddp_drop_last_distributed_round=True. "
                f"Found: num_draws={total}, world_size={world_size}"
            )
        self._weights: Any = None
        if weights is None:
            if total > n:
                raise ValueError(
                    "`num_draws` cannot exceed the dataset size when sampling without replacement. "
                    f"Found: num_draws={total}, dataset size={n}"
                )
        else:
            self._weights = _normalized_weights(weights, n)
        self._n = n
        self._rank = rank
        self._world_size = world_size
        self._seed = seed
        self._len, self._num_draws = _share(total, rank, world_size, ddp_drop_last_distributed_round)

    def __len__(self) -> int:
        """The number of indices one iteration yields."""
        return self._len

    def __iter__(self) -> Iterator[int]:
        """Yields this rank's share of the draws made with the current seed."""
        import numpy as np

        rng = np.random.default_rng(self._seed)
        drawn = rng.choice(self._n, size=self._num_draws, replace=self._weights is not None, p=self._weights)
        mine: list[int] = drawn[self._rank :: self._world_size].tolist()
        yield from mine

    def shuffle(self, seed: int) -> None:
        """Sets the seed of the following iterations (the order depends on this seed alone, not on history)."""
        self._seed = seed
