"""Side-by-side comparison of spdl-rs against peer loaders on three image jobs.

The jobs (`--job`, all three by default), each decode + transform to 224x224 + batch 32 over the same JPEGs,
1 and 2 threads/workers:

- resize: straight to 224x224 (`spdl bench --transform resize`);
- eval: shorter side to 256, center crop 224 (`--transform center-crop`; torchvision Resize(256) + CenterCrop(224));
- train: RandomResizedCrop(224) + RandomHorizontalFlip() (`--transform random-resized-crop`).

Runners: spdl-rs (`spdl bench --json`, the libjpeg-turbo build given by --spdl-bin, and the pure-Rust zune-jpeg
build given by --zune-bin as spdl-rs-zune), Meta's SPDL 0.8.0 (pipeline + `load_image_batch`; resize and eval),
Pillow in a plain loop (resize), torch DataLoader (0 and 2 workers; `torchvision.io.decode_jpeg` + v2 transforms on
every job, PIL decode on resize) and NVIDIA DALI on the CPU (`device_id=None`, 1 and 2 threads) when it imports.
A runner name ending in `-t1` is the same runner with one thread. Each run is a process of its own, the runners of
a job alternate round-robin, jobs follow each other within a round, for `--rounds` rounds, and the median of each
figure is reported:

- img/s: images / loading wall time (as the runner measures it: spdl-rs's `seconds`, the runners.py loop);
- CPU s: spdl-rs: the whole process (os.wait4); Python runners: process + reaped workers over the loading only
  (interpreter start and imports, e.g. torch's, are not charged);
- img/s per core: images / CPU s, the efficiency figure the targets are judged on;
- peak RSS: the process tree's resident set, sampled every 50 ms with psutil (summed over children: forked
  DataLoader workers count each), and never below the largest single process's ru_maxrss.

Run through `cargo xtask compare` (benches/compare/run.sh makes the venv, the CLI and the corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SPDL_RS = "spdl-rs"
# The same binary with one decoding thread: the like-for-like peer of the single-process runners (torch
# DataLoader with 0 workers, Pillow), since per-thread efficiency drops when both cores decode at once.
SPDL_RS_T1 = "spdl-rs-t1"
# The same CLI built without the `turbojpeg` feature (pure-Rust zune-jpeg, full-image decode): the gain of the
# region decode is the ratio of spdl-rs to these.
SPDL_RS_ZUNE = "spdl-rs-zune"
SPDL_RS_ZUNE_T1 = "spdl-rs-zune-t1"
SPDL_RS_ALL = [SPDL_RS, SPDL_RS_T1, SPDL_RS_ZUNE, SPDL_RS_ZUNE_T1]
PY_RUNNERS = ["spdl-0.8", "pillow", "torch-pil-w0", "torch-pil-w2", "torch-tv-w0", "torch-tv-w2", "dali-cpu-t1",
              "dali-cpu"]
ALL_RUNNERS = [*SPDL_RS_ALL, *PY_RUNNERS]
# The job -> `spdl bench --transform`, and the runners that can do it.
JOBS = {"resize": "resize", "eval": "center-crop", "train": "random-resized-crop"}
JOB_RUNNERS = {
    "resize": ALL_RUNNERS,
    "eval": [*SPDL_RS_ALL, "spdl-0.8", "torch-tv-w0", "torch-tv-w2", "dali-cpu-t1", "dali-cpu"],
    "train": [*SPDL_RS_ALL, "torch-tv-w0", "torch-tv-w2", "dali-cpu-t1", "dali-cpu"],
}
IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".JPG", ".JPEG"}
SAMPLE_SECONDS = 0.05


@dataclass
class Run:
    """One measured run of one runner."""

    runner: str
    round: int
    job: str = "resize"
    images: int = 0
    failed: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    wall_seconds: float = 0.0
    process_cpu_seconds: float = 0.0
    max_single_rss_bytes: int = 0
    error: str | None = None
    raw: dict = field(default_factory=dict)

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def images_per_cpu_sec(self) -> float:
        return self.images / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def log(message: str) -> None:
    print(f"compare: {message}", file=sys.stderr, flush=True)


def list_corpus(data: Path, limit: int | None) -> list[Path]:
    files = sorted(p for p in data.rglob("*") if p.is_file() and p.suffix in IMAGE_EXTENSIONS)
    return files[:limit] if limit else files


def warm_page_cache(files: list[Path]) -> int:
    """Reads every file once so that no runner pays for the first read from disk."""
    total = 0
    for path in files:
        total += len(path.read_bytes())
    return total


class TreeRssSampler(threading.Thread):
    """Samples the summed RSS of a process and all its descendants every SAMPLE_SECONDS."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    pass
            self.peak = max(self.peak, total)
            self.samples += 1
            self.stop.wait(SAMPLE_SECONDS)


