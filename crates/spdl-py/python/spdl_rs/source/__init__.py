"""Samplers, dataset listings, object stores, and SPDL's data-source protocols and helpers.

.. code-block:: python

    from spdl_rs.source import Sampler, Store, list_dataset

    keys, labels, classes = list_dataset("/data/imagenet/train", extensions=["jpg", "jpeg"])
    sampler = Sampler.shuffled(len(keys), seed=42).sharded(rank, world_size)
    builder.add_source([keys[i] for i in sampler.order(epoch)])

    store = Store.open("https://example.org/data")   # or a local directory, or s3://bucket/prefix
    builder.pipe(store.get, concurrency=16)           # the GIL is released while each request waits

The protocols :py:class:`IterableWithShuffle`, :py:class:`SizedIterable` and
:py:class:`SizedIterableWithShuffle` are those of ``spdl.source``; the helpers that use them
(``MergeIterator``, ``embed_shuffle``, ``repeat_source``) live in :py:mod:`spdl_rs.source.utils`,
as in ``spdl.source.utils``. SPDL's index samplers :py:class:`DistributedRandomSampler` and
:py:class:`DistributedDeterministicSampler` are here too, and :py:mod:`spdl_rs.source.imagenet` is
``spdl.source.imagenet`` (over :py:class:`spdl_rs.source.local_directory.LocalDirectory`, SPDL's
``spdl.source.local_directory``):

.. code-block:: python

    from spdl_rs.source.utils import MergeIterator, repeat_source

    mixed = MergeIterator([speech, music], weights=[3, 1], stop_after=1000, seed=0)
"""

from .._native import HAS_SOURCE
from .._native.source import (
    DistributedDeterministicSampler,
    DistributedRandomSampler,
    ElasticSampler,
    merge_rank_states,
)
from ._types import IterableWithShuffle, SizedIterable, SizedIterableWithShuffle

if HAS_SOURCE:
    from .._native.source import Sampler, Store, list_dataset
else:  # pragma: no cover (a build without the `source` feature)
    Sampler = None
    Store = None

    def list_dataset(*_args, **_kwargs):
        raise RuntimeError("spdl_rs was built without the `source` feature")


__all__ = [
    "DistributedDeterministicSampler",
    "DistributedRandomSampler",
    "ElasticSampler",
    "IterableWithShuffle",
    "Sampler",
    "SizedIterable",
    "SizedIterableWithShuffle",
    "Store",
    "list_dataset",
    "merge_rank_states",
]
