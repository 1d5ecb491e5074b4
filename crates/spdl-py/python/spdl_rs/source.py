"""Samplers, dataset listings and object stores in Rust (spdl-source).

.. code-block:: python

    from spdl_rs.source import Sampler, Store, list_dataset

    keys, labels, classes = list_dataset("/data/imagenet/train", extensions=["jpg", "jpeg"])
    sampler = Sampler.shuffled(len(keys), seed=42).sharded(rank, world_size)
    builder.add_source([keys[i] for i in sampler.order(epoch)])

    store = Store.open("https://example.org/data")   # or a local directory, or s3://bucket/prefix
    builder.pipe(store.get, concurrency=16)           # the GIL is released while each request waits
"""

from ._native import HAS_SOURCE

if HAS_SOURCE:
    from ._native import Sampler, Store, list_dataset
else:  # pragma: no cover (a build without the `source` feature)
    Sampler = None
    Store = None

    def list_dataset(*_args, **_kwargs):
        raise RuntimeError("spdl_rs was built without the `source` feature")


__all__ = ["Sampler", "Store", "list_dataset"]