def measure(cmd: list[str], timeout: float) -> tuple[int, str, str, float, float, int, int]:
    """Runs `cmd` as its own process; returns (status, stdout, stderr, wall s, CPU s of the tree that was reaped,
    sampled peak tree RSS, largest single-process ru_maxrss in bytes)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT)
        sampler = TreeRssSampler(proc.pid)
        sampler.start()
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            # wait4 rather than Popen.wait: it returns the rusage of the child and every descendant it reaped.
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
            sampler.stop.set()
            sampler.join()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        return proc.returncode, out.read(), err.read(), wall, cpu, sampler.peak, usage.ru_maxrss * 1024


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON object on stdout")


def run_one(name: str, rnd: int, args: argparse.Namespace, listing: Path, n_files: int, job: str = "resize") -> Run:
    threads = 1 if name.endswith("-t1") else args.threads
    common = ["--threads", str(threads), "--batch-size", str(args.batch_size), "--size", str(args.size)]
    if name in SPDL_RS_ALL:
        # The job's transform (resize: straight, not the default center crop, like every peer); CPU only, like
        # every peer.
        binary = args.zune_bin if name.startswith(SPDL_RS_ZUNE) else args.spdl_bin
        cmd = [str(binary), "bench", str(listing), *common, "--transform", JOBS[job], "--no-gpu",
               "--no-progress", "--json"]
    else:
        base = name.removesuffix("-t1")
        cmd = [sys.executable, str(HERE / "runners.py"), base, "--list", str(listing), "--job", job, *common]
    run = Run(name, rnd, job)
    status, stdout, stderr, wall, cpu, peak, max_single = measure(cmd, args.timeout)
    run.wall_seconds, run.process_cpu_seconds = wall, cpu
    run.max_single_rss_bytes = max_single
    run.peak_rss_bytes = max(peak, max_single)
    if status != 0:
        run.error = f"exit status {status}: {stderr.strip()[-600:]}"
        return run
    try:
        raw = last_json(stdout)
    except ValueError as err:
        run.error = f"{err}; stderr: {stderr.strip()[-600:]}"
        return run
    run.raw = raw
    run.images = int(raw.get("images", 0))
    run.failed = int(raw.get("failed", 0))
    run.seconds = float(raw.get("seconds", 0.0))
    if name in SPDL_RS_ALL:
        # A native binary has no interpreter to start: charge it the whole process.
        run.cpu_seconds = cpu
    else:
        run.cpu_seconds = float(raw.get("cpu_seconds", 0.0))
    if run.images != n_files or run.failed:
        run.error = f"decoded {run.images} of {n_files} images ({run.failed} failed)"
    return run


def median_of(runs: list[Run]) -> dict:
    ok = [r for r in runs if r.error is None]
    if not ok:
        return {"ok": 0, "error": runs[0].error if runs else "not run"}
    med = statistics.median
    return {
        "ok": len(ok),
        "images": ok[0].images,
        "images_per_sec": med(r.images_per_sec for r in ok),
        "images_per_sec_min": min(r.images_per_sec for r in ok),
        "images_per_sec_max": max(r.images_per_sec for r in ok),
        "cpu_seconds": med(r.cpu_seconds for r in ok),
        "images_per_cpu_sec": med(r.images_per_cpu_sec for r in ok),
        "peak_rss_bytes": med(r.peak_rss_bytes for r in ok),
        "wall_seconds": med(r.wall_seconds for r in ok),
        # Time to the first batch, and the mean time per batch (loading seconds / batches) beside it.
        "first_batch_seconds": med(float(r.raw.get("first_batch_seconds") or 0.0) for r in ok),
        "mean_batch_seconds": med(r.seconds / max(1, int(r.raw.get("batches") or 0)) for r in ok),
    }


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    from importlib import metadata

    for dist in ["spdl", "spdl-io", "torch", "torchvision", "pillow", "numpy", "nvidia-dali-cuda120"]:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    os_name = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": os_name,
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run_py_pipeline(args: argparse.Namespace) -> dict:
    """Runs benches/compare/py_pipeline.py (the Python facade's pipeline benchmark) when it exists: Meta's
    spdl with this venv's interpreter, spdl_rs with `.venv` (and `.venv-ft`, free-threaded) where it imports."""
    script = HERE / "py_pipeline.py"
    if not script.exists():
        return {"status": "not yet: benches/compare/py_pipeline.py does not exist", "lines": []}
    candidates = [("spdl", Path(sys.executable), "spdl.pipeline")]
    for venv in (".venv", ".venv-ft"):
        candidates.append(("spdl_rs", ROOT / venv / "bin/python", "spdl_rs.pipeline, spdl_rs.io"))
    lines: list[dict] = []
    notes: list[str] = []
    for impl, python, modules in candidates:
        where = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
        if not python.exists():
            notes.append(f"{impl} with {where}: skipped (no such interpreter)")
            continue
        probe = subprocess.run([str(python), "-c", f"import {modules}"], capture_output=True, text=True)
        if probe.returncode != 0:
            notes.append(f"{impl} with {where}: skipped ({last_line(probe.stderr)})")
            continue
        cmd = [str(python), str(script), "--impl", impl, "--images", str(args.data),
               "--num-threads", str(args.threads)]
        log(f"running {script.relative_to(ROOT)} --impl {impl} with {where}")
        try:
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.py_pipeline_timeout)
        except subprocess.TimeoutExpired:
            notes.append(f"{impl} with {where}: timed out after {args.py_pipeline_timeout:.0f} s")
            continue
        got = 0
        for line in out.stdout.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                lines.append(record | {"interpreter": str(where)})
                got += 1
        if out.returncode != 0:
            notes.append(f"{impl} with {where}: exit status {out.returncode} ({last_line(out.stderr)})")
        else:
            notes.append(f"{impl} with {where}: ok, {got} results")
    return {"status": "; ".join(notes), "notes": notes, "lines": lines}


