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

import sys as _sys
import sysconfig as _sysconfig
from typing import Any as _Any

from . import _native, io, pipeline, source
from ._native import Buffer
from ._native.pipeline import NativeOp

__version__ = "0.1.0"

__all__ = ["Buffer", "NativeOp", "build_info", "io", "pipeline", "source", "__version__"]


def build_info() -> dict[str, _Any]:
    """What this installation of spdl_rs has and found.

    - ``version``, ``features`` (the cargo features it was built with);
    - ``jpeg``: the JPEG decoder (``"libjpeg-turbo 3.1.0"``, linked in, or ``"zune-jpeg"``);
    - ``ffmpeg``: what was found at run time (this loads FFmpeg if no call did yet): ``available``,
      ``major``, ``libraries`` (library to version), ``backend`` (the file loaded), ``backends`` (the FFmpeg
      majors this build supports), ``found`` (the majors on this machine) and ``error`` (why none, and how
      to install one);
    - ``cuda``: ``built`` and ``devices`` (0 without a GPU or driver);
    - ``python``, ``free_threaded`` (a free-threaded interpreter) and ``gil_enabled``.
    """
    info = dict(_native._build_info())
    info["python"] = ".".join(map(str, _sys.version_info[:3]))
    info["free_threaded"] = bool(_sysconfig.get_config_var("Py_GIL_DISABLED"))
    is_gil_enabled = getattr(_sys, "_is_gil_enabled", None)
    info["gil_enabled"] = bool(is_gil_enabled()) if is_gil_enabled is not None else True
    return info
