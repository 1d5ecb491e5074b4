"""``CacheDataLoader``: replay the first outputs of a data loader, to measure a training loop without it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["CacheDataLoader"]

T = TypeVar("T")


def _check_cache_args(num_caches: int, return_caches_after: int | None, stop_after: int | None) -> None:
    if num_caches <= 0:
        raise ValueError(f"`num_caches` must be greater than zero. Found: {num_caches}")
    if return_caches_after is not None and return_caches_after < num_caches:
        raise ValueError(
            "When provided, `return_caches_after` must be greater than or equal to `num_caches`. "
            f"num_caches={num_caches}, return_caches_after={return_caches_after}"
        )
    if stop_after is not None:
        if stop_after < num_caches:
            raise ValueError(
                "When provided, `stop_after` must be greater than or equal to `num_caches`. "
                f"num_caches={num_caches}, stop_after={stop_after}"
            )
        if return_caches_after is not None and stop_after < return_caches_after:
            raise ValueError(
                "When provided, `stop_after` must be greater than or equal to `return_caches_after`. "
                f"return_caches_after={return_caches_after}, stop_after={stop_after}"
            )


def _cache_iterator(
    src: Iterable[T], num_caches: int, return_caches_after: int | None, stop_after: int | None
) -> Iterator[T]:
    """Yields ``src``'s first ``return_caches_after`` items (keeping the first ``num_caches``), then the kept
    items over and over; ``stop_after`` items in all, or without end when ``None``. Arguments are checked
    when the first item is asked for."""
    _check_cache_args(num_caches, return_caches_after, stop_after)
    run_for = num_caches if return_caches_after is None else return_caches_after
    limit = float("inf") if stop_after is None else stop_after
    cache: list[T] = []
    count = 0
    it = iter(src)
    try:
        for item in it:
            yield item
            count += 1
            if len(cache) < num_caches:
                cache.append(item)
            if count >= limit:
                return
            if count >= run_for:
                break
    finally:
        # Stop the source now (e.g. a DataLoader's background pipeline) rather than when it is collected;
        # an iterator the caller passed in is theirs to close.
        if it is not src:
            close = getattr(it, "close", None)
            if callable(close):
                close()
    del it
    if not cache:
        return
    while True:
        for item in cache:
            yield item
            count += 1
            if count >= limit:
                return


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
        return _cache_iterator(self.dl, self.num_caches, self.return_caches_after, self.stop_after)

    def __len__(self) -> int:
        """``len(dl)`` (``TypeError`` if it has none)."""
        return len(self.dl)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (e.g. while unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.dl, name)
