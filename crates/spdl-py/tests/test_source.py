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
    with pytest.raises(FileNotFoundError, match="missing.bin"):
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
        with pytest.raises(FileNotFoundError, match="nope.bin"):
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
    with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
        store.get("a/b.bin")
    assert time.monotonic() - t < 30


S3_ACCESS_KEY = "spdl-test-access"
S3_SECRET_KEY = "spdl-test-secret-key"


@pytest.fixture
def s3_server(tmp_path):
    """A real S3-compatible server (s3s-fs, installed by `cargo xtask test`) on a free port of 127.0.0.1,
    serving `tmp_path / "s3"`: each directory there is a bucket. Yields `(endpoint, root)`."""
    import os
    import shutil
    import socket
    import subprocess
    import time
    from pathlib import Path

    binary = os.environ.get("SPDL_S3S_FS")
    if binary and not Path(binary).is_file():
        pytest.fail(f"SPDL_S3S_FS={binary} does not name a file")
    binary = binary or shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    if not Path(binary).is_file():
        pytest.skip("s3s-fs not found (`cargo xtask test` installs it and sets SPDL_S3S_FS)")
    root = tmp_path / "s3"
    root.mkdir()
    for _ in range(5):  # a free port can be taken between probing and binding
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", S3_ACCESS_KEY,
             "--secret-key", S3_SECRET_KEY, str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None and time.monotonic() < deadline:
            try:
                yield f"http://127.0.0.1:{port}", root
            finally:
                proc.kill()
                proc.wait()
            return
        proc.kill()
        proc.wait()
    pytest.fail("s3s-fs did not start listening")


def _open_s3(url, endpoint, **kwargs):
    from spdl_rs.source import Store

    try:
        return Store.open(url, endpoint=endpoint, region="us-east-1", access_key=S3_ACCESS_KEY,
                          secret_key=S3_SECRET_KEY, **kwargs)
    except Exception as e:  # a build without the `s3` feature says so
        if "s3" not in str(e).lower() or "feature" not in str(e):
            raise
        pytest.skip(f"built without the s3 feature: {e}")


def test_s3_store_against_a_real_server(s3_server):
    endpoint, root = s3_server
    bucket = root / "spdl-bucket"
    objs = {}
    # More than one page of a listing (S3 returns at most 1,000 keys per request).
    for i in range(1100):
        key = f"train/{i // 100:02d}/{i:05d}.bin"
        data = bytes((i * 7 + j) % 251 for j in range(64 + i % 50))
        (bucket / key).parent.mkdir(parents=True, exist_ok=True)
        (bucket / key).write_bytes(data)
        objs[key] = data
    (bucket / "other.txt").write_bytes(b"not under the prefix")

    store = _open_s3("s3://spdl-bucket/train", endpoint, max_attempts=2, read_timeout=10.0)
    keys = sorted(objs)
    rel = [k.removeprefix("train/") for k in keys]
    assert store.get(rel[3]) == objs[keys[3]]
    assert store.get_range(rel[5], 10, 20) == objs[keys[5]][10:20]
    assert store.get_range(rel[5], 10, 10_000) == objs[keys[5]][10:]
    assert store.size(rel[7]) == len(objs[keys[7]])
    listed = store.list()
    assert listed == [(r, len(objs[k])) for r, k in zip(rel, keys)]
    assert [k for k, _ in store.list("03/")] == [r for r in rel if r.startswith("03/")]
    assert store.get_many(rel[:300], concurrency=16) == [objs[k] for k in keys[:300]]
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        store.get("missing.bin")

    # As a pipeline stage: every object comes out once, intact.
    p = PipelineBuilder().add_source(rel[:200]).pipe(store.get, concurrency=8).add_sink(4).build(num_threads=4)
    with p.auto_stop():
        got = sorted(p)
    assert got == sorted(objs[k] for k in keys[:200])


def test_s3_options_are_checked(tmp_path, s3_server):
    from spdl_rs.source import Store

    endpoint, _ = s3_server
    with pytest.raises(ValueError, match="s3://"):
        Store.open(str(tmp_path), endpoint=endpoint)
    with pytest.raises(ValueError, match="access_key and secret_key"):
        Store.open("s3://b", endpoint=endpoint, access_key="only-one")
    # Wrong credentials: a clear error naming the key, not a hang.
    bucket = s3_server[1] / "creds-bucket"
    bucket.mkdir()
    (bucket / "k.bin").write_bytes(b"x")
    try:
        store = Store.open("s3://creds-bucket", endpoint=endpoint, region="us-east-1", access_key="wrong",
                           secret_key="wrong-secret", max_attempts=1)
    except Exception as e:
        if "feature" in str(e):
            pytest.skip(f"built without the s3 feature: {e}")
        raise
    with pytest.raises(PermissionError, match="creds-bucket/k.bin"):
        store.get("k.bin")


def test_store_get_op_is_a_native_async_stage(tmp_path):
    from spdl_rs.pipeline import PipelineFailure
    from spdl_rs.source import Store

    objs = _files(tmp_path)
    keys = sorted(objs)
    server = _http_server(tmp_path)
    stores = [Store.open(str(tmp_path))]
    try:
        try:
            stores.append(Store.open(f"http://127.0.0.1:{server.server_address[1]}", max_attempts=2))
        except Exception as e:  # a build without the `http` feature: the local store alone
            assert "http" in str(e)
        for store in stores:
            op = store.get_op()
            assert op.name == "fetch"
            assert op(keys[0]) == objs[keys[0]]  # called directly
            with pytest.raises(TypeError, match="key of the store"):
                op(3)
            # Native fetch, then a Python check; input order kept with 16 requests in flight.
            p = (
                PipelineBuilder()
                .add_source(keys * 3)
                .pipe(op, concurrency=16, output_order="input")
                .add_sink(8)
                .build(num_threads=2)
            )
            with p.auto_stop():
                assert list(p) == [objs[k] for k in keys * 3]
            # A missing key fails that item, named; the rest come out.
            p = (
                PipelineBuilder()
                .add_source([*keys, "shard/absent.bin", *keys])
                .pipe(op, concurrency=4, name="fetch", max_failures=1)
                .add_sink(8)
                .build(num_threads=2)
            )
            with p.auto_stop():
                assert sorted(p) == sorted([objs[k] for k in keys] * 2)
            p = (
                PipelineBuilder()
                .add_source(["shard/absent.bin"] * 3)
                .pipe(op, name="fetch", max_failures=1)
                .add_sink(8)
                .build(num_threads=2)
            )
            with pytest.raises(PipelineFailure) as info:
                with p.auto_stop():
                    list(p)
            assert info.value.stage == "fetch"
            assert "absent.bin" in str(info.value.exceptions[0])
        # The op keeps its store's runtime alive after the store object is gone.
        op = stores.pop().get_op()
        stores.clear()
        import gc

        gc.collect()
        p = PipelineBuilder().add_source(keys).pipe(op, concurrency=4).add_sink(4).build(num_threads=2)
        with p.auto_stop():
            assert sorted(p) == sorted(objs[k] for k in keys)
    finally:
        server.shutdown()
        server.server_close()
