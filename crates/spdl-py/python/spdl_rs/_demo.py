"""``python -m spdl_rs demo``: a first run of spdl_rs on data it makes itself.

1. A small JPEG dataset (``images/class_NNN/img_NNNNN.jpg``, sizes from 320x240 to 640x480, encoded by
   spdl_rs's own encoder), made once and reused.
2. :py:class:`spdl_rs.loader.ImageLoader` over it: read, batch, decode and center-crop to 224x224 in Rust;
   prints the per-stage statistics (with the bottleneck), images/s, CPU seconds and peak RSS.
3. Where video decoding works and the ``ffmpeg`` command is on PATH, a few short H.264 videos and a
   :py:class:`spdl_rs.pipeline.PipelineBuilder` pipeline whose one native stage decodes each video's clips
   (:py:func:`spdl_rs.io.ops.load_clips`, each GOP once); prints clips/s. Otherwise one line says why it was skipped and how to get video.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import spdl_rs

from . import _native
from .io import ops
from .loader import ImageLoader
from .pipeline import PipelineBuilder

__all__ = ["default_dir", "run_demo"]

_SEED = 2024
_CLASSES = 10
_SIZE = 224
"""The side of the square images the loader makes (center crop)."""

# The video part: short testsrc2 videos (H.264, 25 fps, a keyframe every second) and 1-second clips of them.
_VIDEO_SIZES = ((320, 240), (480, 270), (640, 360), (640, 480))
_VIDEO_SECONDS = 3
_CLIP_SECONDS = 1.0
_CLIP_FRAMES = 8
_CLIP_SIZE = 112
_CLIP_PASSES = 3

_VIDEO_BUILD_HINT = (
    "to decode video, use a build with the `ffmpeg` feature (the wheel of `cargo xtask wheel` has it) and "
    "FFmpeg's shared libraries (e.g. `apt-get install ffmpeg`)"
)


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/spdl-rs/demo-py``, else ``~/.cache/spdl-rs/demo-py``."""
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path.home() / ".cache"
    return base / "spdl-rs" / "demo-py"


def _default_threads() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------- measuring


def _cpu_seconds() -> float:
    """CPU time of the whole process (every thread, the Rust ones included), user + system."""
    try:
        import resource
    except ImportError:  # not a Unix
        return time.process_time()
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB elsewhere


def _bottleneck(table: str) -> str | None:
    """The stage the stats table names as the bottleneck."""
    m = re.search(r"bottleneck: `([^`]+)`", table)
    if m:
        return m.group(1)
    for line in table.splitlines():
        if line.rstrip().endswith("<- bottleneck") and line.split():
            return line.split()[0]
    return None


