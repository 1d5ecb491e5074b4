"""spdl_rs.io audio: load_audio, load_audio_batch, probe and their native ops, on files made by ffmpeg."""

import logging
import threading
import time

import numpy as np
import pytest

import spdl_rs
from spdl_rs.io import ops
from spdl_rs.pipeline import PipelineBuilder, PipelineFailure

def assert_views_a_buffer(a: np.ndarray) -> None:
    """The array views the memory of the spdl_rs.Buffer the decoder wrote (no copy)."""
    owner = a.base.obj if isinstance(a.base, memoryview) else a.base
    assert isinstance(owner, spdl_rs.Buffer) and not a.flags.owndata
    assert owner.data_ptr == a.ctypes.data and owner.nbytes == a.nbytes


pytestmark = pytest.mark.skipif(not spdl_rs._native.HAS_IO, reason="built without the io feature")

RATE = 16000
AMPLITUDE = 0.125  # ffmpeg's lavfi `sine` default


def sine(n: int, start: int = 0, rate: int = RATE) -> np.ndarray:
    t = (np.arange(n) + start) / rate
    return AMPLITUDE * np.sin(2 * np.pi * 440 * t)


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum)) * rate / len(x)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_values_match_the_sine(media, fmt):
    buf = spdl_rs.io.load_audio(media[fmt])
    assert isinstance(buf, spdl_rs.Buffer) and buf.dtype == "float32"  # the documented result type
    a = np.asarray(buf)
    assert a.dtype == np.float32
    assert a.shape == (2, 2 * RATE)
    np.testing.assert_allclose(a[0], sine(2 * RATE), atol=2e-4)
    np.testing.assert_array_equal(a[0], a[1])


def test_mp3_is_the_sine_within_tolerance(media):
    buf, info = spdl_rs.io.load_audio(media["mp3"], return_info=True)
    a = np.asarray(buf)
    assert info["codec"] == "mp3" and info["sample_rate"] == RATE and info["source_channels"] == 2
    assert a.shape[0] == 2 and abs(a.shape[1] - 2 * RATE) < 0.1 * RATE  # encoder padding
    body = a[0, 2000:30000]
    assert abs(np.sqrt(np.mean(body**2)) - AMPLITUDE / np.sqrt(2)) < 0.01
    assert abs(dominant_hz(body, RATE) - 440) < 2


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_window_length_is_exact(media, fmt):
    a = np.asarray(spdl_rs.io.load_audio(media[fmt], start=0.5, duration=0.25))
    assert a.shape == (2, 4000)
    if fmt != "mp3":
        np.testing.assert_allclose(a[0], sine(4000, start=8000), atol=2e-4)
    else:
        assert abs(dominant_hz(a[0], RATE) - 440) < 5


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_resampled_length_is_exact(media, fmt):
    a = np.asarray(spdl_rs.io.load_audio(media[fmt], start=0.5, duration=0.5, sample_rate=8000))
    assert a.shape == (2, 4000)
    assert abs(dominant_hz(a[0], 8000) - 440) < 5
    b = spdl_rs.io.load_audio(media["wav"], sample_rate=22050)
    assert b.shape == (2, int(np.ceil(2 * RATE * 22050 / RATE)))


def test_dtype_layout_channels_and_padding(media):
    i16 = np.asarray(spdl_rs.io.load_audio(media["wav"], dtype="int16", layout="interleaved", channels="mono"))
    assert i16.dtype == np.int16 and i16.shape == (2 * RATE, 1)
    np.testing.assert_allclose(i16[:, 0] / 32768.0, sine(2 * RATE), atol=2e-4)
    picked = np.asarray(spdl_rs.io.load_audio(media["wav"], channels=[1, 1, 0], num_samples=40000))
    assert picked.shape == (3, 40000)
    assert not picked[:, 32000:].any()  # padded with zeros
    with pytest.raises(ValueError, match="channels"):
        spdl_rs.io.load_audio(media["wav"], channels=[5])
    with pytest.raises(ValueError):
        spdl_rs.io.load_audio(media["wav"], dtype="float64")
    with pytest.raises(ValueError, match="max_nope"):
        spdl_rs.io.load_audio(media["wav"], limits={"max_nope": 1})
    with pytest.raises(RuntimeError, match="above the limit"):
        spdl_rs.io.load_audio(media["flac"], limits={"max_samples": 1000})


