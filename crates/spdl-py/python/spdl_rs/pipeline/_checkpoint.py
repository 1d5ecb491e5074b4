"""Whole-pipeline checkpoints for Python pipelines: what the consumer has received, saved so that a new
pipeline resumes with exactly the items not yet delivered.

The design is spdl-exec's ``checkpoint`` module (docs/ARCHITECTURE.md, "Whole-pipeline checkpoints"),
applied to a pipeline's configuration at build time: when every source implements the torchdata
``Stateful`` protocol (``state_dict()``/``load_state_dict()``), each item is wrapped with its key
``(input, epoch, index)`` (``index``: its position in the epoch the source enumerated), every op is wrapped
to pass the key on (and to record a failure against it), batches carry the keys of their items, and
:py:meth:`Pipeline.get_item` records the keys it hands out. The state holds, per input, the source's
``state_dict()`` at the start of each epoch not fully delivered, a watermark (every position below it is
delivered or failed), the delivered positions above it, and the failures. On resume the source is loaded
with that start state, enumerates the epoch again, and the delivered positions are skipped.

A source's protocol, as used here: ``state_dict()`` taken before ``iter(source)`` is the state from which
that iteration enumerates an epoch (the same items in the same order for the same state); after the epoch
is exhausted, ``state_dict()`` is the state of the next epoch; ``load_state_dict(state)`` restores one.
A source whose epochs do not come again in the same order (a distributed reader, a stream) says so with a
false ``deterministic_epoch_order`` attribute: a state taken in the middle of one of its epochs is then refused,
since skipping "the delivered positions" of a different order would skip the wrong items.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from . import defs
from ._op import _op_kind

__all__ = ["Tracker", "instrument"]

#: Version of the state's format.
_VERSION = 1


class _Keyed:
    """An item in flight with the keys of the source items it was made from."""

    __slots__ = ("keys", "value")

    def __init__(self, keys: list[tuple[int, int, int]], value: Any) -> None:
        self.keys = keys
        self.value = value

    def __repr__(self) -> str:
        return f"_Keyed({self.keys!r}, {self.value!r})"


class _Spans:
    """Positions as sorted, disjoint, non-adjacent ``[start, end)`` spans (few: one per gap an item still in
    flight leaves above the watermark)."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    @classmethod
    def from_pairs(cls, pairs: Any) -> _Spans:
        out = cls()
        last = None
        for pair in pairs:
            s, e = (int(x) for x in pair)
            if s >= e or (last is not None and s <= last):
                raise ValueError(f"delivered spans must be ascending, disjoint and non-empty; got {pairs!r:.200}")
            out.starts.append(s)
            out.ends.append(e)
            last = e
        return out

    def pairs(self) -> list[list[int]]:
        return [[s, e] for s, e in zip(self.starts, self.ends, strict=True)]

    def add(self, p: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, p) - 1
        if i >= 0 and p < ends[i]:
            return  # present
        left = i >= 0 and ends[i] == p
        right = i + 1 < len(starts) and starts[i + 1] == p + 1
        if left and right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif left:
            ends[i] = p + 1
        elif right:
            starts[i + 1] = p
        else:
            starts.insert(i + 1, p)
            ends.insert(i + 1, p + 1)

    def take_from(self, w: int) -> int:
        """``w``, or the end of the span starting at ``w`` (removed): the new watermark."""
        if self.starts and self.starts[0] == w:
            end = self.ends[0]
            del self.starts[0], self.ends[0]
            return end
        return w


class _Epoch:
    """The delivery log of one epoch of one input."""

    __slots__ = ("above", "failures", "start", "total", "watermark")

    def __init__(self, start: Any) -> None:
        self.start = start
        self.watermark = 0
        self.above = _Spans()
        self.total: int | None = None
        self.failures: list[tuple[int, str, str]] = []

    def mark(self, index: int) -> None:
        if index < self.watermark:
            return
        if index == self.watermark:
            self.watermark = self.above.take_from(index + 1)
        else:
            self.above.add(index)

    def complete(self) -> bool:
        return self.total is not None and self.watermark >= self.total


