"""Ray Data + spdl_rs decode against Ray Data + Pillow decode, side by side on one local Ray cluster.

Both runners read the same JPEGs with ``ray.data.read_binary_files`` and decode + resize each batch of 32 to
224x224 RGB in ``map_batches`` (as Ray tasks, one CPU each), and the driver iterates the decoded batches:

- ``spdl_rs``: :py:class:`spdl_rs.ray.ImageBatchDecoder` (``spdl_rs.io.load_image_batch``, one decoding thread
  per task, bilinear resize);
- ``pil``: Pillow, the loop of the comparison's Pillow runner (``Image.open(...).convert("RGB").resize(size,
  BILINEAR)``, then ``numpy.stack``).

One ``ray.init(num_cpus=N)`` for the whole run; a warm-up round of each runner first (worker start, imports),
then the runners alternate, ``--rounds`` times. Per run: images/s (wall time from the first request to the last
batch on the driver) and CPU seconds of the whole cluster: user + system time of the driver and every process
under it (GCS, raylet, workers, actors, agents), sampled from /proc every 50 ms by a separate process, and of
the Ray workers alone. The report gives medians.

Run with an interpreter where ``ray[data]``, ``spdl_rs`` and Pillow import (the repository's ``.venv``):

    .venv/bin/python benches/compare/ray_bench.py --data /tmp/bench-data --rounds 5 --docs docs/benchmarks.md

``--docs`` writes (or rewrites) the "## Ray Data" section of that file and nothing else.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SECTION = "## Ray Data"
IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".JPG", ".JPEG"}
TICKS = os.sysconf("SC_CLK_TCK")


def pil_decode(batch: dict[str, Any], size: tuple[int, int] = (224, 224), column: str = "bytes") -> dict[str, Any]:
    """The Pillow runner's decode: each image (encoded bytes, or a path to read) decoded, converted to RGB and
    resized bilinearly, then stacked."""
    import numpy as np
    from PIL import Image

    images = []
    for data in batch[column]:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else str(data)) as image:
            images.append(np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR)))
    return {"image": np.stack(images) if images else np.zeros((0, size[1], size[0], 3), np.uint8)}


class PilDecoder:
    """:py:func:`pil_decode` as a class, for an actor pool."""

    def __init__(self, size: tuple[int, int], column: str) -> None:
        self.size, self.column = size, column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return pil_decode(batch, self.size, self.column)


def _proc_table() -> dict[int, tuple[int, float, bool]]:
    """pid -> (ppid, user + system CPU seconds, is a Ray worker) for every process readable."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is the state (field 3 of stat); utime and stime are fields 14 and 15.
        ppid = int(fields[1])
        cpu = (int(fields[11]) + int(fields[12])) / TICKS
        worker = b"default_worker.py" in cmdline or cmdline.startswith(b"ray::")
        table[int(entry)] = (ppid, cpu, worker)
    return table


def _tree(table: dict[int, tuple[int, float, bool]], root: int, exclude: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu, _w) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid == exclude:
            continue
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def sampler_main(root: int, interval: float) -> None:
    """The CPU sampler (a process of its own, left out of what it measures): every ``interval`` seconds, the
    user + system time of ``root`` and each process under it. A process seen at the first sample counts from
    there, a later one from its start (0); each counts up to its last sample, so a process that exits during
    the run (an actor torn down at the end of a dataset) is counted, less its last ``interval``, and nothing is
    counted twice (reaped children's time, which moves into the parent's, is not read). Prints "ready" after the
    first sample, samples until a line (or EOF) on stdin, then prints the totals as JSON."""
    import select

    me = os.getpid()
    first: dict[int, float] = {}
    last: dict[int, tuple[float, bool]] = {}
    initial = True
    while True:
        table = _proc_table()
        for pid in _tree(table, root, me):
            _ppid, cpu, worker = table[pid]
            if pid not in first:
                first[pid] = cpu if initial else 0.0
            last[pid] = (cpu, worker)
        if initial:
            print("ready", flush=True)
            initial = False
        if select.select([sys.stdin], [], [], interval)[0]:
            sys.stdin.readline()
            break
    table = _proc_table()  # a last sample of what is still alive
    for pid in _tree(table, root, me):
        if pid in last:
            last[pid] = (table[pid][1], table[pid][2])
    total = sum(cpu - first[pid] for pid, (cpu, _w) in last.items())
    workers = sum(cpu - first[pid] for pid, (cpu, w) in last.items() if w)
    print(json.dumps({"cpu_s": total, "worker_cpu_s": workers, "processes": len(last)}), flush=True)