def last_line(text: str, limit: int = 200) -> str:
    """The last line of a child's stderr (usually the exception), shortened for the report."""
    line = (text.strip().splitlines() or ["no output"])[-1].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def audio_video_status(args: argparse.Namespace) -> str:
    """Where the audio/video comparison lives (run.sh runs it after this script)."""
    return ("see \"## Audio/video comparison\" below: spdl-io's `av_throughput` example against Meta SPDL's "
            "load_audio/load_video (benches/compare/av_compare.py, run by run.sh after this comparison)")


def write_outputs(results: dict, args: argparse.Namespace) -> None:
    """Prints the tables; unless --no-docs, writes the per-job section and chart, and "## Comparison" and its chart
    from the resize job unless --no-comparison-section."""
    legacy = bool(results.get("summary")) and not args.no_comparison_section
    if results.get("summary"):
        results["targets"] = report.targets(results["summary"])
        print(report.text_table(results))
    for job, jr in results.get("jobs", {}).items():
        jr["targets"] = report.job_targets(job, jr["summary"])
    if results.get("jobs"):
        print(report.jobs_text(results))
    if args.no_docs:
        return
    if legacy:
        report.write_png(results, args.png)
        report.write_markdown(results, args.docs, args.png)
        log(f"wrote {args.docs} (## Comparison) and {args.png}")
    if results.get("jobs"):
        report.write_jobs_png(results, args.jobs_png)
        report.write_jobs_markdown(results, args.docs, args.jobs_png)
        log(f"wrote {args.docs} ({report.JOBS_SECTION}) and {args.jobs_png}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "target/compare-data", help="directory of JPEGs")
    parser.add_argument("--corpus", default=None, help="how the corpus was made, for the report")
    parser.add_argument("--spdl-bin", type=Path, default=ROOT / "target/release/spdl",
                        help="the spdl CLI built with `--features turbojpeg` (run.sh builds it)")
    parser.add_argument("--zune-bin", type=Path, default=ROOT / "target/compare/spdl-zune",
                        help="the spdl CLI built without `turbojpeg` (zune-jpeg), run as spdl-rs-zune (run.sh "
                             "builds it); its runners are skipped when it is missing")
    parser.add_argument("--job", default=",".join(JOBS),
                        help=f"comma-separated jobs among {','.join(JOBS)} (default: all three)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N files")
    parser.add_argument("--runners", default=",".join(ALL_RUNNERS),
                        help=f"comma-separated subset of {','.join(ALL_RUNNERS)}")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before one run is killed")
    parser.add_argument("--py-pipeline-timeout", type=float, default=1800.0,
                        help="seconds for each py_pipeline.py invocation")
    parser.add_argument("--no-py-pipeline", action="store_true", help="skip benches/compare/py_pipeline.py")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs/benchmarks.md")
    parser.add_argument("--png", type=Path, default=ROOT / "docs/img/compare.png")
    parser.add_argument("--jobs-png", type=Path, default=ROOT / "docs/img/compare-jobs.png")
    parser.add_argument("--no-comparison-section", action="store_true",
                        help=f"write only the \"{report.JOBS_SECTION}\" section, leaving \"## Comparison\" (the "
                             "resize job and its targets) and compare.png as they are")
    parser.add_argument("--no-docs", action="store_true", help="print only; do not touch docs/")
    parser.add_argument("--results", type=Path, default=ROOT / "target/compare/results.json")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: print and write docs from an earlier --results file")
    args = parser.parse_args()

    if args.render_only:
        results = json.loads(args.results.read_text())
        write_outputs(results, args)
        return 0

    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    unknown = [r for r in runners if r not in ALL_RUNNERS]
    if unknown:
        parser.error(f"unknown runners {unknown}; known: {ALL_RUNNERS}")
    jobs = [j.strip() for j in args.job.split(",") if j.strip()]
    if not jobs or [j for j in jobs if j not in JOBS]:
        parser.error(f"--job takes a comma-separated list of {list(JOBS)}")
    if {SPDL_RS, SPDL_RS_T1} & set(runners) and not args.spdl_bin.is_file():
        parser.error(f"{args.spdl_bin} is missing: cargo build --release -p spdl-cli --features turbojpeg")
    # Runners that cannot start here are skipped once, with the reason, rather than failing every round.
    skipped: dict[str, str] = {}
    if not args.zune_bin.is_file():
        for name in (SPDL_RS_ZUNE, SPDL_RS_ZUNE_T1):
            skipped[name] = f"{args.zune_bin} is missing (cargo build --release -p spdl-cli, without turbojpeg)"
    if {"dali-cpu", "dali-cpu-t1"} & set(runners):
        probe = subprocess.run([sys.executable, "-c", "import nvidia.dali"], capture_output=True, text=True)
        if probe.returncode != 0:
            for name in ("dali-cpu", "dali-cpu-t1"):
                skipped[name] = f"nvidia-dali-cuda120 does not import: {last_line(probe.stderr)}"
    for name, why in skipped.items():
        if name in runners:
            log(f"skipping {name}: {why}")
    per_job = {job: [r for r in JOB_RUNNERS[job] if r in runners and r not in skipped] for job in jobs}

    files = list_corpus(args.data, args.limit)
    if not files:
        parser.error(f"no JPEG files under {args.data}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    listing = args.results.parent / "files.txt"
    listing.write_text("".join(f"{p.resolve()}\n" for p in files))
    args.listing = listing
    size = warm_page_cache(files)
    log(f"{len(files)} files ({size / 2**20:.1f} MiB) from {args.data}, listed in {listing}; page cache warmed")

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()
    runs: list[Run] = []
    for rnd in range(args.rounds):
        for job in jobs:
            # Round-robin, and each round starts one runner later, so no runner always follows the same neighbour.
            names = per_job[job]
            order = names[rnd % len(names):] + names[: rnd % len(names)] if names else []
            for name in order:
                run = run_one(name, rnd, args, listing, len(files), job)
                runs.append(run)
                if run.error:
                    log(f"round {rnd + 1}/{args.rounds} {job} {name}: FAILED: {run.error}")
                else:
                    log(f"round {rnd + 1}/{args.rounds} {job} {name}: {run.images_per_sec:7.1f} img/s, "
                        f"{run.cpu_seconds:6.2f} CPU s, {run.images_per_cpu_sec:6.0f} img/CPU-s, "
                        f"{run.peak_rss_bytes / 2**20:7.1f} MiB")
    load_after = os.getloadavg()

    job_results = {}
    for job in jobs:
        job_summary = {name: median_of([r for r in runs if r.runner == name and r.job == job])
                       for name in per_job[job]}
        job_results[job] = {"transform": JOBS[job], "summary": job_summary,
                            "skipped": {n: w for n, w in skipped.items() if n in JOB_RUNNERS[job] and n in runners},
                            "targets": report.job_targets(job, job_summary)}
    # "## Comparison" is the resize job's table.
    summary = job_results["resize"]["summary"] if "resize" in job_results else {}
    results = {
        "date": started,
        "command": os.environ.get("SPDL_COMPARE_COMMAND") or " ".join(["python", *sys.argv]),
        "machine": machine(),
        "versions": package_versions(),
        "commit": git_commit(),
        "load_average": {"before": load_before, "after": load_after},
        "job": {"files": len(files), "data": str(args.data), "corpus": args.corpus or str(args.data),
                "threads": args.threads,
                "batch_size": args.batch_size, "size": args.size, "rounds": args.rounds, "jobs": jobs},
        "summary": summary,
        "jobs": job_results,
        "runs": [asdict(r) | {"images_per_sec": r.images_per_sec} for r in runs],
        "audio_video": audio_video_status(args),
        "py_pipeline": {"status": "skipped (--no-py-pipeline)"} if args.no_py_pipeline else run_py_pipeline(args),
    }
    results["targets"] = report.targets(summary)
    args.results.write_text(json.dumps(results, indent=2))
    log(f"raw results in {args.results}")
    write_outputs(results, args)
    failed = [f"{job}/{name}" for job, jr in job_results.items() for name, s in jr["summary"].items() if not s.get("ok")]
    if failed:
        log(f"runners that never succeeded: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
