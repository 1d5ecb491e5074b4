"""In-memory format readers side by side: Meta's SPDL 0.8.0 (`spdl.io`, C++) against spdl_rs (`spdl_rs.io`, pure
Python over numpy/zlib/zipfile; TAR through the native `spdl_source::tar_index`) on the same bytes, in one process,
alternating per case.

Cases: `load_npy` of a 400 B and a 4 MiB array; `load_npz` of 10 arrays (stored, then deflated) with every array
loaded; `parse_wav` and `load_wav` + `numpy.asarray` of 10 s of 16 kHz stereo s16; `iter_tarfile` of 1,000 1 KB
members from bytes and from a BytesIO. Each figure is the best of 5 repeats of `timeit`'s autorange loop, in
microseconds per call; the ratio is spdl_rs / SPDL (below 1: spdl_rs is faster).

    PYTHONPATH=crates/spdl-py/python .venv-peers/bin/python benches/compare/formats_compare.py
"""

from __future__ import annotations

import io
import tarfile
import timeit
import wave

import numpy as np
import spdl.io as spdl_io

import spdl_rs.io as rs_io


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npz(compressed: bool, **arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def _wav(frames: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(frames * 4))
    return buf.getvalue()


def _tar(members: int, size: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(members):
            info = tarfile.TarInfo(f"dir/{i:06d}.jpg")
            info.size = size
            tf.addfile(info, io.BytesIO(bytes(size)))
    return buf.getvalue()


def main() -> None:
    small = _npy(np.arange(100, dtype=np.float32))
    big = _npy(np.zeros((1024, 1024), dtype=np.float32))
    stored = _npz(False, **{f"a{i}": np.arange(1000) for i in range(10)})
    deflated = _npz(True, **{f"a{i}": np.arange(1000) for i in range(10)})
    wav = _wav(16000 * 10)
    tar = _tar(1000, 1000)
    cases = {
        "load_npy (400 B array)": lambda m: m.load_npy(small),
        "load_npy (4 MiB array)": lambda m: m.load_npy(big),
        "load_npz, 10 arrays loaded (stored)": lambda m: list(m.load_npz(stored).values()),
        "load_npz, 10 arrays loaded (deflated)": lambda m: list(m.load_npz(deflated).values()),
        "parse_wav": lambda m: m.parse_wav(wav),
        "load_wav (10 s stereo) + numpy.asarray": lambda m: np.asarray(m.load_wav(wav)),
        "iter_tarfile, bytes (1,000 x 1 KB)": lambda m: list(m.iter_tarfile(tar)),
        "iter_tarfile, BytesIO (1,000 x 1 KB)": lambda m: list(m.iter_tarfile(io.BytesIO(tar))),
    }
    print("| case | SPDL 0.8.0 (us) | spdl_rs (us) | spdl_rs / SPDL |")
    print("| --- | ---: | ---: | ---: |")
    for name, fn in cases.items():
        best = {}
        for label, module in (("spdl", spdl_io), ("rs", rs_io)):
            timer = timeit.Timer(lambda module=module: fn(module))  # type: ignore[misc]
            number, _ = timer.autorange()
            best[label] = min(timer.repeat(5, number)) / number * 1e6
        print(f"| {name} | {best['spdl']:.1f} | {best['rs']:.1f} | {best['rs'] / best['spdl']:.2f} |")


if __name__ == "__main__":
    main()
