"""SPDL's image writers: :py:func:`encode_image` and :py:func:`save_image`.

The format follows the file extension (``.jpg``/``.jpeg``, ``.png``, ``.webp`` (lossless), ``.bmp``,
``.tiff``, ``.gif``); pixels are encoded in Rust (the ``image`` crate) with the GIL released. Unlike SPDL,
which goes through FFmpeg's encoders, no FFmpeg is needed.
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from .. import _native

__all__ = ["encode_image", "save_image"]


def _pixels(data: Any, pix_fmt: str) -> tuple[bytes, int, int, str]:
    """The bytes, width, height and native pixel layout of ``data`` in ``pix_fmt`` (SPDL's shapes)."""
    import numpy

    if hasattr(data, "numpy") and not hasattr(data, "__array_interface__"):
        data = data.cpu().numpy() if hasattr(data, "cpu") else data.numpy()
    arr = numpy.asarray(data)
    match pix_fmt:
        case "rgb24" | "bgr24":
            if arr.ndim != 3 or arr.shape[2] != 3:
                raise ValueError(f"The input shape must be [H, W, C==3]. Found: {arr.shape}")
            if arr.dtype.itemsize != 1:
                raise ValueError(f"The input dtype must be 8bit. Found: {arr.dtype}")
            if pix_fmt == "bgr24":
                arr = arr[:, :, ::-1]
            layout = "rgb24"
        case "rgba":
            if arr.ndim != 3 or arr.shape[2] != 4:
                raise ValueError(f"The input shape must be [H, W, C==4]. Found: {arr.shape}")
            if arr.dtype.itemsize != 1:
                raise ValueError(f"The input dtype must be 8bit. Found: {arr.dtype}")
            layout = "rgba"
        case "gray" | "gray8":
            if arr.ndim != 2:
                raise ValueError(f"The input shape must be [H, W]. Found: {arr.shape}")
            if arr.dtype.itemsize != 1:
                raise ValueError(f"The input dtype must be 8bit. Found: {arr.dtype}")
            layout = "gray8"
        case "gray16" | "gray16be" | "gray16le":
            if arr.ndim != 2:
                raise ValueError(f"The input shape must be [H, W]. Found: {arr.shape}")
            if arr.dtype.itemsize != 2:
                raise ValueError(f"The input dtype must be 16-bit. Found: {arr.dtype}")
            # FFmpeg's gray16be/gray16le name the byte order of the array's bytes (SPDL hands them to FFmpeg as
            # they are): read them so, into native 16-bit values. "gray16" is native order.
            order = {"gray16be": ">u2", "gray16le": "<u2"}.get(pix_fmt, "=u2")
            arr = numpy.ascontiguousarray(arr).view(order).astype(numpy.uint16)
            layout = "gray16"
        case "yuv444p":
            raise ValueError(
                "pix_fmt='yuv444p' is not supported by spdl_rs's image encoder; convert to rgb24 first"
            )
        case _:
            raise ValueError(f"Unsupported pix_fmt: {pix_fmt}")
    arr = numpy.ascontiguousarray(arr)
    height, width = arr.shape[:2]
    return arr.tobytes(), int(width), int(height), layout


def encode_image(path: str, data: Any, pix_fmt: str = "rgb24", *, encode_config: object = None) -> None:
    """Writes an image array to ``path`` (SPDL's ``encode_image``), in the format of its extension.

    Args:
        path: The output file.
        data: ``uint8`` pixels: ``[H, W, 3]`` (``"rgb24"``, ``"bgr24"``), ``[H, W, 4]`` (``"rgba"``),
            ``[H, W]`` (``"gray8"``/``"gray"``); 16-bit ``[H, W]`` for ``"gray16"`` (PNG, TIFF). A NumPy array,
            a CPU tensor, or any array-like.
        pix_fmt: See ``data``.
        encode_config: SPDL's encoder configuration; only ``None`` is accepted (resize before encoding).
    """
    if encode_config is not None:
        raise ValueError("encode_image: encode_config is not supported by spdl_rs (resize the array first)")
    buf, width, height, layout = _pixels(data, pix_fmt)
    _native.io.encode_image_file(path, buf, width, height, layout)


def save_image(
    path: str | PathLike[str],
    data: Any,
    pix_fmt: str = "rgb24",
    *,
    bit_rate: int = -1,
    compression_level: int = -1,
    qscale: int = -1,
    gop_size: int = -1,
    max_b_frames: int = -1,
    colorspace: str | None = None,
    color_primaries: str | None = None,
    color_trc: str | None = None,
) -> None:
    """Writes an image array to ``path`` (SPDL's ``save_image``), in the format of its extension.

    Args:
        path: The output file.
        data, pix_fmt: As :py:func:`encode_image`.
        compression_level: PNG compression, ``0`` (fastest) to ``9`` (smallest); ``-1``: the default.
        qscale: JPEG quality as FFmpeg's ``qscale``, ``1`` (best) to ``31`` (worst); ``-1``: quality 90.
        bit_rate, gop_size, max_b_frames, colorspace, color_primaries, color_trc: video encoder settings
            that an image file does not use; only their defaults are accepted.
    """
    video_only = {"bit_rate": bit_rate, "gop_size": gop_size, "max_b_frames": max_b_frames}
    for key, value in video_only.items():
        if value != -1:
            raise ValueError(f"save_image: {key} is not supported by spdl_rs's image encoder")
    for key, text in {"colorspace": colorspace, "color_primaries": color_primaries, "color_trc": color_trc}.items():
        if text is not None:
            raise ValueError(f"save_image: {key} is not supported by spdl_rs's image encoder")
    quality = None
    if qscale != -1:
        if not 1 <= qscale <= 31:
            raise ValueError(f"save_image: qscale must be in [1, 31], got {qscale}")
        quality = max(1, min(100, round(100 - (qscale - 1) * 99 / 30)))
    compression = None
    if compression_level != -1:
        if not 0 <= compression_level <= 9:
            raise ValueError(f"save_image: compression_level must be in [0, 9], got {compression_level}")
        compression = compression_level
    buf, width, height, layout = _pixels(data, pix_fmt)
    _native.io.encode_image_file(str(path), buf, width, height, layout, quality=quality, compression=compression)
