"""Stands in for :py:mod:`._media` in a build without the ``ffmpeg`` feature, where importing ``_media`` fails:
any attribute raises the same ``ImportError``, so that what needs the demuxing and decoding objects fails as an
import of them would."""

from __future__ import annotations

#: Why ``_media`` cannot be imported (its ``ImportError``).
MESSAGE = "spdl_rs was built without the `ffmpeg` feature: the demuxing and decoding objects need FFmpeg"


def __getattr__(name: str) -> object:
    if name.startswith("__") and name.endswith("__"):  # the import system's own lookups (``__path__``, ...)
        raise AttributeError(name)
    raise ImportError(MESSAGE)
