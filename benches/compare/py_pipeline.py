#!/usr/bin/env python3
"""Python-stage benchmark: spdl_rs.pipeline vs Meta's spdl.pipeline (SPDL 0.8.0).

Run it with each interpreter that has one of them installed (they live in different venvs):

    .venv/bin/python       benches/compare/py_pipeline.py --impl spdl_rs
    .venv-ft/bin/python    benches/compare/py_pipeline.py --impl spdl_rs      # free-threaded 3.13t
    .venv-peers/bin/python benches/compare/py_pipeline.py --impl spdl

Benchmarks (each in a fresh subprocess, so that its peak RSS is its own):
  (a) ``trivial``: a 3-stage pipeline of trivial Python functions over --items items (default 100,000);
  (b) ``images``: decode + resize to 224x224 + batch of 32 through ``load_image_batch`` in a pipeline, over
      the JPEG/PNG files in --images (skipped when no directory is given or it has no images);
  (c) ``graph``: a 3-input merge (as available), a 2-way ``PathVariants`` and a trivial stage, all trivial Python
      functions, over --items items, built from ``spdl.pipeline.defs`` configs (the same in both);
  (d) ``cpu``: a CPU-bound pure-Python stage (a tokenizer-like loop of about 1 ms per item) at concurrency
      1, 2 and 4 (``num_threads`` = concurrency), over --cpu-items items: the free-threading scaling test;
  (e) the peak RSS of each run (``ru_maxrss``).

Prints one JSON object per line: bench, impl, python, gil, items, seconds, items_per_s, cpu_seconds,
items_per_cpu_s (the process's CPU time over the timed loop, all threads), peak_rss_mb (the median of --repeat
runs for the rates).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time


def _builder(impl: str):
    if impl == "spdl_rs":
        from spdl_rs.pipeline import PipelineBuilder
    else:
        from spdl.pipeline import PipelineBuilder
    return PipelineBuilder


def _drain(pipeline, items: int) -> dict:
    """Iterates the whole pipeline; its wall and CPU time (all threads of the process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    with pipeline.auto_stop():
        for _ in pipeline:
            n += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert n == items, (n, items)
    return {"items": n, "seconds": dt, "cpu_seconds": cpu}


def bench_trivial(impl: str, items: int, num_threads: int) -> dict:
    PipelineBuilder = _builder(impl)

    def inc(x):
        return x + 1

    def double(x):
        return x * 2

    def dec(x):
        return x - 1

    pipeline = (
        PipelineBuilder()
        .add_source(range(items))
        .pipe(inc)
        .pipe(double)
        .pipe(dec)
        .add_sink(3)
        .build(num_threads=num_threads)
    )
    return _drain(pipeline, items)


def bench_graph(impl: str, items: int, num_threads: int) -> dict:
    if impl == "spdl_rs":
        from spdl_rs.pipeline import build_pipeline
        from spdl_rs.pipeline.defs import Merge, PathVariants, Pipe, PipelineConfig, SinkConfig, SourceConfig
    else:
        from spdl.pipeline import build_pipeline
        from spdl.pipeline.defs import Merge, PathVariants, Pipe, PipelineConfig, SinkConfig, SourceConfig

    def inc(x):
        return x + 1

    def double(x):
        return x * 2

    def dec(x):
        return x - 1

    def parity(x):
        return x % 2

    third = items // 3
    bounds = [(0, third), (third, 2 * third), (2 * third, items)]
    inputs = [PipelineConfig(src=SourceConfig(range(a, b)), pipes=[], sink=SinkConfig(3)) for a, b in bounds]
    cfg = PipelineConfig(
        src=Merge(inputs),
        pipes=[PathVariants(parity, [[Pipe(inc)], [Pipe(double)]]), Pipe(dec)],
        sink=SinkConfig(3),
    )
    pipeline = build_pipeline(cfg, num_threads=num_threads)
    return _drain(pipeline, items)


def _tokenize(x: int) -> int:
    """About 1 ms of pure-Python work (a tokenizer-like loop over a synthetic text)."""
    text = "the quick brown fox jumps over the lazy dog " * 40
    vocab: dict[str, int] = {}
    h = x
    for _ in range(20):
        for word in text.split():
            tok = vocab.setdefault(word, len(vocab))
            h = (h * 31 + tok) & 0xFFFFFFFF
    return h


def bench_cpu(impl: str, items: int, concurrency: int) -> dict:
    PipelineBuilder = _builder(impl)
    pipeline = (
        PipelineBuilder()
        .add_source(range(items))
        .pipe(_tokenize, concurrency=concurrency)
        .add_sink(3)
        .build(num_threads=concurrency)
    )
    return _drain(pipeline, items)


def _image_paths(directory: str) -> list[str]:
    exts = (".jpg", ".jpeg", ".png", ".webp")
    out = []
    for root, _dirs, files in os.walk(directory):
        out.extend(os.path.join(root, f) for f in sorted(files) if f.lower().endswith(exts))
    return sorted(out)


def bench_images(impl: str, directory: str, num_threads: int) -> dict:
    PipelineBuilder = _builder(impl)
    paths = _image_paths(directory)
    if impl == "spdl_rs":
        from spdl_rs.io import ops

        decode = ops.load_image_batch(224, 224)
    else:
        import spdl.io

        def decode(batch):
            # SPDL returns a CPUBuffer (no shape, no len); `to_numpy` makes it an array without a copy, as a
            # training loop would before handing it on.
            return spdl.io.to_numpy(spdl.io.load_image_batch(batch, width=224, height=224, pix_fmt="rgb24"))

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .aggregate(32)
        .pipe(decode, concurrency=num_threads)
        .add_sink(4)
        .build(num_threads=num_threads)
    )
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    with pipeline.auto_stop():
        for batch in pipeline:
            # spdl_rs: an spdl_rs.Buffer [N, H, W, C] (numpy.asarray views it in place); spdl: a numpy array.
            n += batch.shape[0]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"items": n, "seconds": dt, "cpu_seconds": cpu}


