"""Hostile files and arguments through ``spdl_rs.io``: each case runs in a child interpreter with its address
space capped (``RLIMIT_AS``) and a deadline, and must end with a clean exception that names the item and the
cause, or a bounded, correct result. Never an abort, a runaway allocation or a hang."""

import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest

# The child's address-space cap: far below what any of these inputs would cost unchecked (6.7 GB to 33 GB),
# with room for the interpreter, numpy and the decoding threads' stacks and arenas.
MEMORY_CAP = 4 << 30

PRELUDE = textwrap.dedent(
    """
    import json, os, struct, sys, time, zlib

    def png(width, height, channels=1, fill=0):
        # A PNG of one repeated byte, written by hand (zlib): an aspect-ratio bomb costs a few KB.
        color = {1: 0, 3: 2, 4: 6}[channels]
        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        row = b"\\0" + bytes([fill]) * (width * channels)
        comp = zlib.compressobj(9)
        body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
        ihdr = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
        return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")

    def wav(frames, rate, channels=1):
        data = b"\\0\\0" * frames * channels
        fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
        return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
                + b"data" + struct.pack("<I", len(data)) + data)

    def outcome(fn):
        try:
            value = fn()
            return {"ok": True, "value": value}
        except BaseException as e:  # noqa: BLE001 (the test asserts what was raised)
            return {"ok": False, "type": type(e).__name__, "message": str(e)}

    import spdl_rs.io as io
    """
)


