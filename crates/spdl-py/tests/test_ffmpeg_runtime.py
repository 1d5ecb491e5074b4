"""FFmpeg is found at run time, never at import: ``import spdl_rs`` maps no FFmpeg library, the first video
call loads the backend for the FFmpeg major the machine has, ``SPDL_RS_FFMPEG_DIR`` picks another copy, and
where FFmpeg is missing every video call raises one clear error while images and audio keep working.

The suite runs a second time with FFmpeg's libraries hidden (``SPDL_RS_TEST_NO_FFMPEG=1``, see conftest.py):
the tests below check both sides, each where it applies.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import FFMPEG_ERROR_PARTS, NO_FFMPEG

import spdl_rs
import spdl_rs.io

needs_ffmpeg = pytest.mark.skipif(NO_FFMPEG, reason="FFmpeg's libraries are hidden in this run")
needs_no_ffmpeg = pytest.mark.skipif(not NO_FFMPEG, reason="runs where FFmpeg's libraries are hidden")


def child(code: str, env: dict[str, str] | None = None) -> dict:
    """Runs ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


MAPPED = """
def mapped():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if "libav" in l or "libsw" in l or "spdl_ffmpeg" in l})
"""


def test_import_loads_no_ffmpeg_and_the_first_video_call_does(media):
    mp4 = media["mp4"]
    r = child(
        MAPPED
        + f"""
import json, spdl_rs, spdl_rs.io as io
before = mapped()
try:
    io.load_video({str(mp4)!r}, num_frames=2)
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({{"before": before, "after": mapped(), "error": error}}))
"""
    )
    assert r["before"] == [], r
    if NO_FFMPEG:
        assert r["error"] is not None and all(p in r["error"] for p in FFMPEG_ERROR_PARTS), r
    else:
        assert r["error"] is None, r
        assert any("libavcodec.so." in p for p in r["after"]), r
        assert any("libspdl_ffmpeg" in p for p in r["after"]), r


def test_build_info_tells_what_was_found():
    info = spdl_rs.build_info()
    assert info["version"] == spdl_rs.__version__
    assert "ffmpeg" in info["features"] and "io" in info["features"]
    assert info["jpeg"].startswith("libjpeg-turbo 3") or info["jpeg"] == "zune-jpeg"
    assert isinstance(info["cuda"]["built"], bool) and info["cuda"]["devices"] >= 0
    assert info["free_threaded"] == bool(__import__("sysconfig").get_config_var("Py_GIL_DISABLED"))
    ff = info["ffmpeg"]
    assert ff["backends"], "the build ships at least one FFmpeg backend"
    if NO_FFMPEG:
        assert ff["available"] is False and ff["found"] == [] and ff["libraries"] == {}
        # The status holds the detail; the exception prefixes it with "FFmpeg is not available: ".
        assert all(p in ff["error"] for p in FFMPEG_ERROR_PARTS[1:]), ff
        assert not spdl_rs.io.video_available()
    else:
        assert ff["available"] is True and ff["error"] is None
        assert ff["major"] in ff["backends"] and ff["major"] in ff["found"]
        assert ff["libraries"]["libavcodec"].count(".") == 2
        assert os.path.basename(ff["backend"]) == f"libspdl_ffmpeg{ff['major']}.so"
        assert spdl_rs.io.video_available()


@needs_no_ffmpeg
def test_without_ffmpeg_every_video_entry_point_raises_the_clear_error(media):
    mp4 = str(media["mp4"])
    calls = [
        lambda: spdl_rs.io.load_video(mp4),
        lambda: spdl_rs.io.demux_video(mp4),
        lambda: spdl_rs.io.Demuxer(mp4),
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as e:
            call()
        assert all(p in str(e.value) for p in FFMPEG_ERROR_PARTS), e.value


@needs_no_ffmpeg
def test_without_ffmpeg_images_and_audio_still_decode(media, tmp_path):
    import numpy as np

    # Audio: WAV (fast path), FLAC (symphonia) and MP3 (FFmpeg's when present; symphonia's here).
    for kind in ("wav", "flac", "mp3"):
        buf = np.asarray(spdl_rs.io.load_audio(str(media[kind])))
        assert buf.size > 0 and np.abs(buf).max() > 0.05, kind
    info = spdl_rs.io.probe(str(media["wav"]))
    assert info["streams"][0]["kind"] == "audio"
    # Images: a JPEG and a PNG made here.
    img = np.zeros((24, 32, 3), dtype=np.uint8)
    img[:, :16] = 200
    for ext in ("jpg", "png"):
        path = str(tmp_path / f"a.{ext}")
        spdl_rs.io.encode_image(path, img)
        out = np.asarray(spdl_rs.io.load_image_batch([path], 16, 12))
        assert out.shape[:3] == (1, 12, 16), ext


@needs_ffmpeg
def test_ffmpeg_dir_picks_the_libraries_to_load(media, tmp_path):
    info = spdl_rs.build_info()["ffmpeg"]
    libs = _loaded_libraries()
    if not libs:
        pytest.skip("FFmpeg's libraries are not mapped in this process")
    copy = tmp_path / "ffmpeg"
    copy.mkdir()
    for name, path in libs.items():
        shutil.copy(path, copy / name)
    r = child(
        MAPPED
        + f"""
import json, spdl_rs.io as io
io.load_video({str(media["mp4"])!r}, num_frames=1)
print(json.dumps({{"after": mapped()}}))
""",
        env={"SPDL_RS_FFMPEG_DIR": str(copy)},
    )
    from_copy = [p for p in r["after"] if p.startswith(str(copy))]
    assert any("libavcodec" in p for p in from_copy), (r, info)


def _loaded_libraries() -> dict[str, str]:
    """soname -> file of the FFmpeg libraries this process has mapped (loads them first)."""
    spdl_rs.io.video_available()
    out = {}
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            base = os.path.basename(path)
            for lib in ("avutil", "avcodec", "avformat", "avfilter", "swscale", "swresample"):
                if base.startswith(f"lib{lib}.so."):
                    major = base.split(".so.")[1].split(".")[0]
                    out[f"lib{lib}.so.{major}"] = path
    return out


def test_a_backend_dir_without_backends_says_so(tmp_path):
    r = child(
        """
import json, spdl_rs
print(json.dumps(spdl_rs.build_info()["ffmpeg"]))
""",
        env={"SPDL_RS_FFMPEG_BACKEND_DIR": str(tmp_path)},
    )
    # The variable names the one directory to look in.
    assert r["available"] is False and r["backends"] == [], r
    assert str(tmp_path) in r["error"] and "no libspdl_ffmpeg" in r["error"], r
    bogus = tmp_path / "libspdl_ffmpeg5.so"
    bogus.write_bytes(b"\x7fELF not really")
    r = child(
        """
import json, spdl_rs
print(json.dumps(spdl_rs.build_info()["ffmpeg"]))
""",
        env={"SPDL_RS_FFMPEG_BACKEND_DIR": str(tmp_path)},
    )
    assert r["available"] is False and r["backends"] == [5], r
    if not NO_FFMPEG:
        # FFmpeg 5 is there (Debian 12's): the backend is the one that is refused, with the loader's reason.
        assert str(bogus) in r["error"], r