class CpuSampler:
    """Runs :py:func:`sampler_main` over this process's tree for the duration of a ``with`` block."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.result: dict[str, float] = {}

    def __enter__(self) -> CpuSampler:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--sample", str(os.getpid()), "--sample-interval", str(self.interval)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        self.result = json.loads(out.strip().splitlines()[-1])


def run_once(
    ray: Any, job: str, runner: str, files: list[str], batch_size: int, size: int, compute: str = "tasks"
) -> dict[str, Any]:
    from spdl_rs.ray import ImageBatchDecoder

    if job == "bytes":  # Ray's read tasks read the files; the decoders get the encoded bytes
        ds, column = ray.data.read_binary_files(files), "bytes"
    elif job == "paths":  # a dataset of paths; each decoder reads its files
        ds, column = ray.data.from_items([{"path": f} for f in files]), "path"
    else:
        raise ValueError(f"unknown job {job!r}")
    if compute == "actors":  # a pool of one actor per CPU, each decoding batch after batch
        pool = {"compute": ray.data.ActorPoolStrategy(size=int(ray.cluster_resources()["CPU"]))}
        spdl: Any = ImageBatchDecoder
        spdl_args: dict[str, Any] = {"fn_constructor_kwargs": {"width": size, "height": size, "column": column}}
        pil: Any = PilDecoder
        pil_args: dict[str, Any] = {"fn_constructor_kwargs": {"size": (size, size), "column": column}}
    elif compute == "tasks":
        pool = {}
        spdl, spdl_args = ImageBatchDecoder(size, size, column=column), {}
        pil, pil_args = pil_decode, {"fn_kwargs": {"size": (size, size), "column": column}}
    else:
        raise ValueError(f"unknown compute {compute!r}")
    if runner == "spdl_rs":
        ds = ds.map_batches(spdl, batch_size=batch_size, batch_format="numpy", **spdl_args, **pool)
    elif runner == "pil":
        ds = ds.map_batches(pil, batch_size=batch_size, batch_format="numpy", **pil_args, **pool)
    else:
        raise ValueError(f"unknown runner {runner!r}")
    with CpuSampler() as sampler:
        start = time.perf_counter()
        images = 0
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            shape = batch["image"].shape
            if shape[1:] != (size, size, 3):
                raise RuntimeError(f"{runner}: a batch of shape {shape}")
            images += shape[0]
        seconds = time.perf_counter() - start
    if images != len(files):
        raise RuntimeError(f"{runner}: {images} images out of {len(files)}")
    cpu, worker_cpu = sampler.result["cpu_s"], sampler.result["worker_cpu_s"]
    return {
        "job": job, "batch_size": batch_size, "runner": runner, "compute": compute, "images": images, "seconds": seconds, "cpu_s": cpu, "worker_cpu_s": worker_cpu,
        "img_s": images / seconds, "img_per_cpu_s": images / cpu, "img_per_worker_cpu_s": images / worker_cpu,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medians per ``job/batch size/runner``."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(f"{r['job']}/{r['batch_size']}/{r['runner']}" for r in runs):
        mine = [r for r in runs if f"{r['job']}/{r['batch_size']}/{r['runner']}" == key]
        out[key] = {
            k: statistics.median(r[k] for r in mine)
            for k in ("img_s", "cpu_s", "worker_cpu_s", "img_per_cpu_s", "img_per_worker_cpu_s", "seconds")
        }
        out[key]["img_s_min"] = min(r["img_s"] for r in mine)
        out[key]["img_s_max"] = max(r["img_s"] for r in mine)
        out[key]["rounds"] = len(mine)
    return out


LABELS = {
    "spdl_rs": "spdl_rs (`spdl_rs.ray.ImageBatchDecoder`)",
    "pil": "Pillow (`map_batches` with Pillow)",
}
JOBS = {
    "bytes": "`read_binary_files` (Ray's read tasks read the files, the decoders get bytes)",
    "paths": "`from_items(paths)` (each decoder reads its own files)",
}
TARGET = 2.0


def markdown(meta: dict[str, Any], summary: dict[str, dict[str, Any]], jobs: list[str], sizes: list[int]) -> str:
    lines = [
        SECTION,
        "",
        "_Written by benches/compare/ray_bench.py (the command below); rerun it rather than editing this section._",
        "",
        f"- Date: {meta['date']}; commit {meta['commit']}",
        f"- Machine: {meta['machine']} (load average {meta['load_before']} before, {meta['load_after']} after; "
        "the machine is shared)",
        f"- Command: `{meta['command']}`",
        f"- Versions: Python {meta['python']}, Ray {meta['ray']}, Pillow {meta['pillow']}, numpy {meta['numpy']}",
        f"- Job: the image comparison's photo corpus ({meta['files']} JPEGs, {meta['data']}) -> `map_batches` "
        f"(Ray tasks, 1 CPU each, batches of {' and '.join(str(b) for b in sizes)} images): decode + bilinear "
        "resize to "
        f"{meta['size']}x{meta['size']} RGB -> the driver iterates the batches. The dataset is made two ways: "
        + "; ".join(f"`{j}`: {JOBS[j]}" for j in jobs)
        + f". One `ray.init(num_cpus={meta['num_cpus']})` cluster for every run, a warm-up round of each, then "
        f"round-robin, median of {meta['rounds']} rounds.",
        "",
        "| dataset | map batch | decoder | img/s (min-max) | cluster CPU s | img per cluster CPU-s | worker CPU s "
        "| img per worker CPU-s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cases = [(job, size) for size in sizes for job in jobs]
    for job, size in cases:
        for runner in ("spdl_rs", "pil"):
            r = summary[f"{job}/{size}/{runner}"]
            lines.append(
                f"| `{job}` | {size} | {LABELS[runner]} | {r['img_s']:.0f} ({r['img_s_min']:.0f}-{r['img_s_max']:.0f}) "
                f"| {r['cpu_s']:.2f} | {r['img_per_cpu_s']:.0f} | {r['worker_cpu_s']:.2f} "
                f"| {r['img_per_worker_cpu_s']:.0f} |"
            )
    lines.append("")
    for job, size in cases:
        s, p = summary[f"{job}/{size}/spdl_rs"], summary[f"{job}/{size}/pil"]
        per_cpu = s["img_per_cpu_s"] / p["img_per_cpu_s"]
        lines.append(
            f"- `{job}`, batch {size}: spdl_rs / Pillow, images per cluster CPU-second **{per_cpu:.2f}x** (target >= {TARGET}x: "
            f"{'met' if per_cpu >= TARGET else 'NOT met'}); images/s {s['img_s'] / p['img_s']:.2f}x; images per "
            f"worker CPU-second {s['img_per_worker_cpu_s'] / p['img_per_worker_cpu_s']:.2f}x."
        )
    lines += [
        "- Cluster CPU s: user + system seconds of the driver and every process under it (GCS server, raylet, "
        "the workers and actors, Ray's agents and monitors), sampled from /proc every 50 ms by a process of its "
        "own (left out), from the start of the run to its end; a process that exits during the run counts up to "
        "its last sample. Worker CPU s: the Ray worker processes alone (read and decode tasks). "
        "The difference is Ray's own cost (the driver's planning and file listing, scheduling, the object "
        "store, monitors), the same for both decoders: it is what keeps the cluster ratio below the worker "
        "ratio, and `read_binary_files` adds the most of it (its driver-side listing and its read tasks).",
        "- Reading it: the ratio per cluster CPU-second is the decoders' own ratio (spdl-rs against the Pillow "
        "loop on one core: see \"## Comparison\") diluted by Ray's CPU, which is the same for both. It is "
        "highest where Ray's share is smallest: `paths` (spdl_rs reads each file inside the GIL-free call that "
        "decodes it: no read tasks, no driver-side file listing) and large map batches (Ray's per-task cost "
        "spread over more images). With `read_binary_files`, the read tasks and the listing cost about as much "
        "CPU as spdl_rs's decoding; Pillow's decode is slow enough that they matter less to it.",
        "- Raw runs: " + meta["results"],
        "",
    ]
    return "\n".join(lines)


def write_section(doc: Path, text: str) -> None:
    """Replaces the "## Ray Data" section of ``doc`` (up to the next "## " heading), or appends it."""
    old = doc.read_text() if doc.exists() else "# Benchmarks\n"
    lines = old.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == SECTION), None)
    if start is None:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + text + ("\n" + tail if tail else "")
    doc.write_text(new)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:1])


def _machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB, {platform.platform(terse=True)}"


def rewrite(results: Path, doc: Path) -> None:
    """Writes the section of ``doc`` again from a results file (after a change to the report's wording)."""
    saved = json.loads(results.read_text())
    meta, summary = saved["meta"], saved["summary"]
    jobs = list(dict.fromkeys(r["job"] for r in saved["runs"]))
    write_section(doc, markdown(meta, summary, jobs, meta["batch_sizes"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("target/compare-data"), help="the JPEG corpus")
    parser.add_argument("--limit", type=int, default=None, help="use the first N files only")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", default="32", help="map_batches batch sizes, comma-separated")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    parser.add_argument("--runners", default="spdl_rs,pil")
    parser.add_argument("--compute", default="tasks", choices=["tasks", "actors"],
                        help="map_batches as Ray tasks, or in an actor pool of one actor per CPU")
    parser.add_argument("--jobs", default="bytes,paths", help="how the dataset is made: bytes, paths")
    parser.add_argument("--results", type=Path, default=Path("target/compare/results-ray.json"))
    parser.add_argument("--docs", type=Path, default=None, help="write the '## Ray Data' section of this file")
    parser.add_argument("--rewrite", type=Path, default=None,
                        help="write the --docs section from this results file instead of running")
    parser.add_argument("--sample", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sample-interval", type=float, default=0.05, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample is not None:
        sampler_main(args.sample, args.sample_interval)
        return
    if args.rewrite is not None:
        if args.docs is None:
            sys.exit("ray_bench: --rewrite needs --docs")
        rewrite(args.rewrite, args.docs)
        return

    files = sorted(str(p) for p in args.data.rglob("*") if p.is_file() and p.suffix in IMAGE_EXTENSIONS)
    if args.limit:
        files = files[: args.limit]
    if not files:
        sys.exit(f"ray_bench: no JPEGs under {args.data} (make the corpus with `cargo xtask compare` first)")
    for path in files:  # page cache warm for every runner
        Path(path).read_bytes()
    runners = args.runners.split(",")
    jobs = args.jobs.split(",")
    sizes = [int(b) for b in args.batch_size.split(",")]

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import numpy
    import PIL
    import ray
    import ray.data

    load_before = _loadavg()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    runs: list[dict[str, Any]] = []
    try:
        cases = [(job, size, runner) for size in sizes for job in jobs for runner in runners]
        for job, runner in [(job, runner) for job in jobs for runner in runners]:  # warm-up: workers, imports
            run_once(ray, job, runner, files[: min(len(files), 256)], sizes[0], args.size, args.compute)
        for round_ in range(args.rounds):
            for job, size, runner in cases:
                run = run_once(ray, job, runner, files, size, args.size, args.compute)
                run["round"] = round_
                runs.append(run)
                print(
                    f"ray_bench: round {round_} {job}/{size}/{runner}: {run['img_s']:.0f} img/s, cluster "
                    f"{run['cpu_s']:.2f} CPU s ({run['img_per_cpu_s']:.0f} img/CPU-s), workers "
                    f"{run['worker_cpu_s']:.2f} CPU s",
                    file=sys.stderr, flush=True,
                )
    finally:
        ray.shutdown()
    summary = summarize(runs)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit or "unknown",
        "machine": _machine(),
        "load_before": load_before,
        "load_after": _loadavg(),
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benches/compare/ray_bench.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "pillow": PIL.__version__,
        "numpy": numpy.__version__,
        "files": len(files),
        "data": str(args.data),
        "batch_sizes": sizes,
        "size": args.size,
        "num_cpus": args.num_cpus,
        "rounds": args.rounds,
        "results": str(args.results),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"meta": meta, "runs": runs, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    if set(runners) >= {"spdl_rs", "pil"}:
        text = markdown(meta, summary, jobs, sizes)
        print(text)
        if args.docs is not None:
            write_section(args.docs, text)


if __name__ == "__main__":
    main()
