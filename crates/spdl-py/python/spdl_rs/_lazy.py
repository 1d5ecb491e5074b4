"""Module attributes loaded on first use (PEP 562), for packages that map public names to the private modules
that implement them: importing the package stays cheap, and ``from package import name`` works."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, namespace: dict[str, Any], names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``.

    ``names`` maps each public name to the module (relative to ``package``) that defines it; a name is imported
    on first access and then stored in ``namespace`` (the package's ``globals()``), so later lookups are plain.

    Example::

        __getattr__, __dir__ = lazy_attributes(__name__, globals(), {"Decoder": "._media"})
    """

    def getattr_(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
