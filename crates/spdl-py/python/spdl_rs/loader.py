"""The image-loading recipe of spdl-rs (spdl-loader) as one object: list a dataset, read each image through a
store (local files, ``s3://``, ``http(s)://``), decode and transform whole batches in Rust, and iterate batches.
It is the pipeline ``spdl bench`` runs, with no Python call per image.

.. code-block:: python

    from spdl_rs.loader import ImageLoader

    loader = ImageLoader("/data/imagenet/val", batch_size=32, num_threads=4, size=224)
    for images, labels in loader:      # images: spdl_rs.Buffer [32, 224, 224, 3] uint8
        batch = torch.from_dlpack(images)
    print(loader.stats_table())
"""

from ._native import ImageLoader

__all__ = ["ImageLoader"]
