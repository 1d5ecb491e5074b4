"""The files of a local directory that match a pattern, as a shuffleable source (SPDL's
``spdl.source.local_directory``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from os import PathLike
from pathlib import Path

from ._types import IterableWithShuffle

__all__ = ["LocalDirectory"]


class LocalDirectory(IterableWithShuffle[Path]):
    """The paths under ``root`` that match ``pattern`` (:py:meth:`pathlib.Path.glob`'s pattern language, e.g.
    ``"train/*/*.JPEG"`` or ``"**/*.mp4"``), sorted, listed once when it is made.

    :py:meth:`shuffle` reorders them in place with ``random.Random(seed)``, so a seed gives the same order as
    SPDL's.

    .. code-block:: python

        from spdl_rs.source.local_directory import LocalDirectory

        src = LocalDirectory("/data/videos", "**/*.mp4")
        src.shuffle(seed=epoch)
        builder.add_source(src)
    """

    def __init__(self, root: str | PathLike[str], pattern: str) -> None:
        self.root = Path(root)
        self.pattern = pattern
        self._flist: list[Path] = sorted(self.root.glob(pattern))

    def __len__(self) -> int:
        return len(self._flist)

    def shuffle(self, seed: int) -> None:
        """Reorders the listing in place with ``random.Random(seed)``."""
        random.Random(seed).shuffle(self._flist)

    def __iter__(self) -> Iterator[Path]:
        yield from self._flist
