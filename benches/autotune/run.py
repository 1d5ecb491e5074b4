"""Auto-tuning benchmark: for each workload, a grid of hand-set options, ``--autotune`` from the defaults, and
the defaults without it, run one after the other on the same machine; prints the markdown table of
docs/benchmarks.md ("## Autotune") and writes the controller's trajectories as an SVG plot.

Workloads:
- ``jpeg``: ``spdl bench`` over local JPEGs (eval center-crop at 224).
- ``s3``: the same JPEGs from a local S3-compatible server (s3s-fs) behind a proxy on 127.0.0.1 that holds
  each request 20 ms before passing it on.
- ``pyslow``: an ``spdl_rs`` pipeline whose Python stage waits 2 ms per item (``time.sleep``) and works 0.1 ms,
  run for ``--py-seconds`` each (throughput over the whole run, tuning included).
- ``audio``: an ``spdl_rs`` pipeline over audio clips made at start (``--audio-clips`` of 5-10 s, 44.1 and
  48 kHz stereo; WAV, FLAC and MP3 in turn when ``ffmpeg`` is on the PATH to encode them, WAV only
  otherwise): a stage reads each file's bytes, a stage decodes and resamples them to 16 kHz mono
  (``spdl_rs.io.load_audio``), then batches of 16; ``--py-seconds`` per run, the clips in a cycle.

Usage (standard library only; ``--spdl`` is a release build of the CLI, ``--python`` an interpreter with
``spdl_rs`` built from this tree)::

    python benches/autotune/run.py --spdl target/release/spdl --data /tmp/bench-data \\
        --python .venv/bin/python --py-seconds 20 --svg docs/autotune_trajectory.svg --json /tmp/autotune.json
"""

from __future__ import annotations

import argparse
import array
import asyncio
import concurrent.futures
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path
from typing import Any

ACCESS_KEY = "spdl-bench-access"
SECRET_KEY = "spdl-bench-secret-key"


