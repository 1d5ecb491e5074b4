"""``cache_iterator``: yield a source's first items, then replay them (see :py:class:`spdl_rs.dataloader.CacheDataLoader`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["cache_iterator"]

T = TypeVar("T")


def cache_iterator(
    src: Iterable[T],
    num_caches: int,
    *,
    return_caches_after: int | None = None,
    stop_after: int | None = None,
    delete_src: bool = True,
) -> Iterator[T]:
    """Yields the items of ``src`` while keeping the first ``num_caches``, then yields the kept ones over and
    over: to measure how fast the training loop would run if data loading cost nothing.

    Args:
        src: The source (typically a data loader).
        num_caches: How many items to keep (positive).
        return_caches_after: After how many items of ``src`` the cache takes over (default: ``num_caches``;
            at least ``num_caches``).
        stop_after: Stop after this many items in all (at least ``num_caches``); default: never.
        delete_src: Drop the reference to ``src`` once the cache takes over, so its resources can be freed.

    The arguments are checked when iteration starts (this is a generator). An empty ``src`` ends at once.
    """
    if num_caches <= 0:
        raise ValueError(f"`num_caches` must be greater than zero. Found: {num_caches}")
    if return_caches_after is not None and return_caches_after < num_caches:
        raise ValueError(
            "When provided, `return_caches_after` must be greater than or equal to `num_caches`. "
            f"{num_caches=}, {return_caches_after=}"
        )
    if stop_after is not None:
        if stop_after < num_caches:
            raise ValueError(
                "When provided, `stop_after` must be greater than or equal to `num_caches`. "
                f"{num_caches=}, {stop_after=}"
            )
        if return_caches_after is not None and stop_after < return_caches_after:
            raise ValueError(
                "When provided, `stop_after` must be greater than or equal to `return_caches_after`. "
                f"{return_caches_after=}, {stop_after=}"
            )

    cache: list[T] = []
    switch_at = num_caches if return_caches_after is None else return_caches_after
    limit = float("inf") if stop_after is None else stop_after
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
            if count >= switch_at:
                break
    finally:
        # Stop the source's iteration now (e.g. a data loader's background pipeline) rather than when it is
        # collected; an iterator the caller passed in is theirs to close.
        if it is not src:
            close = getattr(it, "close", None)
            if callable(close):
                close()
    del it
    if delete_src:
        del src
    if not cache:
        return
    while True:
        for item in cache:
            yield item
            count += 1
            if count >= limit:
                return
