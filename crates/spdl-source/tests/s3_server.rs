//! The S3 store against a real S3-compatible server (s3s-fs) started on 127.0.0.1 by the test.
//! Needs the s3s-fs binary (see tests/support/s3s.rs); `SPDL_SKIP_S3=1` skips.
#![cfg(feature = "s3")]

mod support;

use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use spdl_source::sampler::{Sampler, ShuffledSampler};
use spdl_source::{
    Dataset, FolderLayout, ObjectMeta, ObjectStore, ParallelRead, RetryPolicy, S3Options, S3Store, SourceError,
    StoreOptions, open_store_with,
};
use support::s3s::{ACCESS_KEY, S3sServer, SECRET_KEY};

const BUCKET: &str = "spdl-test";

fn options(server: &S3sServer) -> StoreOptions {
    StoreOptions::default()
        .retry(RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
        })
        .s3(S3Options {
            region: Some("us-east-1".into()),
            endpoint: Some(server.endpoint.clone()),
            force_path_style: Some(true),
            credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
        })
}

async fn bucket_store(server: &S3sServer) -> S3Store {
    let store = S3Store::connect(BUCKET, "", &options(server)).await.unwrap();
    store.client().create_bucket().bucket(BUCKET).send().await.unwrap();
    store
}

fn payload(i: usize) -> Bytes {
    Bytes::from((0..(10 + i % 190)).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_list_paginate_get_range_and_missing() {
    let Some(server) = support::s3s::start() else { return };
    let store = bucket_store(&server).await;

    // More than one page of 1,000 keys.
    let n = 1_050;
    futures::stream::iter(0..n)
        .map(|i| {
            let store = &store;
            async move { store.put(&format!("many/{i:05}.bin"), payload(i)).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    store.put("other/x.bin", Bytes::from_static(b"x")).await.unwrap();

    let listed: Vec<ObjectMeta> = store.list("many/").try_collect().await.unwrap();
    let expected: Vec<ObjectMeta> =
        (0..n).map(|i| ObjectMeta::new(format!("many/{i:05}.bin"), payload(i).len() as u64)).collect();
    assert_eq!(listed, expected);
    let small_pages = store.clone().with_page_size(100);
    let paged: Vec<ObjectMeta> = small_pages.list("many/").try_collect().await.unwrap();
    assert_eq!(paged, expected);
    assert_eq!(store.list("").try_collect::<Vec<_>>().await.unwrap().len(), n + 1);

    // A store scoped to a prefix sees keys relative to it.
    let scoped = S3Store::connect(BUCKET, "many/", &options(&server)).await.unwrap();
    let first: Vec<ObjectMeta> = scoped.list("0000").take(3).try_collect().await.unwrap();
    assert_eq!(first.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["00000.bin", "00001.bin", "00002.bin"]);
    assert_eq!(scoped.get("00007.bin").await.unwrap(), payload(7));
    assert_eq!(scoped.location("00007.bin"), format!("s3://{BUCKET}/many/00007.bin"));

    // Full, ranged, head, parallel.
    let p = payload(42);
    assert_eq!(store.get("many/00042.bin").await.unwrap(), p);
    assert_eq!(store.get_range("many/00042.bin", 3..9).await.unwrap(), p.slice(3..9));
    assert_eq!(store.get_range("many/00042.bin", 5..100_000).await.unwrap(), p.slice(5..));
    assert_eq!(store.head("many/00042.bin").await.unwrap().size, p.len() as u64);
    let err = store.get_range("many/00042.bin", 10_000..10_010).await.unwrap_err();
    assert!(matches!(err, SourceError::InvalidRange { .. }), "{err}");
    let big: Bytes = (0..1_000_003u32).map(|i| (i % 253) as u8).collect::<Vec<u8>>().into();
    store.put("big.bin", big.clone()).await.unwrap();
    let opts = ParallelRead { chunk_size: 100_000, concurrency: 4 };
    assert_eq!(store.get_parallel("big.bin", opts).await.unwrap(), big);

    // A missing key is a clear not-found error naming the object, not retried into a timeout.
    let err = store.get("many/missing.bin").await.unwrap_err();
    eprintln!("missing: {err}");
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains(&format!("s3://{BUCKET}/many/missing.bin")), "{err}");
    assert!(store.head("many/missing.bin").await.unwrap_err().is_not_found());
    assert!(store.get_range("many/missing.bin", 0..10).await.unwrap_err().is_not_found());

    // The address form, as a user would write it.
    let opened = open_store_with(&format!("s3://{BUCKET}/many"), &options(&server)).await.unwrap();
    assert_eq!(opened.get("01049.bin").await.unwrap(), payload(1049));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imagenet_listing_from_s3_feeds_a_sampler() {
    let Some(server) = support::s3s::start() else { return };
    let store = bucket_store(&server).await;
    for (class, count) in [("n02", 3), ("n01", 2), ("n03", 1)] {
        for i in 0..count {
            store.put(&format!("train/{class}/{i}.jpg"), Bytes::from(format!("{class}-{i}"))).await.unwrap();
        }
    }
    store.put("train/n01/notes.txt", Bytes::from_static(b"skip")).await.unwrap();
    let ds = Dataset::from_store(&store, "train/", &["jpg"], FolderLayout::ClassFolders).await.unwrap();
    assert_eq!(ds.classes(), ["n01", "n02", "n03"]);
    assert_eq!(ds.len(), 6);
    for index in ShuffledSampler::new(ds.len(), 7).order(0) {
        let record = ds.get(index).unwrap();
        let bytes = store.get(&record.key).await.unwrap();
        let class = &ds.classes()[record.label.unwrap() as usize];
        assert!(bytes.starts_with(class.as_bytes()), "{record:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_denied_and_dead_servers_report_attempts() {
    let Some(server) = support::s3s::start() else { return };
    let store = bucket_store(&server).await;
    store.put("k.bin", Bytes::from_static(b"data")).await.unwrap();

    let mut bad = options(&server);
    bad.s3.credentials = Some((ACCESS_KEY.into(), "wrong-secret".into()));
    let denied = S3Store::connect(BUCKET, "", &bad).await.unwrap();
    let err = denied.get("k.bin").await.unwrap_err();
    eprintln!("bad credentials: {err}");
    assert!(matches!(err, SourceError::PermissionDenied { .. }), "{err}");
    assert!(err.to_string().contains(&format!("s3://{BUCKET}/k.bin")), "{err}");

    let endpoint = server.endpoint.clone();
    drop(server); // the port now refuses connections
    let mut opts = StoreOptions::default().connect_timeout(Duration::from_secs(2)).retry(RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
    });
    opts.s3 = S3Options {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint),
        force_path_style: None,
        credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
    };
    let dead = S3Store::connect(BUCKET, "", &opts).await.unwrap();
    let err = dead.get("k.bin").await.unwrap_err();
    eprintln!("dead server: {err}");
    match &err {
        SourceError::Request { attempts: 3, location, .. } => assert_eq!(location, &format!("s3://{BUCKET}/k.bin")),
        other => panic!("expected 3 failed attempts, got: {other}"),
    }
}
