"""spdl_rs.io.utils against SPDL 0.8.0's ``spdl.io.utils``: the same names; FFmpeg's versions as
``{library: (major, minor, micro)}``; its filters; its log level set and read back; what the build has; and
tracing written as Chrome trace-event JSON."""

import json
import os
import threading

import pytest

import spdl_rs
from spdl_rs.io import utils

SPDL_UTILS = {
    "built_with_cuda", "built_with_nvcodec", "built_with_nvjpeg", "get_ffmpeg_filters", "get_ffmpeg_log_level",
    "get_ffmpeg_versions", "set_ffmpeg_log_level", "trace_counter", "trace_event", "trace_gc", "tracing",
}


def test_the_names_are_spdls():
    assert set(utils.__all__) == SPDL_UTILS
    assert all(callable(getattr(utils, n)) for n in SPDL_UTILS)


def test_ffmpeg_versions_are_tuples_of_the_loaded_libraries():
    versions = utils.get_ffmpeg_versions()
    # SPDL: {'libavcodec': (60, 3, 100), 'libavfilter': ..., 'libavformat': ..., 'libavutil': ...}
    for lib in ("libavcodec", "libavformat", "libavutil", "libavfilter"):
        v = versions[lib]
        assert isinstance(v, tuple) and len(v) == 3 and all(isinstance(x, int) for x in v), versions
    libs = spdl_rs.build_info()["ffmpeg"]["libraries"]
    assert ".".join(map(str, versions["libavcodec"])) == libs["libavcodec"]
    major = spdl_rs.build_info()["ffmpeg"]["major"]
    # libavutil's major follows FFmpeg's: 56 (FFmpeg 4), 57 (5), 58 (6), 59 (7), 60 (8).
    assert versions["libavutil"][0] == {4: 56, 5: 57, 6: 58, 7: 59, 8: 60}[major]


def test_ffmpeg_filters_are_the_ones_filter_graphs_use():
    filters = utils.get_ffmpeg_filters()
    assert isinstance(filters, list) and filters == sorted(filters)
    for name in ("scale", "format", "aresample", "atrim", "trim", "fps", "buffer", "abuffer", "buffersink"):
        assert name in filters, name


def test_ffmpeg_log_level_is_set_and_read_back():
    before = utils.get_ffmpeg_log_level()
    assert before == 8  # spdl_rs keeps FFmpeg at "fatal" unless told otherwise
    try:
        for level in (-8, 16, 24, 32):
            utils.set_ffmpeg_log_level(level)
            assert utils.get_ffmpeg_log_level() == level
    finally:
        utils.set_ffmpeg_log_level(before)
    with pytest.raises(TypeError):
        utils.set_ffmpeg_log_level("debug")


def test_built_with_reports_the_build():
    cuda = spdl_rs.build_info()["cuda"]
    assert utils.built_with_cuda() is (bool(cuda["built"]) and cuda["devices"] > 0)
    assert utils.built_with_nvcodec() is False and utils.built_with_nvjpeg() is False


def test_tracing_records_slices_counters_and_gc_from_every_thread(tmp_path):
    import gc

    out = tmp_path / "trace.json"
    utils.trace_counter(0, 1)  # outside a trace: nothing, no error
    with utils.trace_event("ignored"):
        pass
    utils.trace_gc()
    with utils.tracing(str(out), buffer_size=1, process_name="trainer"):
        with utils.trace_event("load"):
            utils.trace_counter(3, 2.5)

        def worker():
            with utils.trace_event("worker"):
                pass

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        gc.collect()
        with pytest.raises(RuntimeError, match="already"):
            with utils.tracing(str(tmp_path / "second.json")):
                pass
    events = json.loads(out.read_text())
    names = [(e["name"], e["ph"]) for e in events]
    assert ("process_name", "M") in names and events[0]["args"]["name"] == "trainer"
    assert names.index(("load", "B")) < names.index(("counter_3", "C")) < names.index(("load", "E"))
    assert ("worker", "B") in names and ("gc", "B") in names and ("gc", "E") in names
    assert ("ignored", "B") not in names
    load = next(e for e in events if e["name"] == "load")
    work = next(e for e in events if e["name"] == "worker")
    assert load["pid"] == os.getpid() and load["tid"] != work["tid"]
    assert all(e["ts"] >= 0 for e in events)
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        utils.trace_counter(8, 1)
    # To a file descriptor (left open), and disabled.
    fd = os.open(tmp_path / "fd.json", os.O_WRONLY | os.O_CREAT)
    try:
        with utils.tracing(fd):
            with utils.trace_event("x"):
                pass
        os.write(fd, b"")  # still open
    finally:
        os.close(fd)
    assert any(e["name"] == "x" for e in json.loads((tmp_path / "fd.json").read_text()))
    with utils.tracing(str(tmp_path / "off.json"), enable=False):
        pass
    assert not (tmp_path / "off.json").exists()
