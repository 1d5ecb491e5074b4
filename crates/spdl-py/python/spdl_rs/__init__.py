"""spdl-rs: scalable data loading, with the pipeline engine and the media decoders in Rust.

- :py:mod:`spdl_rs.pipeline`: a drop-in for ``spdl.pipeline`` (``PipelineBuilder``, ``Pipeline``, ``defs``:
  merges, path variants, ``.to()`` regions).
- :py:mod:`spdl_rs.io`: image, audio and (with FFmpeg) video decoding in Rust, GIL released;
  :py:mod:`spdl_rs.io.ops` as pipeline stages.
- :py:mod:`spdl_rs.source`: stores, deterministic samplers (shuffle, shard) and dataset listings, SPDL's
  samplers, ``utils`` and ``imagenet``; :py:mod:`spdl_rs.dataloader`: SPDL's data loaders.
- :py:class:`Buffer`: what every decoder returns (images, audio, video); ``numpy.asarray(buf)``,
  ``numpy.from_dlpack(buf)`` and ``torch.from_dlpack(buf)`` view it without a copy.

The native module declares itself safe without the GIL: on a free-threaded CPython the GIL stays off.
"""

from . import io, pipeline, source
from ._native import Buffer, NativeOp

__version__ = "0.1.0"

__all__ = ["Buffer", "NativeOp", "io", "pipeline", "source", "__version__"]
