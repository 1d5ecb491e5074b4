"""Ray Data decodes, spdl_rs feeds the trainer: an image folder through a Ray Data job whose CPU workers decode
with spdl-rs (no GIL), split across trainer ranks with ``streaming_split``, each rank's last steps (collate, pin,
host-to-device) in an spdl_rs pipeline.

    .venv/bin/python examples/ray_decode.py --data /tmp/bench-data --num-cpus 2 --world-size 2 --epochs 2

On a real cluster, ``--address auto`` joins it instead of starting a local one, and each rank runs in its own
trainer process (e.g. ``ray.train.get_dataset_shard("train")`` instead of ``streaming_split`` here). Needs
``ray[data]``; torch is optional (without it batches stay NumPy arrays). See docs/scale-out.md.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from spdl_rs.pipeline import PipelineBuilder
from spdl_rs.ray import ImageBatchDecoder, RayDataSource, import_ray
from spdl_rs.source import list_dataset


def build_dataset(ray: Any, root: Path, size: int, map_batch_size: int, seed: int, limit: int | None) -> Any:
    """Paths and labels of an image folder, decoded by spdl-rs in Ray's CPU workers (ImageNet train transform)."""
    keys, labels, _classes = list_dataset(root)
    rows = [{"path": str(root / key), "label": label, "id": i} for i, (key, label) in enumerate(zip(keys, labels))]
    ds = ray.data.from_items(rows[:limit] if limit else rows)
    # `id` seeds each image's crop and flip with `seed`: reproducible whichever worker decodes it.
    decoder = ImageBatchDecoder(size, size, column="path", transform="random-resized-crop", seed=seed,
                                key_column="id", strict=False)
    return ds.map_batches(decoder, batch_size=map_batch_size)


def rank_pipeline(source: RayDataSource, device: str | None) -> Any:
    """The trainer side: collate (NumPy -> torch, no copy), pin, copy to the GPU; Ray did the decoding."""
    torch: Any
    try:
        import torch
    except ImportError:
        torch = None

    def collate(batch: dict[str, Any]) -> tuple[Any, Any]:
        if torch is None:
            return batch["image"], batch["label"]
        with warnings.catch_warnings():
            # Ray hands out read-only views of its object store; the tensors are only read (copied to the GPU).
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(batch["image"]), torch.from_numpy(batch["label"])

    builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(source).pipe(collate, name="collate")
    if torch is not None and device is not None and device.startswith("cuda"):
        builder = builder.pipe(lambda b: (b[0].pin_memory(), b[1].pin_memory()), name="pin")
        builder = builder.pipe(lambda b: (b[0].to(device, non_blocking=True), b[1].to(device, non_blocking=True)),
                               name="h2d")
    return builder.add_sink(2).build(num_threads=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an image folder (class sub-folders)")
    parser.add_argument("--limit", type=int, default=None, help="the first N images only")
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: start a local one)")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count(), help="CPUs of the local cluster")
    parser.add_argument("--world-size", type=int, default=2, help="trainer ranks (streaming_split)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32, help="the trainer's batch size")
    parser.add_argument("--map-batch-size", type=int, default=64, help="images per decode task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="e.g. cuda:0 (default: stay on the host)")
    args = parser.parse_args()

    ray = import_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    try:
        ds = build_dataset(ray, args.data, args.size, args.map_batch_size, args.seed, args.limit)
        shards = ds.streaming_split(args.world_size, equal=True)
        sources = [RayDataSource(shard, batch_size=args.batch_size) for shard in shards]
        counts = [0] * args.world_size
        errors: list[BaseException] = []

        def run_rank(rank: int) -> None:
            # Every rank must iterate each epoch of its shard: streaming_split's consumers advance together.
            try:
                for epoch in range(args.epochs):
                    pipeline = rank_pipeline(sources[rank], args.device)
                    with pipeline.auto_stop():
                        for images, _labels in pipeline:
                            counts[rank] += len(images)
                    # An epoch boundary: the one place a RayDataSource state is exact to resume from.
                    print(f"rank {rank} epoch {epoch} done, source state {sources[rank].state_dict()}")
                    if rank == 0:
                        print(pipeline.stats_table())
            except BaseException as exc:
                errors.append(exc)

        start = time.perf_counter()
        threads = [threading.Thread(target=run_rank, args=(r,)) for r in range(args.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        if errors:
            raise errors[0]
        total = sum(counts)
        print(f"{total} images in {seconds:.1f} s ({total / seconds:.0f} img/s) over {args.world_size} ranks: {counts}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
