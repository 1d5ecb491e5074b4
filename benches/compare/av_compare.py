"""Audio/video decode throughput: spdl-rs (spdl-io) against Meta's SPDL 0.8.0 `load_audio` / `load_video`.

Targets: at least parity with SPDL on video (both decode with FFmpeg's libavcodec) and >= 1.2x on
FLAC and MP3 audio (spdl-rs decodes audio with symphonia, SPDL with FFmpeg).

The job, the same on both sides: decode every file of one format whole, in its native format (audio: f32
channels-first [C, T] at the source rate and channel count; video: every frame as rgb24 [N, H, W, 3] at the
coded size, one decoder thread per video), `--repeat` times over, across T threads that take the next file
from a shared queue. spdl-rs runs `cargo run --example av_throughput` (std threads, an atomic index); SPDL runs
`spdl.io.load_*` + `spdl.io.to_numpy` in a Python `ThreadPoolExecutor(T)` (its decoders release the GIL).
Each side decodes the first file once before its clock starts (library initialisation).

Media are made once by the ffmpeg CLI into target/compare-av (delete the directory to remake them): 40 clips
of 10 s 44.1 kHz stereo music-like audio (chords of sines with vibrato and tremolo, plus noise; each clip its
own notes) as FLAC (s16), MP3 (192 kb/s), WAV (s16), Ogg Vorbis (q6) and AAC in M4A (192 kb/s); 8 clips of
10 s 640x360 25 fps yuv420p video (testsrc2, hue-shifted per clip) as H.264 (libx264 fast, GOP 50, MP4) and
VP9 (libvpx realtime, WebM).

Each run is a process of its own; the two runners alternate for `--rounds` rounds (the order flips each
round) and the median is reported: seconds of audio (or frames) per second of the decode loop's wall time,
and per CPU second (user + system of the process over the loop, getrusage, so interpreter start and imports
are not charged), the ratio spdl-rs / SPDL of each, and peak RSS (ru_maxrss). The output shapes of both
loaders are compared file by file; a mismatch is printed and reported.

Run through `AV_ONLY=1 bash benches/compare/run.sh` (or `cargo xtask compare`, which runs it after the image
comparison), or directly with `.venv-peers/bin/python benches/compare/av_compare.py [--no-docs]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MEDIA_VERSION = "av-media-v1"  # change when the media recipe changes: the cache is remade
SAMPLE_RATE = 44_100
CLIP_SECONDS = 10
SECTION = "## Audio/video comparison"

# name -> (kind, extension, ffmpeg encoder arguments from the WAV/Y4M master)
AUDIO_FORMATS = {
    "flac": ("audio", "flac", ["-c:a", "flac", "-sample_fmt", "s16"]),
    "mp3": ("audio", "mp3", ["-c:a", "libmp3lame", "-b:a", "192k"]),
    "wav": ("audio", "wav", ["-c:a", "pcm_s16le"]),
    "vorbis": ("audio", "ogg", ["-c:a", "libvorbis", "-q:a", "6"]),
    "aac-m4a": ("audio", "m4a", ["-c:a", "aac", "-b:a", "192k"]),
}
VIDEO_FORMATS = {
    "h264": ("video", "mp4", ["-c:v", "libx264", "-preset", "fast", "-g", "50", "-pix_fmt", "yuv420p"]),
    "vp9": ("video", "webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "1M",
                              "-g", "50", "-pix_fmt", "yuv420p"]),
}
FORMATS = {**AUDIO_FORMATS, **VIDEO_FORMATS}
# Targets: spdl-rs / SPDL, judged on throughput and on throughput per CPU core.
TARGETS = {"h264": 1.0, "vp9": 1.0, "flac": 1.2, "mp3": 1.2}
RUNNERS = ["spdl-rs", "spdl-0.8"]
LABELS = {"spdl-rs": "spdl-rs (spdl-io, av_throughput)", "spdl-0.8": "Meta SPDL 0.8.0 (load_audio/load_video)"}


def log(message: str) -> None:
    print(f"av-compare: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- worker


def spdl_worker(args: argparse.Namespace) -> int:
    """Runs the job through Meta's SPDL in this process; prints one JSON line like av_throughput's."""
    import resource

    import spdl.io

    files = [line.strip() for line in Path(args.list).read_text().splitlines() if line.strip()]
    load = spdl.io.load_audio if args.kind == "audio" else spdl.io.load_video

    def job(path: str) -> tuple[int, ...]:
        return tuple(spdl.io.to_numpy(load(path)).shape)

    job(files[0])  # warm-up: FFmpeg/library initialisation, outside the clock (as the Rust side does)
    jobs = [(i % len(files), files[i % len(files)]) for i in range(len(files) * args.repeat)]
    shapes: dict[str, list[int]] = {}
    failed, first_error, frames = 0, None, 0
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        futures = [(path, pool.submit(job, path)) for _, path in jobs]
        for path, fut in futures:
            try:
                shape = fut.result()
            except Exception as err:  # noqa: BLE001 - counted and reported, like the Rust side
                failed += 1
                first_error = first_error or f"{path}: {err}"
                continue
            shapes.setdefault(path, list(shape))
            # audio [C, T]: T samples per channel; video [N, H, W, C]: N frames
            frames += shape[-1] if args.kind == "audio" else shape[0]
    seconds = time.perf_counter() - start
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    print(json.dumps({
        "runner": "spdl-0.8", "kind": args.kind, "threads": args.threads, "repeat": args.repeat,
        "items": len(jobs) - failed, "failed": failed, "seconds": seconds, "cpu_seconds": cpu,
        "audio_seconds": frames / SAMPLE_RATE if args.kind == "audio" else 0.0, "frames": frames,
        "peak_rss_mib": ru1.ru_maxrss / 1024, "first_error": first_error, "shapes": shapes,
    }))
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------------- media


def ffmpeg(*argv: str) -> None:
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *argv], check=True)


def audio_expr(i: int) -> str:
    """A music-like stereo signal: a three-note chord with vibrato, a tremolo melody line, and noise; each clip
    its own root note."""
    root = 110.0 * 2 ** ((i * 5 % 24) / 12)
    left = (f"0.22*sin(2*PI*{root:.3f}*t+0.8*sin(2*PI*5*t))+0.15*sin(2*PI*{root * 1.26:.3f}*t)"
            f"+0.12*sin(2*PI*{root * 1.5:.3f}*t)*(0.6+0.4*sin(2*PI*0.7*t))"
            f"+0.1*sin(2*PI*{root * 4:.3f}*t)*abs(sin(2*PI*2*t))+0.03*(2*random(0)-1)")
    right = (f"0.2*sin(2*PI*{root * 1.005:.3f}*t)+0.15*sin(2*PI*{root * 1.498:.3f}*t+0.5*sin(2*PI*3*t))"
             f"+0.12*sin(2*PI*{root * 2:.3f}*t)*(0.6+0.4*cos(2*PI*0.5*t))"
             f"+0.1*sin(2*PI*{root * 3:.3f}*t)*abs(cos(2*PI*2*t))+0.03*(2*random(1)-1)")
    return f"aevalsrc={left}|{right}:s={SAMPLE_RATE}:d={CLIP_SECONDS}"


def make_media(root: Path, n_audio: int, n_video: int, formats: list[str]) -> dict[str, list[Path]]:
    """Lists the clips of each format under `root`, making (once) those that are missing. Files are written
    under a temporary name and renamed, so an interrupted run leaves no half-written clip behind."""
    marker = root / ".media-version"
    if root.is_dir() and (not marker.is_file() or marker.read_text().strip() != MEDIA_VERSION):
        log(f"media recipe changed: removing the old clips in {root}")
        for name in FORMATS:
            for old in (root / name).glob("clip*"):
                old.unlink()
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(MEDIA_VERSION + "\n")
    listing = {}
    for name in formats:
        kind, ext, _ = FORMATS[name]
        n = n_audio if kind == "audio" else n_video
        listing[name] = [root / name / f"clip{i:03d}.{ext}" for i in range(n)]
    jobs = []
    for kind, n in (("audio", n_audio), ("video", n_video)):
        for i in range(n):
            names = [f for f in formats if FORMATS[f][0] == kind and not listing[f][i].is_file()]
            if names:
                jobs.append((kind, i, names))
    if not jobs:
        log(f"reusing media in {root}")
        return listing
    log(f"making {sum(len(j[2]) for j in jobs)} clips in {root} with the ffmpeg CLI (once; a few minutes on "
        "2 busy cores)")
    master = root / "master"
    master.mkdir(parents=True, exist_ok=True)

    def make(job: tuple[str, int, list[str]]) -> None:
        kind, i, names = job
        if kind == "audio":
            src = master / f"a{i:03d}.wav"
            ffmpeg("-f", "lavfi", "-i", audio_expr(i), "-c:a", "pcm_s16le", str(src))
        else:
            src = master / f"v{i:03d}.y4m"
            ffmpeg("-f", "lavfi", "-i", f"testsrc2=size=640x360:rate=25:duration={CLIP_SECONDS}",
                   "-vf", f"hue=h={i * 45 % 360}", "-pix_fmt", "yuv420p", str(src))
        for name in names:
            _, ext, enc = FORMATS[name]
            out = root / name / f"clip{i:03d}.{ext}"
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f"tmp-{out.name}")
            ffmpeg("-i", str(src), *enc, str(tmp))
            tmp.rename(out)
        src.unlink()

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(make, jobs))
    master.rmdir()
    return listing


# ------------------------------------------------------------------------------------------------ measuring


def rust_example(root: Path) -> Path:
    return root / "target" / "release" / "examples" / "av_throughput"


def run_one(runner: str, fmt: str, threads: int, repeat: int, listing: Path, args: argparse.Namespace) -> dict:
    kind = FORMATS[fmt][0]
    common = ["--threads", str(threads), "--repeat", str(repeat), "--list", str(listing)]
    if runner == "spdl-rs":
        cmd = [str(args.rust_bin), kind, *common]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--kind", kind, *common]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    wall = time.perf_counter() - start
    raw = None
    for line in reversed(proc.stdout.splitlines()):
        if line.strip().startswith("{"):
            raw = json.loads(line)
            break
    if raw is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][-300:]
        return {"error": f"exit status {proc.returncode}: {tail}"}
    raw["process_wall_seconds"] = wall
    if proc.returncode != 0 or raw.get("failed"):
        raw["error"] = f"exit status {proc.returncode}, {raw.get('failed')} failed: {raw.get('first_error')}"
    return raw


def rate(run: dict, kind: str, per_cpu: bool) -> float:
    amount = run["audio_seconds"] if kind == "audio" else run["frames"]
    denom = run["cpu_seconds"] if per_cpu else run["seconds"]
    return amount / denom if denom else 0.0


def summarize(runs: list[dict], kind: str) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"ok": 0, "error": runs[0].get("error") if runs else "not run"}
    med = statistics.median
    return {
        "ok": len(ok),
        "rate": med(rate(r, kind, False) for r in ok),
        "rate_min": min(rate(r, kind, False) for r in ok),
        "rate_max": max(rate(r, kind, False) for r in ok),
        "rate_per_cpu": med(rate(r, kind, True) for r in ok),
        "cpu_seconds": med(r["cpu_seconds"] for r in ok),
        "seconds": med(r["seconds"] for r in ok),
        "peak_rss_mib": med(r["peak_rss_mib"] for r in ok),
    }


def shape_mismatches(rs: dict, py: dict) -> list[str]:
    out = []
    for path in sorted(set(rs) | set(py)):
        a, b = rs.get(path), py.get(path)
        if a != b:
            out.append(f"{Path(path).parent.name}/{Path(path).name}: spdl-rs {a} vs SPDL {b}")
    return out


# ----------------------------------------------------------------------------------------------------- report


def machine() -> dict:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ["spdl", "spdl-io", "numpy"]:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        out["ffmpeg"] = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split()[2]
    except (OSError, IndexError):
        out["ffmpeg"] = None
    return out


def verdict(ratio: float | None, target: float | None) -> str:
    if ratio is None:
        return "n/a"
    if target is None:
        return ""
    return "met" if ratio >= target else "NOT met"


def rows(results: dict) -> list[dict]:
    out = []
    for fmt, by_threads in results["summary"].items():
        kind = FORMATS[fmt][0]
        for threads, s in by_threads.items():
            rs, py = s.get("spdl-rs", {}), s.get("spdl-0.8", {})
            both = rs.get("ok") and py.get("ok")
            ratio = rs["rate"] / py["rate"] if both and py["rate"] else None
            ratio_cpu = rs["rate_per_cpu"] / py["rate_per_cpu"] if both and py["rate_per_cpu"] else None
            out.append({"format": fmt, "kind": kind, "threads": int(threads), "spdl_rs": rs, "spdl": py,
                        "ratio": ratio, "ratio_per_cpu": ratio_cpu, "target": TARGETS.get(fmt),
                        "mismatches": s.get("mismatches", [])})
    return out


def fmt_rate(s: dict, key: str) -> str:
    return f"{s[key]:,.0f}" if s.get("ok") else f"failed ({s.get('error', '')[:60]})"


def table_lines(results: dict) -> list[str]:
    unit = {"audio": "s audio/s", "video": "frames/s"}
    lines = ["| format | T | unit | spdl-rs (min-max) | SPDL 0.8.0 (min-max) | ratio | spdl-rs per core | "
             "SPDL per core | ratio per core | target | RSS MiB rs / SPDL |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(results):
        rs, py = r["spdl_rs"], r["spdl"]

        def span(s: dict) -> str:
            return f"{fmt_rate(s, 'rate')} ({s['rate_min']:,.0f}-{s['rate_max']:,.0f})" if s.get("ok") \
                else fmt_rate(s, "rate")

        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "n/a"
        ratio_cpu = f"{r['ratio_per_cpu']:.2f}x" if r["ratio_per_cpu"] is not None else "n/a"
        target = (f">= {r['target']:.1f}x: {verdict(r['ratio'], r['target'])} / "
                  f"{verdict(r['ratio_per_cpu'], r['target'])}") if r["target"] else ""
        rss = (f"{rs.get('peak_rss_mib', 0):.0f} / {py.get('peak_rss_mib', 0):.0f}"
               if rs.get("ok") and py.get("ok") else "")
        lines.append(f"| {r['format']} | {r['threads']} | {unit[r['kind']]} | {span(rs)} | {span(py)} | {ratio} | "
                     f"{fmt_rate(rs, 'rate_per_cpu')} | {fmt_rate(py, 'rate_per_cpu')} | {ratio_cpu} | {target} | "
                     f"{rss} |")
    return lines


def markdown(results: dict) -> str:
    job = results["job"]
    mism = [f"- {r['format']}: {m}" for r in rows(results) if r["threads"] == min(job["threads"])
            for m in r["mismatches"][:3]]
    n_mism = {r["format"]: len(r["mismatches"]) for r in rows(results) if r["threads"] == min(job["threads"])}
    out = [
        SECTION,
        "",
        "_Written by `benches/compare/av_compare.py` (`AV_ONLY=1 bash benches/compare/run.sh`, or after the image "
        "comparison in `cargo xtask compare`); rerun it rather than editing this section._",
        "",
        f"- Date: {results['date']}; commit {results.get('commit') or 'unknown'}",
        f"- Machine: {results['machine']['cpu']}, {results['machine']['cores']} cores; `uptime` before: "
        f"`{results['uptime_before']}`; after: `{results['uptime_after']}` (the machine is shared: other builds "
        "and tests ran at the same time)",
        f"- Command: `{results['command']}`; the Rust side: `{results['rust_command']}`",
        f"- Versions: Python {results['machine']['python']}, spdl {results['versions'].get('spdl')}, "
        f"numpy {results['versions'].get('numpy')}, FFmpeg {results['versions'].get('ffmpeg')} (CLI and libraries)",
        f"- Job: decode whole files, {job['audio_clips']} audio clips of {CLIP_SECONDS} s 44.1 kHz stereo per "
        f"format (x{job['audio_repeat']}) to f32 [C, T] at the native rate; {job['video_clips']} video clips of "
        f"{CLIP_SECONDS} s 640x360 25 fps (x{job['video_repeat']}), every frame to rgb24 [N, H, W, 3] at the "
        f"native size, one decoder thread per video; T threads; each run a process of its own, runners "
        f"alternating, median of {job['rounds']} rounds. Media: `target/compare-av`, made by the ffmpeg CLI.",
        "",
        *table_lines(results),
        "",
        "Rates: seconds of audio decoded per second of wall time (audio) or frames per second (video), over the "
        "decode loop only (each side decodes its first file once before the clock starts); per core: the same "
        "amount over the process's CPU seconds in the loop (getrusage). Ratios are spdl-rs / SPDL. Targets "
        "targets: video >= 1.0x, FLAC/MP3 >= 1.2x; the verdict is given on throughput / per core.",
        "",
        "Output shapes, file by file (first decode of each): "
        + ", ".join(f"{f}: {'same' if n == 0 else f'{n} files differ'}" for f, n in n_mism.items()) + ".",
        *mism,
        *aac_note(results),
        "",
        "Reading it: T=2 can only show scaling on an idle machine; on a shared one both runners get whatever the "
        "other processes leave, so the per-core figures (work per CPU-second) are the steadier comparison, and "
        "the min-max spread says how much the wall-time figures moved between rounds.",
        "",
        "How each side decodes: spdl-rs reads PCM WAV with its fast path (bytes straight into the output), FLAC "
        "and AAC with symphonia (pure Rust), MP3 and Vorbis with FFmpeg (libavcodec, faster than symphonia on "
        "them; samples converted straight into the output planes), video with FFmpeg through ffmpeg-next "
        "(swscale writes each frame into its slot of the output buffer). SPDL decodes all of them with FFmpeg "
        "(libavcodec + an `aformat=fltp` / `format=rgb24` filter graph).",
        "",
    ]
    return "\n".join(out)


def aac_note(results: dict) -> list[str]:
    """Explains the AAC length difference when it is exactly the encoder priming (1024 samples)."""
    rs_len, py_len = [], []
    for r in rows(results):
        if r["format"] != "aac-m4a" or not r["mismatches"]:
            continue
        for m in r["mismatches"]:
            try:
                a, b = m.split(": spdl-rs ", 1)[1].split(" vs SPDL ")
                rs_len.append(json.loads(a)[-1])
                py_len.append(json.loads(b)[-1])
            except (IndexError, ValueError, TypeError):
                return []
    if rs_len and all(a - b == 1024 for a, b in zip(rs_len, py_len)):
        return ["- aac-m4a: every clip is 1024 samples longer through spdl-rs: symphonia keeps the AAC encoder's "
                "priming samples (no gapless trim), FFmpeg drops them as the M4A edit list says. The rates count "
                "each side's own samples."]
    return []


def write_docs(docs: Path, section: str) -> None:
    """Replaces this section of docs (up to the next `## ` heading); if absent, inserts it after the image
    "## Comparison" section, or appends it."""
    lines = docs.read_text().splitlines(keepends=True) if docs.exists() else ["# Benchmarks\n", "\n"]
    new = [line + "\n" for line in section.rstrip("\n").split("\n")] + ["\n"]
    start = next((i for i, line in enumerate(lines) if line.rstrip() == SECTION), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        comp = next((i for i, line in enumerate(lines) if line.rstrip() == "## Comparison"), None)
        if comp is None:
            start = end = len(lines)
            if lines and lines[-1].strip():
                new = ["\n", *new]
        else:
            start = end = next((i for i in range(comp + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    if end == len(lines):
        new = new[:-1]
    docs.write_text("".join(lines[:start] + new + lines[end:]))


# ------------------------------------------------------------------------------------------------------- main


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=["audio", "video"], help=argparse.SUPPRESS)
    parser.add_argument("--list", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                        help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"subset of {','.join(FORMATS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--audio-clips", type=int, default=40)
    parser.add_argument("--video-clips", type=int, default=8)
    parser.add_argument("--audio-repeat", type=int, default=2, help="decodes of each audio clip per run")
    parser.add_argument("--video-repeat", type=int, default=1, help="decodes of each video clip per run")
    parser.add_argument("--media", type=Path, default=ROOT / "target/compare-av")
    parser.add_argument("--rust-bin", type=Path, default=rust_example(ROOT),
                        help="the av_throughput example (cargo build --release -p spdl-io --example av_throughput "
                             "--features ffmpeg)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before one run is abandoned")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs/benchmarks.md")
    parser.add_argument("--no-docs", action="store_true", help="print only; do not touch docs/")
    parser.add_argument("--results", type=Path, default=ROOT / "target/compare-av/results.json")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: print and write docs from an earlier --results file")
    args = parser.parse_args()

    if args.worker:
        args.threads = args.threads[0]
        return spdl_worker(args)
    if args.render_only:
        results = json.loads(args.results.read_text())
        print("\n".join(table_lines(results)))
        if not args.no_docs:
            write_docs(args.docs, markdown(results))
            log(f"wrote {args.docs} ({SECTION}) from {args.results}")
        return 0

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {list(FORMATS)}")
    if not args.rust_bin.is_file():
        parser.error(f"{args.rust_bin} is missing: cargo build --release -p spdl-io --example av_throughput "
                     "--features ffmpeg")
    media = make_media(args.media, args.audio_clips, args.video_clips, formats)
    for name, files in media.items():
        listing = args.media / f"{name}.txt"
        listing.write_text("".join(f"{p.resolve()}\n" for p in files))
        for p in files:
            p.read_bytes()  # page cache warm for both runners

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    up_before = uptime()
    log(f"uptime: {up_before}")
    runs: dict[str, dict[int, dict[str, list[dict]]]] = {}
    mismatches: dict[str, dict[int, list[str]]] = {}
    for fmt in formats:
        kind = FORMATS[fmt][0]
        repeat = args.audio_repeat if kind == "audio" else args.video_repeat
        listing = args.media / f"{fmt}.txt"
        for threads in args.threads:
            slot = runs.setdefault(fmt, {}).setdefault(threads, {r: [] for r in RUNNERS})
            for rnd in range(args.rounds):
                order = RUNNERS if rnd % 2 == 0 else RUNNERS[::-1]
                for runner in order:
                    run = run_one(runner, fmt, threads, repeat, listing, args)
                    run["round"] = rnd
                    slot[runner].append(run)
                    if "error" in run:
                        log(f"{fmt} T={threads} round {rnd + 1} {runner}: FAILED: {run['error']}")
                    else:
                        unit = "s audio/s" if kind == "audio" else "frames/s"
                        log(f"{fmt} T={threads} round {rnd + 1} {runner}: {rate(run, kind, False):8.1f} {unit}, "
                            f"{rate(run, kind, True):8.1f} per CPU s, {run['peak_rss_mib']:.0f} MiB")
            rs_ok = [r for r in slot["spdl-rs"] if "shapes" in r]
            py_ok = [r for r in slot["spdl-0.8"] if "shapes" in r]
            if rs_ok and py_ok:
                mm = shape_mismatches(rs_ok[0]["shapes"], py_ok[0]["shapes"])
                mismatches.setdefault(fmt, {})[threads] = mm
                for m in mm[:5]:
                    log(f"SHAPE MISMATCH {fmt}: {m}")
                if len(mm) > 5:
                    log(f"SHAPE MISMATCH {fmt}: ... {len(mm) - 5} more")
    up_after = uptime()

    summary = {
        fmt: {str(t): {r: summarize(by_runner[r], FORMATS[fmt][0]) for r in RUNNERS}
              | {"mismatches": mismatches.get(fmt, {}).get(t, [])}
              for t, by_runner in by_t.items()}
        for fmt, by_t in runs.items()
    }
    results = {
        "date": started,
        "commit": git_commit(),
        "command": os.environ.get("SPDL_AV_COMPARE_COMMAND") or " ".join(["python", *sys.argv]),
        "rust_command": f"{args.rust_bin.relative_to(ROOT) if args.rust_bin.is_relative_to(ROOT) else args.rust_bin}"
                        " (audio|video) --threads T --repeat R --list FILES",
        "machine": machine(),
        "versions": versions(),
        "uptime_before": up_before,
        "uptime_after": up_after,
        "job": {"audio_clips": args.audio_clips, "video_clips": args.video_clips, "audio_repeat": args.audio_repeat,
                "video_repeat": args.video_repeat, "threads": args.threads, "rounds": args.rounds,
                "formats": formats},
        "summary": summary,
        "runs": {fmt: {str(t): {r: [{k: v for k, v in run.items() if k != "shapes"} for run in rr]
                                for r, rr in by.items()} for t, by in by_t.items()} for fmt, by_t in runs.items()},
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2))
    for r in rows(results):
        print(json.dumps({k: v for k, v in r.items() if k != "mismatches"} | {"mismatches": len(r["mismatches"])}))
    print("\n".join(table_lines(results)))
    log(f"raw results in {args.results}")
    if not args.no_docs:
        write_docs(args.docs, markdown(results))
        log(f"wrote {args.docs} ({SECTION})")
    failed = [(r["format"], r["threads"]) for r in rows(results) if not (r["spdl_rs"].get("ok") and r["spdl"].get("ok"))]
    if failed:
        log(f"never succeeded: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
