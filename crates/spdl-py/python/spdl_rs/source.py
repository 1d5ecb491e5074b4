"""Samplers and dataset listings in Rust (spdl-source).

.. code-block:: python

    from spdl_rs.source import Sampler, list_dataset

    keys, labels, classes = list_dataset("/data/imagenet/train", extensions=["jpg", "jpeg"])
    sampler = Sampler.shuffled(len(keys), seed=42).sharded(rank, world_size)
    builder.add_source([keys[i] for i in sampler.order(epoch)])
"""

from ._native import HAS_SOURCE

if HAS_SOURCE:
    from ._native import Sampler, list_dataset
else:  # pragma: no cover (a build without the `source` feature)
    Sampler = None

    def list_dataset(*_args, **_kwargs):
        raise RuntimeError("spdl_rs was built without the `source` feature")


__all__ = ["Sampler", "list_dataset"]
