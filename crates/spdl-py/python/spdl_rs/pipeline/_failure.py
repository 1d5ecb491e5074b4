"""``PipelineFailure`` and the end-of-stream markers."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["PipelineFailure", "is_eof", "is_epoch_end", "EOF", "EPOCH_END"]


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"spdl_rs.pipeline.{self._name}"


EOF = _Marker("EOF")
"""The end-of-stream marker (``is_eof(EOF)`` is true). ``get_item`` raises ``EOFError`` instead of returning it."""

EPOCH_END = _Marker("EPOCH_END")
"""The end-of-epoch marker of a continuous source (``is_epoch_end(EPOCH_END)`` is true)."""


def is_eof(item: Any) -> bool:
    """Whether ``item`` is the end-of-stream marker :py:data:`EOF`."""
    return item is EOF


def is_epoch_end(item: Any) -> bool:
    """Whether ``item`` is the end-of-epoch marker :py:data:`EPOCH_END`."""
    return item is EPOCH_END


def _as_exception(exc: BaseException) -> Exception:
    if isinstance(exc, Exception):
        return exc
    wrapped = RuntimeError(f"{type(exc).__name__}: {exc}")
    wrapped.__cause__ = exc
    return wrapped


if sys.version_info >= (3, 11):

    class PipelineFailure(ExceptionGroup):  # noqa: F821 (builtin since 3.11)
        """Raised by :py:meth:`Pipeline.stop` (and on leaving :py:meth:`Pipeline.auto_stop`) when a failure
        budget was spent or the source raised.

        An :py:class:`ExceptionGroup` of the exceptions the failed items raised (the first ones kept), each
        with a note naming its stage; ``except*`` works on it. :py:attr:`stage` names the stage that spent
        its budget.
        """

        stage: str | None

        def __new__(
            cls, errs: Sequence[tuple[str, BaseException]], message: str | None = None, stage: str | None = None
        ) -> PipelineFailure:
            excs = []
            for name, exc in errs:
                exc = _as_exception(exc)
                note = f"Pipeline stage: {name}"
                if note not in getattr(exc, "__notes__", ()):
                    exc.add_note(note)
                excs.append(exc)
            if not excs:
                excs = [RuntimeError(message or "pipeline failed")]
            self = super().__new__(cls, message or "pipeline stages failed", excs)
            self.stage = stage
            return self

        def __init__(
            self, errs: Sequence[tuple[str, BaseException]], message: str | None = None, stage: str | None = None
        ) -> None:
            excs = [_as_exception(e) for _, e in errs] or [RuntimeError(message or "pipeline failed")]
            super().__init__(message or "pipeline stages failed", excs)

        def derive(self, excs: Sequence[Exception]) -> PipelineFailure:  # type: ignore[override]
            return PipelineFailure([(self.stage or "", e) for e in excs], self.message, self.stage)

else:

    class PipelineFailure(RuntimeError):  # type: ignore[no-redef]
        """Raised by :py:meth:`Pipeline.stop` (and on leaving :py:meth:`Pipeline.auto_stop`) when a failure
        budget was spent or the source raised. The causes are in :py:attr:`exceptions`."""

        def __init__(
            self, errs: Sequence[tuple[str, BaseException]], message: str | None = None, stage: str | None = None
        ) -> None:
            super().__init__(message or "pipeline stages failed")
            self.exceptions: tuple[Exception, ...] = tuple(_as_exception(e) for _, e in errs)
            self.stage = stage
