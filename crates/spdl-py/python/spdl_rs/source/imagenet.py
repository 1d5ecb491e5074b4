"""The ImageNet (ILSVRC2012) directory layout as a data source, as ``spdl.source.imagenet`` (SPDL 0.8.0).

.. code-block:: python

    from spdl_rs.source.imagenet import ImageNet

    src = ImageNet("/data/imagenet", split="train")   # <root>/train/<wnid>/*.JPEG
    src.shuffle(seed=0)
    for path, class_index in src:
        ...
"""

import re
from collections.abc import Iterator
from os import PathLike
from pathlib import Path

from ._imagenet_wnids import WNIDS
from ._types import IterableWithShuffle
from .local_directory import LocalDirectory

__all__ = ["ImageNet", "get_mappings", "parse_wnid"]

_SPLITS = ["train", "val"]
_WNID = re.compile(r"n\d{8}")


class ImageNet(IterableWithShuffle[tuple[Path, int]]):
    """The images of one split of a local ImageNet copy, with their class indices.

    The files ``<root>/<split>/*/*.JPEG`` are listed once, when the object is made, and sorted by path.
    Iterating yields ``(path, class_index)``; the class index is that of the first WordNet ID
    (``n`` and eight digits) in the path (see :py:func:`parse_wnid` and :py:func:`get_mappings`).

    :py:meth:`shuffle` reorders the listing in place, starting from its current order, as SPDL does: the
    order after a series of calls depends on every seed of the series.

    Args:
        root: The directory that holds the ``train`` and ``val`` directories.
        split: ``"train"`` or ``"val"``.

    Raises:
        ValueError: ``split`` is neither.
    """

    def __init__(self, root: str | PathLike[str], split: str = "val") -> None:
        if split not in _SPLITS:
            raise ValueError(f"`split` must be one of {_SPLITS}")
        self._mappings: dict[str, int] = get_mappings()
        self._src = LocalDirectory(root, f"{split}/*/*.JPEG")

    def shuffle(self, seed: int) -> None:
        """Reorders the listing in place with ``random.Random(seed)``."""
        self._src.shuffle(seed=seed)

    def __iter__(self) -> Iterator[tuple[Path, int]]:
        """Yields each image's path and class index.

        Raises:
            ValueError: A path holds no WordNet ID.
            KeyError: A path's WordNet ID is not one of the 1000 classes.
        """
        for path in self._src:
            yield path, self._mappings[parse_wnid(str(path))]


def parse_wnid(s: str) -> str:
    """The first WordNet ID (``n`` followed by eight digits) found in ``s``.

    .. code-block:: python

        parse_wnid("train/n01440764/n01440764_10026.JPEG")  # "n01440764"

    Raises:
        ValueError: ``s`` holds none.
    """
    found = _WNID.search(s)
    if found is None:
        raise ValueError(f"The given string does not contain WNID: {s}")
    return found.group(0)


def get_mappings() -> dict[str, int]:
    """A new dict from each of the 1000 ILSVRC2012 WordNet IDs to its class index.

    The index is the ID's position among the sorted IDs, the labelling most published models use
    (``get_mappings()["n03709823"] == 636``).
    """
    return {wnid: index for index, wnid in enumerate(WNIDS)}
