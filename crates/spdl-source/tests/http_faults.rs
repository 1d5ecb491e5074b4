//! The HTTP store against an in-process HTTP/1.1 server on 127.0.0.1 that injects faults: 500s, connection
//! resets (before the response and in the middle of the body), truncated bodies and a first byte slower than the
//! read timeout. Every object must come back intact or be reported failed with its key; none lost or duplicated.
#![cfg(feature = "http")]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use spdl_source::{HttpStore, ObjectStore, ParallelRead, RetryPolicy, SourceError, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::data::mix;

/// The faults the server can inject, drawn per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    Status500,
    ResetBeforeResponse,
    ResetMidBody,
    TruncatedBody,
    SlowFirstByte,
}

const FAULTS: [Fault; 5] =
    [Fault::Status500, Fault::ResetBeforeResponse, Fault::ResetMidBody, Fault::TruncatedBody, Fault::SlowFirstByte];

struct ServerConfig {
    /// Fraction of requests that get a fault.
    fault_rate: f64,
    /// How long a slow response waits before its first byte.
    slow_delay: Duration,
    /// Whether `Range` is honoured (206) or ignored (200 with the whole object).
    honour_range: bool,
    /// The faults drawn from, with equal odds.
    kinds: &'static [Fault],
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    per_fault: std::sync::Mutex<BTreeMap<Fault, u64>>,
    per_key: std::sync::Mutex<HashMap<String, u64>>,
}

struct TestServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl TestServer {
    async fn start(objects: HashMap<String, Bytes>, config: ServerConfig) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let objects = Arc::new(objects);
        let config = Arc::new(config);
        let c = counters.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                tokio::spawn(serve(stream, objects.clone(), config.clone(), c.clone()));
            }
        });
        TestServer { addr, counters }
    }

    fn base(&self) -> String {
        format!("http://{}/data", self.addr)
    }

    fn faults(&self) -> BTreeMap<Fault, u64> {
        self.counters.per_fault.lock().unwrap().clone()
    }

    fn requests_for(&self, key: &str) -> u64 {
        self.counters.per_key.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 16 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(buf).ok()
}

async fn serve(
    mut stream: TcpStream,
    objects: Arc<HashMap<String, Bytes>>,
    config: Arc<ServerConfig>,
    c: Arc<Counters>,
) {
    // One request per connection ("Connection: close"): every request is a fresh draw, resets hit only it.
    let Some(head) = read_head(&mut stream).await else { return };
    let mut lines = head.split("\r\n");
    let mut request = lines.next().unwrap_or("").split(' ');
    let (method, path) = (request.next().unwrap_or(""), request.next().unwrap_or(""));
    let range = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("range"))
        .and_then(|(_, v)| v.trim().strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
    let key = path.strip_prefix("/data/").unwrap_or("").to_owned();
    let n = c.requests.fetch_add(1, Ordering::SeqCst);
    *c.per_key.lock().unwrap().entry(key.clone()).or_default() += 1;

    let draw = mix(n ^ 0xA5A5);
    let fault = if (draw % 10_000) as f64 / 10_000.0 < config.fault_rate {
        config.kinds.get((mix(draw) % config.kinds.len().max(1) as u64) as usize).copied()
    } else {
        None
    };
    if let Some(f) = fault {
        *c.per_fault.lock().unwrap().entry(f).or_default() += 1;
    }

    let write = |status: &str, headers: String, body: &[u8]| {
        let mut out = format!("HTTP/1.1 {status}\r\n{headers}Connection: close\r\n\r\n").into_bytes();
        out.extend_from_slice(body);
        out
    };
    let response = if key.starts_with("forbidden/") {
        write("403 Forbidden", "Content-Length: 0\r\n".into(), b"")
    } else if let Some(data) = objects.get(&key) {
        let size = data.len() as u64;
        match range.filter(|_| config.honour_range) {
            Some((start, _)) if start >= size => write(
                "416 Range Not Satisfiable",
                format!("Content-Range: bytes */{size}\r\nContent-Length: 0\r\n"),
                b"",
            ),
            Some((start, end)) => {
                let end = end.min(size - 1);
                let body = &data[start as usize..=end as usize];
                let headers =
                    format!("Content-Range: bytes {start}-{end}/{size}\r\nContent-Length: {}\r\n", body.len());
                write("206 Partial Content", headers, if method == "HEAD" { b"" } else { body })
            }
            None => write("200 OK", format!("Content-Length: {size}\r\n"), if method == "HEAD" { b"" } else { data }),
        }
    } else {
        write("404 Not Found", "Content-Length: 0\r\n".into(), b"")
    };

    match fault {
        None => {
            let _ = stream.write_all(&response).await;
            let _ = stream.shutdown().await;
        }
        Some(Fault::Status500) => {
            let _ = stream
                .write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
            let _ = stream.shutdown().await;
        }
        Some(Fault::ResetBeforeResponse) => {
            let _ = stream.set_zero_linger();
        }
        Some(Fault::ResetMidBody) | Some(Fault::TruncatedBody) => {
            // The headers and some of the body, then a reset (RST) or a clean close (FIN) before the end.
            let header_end = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
            let body_len = response.len() - header_end;
            let cut = header_end + body_len / 2;
            if body_len == 0 {
                // Nothing to truncate: a reset is the fault.
                let _ = stream.set_zero_linger();
                return;
            }
            let _ = stream.write_all(&response[..cut]).await;
            let _ = stream.flush().await;
            if fault == Some(Fault::ResetMidBody) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = stream.set_zero_linger();
            } else {
                let _ = stream.shutdown().await;
            }
        }
        Some(Fault::SlowFirstByte) => {
            tokio::time::sleep(config.slow_delay).await;
            let _ = stream.write_all(&response).await;
            let _ = stream.shutdown().await;
        }
    }
}

