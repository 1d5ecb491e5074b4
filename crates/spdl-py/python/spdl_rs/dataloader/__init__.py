"""Ready-made data loaders on the spdl-rs engine, as ``spdl.dataloader`` (SPDL 0.8.0).

- :py:class:`DataLoader`: source, concurrent preprocessing, batching, aggregation and transfer, run by a
  :py:class:`spdl_rs.pipeline.Pipeline`.
- :py:class:`CacheDataLoader`: replays a loader's first outputs, to see whether loading is the bottleneck.
- :py:func:`get_pytorch_dataloader` / :py:class:`PyTorchDataLoader`: a map-style PyTorch dataset served by
  worker processes, with ``torch.utils.data.DataLoader``'s arguments (needs PyTorch, imported on use).

.. code-block:: python

    from spdl_rs.dataloader import DataLoader

    for batch in DataLoader(paths, preprocessor=decode, batch_size=32, aggregator=np.stack):
        ...
"""

from ._cache import CacheDataLoader
from ._dataloader import DataLoader
from ._pytorch import PyTorchDataLoader, get_pytorch_dataloader

__all__ = [
    "CacheDataLoader",
    "DataLoader",
    "PyTorchDataLoader",
    "get_pytorch_dataloader",
]
