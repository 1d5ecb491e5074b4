"""Media decoding in Rust (spdl-io). Every function releases the GIL for its whole duration.

Functions return :py:class:`spdl_rs.Buffer` objects; ``numpy.asarray(buf)`` or ``buf.numpy()`` views them
without a copy, and ``torch.from_dlpack(buf)`` / ``numpy.from_dlpack(buf)`` take them in place.

The same decoders as pipeline stages that never take the GIL are in :py:mod:`spdl_rs.io.ops`.
"""

from .._native import HAS_IO

if HAS_IO:
    from .._native import decode_image, image_info, load_image, load_image_batch
else:  # pragma: no cover (a build without the `io` feature)

    def _missing(*_args, **_kwargs):
        raise RuntimeError("spdl_rs was built without the `io` feature")

    decode_image = image_info = load_image = load_image_batch = _missing

from . import ops

__all__ = ["decode_image", "image_info", "load_image", "load_image_batch", "ops"]