def test_bytes_input_and_zero_copy(media):
    with open(media["flac"], "rb") as f:
        data = f.read()
    a = np.asarray(spdl_rs.io.load_audio(data, name="s3://bucket/sine.flac", start=1.0))
    assert a.shape == (2, RATE)
    assert_views_a_buffer(a)
    a[0, 0] = 1.0  # writable, like any loader's arrays
    with pytest.raises(RuntimeError, match="s3://bucket/broken.flac"):
        spdl_rs.io.load_audio(data[:64], name="s3://bucket/broken.flac")


def test_corrupt_file_names_the_file(media, tmp_path):
    bad = tmp_path / "corrupt.mp3"
    bad.write_bytes(b"\x00garbage" * 500)
    with pytest.raises(RuntimeError, match="corrupt.mp3"):
        spdl_rs.io.load_audio(str(bad))
    with pytest.raises(OSError, match="missing.wav"):
        spdl_rs.io.load_audio(tmp_path / "missing.wav")  # os.PathLike


def test_batch_shape_padding_and_failures(media, tmp_path, caplog):
    srcs = [media["wav"], media["short_wav"], media["flac"]]
    buf, info = spdl_rs.io.load_audio_batch(srcs, num_samples=24000, num_threads=2, return_info=True)
    assert isinstance(buf, spdl_rs.Buffer) and buf.shape == (3, 2, 24000) and buf.dtype == "float32"
    batch = np.asarray(buf)
    assert info["num_samples"] == [24000, 16000, 24000] and info["sample_rate"] == RATE
    assert not batch[1, :, 16000:].any()
    np.testing.assert_allclose(batch[1, 0, :16000], sine(16000), atol=2e-4)
    assert info["failures"] == []

    bad = tmp_path / "bad.flac"
    bad.write_bytes(b"fLaC" + b"\xff" * 300)
    with pytest.raises(RuntimeError, match=r"batch item 1.*bad\.flac"):
        spdl_rs.io.load_audio_batch([media["wav"], str(bad)], num_samples=100)
    with caplog.at_level(logging.WARNING, logger="spdl_rs.io"):
        batch, info = spdl_rs.io.load_audio_batch(
            [media["wav"], str(bad), media["mp3"]], num_samples=1000, channels="mono", strict=False, return_info=True
        )
    batch = np.asarray(batch)
    assert batch.shape == (3, 1, 1000)
    assert not batch[1].any() and batch[0].any() and batch[2].any()
    [(index, item, message)] = info["failures"]
    assert index == 1 and item == str(bad) and "bad.flac" in message
    assert "bad.flac" in caplog.text
    interleaved = spdl_rs.io.load_audio_batch(srcs, num_samples=10, layout="interleaved", dtype="int16")
    assert interleaved.shape == (3, 10, 2) and interleaved.dtype == "int16"


def test_probe(media):
    info = spdl_rs.io.probe(media["flac"])
    assert info["item"] == media["flac"] and info["size_bytes"] > 0
    [s] = info["streams"]
    assert s["kind"] == "audio" and s["codec"] == "flac"
    assert s["sample_rate"] == RATE and s["channels"] == 2
    assert abs(s["duration_s"] - 2.0) < 0.01
    with open(media["wav"], "rb") as f:
        assert spdl_rs.io.probe(f.read(), name="x.wav")["streams"][0]["sample_rate"] == RATE
    with pytest.raises(RuntimeError, match="empty.wav"):
        spdl_rs.io.probe(b"", name="empty.wav")


