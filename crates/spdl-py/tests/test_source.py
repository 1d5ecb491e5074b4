"""spdl_rs.source: samplers and dataset listings."""

import pytest

import spdl_rs
from spdl_rs.pipeline import PipelineBuilder

pytestmark = pytest.mark.skipif(not spdl_rs._native.HAS_SOURCE, reason="built without the source feature")


def test_samplers_are_deterministic_and_shard_disjointly():
    from spdl_rs.source import Sampler

    s = Sampler.shuffled(100, seed=7)
    assert len(s) == 100 and s.seed == 7
    e0, e1 = s.order(0), s.order(1)
    assert sorted(e0) == list(range(100)) and e0 != e1
    assert Sampler.shuffled(100, seed=7).order(0) == e0
    shards = [set(s.sharded(r, 4, drop_remainder=True).order(0)) for r in range(4)]
    assert sum(len(x) for x in shards) == 100 and set().union(*shards) == set(range(100))
    assert Sampler.sequential(5).order(3) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        s.sharded(4, 4)


def test_list_dataset_feeds_a_pipeline(tmp_path):
    from spdl_rs.source import Sampler, list_dataset

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            (tmp_path / cls / f"{i}.jpg").write_bytes(b"x")
    (tmp_path / "cat" / "notes.txt").write_text("skip me")
    keys, labels, classes = list_dataset(tmp_path, extensions=["jpg"])
    assert classes == ["cat", "dog"] and len(keys) == 6 and labels == [0, 0, 0, 1, 1, 1]
    order = Sampler.shuffled(len(keys), seed=1).order(0)
    p = PipelineBuilder().add_source(order).pipe(lambda i: labels[i]).add_sink(2).build(num_threads=1)
    with p.auto_stop():
        assert sorted(p) == sorted(labels)


def _files(root, n=40):
    """n objects of different sizes under root/shard/, returned as {key: bytes}."""
    objs = {}
    for i in range(n):
        key = f"shard/{i:04d}.bin"
        data = bytes((i * 7 + j) % 256 for j in range(100 + 37 * i))
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        objs[key] = data
    return objs


def test_local_store_reads_lists_and_names_missing_keys(tmp_path):
    from spdl_rs.source import Store

    objs = _files(tmp_path)
    store = Store.open(str(tmp_path))
    keys = sorted(objs)
    assert store.get(keys[3]) == objs[keys[3]]
    assert store.get_range(keys[5], 10, 20) == objs[keys[5]][10:20]
    assert store.size(keys[7]) == len(objs[keys[7]])
    assert store.list("shard/") == [(k, len(objs[k])) for k in keys]
    assert store.get_many(keys, concurrency=8) == [objs[k] for k in keys]
    with pytest.raises(Exception, match="missing.bin"):
        store.get("shard/missing.bin")
    with pytest.raises(ValueError):
        Store.open(str(tmp_path), read_timeout=0)


def _http_server(root):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_http_store_against_a_real_server_in_a_pipeline(tmp_path):
    from spdl_rs.source import Store

    objs = _files(tmp_path)
    server = _http_server(tmp_path)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            store = Store.open(url, max_attempts=2, read_timeout=10.0)
        except Exception as e:  # a build without the `http` feature says so
            assert "http" in str(e)
            pytest.skip(f"built without the http feature: {e}")
        keys = sorted(objs)
        assert store.get(keys[0]) == objs[keys[0]]
        assert store.get_many(keys, concurrency=16) == [objs[k] for k in keys]
        # As a pipeline stage: the GIL is released while each request waits.
        p = PipelineBuilder().add_source(keys).pipe(store.get, concurrency=8).add_sink(4).build(num_threads=4)
        with p.auto_stop():
            got = sorted(p)
        assert got == sorted(objs[k] for k in keys)
        with pytest.raises(Exception, match="nope.bin"):
            store.get("shard/nope.bin")
    finally:
        server.shutdown()
        server.server_close()


def test_http_store_to_a_closed_port_fails_within_the_deadline():
    import socket
    import time

    from spdl_rs.source import Store

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    try:
        store = Store.open(f"http://127.0.0.1:{port}", connect_timeout=1.0, read_timeout=1.0, max_attempts=2)
    except Exception as e:
        assert "http" in str(e)
        pytest.skip(f"built without the http feature: {e}")
    t = time.monotonic()
    with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
        store.get("a/b.bin")
    assert time.monotonic() - t < 30
