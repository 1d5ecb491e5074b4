"""spdl_rs.io: native decoding, as functions and as pipeline stages that never take the GIL."""

import os
import struct
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import spdl_rs
from spdl_rs.io import ops
from spdl_rs.pipeline import PipelineBuilder, PipelineFailure

pytestmark = pytest.mark.skipif(not spdl_rs._native.HAS_IO, reason="built without the io feature")


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG, encoded here with zlib (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    paths = []
    for i in range(64):
        p = d / f"img{i:03d}.png"
        p.write_bytes(png(96 + i, 80, (i * 3 % 256, 100, 200)))
        paths.append(str(p))
    return paths


def test_functions_release_results_as_zero_copy_arrays(images):
    b = spdl_rs.io.load_image(images[5])
    a = np.asarray(b)
    assert a.shape == (80, 101, 3) and a.dtype == np.uint8
    assert a.ctypes.data == b.data_ptr
    assert (a == np.array([15, 100, 200], dtype=np.uint8)).all()
    with open(images[5], "rb") as f:
        data = f.read()
    assert spdl_rs.io.image_info(data) == ("png", 101, 80)
    small = np.asarray(spdl_rs.io.decode_image(data, size=(32, 16)))
    assert small.shape == (16, 32, 3) and (small == [15, 100, 200]).all()


def test_load_image_batch(images):
    b = spdl_rs.io.load_image_batch(images[:10], 48, 32, num_threads=2)
    assert b.shape == (10, 32, 48, 3) and b.layout == "NHWC"
    a = np.asarray(b)
    for i in range(10):
        assert (a[i] == [i * 3 % 256, 100, 200]).all()
    f = spdl_rs.io.load_image_batch(images[:2], 8, 8, layout="NCHW", normalize="unit")
    assert f.shape == (2, 3, 8, 8) and f.dtype == "float32"
    np.testing.assert_allclose(np.asarray(f)[0, 2], 200 / 255, rtol=1e-5)


def test_errors_name_the_item(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(RuntimeError, match="bad.jpg"):
        spdl_rs.io.load_image(str(bad))
    with pytest.raises(OSError, match="missing.png"):
        spdl_rs.io.load_image(str(tmp_path / "missing.png"))
    with pytest.raises(ValueError):
        spdl_rs.io.load_image_batch([], 8, 8, layout="HWC")


def test_native_stages_in_a_pipeline(images):
    p = (
        PipelineBuilder()
        .add_source(images)
        .pipe(ops.decode_image(size=(24, 24)), concurrency=4, output_order="input")
        .pipe(lambda b: int(np.asarray(b)[0, 0, 0]), output_order="input")
        .add_sink(4)
        .build(num_threads=4)
    )
    with p.auto_stop():
        assert list(p) == [i * 3 % 256 for i in range(64)]


def test_native_failures_count_against_the_budget(images, tmp_path):
    srcs = images[:4] + [str(tmp_path / "nope.png")] * 5
    p = (
        PipelineBuilder()
        .add_source(srcs)
        .pipe(ops.decode_image(), name="decode", max_failures=2)
        .add_sink(4)
        .build(num_threads=2)
    )
    with pytest.raises(PipelineFailure) as info:
        with p.auto_stop():
            list(p)
    assert info.value.stage == "decode"
    assert "nope.png" in str(info.value.exceptions[0])


def run_native_batches(images, repeat: int, fetch: bool = False) -> tuple[int, float]:
    """(images, seconds) of a pipeline made only of native stages: list source, (with `fetch`, the bytes read by
    a local `Store`'s native `get_op`,) aggregate, batch decode."""
    builder = PipelineBuilder()
    if fetch:
        from spdl_rs.source import Store

        root = os.path.dirname(images[0])
        store = Store.open(root)
        srcs = [os.path.basename(p) for p in images] * repeat
        builder = builder.add_source(srcs).pipe(store.get_op(), concurrency=8)
    else:
        srcs = images * repeat
        builder = builder.add_source(srcs)
    p = (
        builder.aggregate(64)
        .pipe(ops.load_image_batch(64, 64), concurrency=2)
        .add_sink(4)
        .build(num_threads=2)
    )
    t0 = time.perf_counter()
    with p.auto_stop():
        n = sum(len(b) for b in p)
    assert n == len(srcs)
    return n, time.perf_counter() - t0


@pytest.mark.parametrize("fetch", [False, True], ids=["paths", "store-fetch"])
def test_native_pipeline_holds_no_gil_per_item(images, watchdog, fetch):
    # Another thread spins in pure Python, holding the GIL and giving it up only when asked, after 50 ms. A
    # pipeline whose 2 workers needed the GIL for each image would wait about that long per image pair:
    # 512 images -> at least ~12.8 s. One that needs it only to hand each batch of 64 to the consumer (8
    # times) stays far below.
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        pytest.skip("no GIL on this interpreter: nothing to contend for")
    interval = 0.05
    if fetch and not spdl_rs._native.HAS_SOURCE:
        pytest.skip("built without the source feature")
    run_native_batches(images, 1, fetch)  # warm up
    n, alone = run_native_batches(images, 8, fetch)
    old = sys.getswitchinterval()
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin)
    sys.setswitchinterval(interval)
    spinner.start()
    try:
        _, contended = run_native_batches(images, 8, fetch)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old)
    per_item_floor = n * interval / 2
    assert contended < 0.3 * per_item_floor, (
        f"{n} images took {contended:.2f} s with a spinning thread ({alone:.2f} s alone); "
        f"per-item GIL use would take at least {per_item_floor:.1f} s"
    )


