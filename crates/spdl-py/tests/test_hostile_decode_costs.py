"""Decode costs that come from a header or an argument rather than from the data, through ``spdl_rs.io``: a
PNG's ancillary chunks, a progressive JPEG's scan count, a WAVE_FORMAT_EXTENSIBLE channel count, a requested
frame count, and timestamps that go backwards. Each case runs in a child interpreter with its address space
capped (``RLIMIT_AS``) and a deadline (as ``test_hostile_io.py``), and must end with a clean exception naming
the item and the cause, or a bounded, correct result."""

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap

import pytest

MEMORY_CAP = 4 << 30

PRELUDE = textwrap.dedent(
    """
    import json, os, struct, sys, time, zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    def png_with_iccp(profile_bytes):
        # 16 x 16 gray, with an iCCP chunk (before the pixels) whose profile inflates to `profile_bytes`.
        comp = zlib.compressobj(9)
        block = bytes(1 << 20)
        z = b"".join(comp.compress(block) for _ in range(profile_bytes >> 20)) + comp.flush()
        ihdr = struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 0)
        idat = zlib.compress(b"".join(b"\\0" + bytes(16) for _ in range(16)))
        return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", ihdr) + chunk(b"iCCP", b"bomb\\0\\0" + z)
                + chunk(b"IDAT", idat) + chunk(b"IEND", b""))

    def progressive_jpeg(w, h, scans):
        # SOF2 (gray, w x h) and `scans` tiny scans: the markers without pixels worth decoding.
        def seg(marker, body):
            return b"\\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body
        out = b"\\xff\\xd8" + seg(0xDB, b"\\0" + b"\\1" * 64)
        out += seg(0xC2, struct.pack(">BHHB", 8, h, w, 1) + b"\\x01\\x11\\x00")
        out += seg(0xC4, b"\\x00\\x01" + b"\\0" * 15 + b"\\0")
        for i in range(scans):
            band = 0 if i == 0 else 1 + i % 63
            out += seg(0xDA, bytes([1, 1, 0, band, band, 0])) + b"\\x00\\xff\\x00"
        return out + b"\\xff\\xd9"

    def extensible_wav(channels, mask, frames):
        block = 2 * channels
        data = bytes(frames * block)
        guid = bytes([1, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xAA, 0, 0x38, 0x9B, 0x71])
        fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, 8000, 8000 * block, block, 16, 22, 16, mask) + guid
        return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt "
                + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)

    def outcome(fn):
        t = time.monotonic()
        try:
            value = fn()
            return {"ok": True, "value": value, "secs": time.monotonic() - t}
        except BaseException as e:  # noqa: BLE001 (the test asserts what was raised)
            return {"ok": False, "type": type(e).__name__, "message": str(e), "secs": time.monotonic() - t}

    import spdl_rs.io as io
    """
)


def run_child(body: str, tmp_path, timeout: float = 180.0) -> dict:
    """Runs ``body`` after the prelude in a capped child; it prints one JSON object as its last line."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_png_icc_profile_bomb_is_bounded(tmp_path):
    # 256 MB of profile in ~250 KB: the decoder inflates at most its 16 MiB allowance, drops the profile
    # and decodes the 16 x 16 pixels.
    out = run_child(
        """
        bomb = png_with_iccp(256 << 20)
        print(json.dumps({
            "size": len(bomb),
            "decode": outcome(lambda: list(io.decode_image(bomb, name="icc.png").shape)),
        }))
        """,
        tmp_path,
    )
    assert out["size"] < 2 << 20, out
    assert out["decode"]["ok"] and out["decode"]["value"] == [16, 16, 3], out


def test_progressive_jpeg_work_is_refused_from_its_markers(tmp_path):
    out = run_child(
        """
        bomb = progressive_jpeg(8192, 8192, 500)
        print(json.dumps({"decode": outcome(lambda: io.decode_image(bomb, name="scans.jpg").shape)}))
        """,
        tmp_path,
    )
    d = out["decode"]
    assert not d["ok"] and d["type"] == "RuntimeError", out
    assert "scans.jpg" in d["message"] and "JPEG decode work (pixels x scans" in d["message"], out
    assert d["secs"] < 2.0, out


@pytest.mark.parametrize("backend", ["auto", "symphonia"])
def test_extensible_wav_channel_count_is_limited(tmp_path, backend):
    out = run_child(
        f"""
        wide = extensible_wav(1000, 0xFF, 100)
        four = extensible_wav(4, 0x3, 100)
        print(json.dumps({{
            "wide": outcome(lambda: list(io.load_audio(wide, backend="{backend}", name="wide.wav").shape)),
            "four": outcome(lambda: list(io.load_audio(four, backend="{backend}", name="four.wav").shape)),
        }}))
        """,
        tmp_path,
    )
    assert not out["wide"]["ok"], out
    assert "wide.wav" in out["wide"]["message"] and "channels is 1000, above the limit of 64" in out["wide"]["message"]
    assert out["four"] == {**out["four"], "ok": True, "value": [4, 100]}, out


needs_video = pytest.mark.skipif(
    not hasattr(__import__("spdl_rs.io").io, "has_video") or not __import__("spdl_rs.io").io.has_video()
    or shutil.which("ffmpeg") is None,
    reason="needs the ffmpeg feature and the ffmpeg CLI",
)


def _ffmpeg(tmp_path, name: str, *extra: str) -> str:
    path = str(tmp_path / name)
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=10",
         "-frames:v", "20", "-c:v", "mpeg4", *extra, path],
        check=True,
        timeout=120,
    )
    return path


@needs_video
def test_huge_num_frames_is_a_value_error_not_an_abort(tmp_path):
    path = _ffmpeg(tmp_path, "plain.mkv")
    out = run_child(
        f"""
        print(json.dumps({{
            "huge": outcome(lambda: io.load_video({path!r}, num_frames=10**9).shape),
            "fps": outcome(lambda: io.load_video({path!r}, fps=1e12).shape),
            "forty": outcome(lambda: list(io.load_video({path!r}, num_frames=40).shape)),
        }}))
        """,
        tmp_path,
    )
    for key in ["huge", "fps"]:
        assert out[key]["type"] == "ValueError", out
        assert "plain.mkv" in out[key]["message"] and "max_output_bytes" in out[key]["message"], out
        assert out[key]["secs"] < 5.0, out
    assert out["forty"]["value"] == [40, 48, 64, 3], out


@needs_video
@pytest.mark.parametrize(
    "name,expr", [("backwards.mkv", "(19-N)*100"), ("zigzag.mkv", "if(mod(N\\,2)\\,PTS-100\\,PTS+100)")]
)
def test_frames_with_disordered_timestamps_all_come_out(tmp_path, name, expr):
    import numpy as np

    import spdl_rs.io as io

    path = _ffmpeg(tmp_path, name, "-bsf:v", f"setts=pts={expr}")
    buf, info = io.load_video(path, return_info=True)
    frames = np.asarray(buf)
    assert frames.shape == (20, 48, 64, 3)
    pts = list(info["pts"])
    assert pts == sorted(pts) and len(set(pts)) == 20, pts
    assert len({f.tobytes() for f in frames}) == 20
