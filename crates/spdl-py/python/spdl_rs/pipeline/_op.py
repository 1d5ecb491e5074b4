"""How the engine calls a pipeline's op, and the name a stage takes from it: what ``defs``, the builder, the
region and checkpoint code all read, kept apart from them so that none imports another for it."""

from __future__ import annotations

import inspect
from typing import Any

from .. import _native


def _op_kind(op: Any) -> tuple[str, Any]:
    """How the engine calls ``op``: ``native``, ``asyncgen``, ``async``, ``gen`` or ``sync``."""
    if isinstance(op, _native.pipeline.NativeOp):
        return "native", op
    if not callable(op):
        if hasattr(op, "__getitem__"):  # a dict, list, ... : look the item up
            return "sync", op.__getitem__
        raise TypeError(f"op must be callable (or a container with __getitem__), got {type(op).__name__}")
    call = op if inspect.isfunction(op) or inspect.ismethod(op) else getattr(op, "__call__", op)
    for target in (op, call):
        if inspect.isasyncgenfunction(target):
            return "asyncgen", op
        if inspect.iscoroutinefunction(target):
            return "async", op
        if inspect.isgeneratorfunction(target):
            return "gen", op
    return "sync", op



def _op_name(op: Any) -> str:
    for attr in ("name", "__name__"):
        n = getattr(op, attr, None)
        if isinstance(n, str):
            return n
    func = getattr(op, "func", None)  # functools.partial
    if func is not None:
        return _op_name(func)
    return type(op).__name__