def test_spdl_spellings(images):
    # Code written for spdl.io: load_image of encoded bytes, pix_fmt, to_numpy.
    with open(images[5], "rb") as f:
        data = f.read()
    from_bytes = spdl_rs.io.to_numpy(spdl_rs.io.load_image(data))
    from_path = spdl_rs.io.to_numpy(spdl_rs.io.load_image(images[5]))
    assert from_bytes.shape == (80, 101, 3) and (from_bytes == from_path).all()
    assert spdl_rs.io.to_numpy(spdl_rs.io.load_image(images[5], pix_fmt="gray")).shape == (80, 101, 1)
    batch = spdl_rs.io.load_image_batch(images[:3], width=16, height=8, pix_fmt="rgb24")
    assert spdl_rs.io.to_numpy(batch).shape == (3, 8, 16, 3)
    with pytest.raises(ValueError, match="pix_fmt"):
        spdl_rs.io.load_image(images[0], pix_fmt="yuv420p")
    # SPDL's filter_desc: None is the decoder's own format (rgb24 for these PNGs), a graph runs as given.
    assert spdl_rs.io.to_numpy(spdl_rs.io.load_image(images[5], filter_desc=None)).shape == (80, 101, 3)
    batch = spdl_rs.io.load_image_batch(images[:3], width=16, height=8, filter_desc="scale=16:8,format=rgb24")
    assert spdl_rs.io.to_numpy(batch).shape == (3, 8, 16, 3)
    with pytest.raises(ValueError, match=r"cannot be combined with spdl_rs's normalize"):
        spdl_rs.io.load_image_batch(images[:3], width=16, height=8, filter_desc=None, normalize="unit")
    # SPDL's config objects: None ("defaults") is accepted, anything else refused with the reason.
    none_configs = dict(demux_config=None, decode_config=None, device_config=None, storage=None)
    batch = spdl_rs.io.load_image_batch(images[:2], width=16, height=8, strict=True, **none_configs)
    assert spdl_rs.io.to_numpy(batch).shape == (2, 8, 16, 3)
    with open(images[5], "rb") as f:
        assert spdl_rs.io.to_numpy(spdl_rs.io.decode_image(f.read(), decode_config=None)).shape == (80, 101, 3)
    with pytest.raises(TypeError, match="device_config must be a CUDAConfig"):
        spdl_rs.io.load_image(images[0], device_config=object())
