//! spdl-source: throughput of many small GETs from a local S3-compatible server (s3s-fs on 127.0.0.1), at
//! concurrency 1, 16 and 64, in objects/s (criterion's `elem/s`; MB/s = objects/s × 0.1024).
//!
//! Each iteration reads every object once with `ObjectStore::get`, `concurrency` requests in flight.
//! `SPDL_BENCH_S3_OBJECTS` sets the object count (default 1,000 × 100 KB); `SPDL_SKIP_S3=1` skips the bench when
//! s3s-fs is missing (`cargo xtask test` installs it).
//!
//! Run: `cargo bench -p spdl-benches --bench source`

#[path = "../../crates/spdl-source/tests/support/s3s.rs"]
mod s3s;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::{StreamExt, TryStreamExt};
use spdl_source::{ObjectStore, S3Options, S3Store, StoreOptions};

const OBJECT_SIZE: usize = 100 * 1024;
const BUCKET: &str = "bench";

fn object_count() -> usize {
    std::env::var("SPDL_BENCH_S3_OBJECTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000)
}

async fn get_all(store: &S3Store, keys: &[String], concurrency: usize) -> usize {
    futures::stream::iter(keys)
        .map(|key| store.get(key))
        .buffer_unordered(concurrency)
        .try_fold(0usize, |total, bytes| async move { Ok(total + bytes.len()) })
        .await
        .unwrap_or_else(|e| panic!("bench GET failed: {e}"))
}

fn s3_small_gets(c: &mut Criterion) {
    let Some(server) = s3s::start() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let opts = StoreOptions::default().max_in_flight(64).s3(S3Options {
        region: Some("us-east-1".into()),
        endpoint: Some(server.endpoint.clone()),
        force_path_style: Some(true),
        credentials: Some((s3s::ACCESS_KEY.into(), s3s::SECRET_KEY.into())),
    });
    let n = object_count();
    let (store, keys) = rt.block_on(async {
        let store = S3Store::connect(BUCKET, "", &opts).await.unwrap();
        store.client().create_bucket().bucket(BUCKET).send().await.unwrap();
        let keys: Vec<String> = (0..n).map(|i| format!("small/{i:06}.bin")).collect();
        let body = Bytes::from(vec![0x5a; OBJECT_SIZE]);
        futures::stream::iter(&keys)
            .map(|key| store.put(key, body.clone()))
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await
            .unwrap();
        (Arc::new(store), keys)
    });

    let mut group = c.benchmark_group("s3_get_100KB");
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(15));
    for concurrency in [1usize, 16, 64] {
        group.bench_with_input(BenchmarkId::new("concurrency", concurrency), &concurrency, |b, &concurrency| {
            b.iter(|| {
                let bytes = rt.block_on(get_all(&store, &keys, concurrency));
                assert_eq!(bytes, n * OBJECT_SIZE);
                black_box(bytes)
            });
        });
    }
    group.finish();
    drop(server);
}

criterion_group!(benches, s3_small_gets);
criterion_main!(benches);