def run_child(body: str, tmp_path, timeout: float = 120.0) -> dict:
    """Runs ``body`` after the prelude in a capped child; it prints one JSON object as its last line."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_aspect_ratio_bomb_is_an_error_not_an_abort(tmp_path):
    out = run_child(
        """
        with open("wide.png", "wb") as f:
            f.write(png(50_000_000, 1))
        with open("ok.png", "wb") as f:
            f.write(png(64, 48, 3, 200))
        single = outcome(lambda: io.load_image("wide.png", size=(224, 224)).shape)
        def batch():
            buf, info = io.load_image_batch(["wide.png", "ok.png"], 224, 224, strict=False, return_info=True)
            return [buf.shape, [f[:2] for f in info["failures"]]]
        print(json.dumps({"single": single, "batch": outcome(batch), "size": os.path.getsize("wide.png")}))
        """,
        tmp_path,
    )
    assert out["size"] < 100_000
    assert out["single"]["type"] == "RuntimeError", out
    assert "wide.png" in out["single"]["message"] and "resize intermediate pixels" in out["single"]["message"]
    assert out["batch"]["ok"], out
    assert out["batch"]["value"][0] == [2, 224, 224, 3]
    assert out["batch"]["value"][1] == [[0, "wide.png"]]


def test_resample_bomb_is_refused_from_the_header(tmp_path):
    out = run_child(
        """
        bomb = wav(16, 1)
        print(json.dumps({
            "bomb": outcome(lambda: io.load_audio(bomb, sample_rate=44100, name="one-hz.wav").shape),
            "ok": outcome(lambda: list(io.load_audio(wav(800, 8000), sample_rate=768000).shape)),
        }))
        """,
        tmp_path,
    )
    assert out["bomb"]["type"] == "RuntimeError", out
    assert "one-hz.wav" in out["bomb"]["message"] and "resampler bytes" in out["bomb"]["message"]
    assert out["ok"] == {"ok": True, "value": [1, 76800]}


def test_special_files_are_refused_promptly(tmp_path):
    out = run_child(
        """
        os.mkfifo("pipe.jpg")
        os.symlink("/dev/zero", "zero.wav")
        with open("ok.png", "wb") as f:
            f.write(png(64, 48, 3, 10))
        res = {}
        for name in ["pipe.jpg", "zero.wav"]:
            res[name] = {
                "load_image": outcome(lambda: io.load_image(name)),
                "load_audio": outcome(lambda: io.load_audio(name)),
                "probe": outcome(lambda: io.probe(name)),
                "batch": outcome(lambda: io.load_image_batch(["ok.png", name], 8, 8, strict=False,
                                                            return_info=True)[1]["failures"][0][:2]),
            }
        res["missing"] = outcome(lambda: io.load_image("missing.png"))
        print(json.dumps(res))
        """,
        tmp_path,
        timeout=60,
    )
    for name, kind in [("pipe.jpg", "FIFO"), ("zero.wav", "character device")]:
        for call in ["load_image", "load_audio", "probe"]:
            got = out[name][call]
            assert got["type"] == "OSError", (name, call, got)
            assert name in got["message"] and kind in got["message"], (name, call, got)
            assert "empty input" not in got["message"]
        assert out[name]["batch"] == {"ok": True, "value": [1, name]}
    assert out["missing"]["type"] == "FileNotFoundError", out["missing"]


def test_requested_output_sizes_are_bounded(tmp_path):
    out = run_child(
        """
        small = png(64, 48, 3, 1)
        clip = wav(800, 8000, 2)
        print(json.dumps({
            "image": outcome(lambda: io.decode_image(small, size=(65535, 65535))),
            "batch": outcome(lambda: io.load_image_batch([small], 65535, 65535)),
            "audio": outcome(lambda: io.load_audio_batch([clip, clip], num_samples=10**9, strict=False)),
        }))
        """,
        tmp_path,
    )
    for key in ["image", "batch", "audio"]:
        assert out[key]["type"] == "ValueError", out
    assert "65535x65535" in out["image"]["message"]
    assert "max_samples" in out["audio"]["message"]


def test_decode_memory_budget_bounds_concurrent_decodes(tmp_path):
    out = run_child(
        """
        with open("big.png", "wb") as f:
            f.write(png(4000, 4000, 1, 7))
        default = io.decode_memory_budget()
        io.set_decode_memory_budget(64 << 20)
        alone = outcome(lambda: io.load_image("big.png", size=(32, 32)))
        io.set_decode_memory_budget(200 << 20)
        many = outcome(lambda: int(__import__("numpy").asarray(
            io.load_image_batch(["big.png"] * 4, 32, 32, num_threads=4)).min()))
        tiny = outcome(lambda: io.set_decode_memory_budget(1))
        print(json.dumps({"default": default, "alone": alone, "many": many, "tiny": tiny}))
        """,
        tmp_path,
    )
    assert out["default"] >= 64 << 20
    assert out["alone"]["type"] == "RuntimeError", out
    assert "big.png" in out["alone"]["message"] and "decode memory bytes" in out["alone"]["message"]
    assert out["many"] == {"ok": True, "value": 7}
    assert out["tiny"]["type"] == "ValueError"


def test_ctrl_c_interrupts_a_long_batch_decode(tmp_path):
    out = run_child(
        """
        import signal, threading
        with open("big.png", "wb") as f:
            f.write(png(3000, 3000, 3, 9))
        def interrupt():
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt, daemon=True).start()
        start = time.monotonic()
        got = outcome(lambda: io.load_image_batch(["big.png"] * 400, 64, 64, num_threads=1))
        print(json.dumps({"got": got, "seconds": time.monotonic() - start}))
        """,
        tmp_path,
    )
    assert out["got"].get("type") == "KeyboardInterrupt", out
    # 400 decodes of 27 MB each take tens of seconds; the interrupt lands within a fraction of one.
    assert out["seconds"] < 5, out


@pytest.mark.parametrize("size", [(0, 10), (10, 0)])
def test_zero_sizes_are_value_errors(size, tmp_path):
    out = run_child(
        f"""
        print(json.dumps(outcome(lambda: io.decode_image(png(8, 8), size={size!r}))))
        """,
        tmp_path,
        timeout=60,
    )
    assert out["type"] == "ValueError", out