class _Input:
    """One input's log: its open epochs, where it goes next, and the saved epochs still to re-enumerate."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.epochs: dict[int, _Epoch] = {}
        self.next_epoch = 0
        self.next_source: Any = None
        self.failures_done = 0
        self.pending: list[dict[str, Any]] = []
        self.error: str | None = None

    def mark(self, epoch: int, index: int) -> None:
        e = self.epochs.get(epoch)
        if e is not None:
            e.mark(index)
            if e.complete():
                self.finish(epoch)

    def finish(self, epoch: int) -> None:
        e = self.epochs.pop(epoch, None)
        if e is not None:
            self.failures_done += len(e.failures)


class Tracker:
    """The checkpoint of one pipeline: its inputs, what was delivered, what failed."""

    def __init__(self) -> None:
        # Reentrant: a call that holds it runs user code (a source's state_dict, deepcopy) in which the
        # garbage collector may finalize an abandoned epoch generator of this tracker, whose `finally` comes
        # back here on the same thread.
        self._lock = threading.RLock()
        self._inputs: list[_Input] = []
        self._started = False

    # -- sources ---------------------------------------------------------------------------------------------

    def add_input(self, source: Any) -> int:
        self._inputs.append(_Input(source))
        return len(self._inputs) - 1

    def epoch_items(self, i: int) -> Iterator[_Keyed]:
        """One epoch of input ``i``, keyed, without what a loaded state says was delivered."""
        while True:
            epoch, it, skip_below, skip, resumed = self._begin(i)
            index = yielded = 0
            exhausted = False
            # The delivered spans above the watermark, passed in order as the epoch is enumerated again.
            spans = iter(skip)
            span = next(spans, None)
            try:
                for value in it:
                    while span is not None and index >= span[1]:
                        span = next(spans, None)
                    if index < skip_below or (span is not None and span[0] <= index):
                        index += 1
                        continue
                    key = (i, epoch, index)
                    index += 1
                    yielded += 1
                    yield _Keyed([key], value)
                exhausted = True
            finally:
                self._end(i, epoch, index, exhausted)
            # A resumed epoch with nothing left: go on with the next one (an empty epoch would end a
            # continuous source).
            if not (resumed and yielded == 0):
                return

    def _begin(self, i: int) -> tuple[int, Iterator[Any], int, list[list[int]], bool]:
        with self._lock:
            self._started = True
            inp = self._inputs[i]
            src = inp.source
            try:
                if inp.pending:
                    saved = inp.pending.pop(0)
                    src.load_state_dict(copy.deepcopy(saved["source"]))
                    it = iter(src)
                    e = _Epoch(saved["source"])
                    e.watermark = int(saved["watermark"])
                    e.above = _Spans.from_pairs(saved["delivered"])
                    e.failures = [tuple(f) for f in saved["failures"]]
                    inp.epochs[int(saved["epoch"])] = e
                    return int(saved["epoch"]), it, e.watermark, e.above.pairs(), True
                start = copy.deepcopy(src.state_dict())
                it = iter(src)
            except Exception as exc:
                inp.error = f"the source of input {i} failed to report or load its state: {exc!r}"
                raise
            epoch = inp.next_epoch
            inp.epochs[epoch] = _Epoch(start)
            inp.next_epoch = epoch + 1
            return epoch, it, 0, [], False

    def _end(self, i: int, epoch: int, total: int, exhausted: bool) -> None:
        if not exhausted:  # stopped mid-epoch (or the generator was dropped): the epoch stays open
            return
        with self._lock:
            inp = self._inputs[i]
            # The state after the epoch (a generator's `__iter__` moves the state on as it runs): where a
            # resumed pipeline with no epoch open starts.
            try:
                inp.next_source = copy.deepcopy(inp.source.state_dict())
            except Exception as exc:
                inp.error = f"the source of input {i} failed to report its state: {exc!r}"
                raise
            e = inp.epochs.get(epoch)
            if e is not None:
                e.total = total
                if e.complete():
                    inp.finish(epoch)

    # -- deliveries and failures -----------------------------------------------------------------------------

    def deliver(self, keys: Sequence[tuple[int, int, int]]) -> None:
        with self._lock:
            for i, epoch, index in keys:
                self._inputs[i].mark(epoch, index)

    def fail(self, keys: Sequence[tuple[int, int, int]], stage: str, exc: BaseException) -> None:
        cause = f"{type(exc).__name__}: {exc}"
        with self._lock:
            for i, epoch, index in keys:
                inp = self._inputs[i]
                e = inp.epochs.get(epoch)
                if e is not None:
                    e.failures.append((index, stage, cause))
                inp.mark(epoch, index)

    # -- state -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            inputs = []
            for i, inp in enumerate(self._inputs):
                if inp.error is not None:
                    raise RuntimeError(f"this pipeline's state cannot be saved: {inp.error}")
                next_source = inp.next_source
                if next_source is None and not inp.epochs and not inp.pending:  # not started: its current state
                    try:
                        next_source = copy.deepcopy(inp.source.state_dict())
                    except Exception as exc:
                        raise RuntimeError(
                            f"this pipeline's state cannot be saved: the source of input {i} failed to report its "
                            f"state: {exc!r}"
                        ) from exc
                if not getattr(inp.source, "deterministic_epoch_order", True):
                    started = [n for n, e in inp.epochs.items() if e.watermark > 0 or e.above.pairs()]
                    if started or inp.pending:
                        raise RuntimeError(
                            f"this pipeline's state cannot be saved in the middle of an epoch: the source of input {i} "
                            f"({type(inp.source).__name__}) does not enumerate an epoch in the same order again "
                            "(deterministic_epoch_order is false); save the state at an epoch boundary"
                        )
                epochs = [
                    {
                        "epoch": n,
                        "source": copy.deepcopy(e.start),
                        "watermark": e.watermark,
                        "delivered": e.above.pairs(),
                        "failures": [list(f) for f in e.failures],
                    }
                    for n, e in sorted(inp.epochs.items())
                ]
                epochs += copy.deepcopy(inp.pending)
                epochs.sort(key=lambda e: e["epoch"])
                inputs.append(
                    {
                        "epochs": epochs,
                        "next_epoch": inp.next_epoch,
                        "next_source": next_source,
                        "failures_done": inp.failures_done,
                    }
                )
            return {"version": _VERSION, "inputs": inputs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ValueError(f"not a pipeline state of format version {_VERSION}: {state!r:.200}")
        inputs = state.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != len(self._inputs):
            n = len(inputs) if isinstance(inputs, list) else "no"
            raise ValueError(f"the state has {n} inputs, this pipeline has {len(self._inputs)}")
        with self._lock:
            if self._started:
                raise RuntimeError("load_state_dict must be called before the pipeline starts")
            for i, (inp, saved) in enumerate(zip(self._inputs, inputs, strict=True)):
                try:
                    epochs = sorted(saved["epochs"], key=lambda e: e["epoch"])
                    next_epoch = int(saved["next_epoch"])
                    next_source = saved["next_source"]
                    failures_done = int(saved["failures_done"])
                    for e in epochs:
                        _Spans.from_pairs(e["delivered"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"input {i} of the state is malformed: {exc!r}") from exc
                if not epochs:
                    inp.source.load_state_dict(copy.deepcopy(next_source))
                inp.pending = copy.deepcopy(epochs)
                inp.epochs = {}
                inp.next_epoch = next_epoch
                inp.next_source = copy.deepcopy(next_source)
                inp.failures_done = failures_done
                inp.error = None


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
        i = tracker.add_input(src.source)
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
