"""The peer loaders of the comparison, one job each, run in a process of their own.

Usage (compare.py does this; by hand for debugging):

    python runners.py RUNNER --list FILES.txt [--job resize|eval|train] [--threads 2] [--batch-size 32] [--size 224]

Every runner does the same job: read the listed files, decode, transform to SIZE x SIZE, and collect batches of
BATCH_SIZE as one array. The jobs (spdl-rs's `spdl bench --transform` of the same name in brackets):

- resize [resize]: straight to SIZE x SIZE;
- eval [center-crop]: ImageNet eval, shorter side to SIZE*256/224 then the center SIZE x SIZE;
- train [random-resized-crop]: torchvision's RandomResizedCrop(SIZE) + RandomHorizontalFlip().

A runner that cannot express a job exits with status 3 and says why on stderr. It prints one JSON object on stdout:

    {"runner", "job", "images", "batches", "seconds", "first_batch_seconds", "cpu_start", "cpu_seconds", "shape"}

`seconds` is the wall time from the start of loading to the last batch; `cpu_start` is the CPU time the process
had used before that (interpreter start, imports), so the driver can charge only the loading to the runner;
`cpu_seconds` is the CPU time of the process and its reaped children over the loading alone.
Progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

RUNNERS: dict[str, Callable[[argparse.Namespace, list[str]], Iterable[Any]]] = {}
JOBS = ("resize", "eval", "train")


class CannotExpress(Exception):
    """The runner has no way to do this job (exit status 3)."""


def eval_resize(size: int) -> int:
    """The shorter side before the center crop of the eval job (256 for 224, as spdl-rs's center-crop)."""
    return size * 256 // 224


def runner(name: str):
    """Registers a runner: it imports and builds everything up front (not timed), and returns an iterable whose
    iteration is the timed job, yielding batches (anything with a `.shape` whose first entry is the batch size)."""

    def register(fn):
        RUNNERS[name] = fn
        return fn

    return register


def cpu_time() -> float:
    """CPU seconds of this process and of every child it has reaped (DataLoader workers, once joined)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@runner("spdl-0.8")
def run_spdl(args: argparse.Namespace, paths: list[str]) -> Iterable[Any]:
    """Meta's SPDL: its pipeline, batches of paths, `load_image_batch` (FFmpeg decode + scale) per batch.

    eval: one FFmpeg filter graph for the batch (scale the shorter side, crop the center). train cannot be expressed:
    `load_image_batch` applies one filter graph to the whole batch, and the crop differs per image."""
    if args.job == "train":
        raise CannotExpress("spdl 0.8 load_image_batch applies one filter graph to a whole batch; "
                            "RandomResizedCrop needs a different crop per image")
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    size = args.size
    short = eval_resize(size)
    # FFmpeg's default scale flags (bicubic), as load_image_batch's own resize uses.
    eval_filter = (f"scale=w='if(lt(iw,ih),{short},-2)':h='if(lt(iw,ih),-2,{short})',"
                   f"crop={size}:{size},format=rgb24")

    def load(batch: list[str]):
        if args.job == "eval":
            buffer = spdl.io.load_image_batch(batch, width=None, height=None, pix_fmt=None, filter_desc=eval_filter)
        else:
            buffer = spdl.io.load_image_batch(batch, width=size, height=size, pix_fmt="rgb24")
        return spdl.io.to_numpy(buffer)

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .aggregate(args.batch_size)
        .pipe(load, concurrency=args.threads, name="load_image_batch")
        .add_sink(3)
        .build(num_threads=args.threads)
    )

    def batches() -> Iterator[Any]:
        with pipeline.auto_stop():
            yield from pipeline

    return batches()


@runner("pillow")
def run_pillow(args: argparse.Namespace, paths: list[str]) -> Iterable[Any]:
    """Pillow in a plain loop on one thread: open, decode to RGB, bilinear resize, stack 32 into a numpy batch."""
    if args.job != "resize":
        raise CannotExpress("the Pillow loop runs the resize job only")
    import numpy as np
    from PIL import Image

    size = (args.size, args.size)

    def batches() -> Iterator[Any]:
        for start in range(0, len(paths), args.batch_size):
            images = []
            for path in paths[start : start + args.batch_size]:
                with Image.open(path) as image:
                    images.append(np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR)))
            yield np.stack(images)

    return batches()


def _torch_loader(args: argparse.Namespace, paths: list[str], workers: int, decoder: str) -> Iterable[Any]:
    import torch
    import torchvision
    from torch.utils.data import DataLoader, Dataset

    size = [args.size, args.size]
    if decoder == "pil":
        if args.job != "resize":
            raise CannotExpress("the PIL DataLoader runs the resize job only (the decode_jpeg one runs every job)")
        from PIL import Image
        from torchvision import transforms

        transform = transforms.Compose([transforms.Resize(size), transforms.PILToTensor()])

        def load(path: str):
            with Image.open(path) as image:
                return transform(image.convert("RGB"))

    else:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file
        from torchvision.transforms import v2

        # torchvision's v2 transforms on the uint8 tensor (antialias on, their default).
        if args.job == "resize":
            transform = v2.Resize(size, antialias=True)
        elif args.job == "eval":
            transform = v2.Compose([v2.Resize(eval_resize(args.size), antialias=True), v2.CenterCrop(args.size)])
        else:
            transform = v2.Compose([v2.RandomResizedCrop(args.size, antialias=True), v2.RandomHorizontalFlip()])

        def load(path: str):
            return transform(decode_jpeg(read_file(path), mode=ImageReadMode.RGB))

    class Files(Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, index: int):
            return load(paths[index])

    if workers == 0:
        # DataLoader workers run with one intra-op thread (torch sets it in each worker); do the same in-process.
        # With the default (one per core), OpenMP threads spin between the small per-image ops and, on a 2-core
        # machine, triple the CPU time and the wall time of this job: that would measure a misconfiguration.
        torch.set_num_threads(1)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"intra-op threads {torch.get_num_threads()}", file=sys.stderr)
    # Workers start (fork) when iteration starts, inside the timed window, as they do every epoch in training.
    return DataLoader(Files(), batch_size=args.batch_size, num_workers=workers, shuffle=False)


@runner("torch-pil-w0")
def run_torch_pil_w0(args, paths):
    """torch DataLoader, in-process (num_workers=0), PIL decode + torchvision Resize."""
    return _torch_loader(args, paths, 0, "pil")


@runner("torch-pil-w2")
def run_torch_pil_w2(args, paths):
    """torch DataLoader with 2 worker processes, PIL decode + torchvision Resize."""
    return _torch_loader(args, paths, args.threads, "pil")


@runner("torch-tv-w0")
def run_torch_tv_w0(args, paths):
    """torch DataLoader, in-process, torchvision.io.decode_jpeg + tensor resize."""
    return _torch_loader(args, paths, 0, "tv")


@runner("torch-tv-w2")
def run_torch_tv_w2(args, paths):
    """torch DataLoader with 2 worker processes, torchvision.io.decode_jpeg + tensor resize."""
    return _torch_loader(args, paths, args.threads, "tv")


@runner("dali-cpu")
def run_dali(args: argparse.Namespace, paths: list[str]) -> Iterable[Any]:
    """NVIDIA DALI on the CPU only (`device_id=None`): an external source feeds the files' bytes batch by batch
    (so the last batch is short and every image is decoded once), `num_threads` = --threads.
    resize: decoders.image + resize(SIZE x SIZE); eval: decoders.image + resize(shorter side) + crop (centered);
    train: decoders.image_random_crop (area 8-100%, aspect 3/4-4/3, torchvision's defaults) + resize + flip."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    size, bs = args.size, args.batch_size

    def source():
        for start in range(0, len(paths), bs):
            batch = []
            for path in paths[start : start + bs]:
                with open(path, "rb") as f:
                    batch.append(np.frombuffer(f.read(), dtype=np.uint8))
            yield batch

    @pipeline_def(batch_size=bs, num_threads=args.threads, device_id=None, seed=0)
    def pipe():
        jpegs = fn.external_source(source=source, batch=True, no_copy=True)
        if args.job == "train":
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=size, resize_y=size)
            return fn.flip(images, horizontal=fn.random.coin_flip())
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        if args.job == "resize":
            return fn.resize(images, resize_x=size, resize_y=size)
        images = fn.resize(images, resize_shorter=eval_resize(size))
        return fn.crop(images, crop=(size, size))

    pipeline = pipe()
    pipeline.build()

    def batches() -> Iterator[Any]:
        while True:
            try:
                (out,) = pipeline.run()
            except StopIteration:
                return
            yield out.as_array()

    return batches()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runner", choices=sorted(RUNNERS))
    parser.add_argument("--list", required=True, help="file listing one image path per line")
    parser.add_argument("--job", choices=JOBS, default="resize")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()

    with open(args.list, encoding="utf-8") as listing:
        paths = [line.strip() for line in listing if line.strip()]
    if not paths:
        print(f"{args.list} lists no files", file=sys.stderr)
        return 2

    try:
        batches = RUNNERS[args.runner](args, paths)
    except CannotExpress as err:
        print(f"cannot express the {args.job} job: {err}", file=sys.stderr)
        return 3
    cpu_start = cpu_time()
    start = time.perf_counter()
    first_batch = None
    images = 0
    count = 0
    shape = None
    for batch in batches:
        if first_batch is None:
            first_batch = time.perf_counter() - start
        shape = list(batch.shape)
        images += shape[0]
        count += 1
    seconds = time.perf_counter() - start
    # Closing the generator stops the pipeline / joins the DataLoader workers, so their CPU time is counted.
    batches = None
    cpu_seconds = cpu_time() - cpu_start
    print(json.dumps({
        "runner": args.runner,
        "job": args.job,
        "images": images,
        "batches": count,
        "seconds": seconds,
        "first_batch_seconds": first_batch,
        "cpu_start": cpu_start,
        "cpu_seconds": cpu_seconds,
        "shape": shape,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