def _worker(args: argparse.Namespace) -> None:
    if args.bench == "trivial":
        r = bench_trivial(args.impl, args.items, args.num_threads)
    elif args.bench == "graph":
        r = bench_graph(args.impl, args.items, args.num_threads)
    elif args.bench.startswith("cpu"):
        r = bench_cpu(args.impl, args.cpu_items, int(args.bench[3:]))
    else:
        r = bench_images(args.impl, args.images, args.num_threads)
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(r))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["spdl_rs", "spdl"], required=True)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--images", default=None, help="a directory of JPEG/PNG files for the image benchmark")
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-items", type=int, default=2000, help="items of the CPU-bound benchmark")
    ap.add_argument("--only", default=None, help="comma-separated benchmarks to run (trivial, graph, cpu, images)")
    ap.add_argument("--bench", choices=["trivial", "graph", "cpu1", "cpu2", "cpu4", "images"], help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    benches = ["trivial", "graph", "cpu1", "cpu2", "cpu4"]
    if args.only:
        wanted = set(args.only.split(","))
        benches = [b for b in benches if b in wanted or (b.startswith("cpu") and "cpu" in wanted)]
    if args.images and _image_paths(args.images):
        benches.append("images")
    elif args.images:
        print(json.dumps({"bench": "images", "impl": args.impl, "skipped": f"no images in {args.images}"}))
    for bench in benches:
        runs = []
        for _ in range(args.repeat):
            cmd = [sys.executable, __file__, "--worker", "--bench", bench, "--impl", args.impl,
                   "--items", str(args.items), "--num-threads", str(args.num_threads),
                   "--cpu-items", str(args.cpu_items)]
            if args.images:
                cmd += ["--images", args.images]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs.append(json.loads(out))
        rates = [r["items"] / r["seconds"] for r in runs]
        per_cpu = [r["items"] / r["cpu_seconds"] for r in runs if r.get("cpu_seconds")]
        print(json.dumps({
            "bench": bench,
            "impl": args.impl,
            "python": platform.python_version() + ("t" if not gil else ""),
            "gil": gil,
            "num_threads": int(bench[3:]) if bench.startswith("cpu") else args.num_threads,
            "items": runs[0]["items"],
            "seconds": round(statistics.median(r["seconds"] for r in runs), 4),
            "items_per_s": round(statistics.median(rates), 1),
            "cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in runs), 4),
            "items_per_cpu_s": round(statistics.median(per_cpu), 1) if per_cpu else None,
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
        }), flush=True)


if __name__ == "__main__":
    main()
