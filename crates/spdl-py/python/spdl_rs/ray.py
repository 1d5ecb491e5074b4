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

import inspect
from typing import Any

from ._native import ray as _ray
from ._native.ray import RayDataSource, import_ray

__all__ = ["ImageBatchDecoder", "RayDataSource", "VideoClipDecoder", "import_ray"]


class _Decoder:
    """A Python class around a native decoder: given the class, Ray Data subclasses it for its actors (a wrapper
    whose ``__init__`` calls ``super().__init__(*args, **kwargs)``), which a native class cannot take."""

    _native: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._decoder = self._native(*args, **kwargs)

    def __call__(self, batch: Any) -> dict[str, Any]:
        return self._decoder(batch)

    def __repr__(self) -> str:
        return repr(self._decoder)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not before `__init__` ran (unpickling looks up `__setstate__`)
            raise AttributeError(name)
        return getattr(self._decoder, name)


class ImageBatchDecoder(_Decoder):
    __doc__ = _ray.ImageBatchDecoder.__doc__
    __signature__ = inspect.signature(_ray.ImageBatchDecoder)
    _native = _ray.ImageBatchDecoder


class VideoClipDecoder(_Decoder):
    __doc__ = getattr(_ray, "VideoClipDecoder", _Decoder).__doc__  # a build without `ffmpeg` decodes no video
    __signature__ = inspect.signature(getattr(_ray, "VideoClipDecoder", _Decoder))
    _native = getattr(_ray, "VideoClipDecoder", None)
