"""The image-loading recipe of spdl-rs (spdl-loader) as one object: list a dataset, read each image through a
store (local files, ``s3://``, ``http(s)://``), decode and transform whole batches in Rust, and iterate batches.
It is the pipeline ``spdl bench`` runs, with no Python call per image.

.. code-block:: python

    from spdl_rs.loader import ImageLoader

    loader = ImageLoader("/data/imagenet/val", batch_size=32, num_threads=4, size=224)
    for images, labels in loader:      # images: spdl_rs.Buffer [32, 224, 224, 3] uint8
        batch = torch.from_dlpack(images)
    print(loader.stats_table())

:py:class:`ClipLoader` is the same for videos (a build with video): clips sampled from each video and decoded
once per GOP, batches ``[B, num_clips, num_frames, size, size, 3]``:

.. code-block:: python

    from spdl_rs.loader import ClipLoader

    for clips, labels in ClipLoader("/data/kinetics/train", batch_size=8, num_clips=4, num_frames=16, size=112):
        batch = torch.from_dlpack(clips)
"""

from ._native import HAS_VIDEO
from ._native.loader import ImageLoader

if HAS_VIDEO:
    from ._native.loader import ClipLoader

__all__ = ["ClipLoader", "ImageLoader"]