def bench_cli(spdl: str, target: list[str], extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [spdl, "bench", *target, "--json", "--no-progress", "--no-gpu", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    tune = report.get("autotune") or {}
    return {
        "throughput": report["images_per_sec"],
        "seconds": report["seconds"],
        "rss": report["peak_rss_bytes"],
        "settled_at": tune.get("settled_at_s"),
        "changes": tune.get("changes", []),
        "start": tune.get("start", []),
        "end": tune.get("end", []),
        "budget": tune.get("max_memory_bytes"),
        "unit": "images/s",
    }


# --- a proxy that delays each request -------------------------------------------------------------------


class DelayProxy:
    """Forwards 127.0.0.1:port to upstream, holding each chunk from the client `delay` seconds (one chunk is
    one request for GETs), on an asyncio loop in a thread of its own."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, delay: float) -> None:
            try:
                while data := await r.read(1 << 16):
                    if delay:
                        await asyncio.sleep(delay)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pump(cr, uw, self.delay), pump(ur, cw, 0.0))

        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", self.port)
            self.ready.set()
            async with server:
                await server.serve_forever()

        self.loop.run_until_complete(main())


def start_s3(data: Path, limit: int) -> tuple[subprocess.Popen[bytes], int, Path]:
    binary = shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    if not Path(binary).is_file():
        raise RuntimeError("the s3 workload needs s3s-fs: `cargo install s3s-fs@0.14.1 --features binary --locked`")
    files = sorted(p for p in data.rglob("*.jpg"))[:limit]
    if not files:
        raise RuntimeError(f"no .jpg files under {data}")
    root = Path(tempfile.mkdtemp(prefix="spdl-autotune-s3-"))
    dest = root / "photos" / "train"
    for p in files:
        d = dest / p.parent.name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, d / p.name)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    args = ["--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]
    proc = subprocess.Popen([binary, *args, str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port, root
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"s3s-fs did not start listening on 127.0.0.1:{port} (exit status {proc.returncode})")


# --- spdl_rs pipelines run in a child interpreter ---------------------------------------------------------

# Each script builds `b` (a PipelineBuilder up to its last stage) from `duration`, `threads`, `conc` and
# `autotune` (argv 1-4; conc 0: the stages' default concurrency) and defines `size(batch)`; the footer batches,
# runs it for `duration` seconds and prints the figures as one JSON line.
PY_HEAD = r"""
import itertools, json, resource, sys, time
from spdl_rs.pipeline import PipelineBuilder
duration, threads, conc, autotune = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
"""

PY_FOOT = r"""
p = b.aggregate(16).add_sink(4).build(num_threads=threads, autotune=autotune)
got = 0
t0 = time.perf_counter()
with p.auto_stop():
    for batch in p:
        got += size(batch)
        if time.perf_counter() - t0 >= duration:
            break
    dt = time.perf_counter() - t0
    report = p.autotune_report() or {}
    decisions = report.get("decisions", [])
    rows = {d["name"]: d for d in p._core.stats()}
print(json.dumps({"throughput": got / dt, "seconds": dt,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "decisions": decisions, "settled_at": report.get("settled_at"),
                  "end": [[k, v["concurrency"]] for k, v in rows.items() if v["concurrency_bounds"]]}))
"""

# The slow Python stage: 2 ms asleep and 0.1 ms busy per item.
PYSLOW = PY_HEAD + r"""
def slow(x):
    time.sleep(0.002)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0001:
        pass
    return x
b = PipelineBuilder().add_source(itertools.count())
b = b.pipe(slow) if conc == 0 else b.pipe(slow, concurrency=conc)
size = len
""" + PY_FOOT

# Audio: read the bytes of each clip (argv 5: the folder of clips, cycled), decode and resample them to 16 kHz
# mono; `conc` is the decode stage's concurrency, the read stage keeps its default.
AUDIO = PY_HEAD + r"""
import os
from spdl_rs.io import load_audio
root = sys.argv[5]
paths = sorted(os.path.join(root, n) for n in os.listdir(root))
def read(path):
    with open(path, "rb") as f:
        return path, f.read()
def decode(item):
    path, data = item
    return load_audio(data, name=path, sample_rate=16000, channels="mono")
b = PipelineBuilder().add_source(itertools.cycle(paths)).pipe(read)
b = b.pipe(decode) if conc == 0 else b.pipe(decode, concurrency=conc)
def size(batch):
    for clip in batch:
        if clip.shape[0] != 1 or clip.shape[1] < 16000 * 5 - 1:
            raise SystemExit(f"a decoded clip has shape {clip.shape}, expected [1, >= 5 s at 16 kHz]")
    return len(batch)
""" + PY_FOOT


def bench_py(
    python: str, name: str, script: str, seconds: float, threads: int, conc: int, autotune: bool, *extra: str
) -> dict[str, Any]:
    cmd = [python, "-c", script, str(seconds), str(threads), str(conc), "1" if autotune else "0", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} (num_threads {threads}, concurrency {conc}) failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    changes = [
        {"at_s": d["at"], "stage": d["stage"], "knob": d.get("knob", "concurrency"), "from": d["from"],
         "to": d["to"], "reason": d["reason"]}
        for d in r["decisions"]
    ]
    settled = r.get("settled_at") if autotune else None
    return {
        "throughput": r["throughput"],
        "seconds": r["seconds"],
        "rss": r["rss"],
        "settled_at": settled,
        "changes": changes,
        "end": r["end"],
        "start": [],
        "budget": None,
        "unit": "clips/s" if name == "audio" else "items/s",
    }


# --- audio clips ------------------------------------------------------------------------------------------


def _tone_blocks(rate: int, count: int) -> list[bytes]:
    """`count` different seconds of 16-bit stereo at `rate`: two tones per channel and a little noise."""
    blocks = []
    for j in range(count):
        rng = random.Random(rate * 100 + j)
        f = [110.0 * (j + 2), 165.0 * (j + 1) + 7.0, 220.0 * (j + 1) + 3.0, 97.0 * (j + 3)]
        samples = array.array("h")
        step = 2 * math.pi / rate
        for n in range(rate):
            t = n * step
            left = 0.4 * math.sin(f[0] * t) + 0.2 * math.sin(f[1] * t) + 0.05 * (rng.random() - 0.5)
            right = 0.3 * math.sin(f[2] * t) + 0.3 * math.sin(f[3] * t) + 0.05 * (rng.random() - 0.5)
            samples.append(int(left * 32767))
            samples.append(int(right * 32767))
        blocks.append(samples.tobytes())
    return blocks


def make_clips(count: int) -> tuple[Path, str]:
    """Writes `count` clips of 5-10 s (44.1 and 48 kHz stereo, 16-bit) to a new temporary folder: WAV, FLAC and
    MP3 in turn when ffmpeg is on the PATH (it encodes the last two), WAV only otherwise. Returns the folder
    and a line that describes its clips."""
    root = Path(tempfile.mkdtemp(prefix="spdl-autotune-audio-"))
    ffmpeg = shutil.which("ffmpeg")
    formats = ["wav", "flac", "mp3"] if ffmpeg else ["wav"]
    blocks = {rate: _tone_blocks(rate, 6) for rate in (44100, 48000)}
    frame = 4  # bytes per stereo 16-bit frame

    def one(i: int) -> float:
        rate = 48000 if i % 2 == 0 else 44100
        seconds = 5.0 + (i * 37 % 51) / 10.0
        frames = int(seconds * rate)
        parts = [blocks[rate][(i + k) % 6] for k in range(frames // rate)]
        parts.append(blocks[rate][i % 6][: (frames % rate) * frame])
        fmt = formats[i % len(formats)]
        wav = root / (f"clip{i:04d}.wav" if fmt == "wav" else f".clip{i:04d}.tmp.wav")
        with wave.open(str(wav), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(b"".join(parts))
        if fmt != "wav":
            dest = root / f"clip{i:04d}.{fmt}"
            extra = ["-b:a", "128k"] if fmt == "mp3" else []
            cmd = [str(ffmpeg), "-hide_banner", "-loglevel", "error", "-y", "-i", str(wav), *extra, str(dest)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wav.unlink()
            if out.returncode != 0 or not dest.is_file():
                raise RuntimeError(f"ffmpeg could not encode {dest.name}: {out.stderr[-1000:]}")
        return frames / rate

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            total = sum(pool.map(one, range(count)))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in root.iterdir())
    what = (
        f"{count} clips of 5-10 s ({total / 60:.0f} min of audio, {size / 2**20:.0f} MiB; "
        f"{', '.join(f.upper() for f in formats)}; 44.1/48 kHz stereo)"
    )
    return root, what


# --- the plot ---------------------------------------------------------------------------------------------

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def svg(trajectories: dict[str, dict[str, Any]], path: Path) -> None:
    """One panel per workload: each tuned stage's concurrency (and the pool's threads) over time, as steps."""
    pw, ph, pad = 420, 220, 50
    names = list(trajectories)
    width, height = pw * len(names) + pad, ph + 2 * pad
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif"'
        ' font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for k, name in enumerate(names):
        run = trajectories[name]
        series: dict[str, list[tuple[float, int]]] = {}
        start = dict((s, c) for s, c in run.get("start", []))
        for stage, c in run.get("start") or run.get("end") or []:
            series.setdefault(stage, [(0.0, c)])
        for c in run["changes"]:
            # A queue's capacity is a series of its own, named after the stage before it.
            key = f"{c['stage']} queue" if c.get("knob") == "queue_capacity" else c["stage"]
            pts = series.setdefault(key, [(0.0, start.get(key, c["from"]))])
            pts.append((c["at_s"], c["to"]))
        t_end = max(run["seconds"], max((c["at_s"] for c in run["changes"]), default=0.0))
        y_max = max([v for pts in series.values() for _, v in pts] + [1])
        x0, y0 = pad + k * pw + 10, pad
        w, h = pw - 60, ph - 20

        def x(t: float) -> float:
            return x0 + w * t / max(t_end, 1e-9)

        def y(v: float) -> float:
            # log2 scale: concurrency 1-8 and queues of 256 slots in one panel.
            return y0 + h - h * math.log2(max(v, 1)) / max(math.log2(y_max), 1)

        parts.append(f'<text x="{x0}" y="{y0 - 12}" font-size="13" font-weight="bold">{name}</text>')
        parts.append(f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="black"/>')
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>')
        for frac in (0.0, 0.5, 1.0):
            t = t_end * frac
            parts.append(f'<text x="{x(t):.1f}" y="{y0 + h + 14}" text-anchor="middle">{t:.1f}s</text>')
        for v in sorted({1, round(2 ** (math.log2(y_max) / 2)), y_max}):
            parts.append(f'<text x="{x0 - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
        if run.get("settled_at") is not None:
            sx = x(run["settled_at"])
            parts.append(
                f'<line x1="{sx:.1f}" y1="{y0}" x2="{sx:.1f}" y2="{y0 + h}" stroke="#999" stroke-dasharray="4 3"/>'
            )
            parts.append(f'<text x="{sx + 3:.1f}" y="{y0 + 10}" fill="#666">settled</text>')
        for i, (stage, pts) in enumerate(sorted(series.items())):
            color = COLORS[i % len(COLORS)]
            d = [f"M{x(pts[0][0]):.1f},{y(pts[0][1]):.1f}"]
            for (_, v_prev), (t, v) in zip(pts, pts[1:]):
                d.append(f"H{x(t):.1f}V{y(v):.1f}")
            d.append(f"H{x(t_end):.1f}")
            dash = ' stroke-dasharray="6 3"' if stage == "pool" else ""
            parts.append(f'<path d="{"".join(d)}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            label = stage.split("]")[-1] if len(stage) > 28 else stage
            parts.append(f'<text x="{x0 + w - 4}" y="{y0 + 14 + 13 * i}" text-anchor="end" fill="{color}">'
                         f"{label} (end {pts[-1][1]})</text>")
    parts.append(
        f'<text x="{pad}" y="{height - 12}">concurrency per tuned stage, pool threads (dashed) and queue '
        "capacities over the run, log scale; grey: the controller first settled</text>"
    )
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


# --- the runs ---------------------------------------------------------------------------------------------


def interleaved(name: str, runs: dict[str, Any], repeat: int) -> dict[str, dict[str, Any]]:
    """Runs every option set of `runs` (label -> a function returning one result) `repeat` times, one round
    over all of them after the other (so that a slow spell of a shared machine hits every option set alike),
    and keeps each option set's median run (by throughput; its RSS, trajectory and settling time with it)."""
    got: dict[str, list[dict[str, Any]]] = {label: [] for label in runs}
    for k in range(repeat):
        for label, fn in runs.items():
            r = fn()
            got[label].append(r)
            print(f"{name} {label} (round {k + 1}/{repeat}): {r['throughput']:.0f}", file=sys.stderr)
    out = {}
    for label, rs in got.items():
        ordered = sorted(rs, key=lambda r: r["throughput"])
        median = dict(ordered[len(ordered) // 2])
        median["runs"] = [r["throughput"] for r in rs]
        out[label] = median
    return out


AUTO = "**--autotune** from the defaults"
DEFAULT = "defaults, no autotune"


def row(label: str, r: dict[str, Any], best: float) -> str:
    settled = "" if r.get("settled_at") is None else f"{r['settled_at']:.1f}"
    runs = r.get("runs", [r["throughput"]])
    spread = "" if len(runs) < 2 else f" | {min(runs):.0f}-{max(runs):.0f}"
    return (
        f"| {label} | {r['throughput']:.0f} | {r['throughput'] / best * 100:.0f}% | {r['seconds']:.1f} | "
        f"{settled} | {r['rss'] / 2**20:.0f}{spread} |"
    )


def report(name: str, grid: dict[str, dict[str, Any]], auto: dict[str, Any], default: dict[str, Any]) -> str:
    best_label = max(grid, key=lambda k: grid[k]["throughput"])
    best = grid[best_label]["throughput"]
    unit = auto["unit"]
    repeated = len(auto.get("runs", [])) > 1
    head = f"| options | {unit} | of the best grid point | s | settled at s | peak RSS MiB |"
    rule = "|---|---:|---:|---:|---:|---:|"
    if repeated:
        head += " range over the runs |"
        rule += "---:|"
    lines = [f"### {name}", "", head, rule]
    for label, r in sorted(grid.items(), key=lambda kv: -kv[1]["throughput"]):
        lines.append(row(label + (" (best)" if label == best_label else ""), r, best))
    lines.append(row(AUTO, auto, best))
    lines.append(row(DEFAULT, default, best))
    moves = ", ".join(f"{s} {c}" for s, c in auto.get("end", []))
    queues: dict[str, int] = {}
    for c in auto["changes"]:
        if c.get("knob") == "queue_capacity":
            queues[c["stage"]] = c["to"]
    if queues:
        moves += "; queue after " + ", ".join(f"{s} {c} slots" for s, c in queues.items())
    budget = auto.get("budget")
    lines += [
        "",
        f"Autotune ended at {moves or 'the defaults'}"
        + (f" (memory budget {budget / 2**30:.1f} GiB)" if budget else "")
        + f"; {len(auto['changes'])} changes.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spdl", help="the CLI (release build): for the jpeg and s3 workloads")
    ap.add_argument("--data", type=Path, help="a folder of JPEGs (`spdl gen-data`): for the jpeg and s3 workloads")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--py-seconds", type=float, default=20.0)
    ap.add_argument("--audio-clips", type=int, default=300, help="clips the audio workload makes at start")
    ap.add_argument("--workloads", default="jpeg,s3,pyslow")
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs of each option set, in interleaved rounds; the median is reported"
    )
    ap.add_argument("--svg", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="earlier --json results to plot with these")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    out: list[str] = []
    common = ["--limit", str(args.images), "--epochs", str(args.epochs)]
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - {"jpeg", "s3", "pyslow", "audio"})
    if unknown:
        ap.error(f"unknown workloads {', '.join(unknown)} (known: jpeg, s3, pyslow, audio)")
    if {"jpeg", "s3"} & set(workloads) and (args.spdl is None or args.data is None):
        ap.error("the jpeg and s3 workloads need --spdl and --data")
    if args.audio_clips < 1 or args.py_seconds <= 0 or args.repeat < 1:
        ap.error("--audio-clips and --repeat must be at least 1 and --py-seconds above 0")

    def split(name: str, runs: dict[str, Any]):
        got = interleaved(name, runs, args.repeat)
        auto, default = got.pop(AUTO), got.pop(DEFAULT)
        results[name] = {"grid": got, "autotune": auto, "default": default}
        return got, auto, default

    def cli_grid(name: str, target: list[str], threads: list[int], io: list[int], env: dict[str, str] | None = None):
        def cli(extra: list[str]):
            return lambda: bench_cli(args.spdl, target, [*common, *extra], env)

        runs: dict[str, Any] = {
            f"threads {t}, io {c}": cli(["--threads", str(t), "--io-concurrency", str(c)]) for t in threads for c in io
        }
        runs[AUTO] = cli(["--autotune"])
        runs[DEFAULT] = cli(["--no-autotune"])
        return split(name, runs)

    def py_grid(name: str, script: str, label: str, *extra: str):
        def py(t: int, c: int, tune: bool):
            return lambda: bench_py(args.python, name, script, args.py_seconds, t, c, tune, *extra)

        runs: dict[str, Any] = {f"num_threads {t}, {label} {c}": py(t, c, False) for t in [2, 4, 8] for c in [1, 2, 4, 8]}
        runs[AUTO] = py(4, 0, True)
        runs[DEFAULT] = py(4, 0, False)
        return split(name, runs)

    if "jpeg" in workloads:
        g, a, d = cli_grid("jpeg", [str(args.data)], [1, 2, 3, 4], [2, 16, 64])
        out.append(report("Local JPEGs, eval center-crop at 224", g, a, d))
    if "s3" in workloads:
        proc, port, root = start_s3(args.data, args.images)
        proxy = DelayProxy(port, 0.020)
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}
        target = ["s3://photos/train", "--endpoint", f"http://127.0.0.1:{proxy.port}"]
        try:
            g, a, d = cli_grid("s3", target, [1, 2, 4], [4, 16, 64, 128], env)
        finally:
            proc.kill()
            proc.wait()
            shutil.rmtree(root, ignore_errors=True)
        out.append(report("The same JPEGs from S3 (s3s-fs) with 20 ms added per GET", g, a, d))
    if "pyslow" in workloads:
        grid, auto, default = py_grid("pyslow", PYSLOW, "concurrency")
        title = f"A slow Python stage (2 ms wait + 0.1 ms work per item), {args.py_seconds:.0f} s runs"
        out.append(report(title, grid, auto, default))
    if "audio" in workloads:
        clips, what = make_clips(args.audio_clips)
        print(f"audio: {what} in {clips}", file=sys.stderr)
        try:
            grid, auto, default = py_grid("audio", AUDIO, "decode concurrency", str(clips))
        finally:
            shutil.rmtree(clips, ignore_errors=True)
        title = f"Audio: read, decode and resample to 16 kHz mono, {what}, {args.py_seconds:.0f} s runs"
        out.append(report(title, grid, auto, default))
    for earlier in args.merge:
        for k, v in json.loads(earlier.read_text()).items():
            results.setdefault(k, v)
    svg({k: v["autotune"] for k, v in results.items()}, args.svg)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("\n".join(out))


if __name__ == "__main__":
    main()
