"""Sharded loading on several ranks with a checkpoint in the middle of an epoch, on CPU.

    python -m torch.distributed.run --nproc_per_node 2 crates/spdl-py/examples/torchrun_elastic.py --out DIR

Each rank builds an spdl_rs pipeline over its share of the dataset (:py:class:`spdl_rs.source.ElasticSampler`:
the epoch's order is defined over canonical partitions, the same for every world size, and every rank gets
the same number of items). The job is interrupted mid-epoch: every rank saves its pipeline's
``state_dict()``, the states are gathered (gloo) and merged (:py:func:`spdl_rs.source.merge_rank_states`), and
new pipelines resume from the merged state, which any world size could load. Rank 0 checks that the ranks'
outputs are disjoint (padding aside) and together complete, and that every rank made the same number of
batches, then the next epoch runs uninterrupted and is checked the same way. Each rank writes what it saw to
``DIR/rank{N}.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch.distributed as dist

from spdl_rs.pipeline import PipelineBuilder
from spdl_rs.source import ElasticSampler, merge_rank_states


def load(index: int) -> dict[str, int]:
    """Stands for reading and decoding sample ``index``."""
    return {"index": index, "value": index * index}


def build(sampler: ElasticSampler, batch_size: int):  # noqa: ANN201
    return (
        PipelineBuilder()
        .add_source(sampler)
        .pipe(load, concurrency=2)
        .aggregate(batch_size)
        .add_sink(2)
        .build(num_threads=2)
    )


def check(world: int, n: int, seen: list[list[int]], batches: list[int], what: str) -> None:
    counts = Counter(i for s in seen for i in s)
    assert set(counts) == set(range(n)), f"{what}: {n - len(counts)} samples missing"
    assert sum(counts.values()) - n < 2 * world, f"{what}: more repeats than padding explains"
    assert len(set(batches)) == 1, f"{what}: batch counts differ across ranks: {batches}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=1001)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--stop-after", type=int, default=7, help="batches each rank takes before the interruption")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def sampler() -> ElasticSampler:
        return ElasticSampler(args.samples, rank=rank, world_size=world, seed=2024, num_partitions=16)

    # Epoch 0, interrupted after a few batches (what the pipeline held in flight is lost with it).
    first = build(sampler(), args.batch_size)
    seen: list[int] = []
    it = first.get_iterator(timeout=60)
    for _ in range(args.stop_after):
        seen += [x["index"] for x in next(it)]
    state = first.state_dict()
    first.stop()
    states: list = [None] * world
    dist.all_gather_object(states, state)
    merged = merge_rank_states(states)

    # Resumed: the rest of epoch 0.
    resumed = build(sampler(), args.batch_size)
    resumed.load_state_dict(merged)
    batches = 0
    with resumed.auto_stop():
        for batch in resumed.get_iterator(timeout=60):
            seen += [x["index"] for x in batch]
            batches += 1

    # Epoch 1, uninterrupted.
    s = sampler()
    s.set_epoch(1)
    expected_batches = s.num_batches(args.batch_size)
    full = build(s, args.batch_size)
    epoch1: list[int] = []
    batches1 = 0
    with full.auto_stop():
        for batch in full.get_iterator(timeout=60):
            epoch1 += [x["index"] for x in batch]
            batches1 += 1
    assert batches1 == expected_batches, (batches1, expected_batches)

    report = {"rank": rank, "world": world, "epoch0": seen, "resumed_batches": batches, "epoch1": epoch1,
              "epoch1_batches": batches1}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    reports: list = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        check(world, args.samples, [r["epoch0"] for r in reports], [r["resumed_batches"] for r in reports], "epoch 0")
        check(world, args.samples, [r["epoch1"] for r in reports], [r["epoch1_batches"] for r in reports], "epoch 1")
        print(f"ok: {world} ranks, {args.samples} samples, epoch 0 resumed from a merged checkpoint, epoch 1 whole",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
