"""Structural types for data sources, matching ``spdl.source``'s protocols.

They are ``runtime_checkable``: ``isinstance`` only looks for the methods' presence.

.. code-block:: python

    class Shards:
        def __init__(self, n):
            self.order = list(range(n))

        def __iter__(self):
            return iter(self.order)

        def __len__(self):
            return len(self.order)

        def shuffle(self, seed):
            random.Random(seed).shuffle(self.order)

    assert isinstance(Shards(4), SizedIterableWithShuffle)
"""

from collections.abc import Iterable, Sized
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["IterableWithShuffle", "SizedIterable", "SizedIterableWithShuffle"]

T = TypeVar("T")


@runtime_checkable
class IterableWithShuffle(Iterable[T], Protocol):
    """IterableWithShuffle()

    An iterable data source that can reorder itself in place.

    Example:

        >>> class Items:
        ...     def __init__(self):
        ...         self.items = [1, 2, 3]
        ...     def __iter__(self):
        ...         return iter(self.items)
        ...     def shuffle(self, seed):
        ...         random.Random(seed).shuffle(self.items)
        >>> isinstance(Items(), IterableWithShuffle)
        True
    """

    def shuffle(self, seed: int) -> None:
        """Reorder the source in place; the same ``seed`` gives the same order.

        Example: ``src.shuffle(seed=epoch)`` before iterating over ``src`` for that epoch.
        """
        ...


@runtime_checkable
class SizedIterable(Sized, Iterable[T], Protocol):
    """SizedIterable()

    An iterable data source whose number of items is known (``len``).

    Example:

        >>> isinstance([1, 2, 3], SizedIterable)
        True
        >>> isinstance(iter([1, 2, 3]), SizedIterable)
        False
    """


@runtime_checkable
class SizedIterableWithShuffle(SizedIterable[T], Protocol):
    """SizedIterableWithShuffle()

    A :py:class:`SizedIterable` that can also reorder itself in place.

    Example:

        >>> class Items(list):
        ...     def shuffle(self, seed):
        ...         random.Random(seed).shuffle(self)
        >>> isinstance(Items([1, 2, 3]), SizedIterableWithShuffle)
        True
    """

    def shuffle(self, seed: int) -> None:
        """Reorder the source in place; the new order may show only once iteration starts.

        Example: ``src.shuffle(seed=3); first = next(iter(src))``.
        """
        ...
