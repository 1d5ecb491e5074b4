"""Whole-pipeline checkpoints for Python pipelines: what the consumer has received, saved so that a new
pipeline resumes with exactly the items not yet delivered.

The checkpoint is spdl-exec's ``checkpoint`` module (docs/ARCHITECTURE.md, "Whole-pipeline checkpoints"),
reached through ``_native.pipeline.CheckpointTracker`` (:py:data:`Tracker`): it keeps, per input, the
source's state at the start of each epoch not fully delivered, a watermark (every position below it is
delivered or failed), the delivered positions above it and the failures; it enumerates each epoch
(``iter(source)``) and, on resume, loads the saved start state and skips the delivered positions. When
every source implements the torchdata ``Stateful`` protocol (``state_dict()``/``load_state_dict()``), each
item travels through the steps as a ``_native.pipeline.Keyed`` with its key ``(input, epoch, index)``
(``index``: its position in the epoch the source enumerated), every op is wrapped to pass the key on (and to
record a failure against it), batches carry the keys of their items, and :py:meth:`Pipeline.get_item`
records the keys it hands out. The native side does the keying of sync ops and aggregations, and turns the
sources' states (pickled) and the state to and from the ``dict`` form of the protocol; what stays here is
which pipelines can be checkpointed and the keying of async and generator ops.

A source's protocol, as used here: ``state_dict()`` taken before ``iter(source)`` is the state from which
that iteration enumerates an epoch (the same items in the same order for the same state); after the epoch
is exhausted, ``state_dict()`` is the state of the next epoch; ``load_state_dict(state)`` restores one.
A source whose epochs do not come again in the same order (a distributed reader, a stream) says so with a
false ``deterministic_epoch_order`` attribute: a state taken in the middle of one of its epochs is then refused,
since skipping "the delivered positions" of a different order would skip the wrong items.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from .. import _native
from . import defs
from ._op import _op_kind

__all__ = ["Tracker", "instrument"]

#: The checkpoint of one pipeline (the engine's): its inputs, what was delivered, what failed.
Tracker = _native.pipeline.CheckpointTracker
_Keyed = _native.pipeline.Keyed


class _NotCheckpointable(Exception):
    pass


def _is_stateful(source: Any) -> bool:
    return (
        callable(getattr(source, "state_dict", None))
        and callable(getattr(source, "load_state_dict", None))
        and hasattr(source, "__iter__")
        and not hasattr(source, "__aiter__")
    )


def _wrap_op(op: Any, kind: str, stage: str, tracker: Tracker) -> Any:
    """``op`` over keyed items: the keys follow its output, a failure is recorded against them, a ``None``
    output (no output) counts as delivered (a sync op: ``_native.pipeline.KeyedOp``)."""
    deliver, fail = tracker.deliver, tracker.fail
    if kind == "sync":
        return _native.pipeline.KeyedOp(op, stage, tracker)
    if kind == "async":

        async def acall(item: Any) -> Any:
            try:
                out = await op(item.value)
            except BaseException as exc:
                fail(item.keys, stage, exc)
                raise
            if out is None:
                deliver(item.keys)
                return None
            return _Keyed(item.keys, out)

        return acall
    if kind == "gen":
        # The outputs of one input: the last one carries its keys (none: delivered at once).
        def gen(item: Any) -> Iterator[Any]:
            prev: Any = _MISSING
            try:
                for out in op(item.value):
                    if out is None:
                        continue
                    if prev is not _MISSING:
                        yield _Keyed([], prev)
                    prev = out
            except BaseException as exc:
                fail(item.keys, stage, exc)
                raise
            if prev is _MISSING:
                deliver(item.keys)
            else:
                yield _Keyed(item.keys, prev)

        return gen
    if kind == "asyncgen":

        async def agen(item: Any) -> AsyncIterator[Any]:
            prev: Any = _MISSING
            try:
                async for out in op(item.value):
                    if out is None:
                        continue
                    if prev is not _MISSING:
                        yield _Keyed([], prev)
                    prev = out
            except BaseException as exc:
                fail(item.keys, stage, exc)
                raise
            if prev is _MISSING:
                deliver(item.keys)
            else:
                yield _Keyed(item.keys, prev)

        return agen
    raise _NotCheckpointable(f"stage `{stage}` is a native op, which cannot carry item keys")


_MISSING = object()


def _instrument_pipes(pipes: Sequence[Any], tracker: Tracker) -> list[Any]:
    out: list[Any] = []
    for cfg in pipes:
        if isinstance(cfg, defs.PipeConfig):
            kind, fn = _op_kind(cfg.op)
            out.append(dataclasses.replace(cfg, op=_wrap_op(fn, kind, cfg.name, tracker)))
        elif isinstance(cfg, defs.AggregateConfig):
            op = cfg.op
            if type(op) is defs.Collate and not cfg.drop_last:
                out.append(cfg)
                out.append(defs.Pipe(tracker.collate, name="checkpoint/collate"))
            else:
                inner = defs.Collate(op.n) if type(op) is defs.Collate else op
                wrapped = _native.pipeline.KeyedAggregator(inner, bool(cfg.drop_last), tracker, cfg.name)
                out.append(dataclasses.replace(cfg, op=wrapped, drop_last=False))
        elif isinstance(cfg, defs.DisaggregateConfig):
            out.append(defs.Pipe(tracker.split, name="checkpoint/split"))
            out.append(cfg)
        elif isinstance(cfg, defs.PathVariantsConfig):
            raise _NotCheckpointable("path_variants steps do not carry item keys yet")
        elif isinstance(cfg, defs.PlacementConfig):
            raise _NotCheckpointable("to() regions do not carry item keys yet")
        else:
            raise _NotCheckpointable(f"a {type(cfg).__name__} step does not carry item keys")
    return out


def _instrument_source(src: Any, tracker: Tracker) -> Any:
    if isinstance(src, defs.SourceConfig):
        if not _is_stateful(src.source):
            raise _NotCheckpointable(
                f"the source ({type(src.source).__name__}) does not implement state_dict()/load_state_dict() "
                "(the torchdata Stateful protocol)"
            )
        try:
            i = tracker.add_input(src.source)
        except RuntimeError as e:
            raise _NotCheckpointable(str(e)) from e
        return dataclasses.replace(src, source=tracker.keyed_source(i))
    if isinstance(src, defs.MergeConfig):
        if src.op is not None:
            raise _NotCheckpointable("a custom merge op does not carry item keys")
        configs = tuple(
            dataclasses.replace(c, src=_instrument_source(c.src, tracker), pipes=_instrument_pipes(c.pipes, tracker))
            for c in src.pipeline_configs
        )
        return dataclasses.replace(src, pipeline_configs=configs)
    raise _NotCheckpointable(f"a {type(src).__name__} source does not carry item keys")


def instrument(src: Any, pipes: Sequence[Any]) -> tuple[Any, Sequence[Any], Tracker | str]:
    """The source and pipes of a checkpointable pipeline (items keyed, ops wrapped) and its tracker; or
    the originals and the reason the pipeline cannot be checkpointed."""
    tracker = Tracker()
    try:
        new_src = _instrument_source(src, tracker)
        new_pipes = _instrument_pipes(pipes, tracker)
    except _NotCheckpointable as e:
        return src, pipes, str(e)
    return new_src, new_pipes, tracker
