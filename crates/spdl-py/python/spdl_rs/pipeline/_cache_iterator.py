"""``cache_iterator``: yield a source's first items, then replay them (see :py:class:`spdl_rs.dataloader.CacheDataLoader`).
It is :py:func:`spdl_rs._native.pipeline.cache_iterator`."""

from __future__ import annotations

from .._native.pipeline import cache_iterator

__all__ = ["cache_iterator"]
