"""Native ops: decoders as pipeline stages that run entirely in Rust, without the GIL.

.. code-block:: python

    from spdl_rs.io import ops
    from spdl_rs.pipeline import PipelineBuilder

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .aggregate(32)
        .pipe(ops.load_image_batch(224, 224), concurrency=4)
        .add_sink(4)
        .build(num_threads=4)
    )

A pipeline whose source is a list, tuple or range and whose stages are all native ops holds the GIL for no
item-level work: other Python threads run at full speed while it decodes.
"""

from __future__ import annotations

from typing import Any

from .. import _native
from .._native import NativeOp

__all__ = ["decode_image", "load_image", "load_image_batch"]


def decode_image(
    *,
    size: tuple[int, int] | None = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    exif_orientation: bool = False,
) -> NativeOp:
    """A stage that decodes each item (a path or encoded bytes) into an HWC ``uint8`` buffer.

    Args:
        size: ``(width, height)`` to resize to, or ``None`` for the original size.
        pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
        filter: The resize filter.
        exif_orientation: Apply the EXIF orientation.
    """
    return _native.decode_image_op(size=size, pixel_format=pixel_format, filter=filter, exif_orientation=exif_orientation)


load_image = decode_image
"""Same as :py:func:`decode_image` (each item may be a path or encoded bytes)."""


def load_image_batch(
    width: int,
    height: int,
    *,
    layout: str = "NHWC",
    normalize: Any = None,
    pixel_format: str = "rgb",
    filter: str = "bilinear",
    strict: bool = True,
    num_threads: int = 1,
) -> NativeOp:
    """A stage that decodes each item (a list of paths or encoded bytes, e.g. after ``aggregate(32)``) into one
    ``[N, H, W, C]`` (or ``[N, C, H, W]``) buffer. Arguments as :py:func:`spdl_rs.io.load_image_batch`;
    ``num_threads`` is per call (the stage's ``concurrency`` gives the parallelism)."""
    return _native.load_image_batch_op(
        width,
        height,
        layout=layout,
        normalize=normalize,
        pixel_format=pixel_format,
        filter=filter,
        strict=strict,
        num_threads=num_threads,
    )
