"""``python -m spdl_rs demo``: makes its dataset once, runs the image loader and reports the figures (a table, or
one JSON object with ``--json``); the video part runs where video decoding works and the ``ffmpeg`` CLI is
there, and otherwise says why it did not. ``--help`` and ``--version`` work."""

import json
import os
import subprocess
import sys
import textwrap

import spdl_rs


def _run(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m spdl_rs ARGS`` (or ``python -c CODE ARGS``) in a fresh interpreter; fails on a hang."""
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args] if code else [sys.executable, "-m", "spdl_rs", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the demo hung (killed after 120 s); output so far: {e.stdout!r} {e.stderr!r}")


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_demo_json_figures_and_cached_dataset(tmp_path):
    report = json.loads(_ok(_run("demo", "--dir", str(tmp_path), "--images", "40", "--json", "--batch-size", "16")))
    assert report["mode"] == "demo" and report["version"] == spdl_rs.__version__
    assert report["dataset"] == {"images": 40, "made": 40, "seconds": report["dataset"]["seconds"]}
    assert len(list((tmp_path / "images").rglob("*.jpg"))) == 40
    assert report["images"] == 40 and report["failed"] == 0 and report["batches"] == 3
    assert report["images_per_sec"] > 0 and report["cpu_seconds"] > 0 and report["peak_rss_bytes"] > 0
    assert report["batch_size"] == 16 and report["threads"] >= 1 and not report["interrupted"]
    assert report["bottleneck"] and report["bottleneck"] in report["stats_table"]
    video = report["video"]
    if video["ran"]:
        assert video["clips"] > 0 and video["failed"] == 0 and video["clips_per_sec"] > 0
    else:
        assert video["reason"], video

    # The second run finds the dataset made and makes nothing.
    again = json.loads(_ok(_run("demo", "--dir", str(tmp_path), "--images", "40", "--json")))
    assert again["dataset"]["made"] == 0 and again["images"] == 40


def test_demo_table_says_why_video_is_skipped(tmp_path):
    # No `ffmpeg` command on PATH: the image part runs, the video part says it is skipped (or unavailable).
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    out = _ok(_run("demo", "--dir", str(tmp_path), "--images", "8", "--threads", "2", env=env))
    assert "8 images (0 failed)" in out and "images/s" in out and "CPU s" in out and "peak RSS" in out
    assert "bottleneck" in out and "decode" in out
    assert "video: skipped: no `ffmpeg` command" in out or "video: unavailable:" in out

    # A build that cannot decode video says why and how to get it, in one line.
    code = """
        import sys
        import spdl_rs.io
        spdl_rs.io.has_video = lambda: False
        from spdl_rs.__main__ import main
        sys.exit(main(sys.argv[1:]))
    """
    out = _ok(_run("demo", "--dir", str(tmp_path), "--images", "8", code=code))
    (line,) = [line for line in out.splitlines() if line.startswith("video:")]
    assert "video: unavailable: spdl_rs was built without the `ffmpeg` feature" in line
    assert "apt-get install ffmpeg" in line


def test_help_and_version():
    out = _ok(_run("--help"))
    assert "demo" in out
    out = _ok(_run("demo", "--help"))
    for flag in ("--dir", "--images", "--batch-size", "--threads", "--json"):
        assert flag in out
    out = _ok(_run("--version"))
    assert out.startswith(f"spdl_rs {spdl_rs.__version__}")
    bad = _run("demo", "--images", "0")
    assert bad.returncode == 2 and "at least 1" in bad.stderr
