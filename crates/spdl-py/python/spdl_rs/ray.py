"""spdl_rs on Ray Data: GIL-free batch decoding inside Ray's workers, and Ray's iterators as a pipeline source.

Two pieces, one for each side of a Ray Data job:

- :py:class:`ImageBatchDecoder`, a ``map_batches`` callable that decodes a column of encoded images (or paths)
  with :py:func:`spdl_rs.io.load_image_batch` (resize, center crop or random resized crop, optional
  normalization) into one ``[N, H, W, C]`` column, in Rust, without the GIL. An instance runs as Ray tasks; the
  class itself (with ``fn_constructor_kwargs``) runs in an actor pool.
- :py:class:`VideoClipDecoder`, the same for a column of videos: clips sampled from each (seeded) and decoded
  once per GOP by :py:func:`spdl_rs.io.load_clips`, into one ``[N, clips, T, H, W, C]`` column.
- :py:class:`RayDataSource`, which makes a ``ray.data.DataIterator`` (e.g. one of
  ``Dataset.streaming_split(n)``) the source of a :py:class:`spdl_rs.pipeline.Pipeline`, so that the trainer's
  pipeline does only the last steps (collate, pin, host-to-device copy).

.. code-block:: python

    import ray
    from spdl_rs.pipeline import PipelineBuilder
    from spdl_rs.ray import ImageBatchDecoder, RayDataSource

    ds = ray.data.read_binary_files(paths, include_paths=True)
    ds = ds.map_batches(ImageBatchDecoder(224, 224, transform="center-crop"), batch_size=32)
    pipeline = (
        PipelineBuilder()
        .add_source(RayDataSource(ds.iterator(), batch_size=32))
        .pipe(lambda batch: torch.from_numpy(batch["image"]).pin_memory())
        .add_sink(2)
        .build(num_threads=2)
    )

Ray is imported on first use: ``import spdl_rs.ray`` works without Ray installed, and what needs Ray raises an
``ImportError`` that says how to install it. See docs/scale-out.md for when to move to Ray, and for how
checkpoints compose with Ray's iterators.
"""

from __future__ import annotations

from ._native.ray import ImageBatchDecoder, RayDataSource, import_ray

try:
    from ._native.ray import VideoClipDecoder
except ImportError:  # a build without the `ffmpeg` feature decodes no video
    pass

__all__ = ["ImageBatchDecoder", "RayDataSource", "VideoClipDecoder", "import_ray"]
