"""``CacheDataLoader``: replay the first outputs of a data loader, to measure a training loop without it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from ..pipeline._cache_iterator import cache_iterator

__all__ = ["CacheDataLoader"]

T = TypeVar("T")


class CacheDataLoader(Generic[T]):
    """Yields a data loader's first outputs, then replays a cache of them, to show how fast the training loop
    would run if data loading cost nothing.

    Each iteration runs ``dl`` for ``return_caches_after`` outputs, keeping the first ``num_caches``, then
    stops ``dl`` and yields the kept outputs over and over: ``stop_after`` outputs in all, or without end when
    ``stop_after`` is ``None``. If the loop gets faster with the cache, data loading is its bottleneck.

    .. code-block:: python

        loader = CacheDataLoader(DataLoader(...), num_caches=10, return_caches_after=100, stop_after=1000)

    Attributes other than the cache's are looked up on ``dl``.

    Args:
        dl: The data loader (any iterable).
        num_caches: Outputs kept for replay (positive).
        return_caches_after: Outputs taken from ``dl`` before replaying (at least ``num_caches``).
        stop_after: Outputs per iteration in all (at least ``num_caches`` and ``return_caches_after``), or
            ``None``.

    Raises:
        ValueError: (when the first output is asked for) the counts are out of range as above.
    """

    def __init__(
        self,
        dl: Iterable[T],
        num_caches: int,
        return_caches_after: int,
        stop_after: int | None = None,
    ) -> None:
        self.dl = dl
        self.num_caches = num_caches
        self.return_caches_after = return_caches_after
        self.stop_after = stop_after

    def __iter__(self) -> Iterator[T]:
        """The outputs of ``dl``, then the cached ones (see the class)."""
        return cache_iterator(
            self.dl,
            num_caches=self.num_caches,
            return_caches_after=self.return_caches_after,
            stop_after=self.stop_after,
        )

    def __len__(self) -> int:
        """``len(dl)`` (``TypeError`` if it has none)."""
        return len(self.dl)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (e.g. while unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.dl, name)
