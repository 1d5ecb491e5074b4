//! The S3 store through a real pipeline (spdl-exec, a dev-dependency) against a real S3-compatible server
//! (s3s-fs, see tests/support/s3s.rs) that is killed and restarted mid-run on the same port and directory:
//! with retries on, every object is delivered intact, none lost or duplicated; with the server down for good
//! the pipeline ends with a `PipelineError` naming the stage and the object within the deadline.
//! Needs the s3s-fs binary; `SPDL_SKIP_S3=1` skips. Like `reliability_storage.rs`, the store is awaited
//! straight from the stage, which needs tokio's IO driver on spdl-exec's scheduler runtime.
#![cfg(feature = "s3")]

mod support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use spdl_exec::{FailureBudget, PipelineError};
use spdl_source::{RetryPolicy, S3Options, S3Store, StoreOptions};
use support::s3s::{ACCESS_KEY, SECRET_KEY, find_binary};

const BUCKET: &str = "spdl-reliability";

/// An s3s-fs process that can be killed and started again on the same port and directory.
struct Server {
    binary: std::path::PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    fn start() -> Option<Server> {
        let Some(binary) = find_binary() else {
            if std::env::var("SPDL_SKIP_S3").is_ok_and(|v| v == "1") {
                eprintln!("s3s-fs not found and SPDL_SKIP_S3=1: skipping");
                return None;
            }
            panic!(
                "the S3 tests need s3s-fs (`cargo install s3s-fs@0.14.1 --features binary --locked`); SPDL_SKIP_S3=1 skips"
            );
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let mut s = Server { binary, port, dir: tempfile::tempdir().expect("tempdir"), child: None };
        s.up();
        Some(s)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn up(&mut self) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let child = Command::new(&self.binary)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        self.child = Some(child);
        let t = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(60), "s3s-fs did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn options(endpoint: String, retry: RetryPolicy) -> StoreOptions {
    StoreOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(2))
        .retry(retry)
        .s3(S3Options {
            region: Some("us-east-1".into()),
            endpoint: Some(endpoint),
            force_path_style: Some(true),
            credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
        })
}

fn payload(i: usize) -> Bytes {
    Bytes::from((0..(100 + i * 37 % 3000)).map(|j| (i * 131 + j * 7) as u8).collect::<Vec<u8>>())
}

fn key(i: usize) -> String {
    format!("train/{i:05}.bin")
}

/// Creates the bucket and writes `n` objects.
fn fill(rt: &tokio::runtime::Runtime, store: &S3Store, n: usize) {
    rt.block_on(async {
        store.client().create_bucket().bucket(BUCKET).send().await.expect("create bucket");
        futures::stream::iter(0..n)
            .map(|i| async move { store.put(&key(i), payload(i)).await })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await
            .expect("put");
    });
}

/// keys → `store.get` (8 in flight, input order) → sink.
fn fetch_pipeline(store: Arc<S3Store>, n: usize, budget: FailureBudget) -> spdl_exec::Pipeline<(String, Bytes)> {
    support::data::fetch_pipeline(store, (0..n).map(key), 8, 4, budget)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
}

#[test]
fn s3_server_killed_and_restarted_mid_run_loses_and_duplicates_nothing() {
    let Some(mut server) = Server::start() else { return };
    const N: usize = 300;
    let rt = runtime();
    let retry =
        RetryPolicy { max_attempts: 10, base_delay: Duration::from_millis(20), max_delay: Duration::from_secs(1) };
    let store = rt.block_on(S3Store::connect(BUCKET, "", &options(server.endpoint(), retry))).expect("connect");
    fill(&rt, &store, N);
    let pipeline = fetch_pipeline(Arc::new(store), N, FailureBudget::Unlimited);
    let mut delivered = Vec::new();
    let t = Instant::now();
    for item in &pipeline {
        let (k, bytes) = item.expect("an unlimited budget never ends the run");
        let i: usize = k.trim_start_matches("train/").trim_end_matches(".bin").parse().expect("key");
        assert_eq!(bytes, payload(i), "{k}");
        delivered.push(i);
        if delivered.len() == N / 3 {
            server.kill();
            std::thread::sleep(Duration::from_millis(1500));
            server.up();
        }
    }
    let failed = pipeline.stats().stage("fetch").map_or(0, |s| s.items_failed);
    assert_eq!(failed, 0, "{}", pipeline.stats());
    assert_eq!(delivered, (0..N).collect::<Vec<_>>(), "every object once, in order");
    println!(
        "{N} S3 objects through a 1.5 s server outage in {:.1} s: all delivered intact",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn s3_server_down_for_good_ends_the_pipeline_with_an_error_within_the_deadline() {
    let Some(mut server) = Server::start() else { return };
    let rt = runtime();
    let retry =
        RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(10), max_delay: Duration::from_millis(50) };
    let store = rt.block_on(S3Store::connect(BUCKET, "", &options(server.endpoint(), retry))).expect("connect");
    fill(&rt, &store, 20);
    server.kill();
    let t = Instant::now();
    let pipeline = fetch_pipeline(Arc::new(store), 20, FailureBudget::Count(5));
    let err = pipeline.iter().find_map(Result::err).expect("the run ends with an error");
    let took = t.elapsed();
    match &err {
        PipelineError::StageBudgetExceeded { stage, causes, .. } => {
            assert_eq!(stage, "fetch");
            let cause = &causes.first().expect("causes").cause;
            assert!(cause.contains(&format!("s3://{BUCKET}/train/")) && cause.contains("attempt"), "{cause}");
        }
        other => panic!("expected the stage's budget error, got {other}"),
    }
    assert!(took < Duration::from_secs(60), "took {took:?}");
    println!("S3 server down: the pipeline ended in {took:?} with: {err}");
}