/// Deterministic content per key, so the test can check every byte.
fn content(i: usize) -> Bytes {
    support::data::content(i, 1, 20_000, 1)
}

fn objects(n: usize) -> HashMap<String, Bytes> {
    (0..n).map(|i| (format!("obj/{i:05}.bin"), content(i))).collect()
}

fn faulty_options() -> StoreOptions {
    StoreOptions::default()
        .connect_timeout(Duration::from_secs(5))
        // The slow responses wait 4 s; 1 s is far above a healthy first byte even on a loaded machine.
        .read_timeout(Duration::from_secs(1))
        .retry(RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(100),
        })
        .max_in_flight(32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_is_delivered_intact_or_reported_under_30_percent_faults() {
    let n = 1_200;
    let objects = objects(n);
    let config =
        ServerConfig { fault_rate: 0.30, slow_delay: Duration::from_secs(4), honour_range: true, kinds: &FAULTS };
    let server = TestServer::start(objects.clone(), config).await;
    let store = Arc::new(HttpStore::with_options(&server.base(), &faulty_options()).unwrap());

    let keys: Vec<String> = (0..n).map(|i| format!("obj/{i:05}.bin")).collect();
    let results: Vec<(String, Result<Bytes, SourceError>)> = futures::stream::iter(keys.clone())
        .map(|key| {
            let store = store.clone();
            async move {
                let r = store.get(&key).await;
                (key, r)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;

    let mut seen: HashMap<&str, usize> = HashMap::new();
    let (mut delivered, mut failed) = (0, 0);
    for (key, result) in &results {
        *seen.entry(key.as_str()).or_default() += 1;
        match result {
            Ok(bytes) => {
                assert_eq!(bytes, &objects[key], "{key} delivered with wrong content");
                delivered += 1;
            }
            Err(err) => {
                let text = err.to_string();
                assert!(
                    text.contains(key.as_str()) && text.contains("attempt"),
                    "error must name key and attempts: {text}"
                );
                failed += 1;
            }
        }
    }
    assert_eq!(seen.len(), n, "no object lost");
    assert!(seen.values().all(|&c| c == 1), "no object duplicated");
    assert_eq!(delivered + failed, n);
    // With 6 attempts at a 30% fault rate, about 0.07% fail for good; allow a wide margin.
    assert!(delivered >= n * 97 / 100, "{delivered} of {n} delivered");
    let faults = server.faults();
    assert_eq!(faults.len(), FAULTS.len(), "every fault kind was injected: {faults:?}");
    let injected: u64 = faults.values().sum();
    let total = server.counters.requests.load(Ordering::SeqCst);
    eprintln!("delivered {delivered}/{n}, failed {failed}; {injected} faults in {total} requests: {faults:?}");
    assert!(injected as f64 / total as f64 > 0.2, "{injected} faults in {total} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_heads_and_parallel_reads_survive_faults() {
    let mut objects = objects(200);
    let big: Bytes = (0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
    objects.insert("big.bin".into(), big.clone());
    let config =
        ServerConfig { fault_rate: 0.30, slow_delay: Duration::from_secs(4), honour_range: true, kinds: &FAULTS };
    let server = TestServer::start(objects.clone(), config).await;
    let store = Arc::new(HttpStore::with_options(&server.base(), &faulty_options()).unwrap());

    type SizeAndRange = Result<(u64, Bytes), SourceError>;
    let results: Vec<(usize, SizeAndRange)> = futures::stream::iter(0..200usize)
        .map(|i| {
            let store = store.clone();
            async move {
                let key = format!("obj/{i:05}.bin");
                let r = async {
                    let size = store.head(&key).await?.size;
                    let range = size / 3..size / 3 + 1000;
                    Ok((size, store.get_range(&key, range).await?))
                }
                .await;
                (i, r)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut ok = 0;
    for (i, r) in results {
        let key = format!("obj/{i:05}.bin");
        let data = &objects[&key];
        if let Ok((size, part)) = r {
            assert_eq!(size, data.len() as u64);
            let start = data.len() / 3;
            assert_eq!(&part[..], &data[start..(start + 1000).min(data.len())], "{key}");
            ok += 1;
        }
    }
    assert!(ok >= 190, "{ok} of 200");

    let opts = ParallelRead { chunk_size: 128 * 1024, concurrency: 8 };
    assert_eq!(store.get_parallel("big.bin", opts).await.unwrap(), big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_and_forbidden_are_not_retried_and_slow_servers_time_out() {
    let config = ServerConfig { fault_rate: 0.0, slow_delay: Duration::ZERO, honour_range: true, kinds: &FAULTS };
    let server = TestServer::start(objects(3), config).await;
    let store = HttpStore::with_options(&server.base(), &faulty_options()).unwrap();

    let err = store.get("obj/missing.bin").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains(&format!("{}/obj/missing.bin", server.base())), "{err}");
    assert_eq!(server.requests_for("obj/missing.bin"), 1);
    let err = store.get("forbidden/x").await.unwrap_err();
    assert!(matches!(err, SourceError::PermissionDenied { .. }), "{err}");
    assert_eq!(server.requests_for("forbidden/x"), 1);
    let err = store.get_range("obj/00000.bin", 1_000_000..1_000_010).await.unwrap_err();
    assert!(matches!(err, SourceError::InvalidRange { .. }), "{err}");
    assert!(store.list("").next().await.unwrap().is_err());

    // Every response slow: the read timeout fires on each attempt, and the error says so.
    let config = ServerConfig {
        fault_rate: 1.0,
        slow_delay: Duration::from_secs(3),
        honour_range: true,
        kinds: &[Fault::SlowFirstByte],
    };
    let slow = TestServer::start(objects(1), config).await;
    let opts = StoreOptions::default().read_timeout(Duration::from_millis(300)).retry(RetryPolicy {
        max_attempts: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
    });
    let store = HttpStore::with_options(&slow.base(), &opts).unwrap();
    let err = store.get("obj/00000.bin").await.unwrap_err();
    match &err {
        SourceError::Request { attempts, location, .. } => {
            assert_eq!(*attempts, 2, "{err}");
            assert!(location.ends_with("/data/obj/00000.bin"), "{err}");
        }
        other => panic!("expected a request failure, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_ignore_range_still_give_the_right_bytes() {
    let objects = objects(5);
    let config = ServerConfig { fault_rate: 0.0, slow_delay: Duration::ZERO, honour_range: false, kinds: &FAULTS };
    let server = TestServer::start(objects.clone(), config).await;
    let store = HttpStore::new(&server.base()).unwrap();
    let data = &objects["obj/00001.bin"];
    let part = store.get_range("obj/00001.bin", 10..20).await.unwrap();
    assert_eq!(&part[..], &data[10..20.min(data.len())]);
    let err = store.get_range("obj/00001.bin", data.len() as u64..data.len() as u64 + 5).await.unwrap_err();
    assert!(matches!(err, SourceError::InvalidRange { .. }), "{err}");
    let store = spdl_source::open_store(&server.base()).await.unwrap();
    assert_eq!(store.get("obj/00002.bin").await.unwrap(), objects["obj/00002.bin"]);
}
