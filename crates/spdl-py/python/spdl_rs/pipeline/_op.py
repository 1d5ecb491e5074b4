"""How the engine calls a pipeline's op, and the name a stage takes from it: what ``defs``, the builder, the
region and checkpoint code all read, kept apart from them so that none imports another for it."""

from __future__ import annotations

from typing import Any

from .. import _native


#: How the engine calls an op: ``(kind, fn)``, kind one of ``native``, ``asyncgen``, ``async``, ``gen`` or
#: ``sync`` (declared once, where the engine reads a ``PipeConfig``).
_op_kind = _native.pipeline.op_kind


def _op_name(op: Any) -> str:
    for attr in ("name", "__name__"):
        n = getattr(op, attr, None)
        if isinstance(n, str):
            return n
    func = getattr(op, "func", None)  # functools.partial
    if func is not None:
        return _op_name(func)
    return type(op).__name__
