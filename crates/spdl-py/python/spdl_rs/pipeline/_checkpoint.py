"""Whole-pipeline checkpoints for Python pipelines: what the consumer has received, saved so that a new
pipeline resumes with exactly the items not yet delivered.

The checkpoint itself is spdl-exec's ``checkpoint`` module (docs/ARCHITECTURE.md, "Whole-pipeline
checkpoints"), reached through ``_native.pipeline.CheckpointTracker``: it keeps, per input, the source's state at the
start of each epoch not fully delivered, a watermark (every position below it is delivered or failed), the
delivered positions above it and the failures; it enumerates each epoch (``iter(source)``) and, on resume,
loads the saved start state and skips the delivered positions. What stays here is what the engine cannot
see: when every source implements the torchdata ``Stateful`` protocol (``state_dict()``/``load_state_dict()``),
each item travels through the Python steps as a :py:class:`_Keyed` with its key ``(input, epoch, index)``
(``index``: its position in the epoch the source enumerated), every op is wrapped to pass the key on (and to
record a failure against it), batches carry the keys of their items, and :py:meth:`Pipeline.get_item` records
the keys it hands out. The sources' states, Python objects, reach the engine pickled (as base64 text), and
:py:meth:`Tracker.state_dict` gives them back as objects, in the ``dict`` format of the protocol.

A source's protocol, as used here: ``state_dict()`` taken before ``iter(source)`` is the state from which
that iteration enumerates an epoch (the same items in the same order for the same state); after the epoch
is exhausted, ``state_dict()`` is the state of the next epoch; ``load_state_dict(state)`` restores one.
A source whose epochs do not come again in the same order (a distributed reader, a stream) says so with a
false ``deterministic_epoch_order`` attribute: a state taken in the middle of one of its epochs is then refused,
since skipping "the delivered positions" of a different order would skip the wrong items.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from .. import _native
from . import defs
from ._op import _op_kind

__all__ = ["Tracker", "instrument"]

#: Version of the state's format (the engine's).
_VERSION = 1


class _Keyed:
    """An item in flight with the keys of the source items it was made from."""

    __slots__ = ("keys", "value")

    def __init__(self, keys: list[tuple[int, int, int]], value: Any) -> None:
        self.keys = keys
        self.value = value

    def __repr__(self) -> str:
        return f"_Keyed({self.keys!r}, {self.value!r})"


def _encode(state: Any) -> str:
    """A source's state as the text the engine keeps (a snapshot: later changes to ``state`` do not show)."""
    return base64.b64encode(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def _decode(text: str) -> Any:
    """A state from :py:func:`_encode`'s text (only text this module made reaches it)."""
    return pickle.loads(base64.b64decode(text))  # noqa: S301


def _epoch_to_engine(e: Any) -> Any:
    if not isinstance(e, dict):
        return e
    out = dict(e)
    if "source" in e:
        out["source"] = _encode(e["source"])
    failures = e.get("failures")
    if isinstance(failures, list):
        out["failures"] = [
            {"index": f[0], "stage": f[1], "cause": f[2]} if isinstance(f, (list, tuple)) and len(f) == 3 else f
            for f in failures
        ]
    return out


def _input_to_engine(inp: Any) -> Any:
    if not isinstance(inp, dict):
        return inp
    out = dict(inp)
    if "next_source" in inp:
        out["next_source"] = _encode(inp["next_source"])
    epochs = inp.get("epochs")
    if isinstance(epochs, list):
        out["epochs"] = [_epoch_to_engine(e) for e in epochs]
    return out


class Tracker:
    """The checkpoint of one pipeline (the engine's): its inputs, what was delivered, what failed."""

    def __init__(self) -> None:
        self._native = _native.pipeline.CheckpointTracker(_encode, _decode)

    # -- sources ---------------------------------------------------------------------------------------------

    def add_input(self, source: Any) -> int:
        """Registers ``source`` (its state is read now).

        Raises:
            RuntimeError: The source failed to report its state (or it cannot be pickled).
        """
        return self._native.add_input(
            source,
            deterministic_epoch_order=bool(getattr(source, "deterministic_epoch_order", True)),
            name=type(source).__name__,
        )

    def epoch_items(self, i: int) -> Iterator[_Keyed]:
        """One epoch of input ``i``, keyed, without what a loaded state says was delivered."""
        for inp, epoch, index, value in self._native.epoch(i):
            yield _Keyed([(inp, epoch, index)], value)

    # -- deliveries and failures -----------------------------------------------------------------------------

    def deliver(self, keys: Sequence[tuple[int, int, int]]) -> None:
        self._native.deliver(list(keys))

    def fail(self, keys: Sequence[tuple[int, int, int]], stage: str, exc: BaseException) -> None:
        self._native.fail(list(keys), stage, f"{type(exc).__name__}: {exc}")

    # -- state -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self._native.state_json())
        for inp in state["inputs"]:
            for e in inp["epochs"]:
                e["source"] = _decode(e["source"])
                e["failures"] = [[f["index"], f["stage"], f["cause"]] for f in e["failures"]]
            inp["next_source"] = _decode(inp["next_source"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"not a pipeline state of format version {_VERSION}: {state!r:.200}")
        out = dict(state)
        inputs = state.get("inputs")
        try:
            if isinstance(inputs, list):
                out["inputs"] = [_input_to_engine(inp) for inp in inputs]
            text = json.dumps(out)
        except Exception as exc:
            raise ValueError(f"not a pipeline state of format version {_VERSION}: {exc!r}") from exc
        self._native.load_json(text)


class _Unsupported:
    """Stands for the tracker of a pipeline that cannot be checkpointed, and says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def _refuse(self) -> RuntimeError:
        return RuntimeError(f"this pipeline cannot be checkpointed: {self.reason}")

    def state_dict(self) -> dict[str, Any]:
        raise self._refuse()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise self._refuse()


class _KeyedSource:
    """A checkpointable source as keyed items: each ``iter()`` is one epoch."""

    def __init__(self, tracker: Tracker, i: int) -> None:
        self._tracker = tracker
        self._i = i

    def __iter__(self) -> Iterator[_Keyed]:
        return self._tracker.epoch_items(self._i)


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
    output (no output) counts as delivered."""
    deliver, fail = tracker.deliver, tracker.fail
    if kind == "sync":

        def call(item: _Keyed) -> Any:
            try:
                out = op(item.value)
            except BaseException as exc:
                fail(item.keys, stage, exc)
                raise
            if out is None:
                deliver(item.keys)
                return None
            return _Keyed(item.keys, out)

        return call
    if kind == "async":

        async def acall(item: _Keyed) -> Any:
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
        def gen(item: _Keyed) -> Iterator[Any]:
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

        async def agen(item: _Keyed) -> AsyncIterator[Any]:
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


def _collate(batch: list[_Keyed]) -> _Keyed:
    keys: list[tuple[int, int, int]] = []
    values = []
    for k in batch:
        keys += k.keys
        values.append(k.value)
    return _Keyed(keys, values)


def _split_for(tracker: Tracker) -> Any:
    def split(batch: _Keyed) -> list[_Keyed]:
        values = list(batch.value)
        keys = batch.keys
        if len(keys) == len(values):
            return [_Keyed([k], v) for k, v in zip(keys, values, strict=True)]
        if not values:
            tracker.deliver(keys)
            return []
        return [_Keyed([], v) for v in values[:-1]] + [_Keyed(keys, values[-1])]

    return split


class _KeyedAggregator:
    """A custom aggregator (or ``drop_last``) over keyed items: an output carries the keys of every item
    accumulated since the previous output; what ``drop_last`` discards counts as delivered."""

    def __init__(self, inner: Any, drop_last: bool, tracker: Tracker, name: str) -> None:
        self._inner = inner
        self._drop_last = drop_last
        self._tracker = tracker
        self._keys: list[tuple[int, int, int]] = []
        self.name = name

    def accumulate(self, item: _Keyed) -> Any:
        self._keys += item.keys
        try:
            out = self._inner.accumulate(item.value)
        except BaseException as exc:
            keys, self._keys = self._keys, []
            self._tracker.fail(keys, self.name, exc)
            raise
        if out is None:
            return None
        keys, self._keys = self._keys, []
        return _Keyed(keys, out)

    def flush(self) -> Any:
        keys, self._keys = self._keys, []
        out = self._inner.flush()
        if out is None or self._drop_last:
            self._tracker.deliver(keys)
            return None
        return _Keyed(keys, out)


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
                out.append(defs.Pipe(_collate, name="checkpoint/collate"))
            else:
                inner = defs.Collate(op.n) if type(op) is defs.Collate else op
                wrapped = _KeyedAggregator(inner, bool(cfg.drop_last), tracker, cfg.name)
                out.append(dataclasses.replace(cfg, op=wrapped, drop_last=False))
        elif isinstance(cfg, defs.DisaggregateConfig):
            out.append(defs.Pipe(_split_for(tracker), name="checkpoint/split"))
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
        return dataclasses.replace(src, source=_KeyedSource(tracker, i))
    if isinstance(src, defs.MergeConfig):
        if src.op is not None:
            raise _NotCheckpointable("a custom merge op does not carry item keys")
        configs = tuple(
            dataclasses.replace(c, src=_instrument_source(c.src, tracker), pipes=_instrument_pipes(c.pipes, tracker))
            for c in src.pipeline_configs
        )
        return dataclasses.replace(src, pipeline_configs=configs)
    raise _NotCheckpointable(f"a {type(src).__name__} source does not carry item keys")


def instrument(src: Any, pipes: Sequence[Any]) -> tuple[Any, Sequence[Any], Tracker | _Unsupported]:
    """The source and pipes of a checkpointable pipeline (items keyed, ops wrapped) and its tracker; or
    the originals and the reason the pipeline cannot be checkpointed."""
    tracker = Tracker()
    try:
        new_src = _instrument_source(src, tracker)
        new_pipes = _instrument_pipes(pipes, tracker)
    except _NotCheckpointable as e:
        return src, pipes, _Unsupported(str(e))
    return new_src, new_pipes, tracker


def unwrap(tracker: Tracker | _Unsupported | None, value: Any) -> Any:
    """What the consumer gets: a keyed item's value, its keys recorded as delivered."""
    if isinstance(value, _Keyed) and isinstance(tracker, Tracker):
        tracker.deliver(value.keys)
        return value.value
    return value