def test_audio_native_ops_in_a_pipeline(media, tmp_path):
    srcs = [media["wav"], media["flac"], media["short_wav"]] * 4
    p = (
        PipelineBuilder()
        .add_source(srcs)
        .pipe(ops.load_audio(start=0.25, duration=0.5, sample_rate=8000, channels="mono"), concurrency=2)
        .add_sink(4)
        .build(num_threads=2)
    )
    with p.auto_stop():
        out = [np.asarray(b) for b in p]
    assert len(out) == 12 and all(a.shape == (1, 4000) for a in out)

    p = (
        PipelineBuilder()
        .add_source(srcs)
        .aggregate(4)
        .pipe(ops.load_audio_batch(num_samples=8000), concurrency=2, output_order="input")
        .add_sink(4)
        .build(num_threads=2)
    )
    with p.auto_stop():
        batches = [np.asarray(b) for b in p]
    assert [b.shape for b in batches] == [(4, 2, 8000)] * 3
    np.testing.assert_allclose(batches[0][0], batches[0][1], atol=2e-4)  # the WAV and the FLAC agree

    op = ops.load_audio()
    assert op.name == "load_audio" and np.asarray(op(media["wav"])).shape == (2, 2 * RATE)
    p = PipelineBuilder().add_source([str(tmp_path / "nope.wav")]).pipe(op, name="audio").add_sink(1).build(
        num_threads=1, max_failures=0
    )
    with pytest.raises(PipelineFailure) as failure:
        with p.auto_stop():
            list(p)
    assert failure.value.stage == "audio" and "nope.wav" in str(failure.value.exceptions[0])


def test_decode_releases_the_gil(media, watchdog):
    # A Python thread counts while the main thread decodes. Were the GIL held for the decode, the counter
    # would stand still during it (apart from at most one switch interval before the call).
    progress = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            progress[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.2)
        c0, t0 = progress[0], time.perf_counter()
        time.sleep(0.2)
        rate = (progress[0] - c0) / (time.perf_counter() - t0)
        decoding, during = 0.0, 0
        while decoding < 0.5:
            c0, t0 = progress[0], time.perf_counter()
            a = spdl_rs.io.load_audio(media["long_flac"], sample_rate=22050)
            decoding += time.perf_counter() - t0
            during += progress[0] - c0
    finally:
        stop.set()
        spinner.join()
    assert a.shape == (2, 120 * 22050)
    assert during > 0.1 * rate * decoding, (
        f"the spinning thread advanced {during} times in {decoding:.2f} s of decoding "
        f"({rate:.0f}/s when the main thread slept)"
    )


def test_spdl_timestamp_spelling(media):
    # `timestamp=(start, end)` as in spdl.io, the same window as start/duration.
    a = spdl_rs.io.load_audio(media["wav"], timestamp=(0.5, 0.75))
    b = spdl_rs.io.load_audio(media["wav"], start=0.5, duration=0.25)
    np.testing.assert_array_equal(a, b)
    # An empty window holds no frame, as in SPDL.
    with pytest.raises(RuntimeError, match="No frame to convert"):
        spdl_rs.io.load_audio(media["wav"], timestamp=(0.5, 0.25))
    with pytest.raises(ValueError, match="not both"):
        spdl_rs.io.load_audio(media["wav"], timestamp=(0.5, 0.75), start=0.5)
    # SPDL's filter_desc: None is the decoder's own format (packed int16 for this WAV), a graph runs as given.
    native = np.asarray(spdl_rs.io.load_audio(media["wav"], timestamp=(0.5, 0.75), filter_desc=None))
    assert native.dtype == np.int16 and native.ndim == 2
    fltp = np.asarray(spdl_rs.io.load_audio(media["wav"], filter_desc="aresample=16000,aformat=sample_fmts=fltp"))
    assert fltp.dtype == np.float32 and fltp.ndim == 2


def test_options_are_checked_once_for_function_and_op(media):
    # One options struct per decoder: the function and its op take the same keywords, with the same errors.
    native = spdl_rs._native.io
    for call in (lambda **kw: native.load_audio(media["wav"], **kw), native.load_audio_op):
        with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
            call(nope=1)
        with pytest.raises(TypeError, match="argument 'sample_rate'"):
            call(sample_rate="fast")
        with pytest.raises(ValueError, match="dtype must be"):
            call(dtype="float64")
    with pytest.raises(TypeError, match="missing 1 required keyword argument: 'num_samples'"):
        native.load_audio_batch_op()
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        spdl_rs.io.load_audio(media["wav"], nope=1)  # the typed Python signature
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        ops.load_audio_batch(num_samples=10, num_threads=0)