class _Progress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, total: int, unit: str, enabled: bool) -> None:
        self._total = total
        self._unit = unit
        self._enabled = enabled and sys.stderr.isatty()
        self._t0 = time.monotonic()
        self._last = 0.0

    def update(self, done: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self._total:
            return
        self._last = now
        rate = done / max(now - self._t0, 1e-9)
        width = 30
        filled = width * done // max(self._total, 1)
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{self._total} {self._unit}  {rate:.0f}/s ")
        sys.stderr.flush()

    def close(self) -> None:
        if self._enabled:
            sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()


# ----------------------------------------------------------------------------------------------- the data

_SHADES = [bytes(min(255, int(v * (0.55 + 0.05 * k))) for v in range(256)) for k in range(10)]
"""Brightness lookup tables (``bytes.translate``): rows of an image get different shades cheaply."""


def _photo(width: int, height: int, rng: random.Random) -> bytes:
    """RGB pixels with smooth diagonal colour bands, shading and a few flat rectangles: JPEG-friendly content
    of a realistic size, made in a few milliseconds without NumPy."""
    span = width + height
    wave = bytearray(3 * span)
    for c in range(3):
        freq, phase = rng.uniform(0.004, 0.03), rng.uniform(0.0, 2 * math.pi)
        wave[c::3] = bytes(int(127.5 + 120 * math.sin(freq * i + phase)) for i in range(span))
    down = rng.random() < 0.5
    freq, phase = rng.uniform(0.005, 0.05), rng.uniform(0.0, 2 * math.pi)
    rows = []
    for y in range(height):
        off = y if down else height - 1 - y
        shade = int((0.5 + 0.5 * math.sin(freq * y + phase)) * (len(_SHADES) - 1))
        rows.append(wave[3 * off : 3 * (off + width)].translate(_SHADES[shade]))
    img = bytearray().join(rows)
    for _ in range(rng.randint(1, 4)):
        rw, rh = rng.randint(width // 8, width // 3), rng.randint(height // 8, height // 3)
        x0, y0 = rng.randrange(width - rw), rng.randrange(height - rh)
        color = bytes(rng.randrange(256) for _ in range(3)) * rw
        for y in range(y0, y0 + rh):
            start = 3 * (y * width + x0)
            img[start : start + 3 * rw] = color
    return bytes(img)


def _image_path(images_dir: Path, i: int) -> Path:
    return images_dir / f"class_{i % _CLASSES:03d}" / f"img_{i:05d}.jpg"


def _write_image(images_dir: Path, partial: Path, i: int) -> None:
    rng = random.Random(_SEED * 1_000_003 + i)
    width, height = rng.randint(320, 640), rng.randint(240, 480)
    pixels = _photo(width, height, rng)
    tmp = partial / f"img_{i:05d}.jpg"  # the encoder picks the format from the extension
    _native.io.encode_image_file(str(tmp), pixels, width, height, "rgb24", quality=85)
    os.replace(tmp, _image_path(images_dir, i))


def make_images(images_dir: Path, count: int, threads: int) -> int:
    """Writes the images of the dataset that are not there yet (atomically: a file exists only once complete);
    returns how many were written."""
    if not hasattr(_native.io, "encode_image_file"):
        raise RuntimeError("this build of spdl_rs has no image encoder (the `io` feature) to make the demo dataset")
    missing = [i for i in range(count) if not _image_path(images_dir, i).is_file()]
    if not missing:
        return 0
    for c in range(min(count, _CLASSES)):
        (images_dir / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    partial = images_dir.parent / f".partial-{os.getpid()}"  # one per process: two runs may overlap
    partial.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(lambda i: _write_image(images_dir, partial, i), missing):
            pass
    shutil.rmtree(partial, ignore_errors=True)
    return len(missing)


def make_videos(videos_dir: Path) -> list[Path]:
    """Short H.264 test videos made with the ``ffmpeg`` command (kept once made)."""
    videos_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (w, h) in enumerate(_VIDEO_SIZES):
        path = videos_dir / f"video_{k:02d}_{w}x{h}.mp4"
        if not path.is_file():
            tmp = videos_dir / f".partial-{os.getpid()}-{path.name}"
            cmd = [
                "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
                "-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate=25:duration={_VIDEO_SECONDS}",
                "-c:v", "libx264", "-preset", "veryfast", "-g", "25", "-pix_fmt", "yuv420p", "-f", "mp4", str(tmp),
            ]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                tmp.unlink(missing_ok=True)
                detail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
                raise RuntimeError(f"`ffmpeg` could not make an H.264 test video: {detail[0]}")
            os.replace(tmp, path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------- the runs


def run_images(images_dir: Path, count: int, batch_size: int, threads: int, show_progress: bool) -> dict[str, Any]:
    """Runs the image loader over the first ``count`` images; returns its figures."""
    started = time.monotonic()
    cpu0 = _cpu_seconds()
    loader = ImageLoader(str(images_dir), batch_size=batch_size, num_threads=threads, size=_SIZE, limit=count)
    total = loader.images_per_epoch
    progress = _Progress(total, "images", show_progress)
    slots = batches = 0
    first_batch: float | None = None
    interrupted = False
    try:
        for _images, labels in loader:
            if first_batch is None:
                first_batch = time.monotonic() - started
            slots += len(labels)
            batches += 1
            progress.update(slots)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        loader.stop()
        progress.close()
    seconds = time.monotonic() - started
    cpu = _cpu_seconds() - cpu0
    failed = loader.failed_images
    images = max(0, slots - failed)
    table = loader.stats_table()
    return {
        "path": str(images_dir),
        "images": images,
        "failed": failed,
        "batches": batches,
        "seconds": seconds,
        "first_batch_seconds": first_batch,
        "images_per_sec": images / max(seconds, 1e-9),
        "cpu_seconds": cpu,
        "images_per_cpu_second": images / max(cpu, 1e-9),
        "threads": threads,
        "batch_size": batch_size,
        "size": _SIZE,
        "interrupted": interrupted,
        "bottleneck": _bottleneck(table),
        "stats_table": table,
    }


def _video_unavailable() -> str | None:
    """Why video cannot be decoded here (this loads FFmpeg): the loader's own message, which says what was
    looked for and how to install it."""
    if not spdl_rs.io.has_video():
        return "spdl_rs was built without the `ffmpeg` feature"
    if spdl_rs.io.video_available():
        return None
    return str(spdl_rs.build_info()["ffmpeg"]["error"])


def run_videos(videos_dir: Path, threads: int, show_progress: bool) -> dict[str, Any]:
    """Makes the test videos and runs a clip loader over them; returns its figures, or why it did not run
    (``ran`` is ``False``, ``reason`` says why, ``hint`` how to get video where that is the cause)."""
    result: dict[str, Any] = {"available": False, "ran": False, "reason": None, "hint": None}
    reason = _video_unavailable()
    if reason is not None:
        result.update(reason=reason, hint=None if spdl_rs.io.has_video() else _VIDEO_BUILD_HINT)
        return result
    if shutil.which("ffmpeg") is None:
        result.update(available=True, reason="no `ffmpeg` command on PATH to make the H.264 test videos")
        return result
    try:
        videos = make_videos(videos_dir)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        result.update(available=True, reason=str(e))
        return result
    result["available"] = True

    starts = [float(s) for s in range(int(_VIDEO_SECONDS / _CLIP_SECONDS))]
    items = [str(v) for _ in range(_CLIP_PASSES) for v in videos]
    total = len(items) * len(starts)
    # One native stage: each video's clips (one per second, 8 frames at 8 fps) decoded once per GOP.
    load = ops.load_clips(
        num_frames=_CLIP_FRAMES, starts=starts, by="time", fps=_CLIP_FRAMES / _CLIP_SECONDS, width=_CLIP_SIZE,
        height=_CLIP_SIZE,
    )
    builder: PipelineBuilder[str, Any] = PipelineBuilder()
    pipeline = builder.add_source(items).pipe(load, concurrency=threads, name="load_clips").add_sink(3).build(
        num_threads=threads
    )
    progress = _Progress(total, "clips", show_progress)
    done = 0
    interrupted = False
    started = time.monotonic()
    cpu0 = _cpu_seconds()
    try:
        with pipeline.auto_stop():
            for clips in pipeline:
                done += clips.shape[0]
                progress.update(done)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
    seconds = time.monotonic() - started
    cpu = _cpu_seconds() - cpu0
    table = pipeline.stats_table()
    result.update(
        ran=True,
        path=str(videos_dir),
        videos=len(videos),
        clips=done,
        failed=total - done if not interrupted else 0,
        frames_per_clip=_CLIP_FRAMES,
        clip_seconds=_CLIP_SECONDS,
        clip_size=_CLIP_SIZE,
        seconds=seconds,
        clips_per_sec=done / max(seconds, 1e-9),
        frames_per_sec=done * _CLIP_FRAMES / max(seconds, 1e-9),
        cpu_seconds=cpu,
        threads=threads,
        interrupted=interrupted,
        bottleneck=_bottleneck(table),
        stats_table=table,
    )
    return result


# --------------------------------------------------------------------------------------------- reporting


def _mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / (1 << 20):.0f} MiB"


def _print_images(r: dict[str, Any], peak: int | None) -> None:
    print(r["stats_table"].rstrip())
    if r["interrupted"]:
        print("interrupted (Ctrl-C): figures so far")
    print(
        f"{r['images']} images ({r['failed']} failed) in {r['seconds']:.2f} s: {r['images_per_sec']:.0f} images/s, "
        f"{r['images_per_cpu_second']:.0f} images per CPU-second ({r['cpu_seconds']:.2f} CPU s), "
        f"peak RSS {_mib(peak)}"
    )
    bottleneck = f", bottleneck: {r['bottleneck']}" if r["bottleneck"] else ""
    print(f"{r['threads']} threads, batch {r['batch_size']}, {r['size']}x{r['size']}{bottleneck}")


def _print_videos(v: dict[str, Any], peak: int | None) -> None:
    if not v["ran"]:
        if v["available"]:
            print(f"video: skipped: {v['reason']}.")
        else:
            hint = f"; {v['hint']}." if v["hint"] else ""
            print(f"video: unavailable: {v['reason']}{hint}")
        return
    print()
    print(
        f"video: {v['videos']} H.264 test videos in {v['path']}; clips of {v['frames_per_clip']} frames from "
        f"{v['clip_seconds']:g} s at {v['clip_size']}x{v['clip_size']} (spdl_rs.io.ops.load_clips)"
    )
    print(v["stats_table"].rstrip())
    if v["interrupted"]:
        print("interrupted (Ctrl-C): figures so far")
    bottleneck = f", bottleneck: {v['bottleneck']}" if v["bottleneck"] else ""
    print(
        f"{v['clips']} clips ({v['failed']} failed) in {v['seconds']:.2f} s: {v['clips_per_sec']:.1f} clips/s "
        f"({v['frames_per_sec']:.0f} frames/s), {v['cpu_seconds']:.2f} CPU s, peak RSS {_mib(peak)}, "
        f"{v['threads']} threads{bottleneck}"
    )


def run_demo(
    *, dir: str | os.PathLike[str] | None, images: int, batch_size: int, threads: int | None, json_output: bool
) -> int:
    """``python -m spdl_rs demo``; returns the exit status."""
    root = Path(dir).expanduser() if dir is not None else default_dir()
    threads = threads or _default_threads()
    human = not json_output
    try:
        t0 = time.monotonic()
        made = make_images(root / "images", images, threads)
        dataset = {"images": images, "made": made, "seconds": time.monotonic() - t0}
        if human:
            print(f"spdl_rs {spdl_rs.__version__}: demo in {root}", file=sys.stderr)
            print(
                f"demo dataset: {images} JPEGs in {root / 'images'} ({made} made, {dataset['seconds']:.1f} s to "
                "check/make)",
                file=sys.stderr,
            )
        report = run_images(root / "images", images, batch_size, threads, human)
        peak_images = _peak_rss_bytes()
        if human:
            _print_images(report, peak_images)
        video = {"available": False, "ran": False, "reason": "interrupted", "hint": None}
        if not report["interrupted"]:
            video = run_videos(root / "videos", threads, human)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, ValueError) as e:
        print(f"python -m spdl_rs demo: error: {e}", file=sys.stderr)
        return 1
    peak = _peak_rss_bytes()
    if human:
        _print_videos(video, peak)
    else:
        out = {
            "mode": "demo",
            "version": spdl_rs.__version__,
            "build_info": spdl_rs.build_info(),
            "dir": str(root),
            "dataset": dataset,
            **report,
            "peak_rss_bytes": peak_images,
            "video": video,
            "final_peak_rss_bytes": peak,
        }
        print(json.dumps(out, indent=2, default=str))
    return 0
