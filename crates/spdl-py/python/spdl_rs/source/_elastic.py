"""Resuming a distributed job at another world size: the ranks' pipeline states merged into one."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from .. import _native

__all__ = ["merge_rank_states"]


def _delivered(epoch_state: dict[str, Any] | None, completed: bool, share: int) -> list[list[int]]:
    """The positions of its share a rank delivered in one epoch, as ``[start, end)`` spans."""
    if epoch_state is None:
        return [[0, share]] if completed and share > 0 else []
    spans = [[0, int(epoch_state["watermark"])]] if epoch_state["watermark"] > 0 else []
    spans += [[int(s), int(e)] for s, e in epoch_state["delivered"]]
    spans += [[int(f[0]), int(f[0]) + 1] for f in epoch_state["failures"]]
    return spans


def merge_rank_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merges the :py:meth:`~spdl_rs.pipeline.Pipeline.state_dict` of every rank of a job (each a pipeline over an
    :py:class:`~spdl_rs.source.ElasticSampler`, one source) into one state that a pipeline of **any** rank
    of **any** world size loads: over the union of the new ranks, every sample of the epoch not yet delivered
    anywhere is delivered once (padding aside), then the following epochs go on as if never interrupted.

    Gather the states first (e.g. ``torch.distributed.all_gather_object``); pass all of them, one per rank.

    Raises:
        ValueError: The states are not from one job's ranks (other samplers, missing or repeated ranks, more
            than one source).
    """
    if not states:
        raise ValueError("merge_rank_states needs the state of every rank, got none")
    inputs = []
    for s in states:
        if not isinstance(s, dict) or len(s.get("inputs", ())) != 1:
            raise ValueError("merge_rank_states takes pipeline states with exactly one source each")
        inputs.append(s["inputs"][0])

    def sampler_state(inp: dict[str, Any]) -> dict[str, Any]:
        src = inp["epochs"][0]["source"] if inp["epochs"] else inp["next_source"]
        if not isinstance(src, dict) or "world_size" not in src or "done" not in src:
            raise ValueError("merge_rank_states: the source is not an ElasticSampler")
        return src

    first = sampler_state(inputs[0])
    world_size = int(first["world_size"])
    ranks = sorted(int(sampler_state(inp)["rank"]) for inp in inputs)
    if ranks != list(range(world_size)):
        raise ValueError(f"merge_rank_states needs one state per rank 0..{world_size - 1}, got ranks {ranks}")
    by_rank = {int(sampler_state(inp)["rank"]): inp for inp in inputs}

    # Every epoch some rank has open or not yet begun: its start state, and each rank's part of it.
    open_epochs = sorted({int(e["epoch"]) for inp in inputs for e in inp["epochs"]})
    next_epoch = max(int(inp["next_epoch"]) for inp in inputs)
    merged_epochs = []
    failures_done = sum(int(inp["failures_done"]) for inp in inputs)
    for epoch in open_epochs:
        start = None
        for inp in inputs:
            for e in inp["epochs"]:
                if int(e["epoch"]) == epoch:
                    start = e["source"]
                    break
            if start is None and int(inp["next_epoch"]) == epoch:
                start = inp["next_source"]
            if start is not None:
                break
        assert start is not None  # the epoch is open somewhere
        start = dict(start, world_size=world_size)
        sampler = _native.source.ElasticSampler(
            int(start["n"]),
            rank=0,
            world_size=world_size,
            seed=int(start["seed"]),
            shuffle=bool(start["shuffle"]),
            num_partitions=int(start["num_partitions"]),
            drop_remainder=bool(start["drop_remainder"]),
        )
        sampler.load_state_dict(start)
        share = len(sampler)
        delivered = []
        for rank in range(world_size):
            inp = by_rank[rank]
            mine = next((e for e in inp["epochs"] if int(e["epoch"]) == epoch), None)
            failures_done += len(mine["failures"]) if mine is not None else 0
            delivered.append((rank, _delivered(mine, int(inp["next_epoch"]) > epoch, share)))
        progress = _native.source.ElasticSampler.merge_progress(start, delivered)
        done = sum(e - s for s, e in progress["done"])
        if done < int(start["n"]):
            merged_epochs.append(
                {"epoch": epoch, "source": progress, "watermark": 0, "delivered": [], "failures": []}
            )
    # The sampler's epoch runs ahead of the pipeline's epoch count by a fixed offset (set_epoch before
    # the first run); the next epoch starts with nothing delivered.
    inp0 = inputs[0]
    if inp0["epochs"]:
        offset = int(inp0["epochs"][0]["source"]["epoch"]) - int(inp0["epochs"][0]["epoch"])
    else:
        offset = int(inp0["next_source"]["epoch"]) - int(inp0["next_epoch"])
    next_source = dict(copy.deepcopy(first), epoch=next_epoch + offset, done=[], world_size=world_size)
    return {
        "version": states[0]["version"],
        "inputs": [
            {
                "epochs": merged_epochs,
                "next_epoch": next_epoch,
                "next_source": next_source,
                "failures_done": failures_done,
            }
        ],
    }
