"""Stands in for :py:mod:`._media` in a build without the ``ffmpeg`` feature, where importing ``_media`` fails:
any attribute raises the same ``ImportError``, so that what needs the demuxing and decoding objects fails as an
import of them would."""

from __future__ import annotations

from typing import Any, Callable

#: Why ``_media`` cannot be imported (its ``ImportError``).
MESSAGE = "spdl_rs was built without the `ffmpeg` feature: the demuxing and decoding objects need FFmpeg"


def __getattr__(name: str) -> object:
    if name.startswith("__") and name.endswith("__"):  # the import system's own lookups (``__path__``, ...)
        raise AttributeError(name)
    raise ImportError(MESSAGE)


def without_video(qualname: str) -> Callable[..., Any]:
    """What a build without the ``ffmpeg`` feature has in place of the video function ``qualname``
    (``spdl_rs.io.load_clips``, ``spdl_rs.io.ops.load_video``, ...): it raises ``RuntimeError`` naming it."""

    def missing(*_args: object, **_kwargs: object) -> Any:
        raise RuntimeError(
            f"{qualname}: spdl_rs was built without the `ffmpeg` feature (see spdl_rs.io.has_video())"
        )

    missing.__name__ = missing.__qualname__ = qualname.rsplit(".", 1)[-1]
    return missing
