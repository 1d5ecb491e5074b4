//! Storage faults through a real pipeline (spdl-exec, a dev-dependency): the HTTP store reads objects in an
//! async stage from an in-process HTTP/1.1 server on 127.0.0.1 that is killed and restarted mid-run, stalls
//! past the read timeout (before the headers and in the middle of a body) and answers 30% of requests with
//! a 5xx. With retries on, every object is delivered intact or reported with its key, none lost or
//! duplicated; with the server down for good (refusing, or accepting and never answering), the pipeline ends
//! with a `PipelineError` naming the stage within the configured deadline instead of hanging.
//!
//! The store is awaited straight from the stage, as a user writes it: this needs spdl-exec's scheduler
//! runtime to have tokio's IO driver enabled (a runtime with only the timer makes every request panic with
//! "IO is disabled", and each object fails).
//!
//! What `tests/http_faults.rs` already covers (resets, truncated bodies, slow first bytes, 404/403 not
//! retried) is not repeated here.
#![cfg(feature = "http")]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use spdl_exec::{FailureBudget, PipelineError};
use spdl_source::{HttpStore, RetryPolicy, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use support::data::mix;

/// Faults the server injects, per request.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// Fraction answered 503 (and 500) instead of the object.
    server_error: f64,
    /// Fraction that wait `stall` before the headers.
    stall_head: f64,
    /// Fraction that send the headers and half the body, then wait `stall`.
    stall_body: f64,
    stall: Duration,
    /// Accept connections and never answer (a black hole).
    never_answer: bool,
}

/// An HTTP server that can be killed (listener closed, open connections dropped) and restarted on the
/// same port.
struct FaultServer {
    port: u16,
    objects: Arc<HashMap<String, Bytes>>,
    faults: Faults,
    requests: Arc<AtomicU64>,
    injected: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    /// Sending `true` kills the running instance.
    kill: Option<watch::Sender<bool>>,
    rt: tokio::runtime::Handle,
}

impl FaultServer {
    fn start(rt: &tokio::runtime::Runtime, objects: HashMap<String, Bytes>, faults: Faults) -> FaultServer {
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut s = FaultServer {
            port,
            objects: Arc::new(objects),
            faults,
            requests: Arc::default(),
            injected: Arc::default(),
            kill: None,
            rt: rt.handle().clone(),
        };
        s.run(listener);
        s
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}/data", self.port)
    }

    fn run(&mut self, listener: TcpListener) {
        let (tx, rx) = watch::channel(false);
        self.kill = Some(tx);
        let (objects, faults, requests, injected) =
            (self.objects.clone(), self.faults, self.requests.clone(), self.injected.clone());
        self.rt.spawn(async move {
            let mut stop = rx.clone();
            loop {
                tokio::select! {
                    _ = stop.changed() => return, // drops the listener: the port refuses connections
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (objects, requests, injected) = (objects.clone(), requests.clone(), injected.clone());
                        let mut stop = rx.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                _ = stop.changed() => {} // drops the connection mid-request
                                () = serve(stream, objects, faults, requests, injected) => {}
                            }
                        });
                    }
                }
            }
        });
    }

    /// Closes the listener and every open connection.
    fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(true);
        }
        // Until the port refuses: the accept loop ends on its next poll.
        let addr = format!("127.0.0.1:{}", self.port);
        let t = Instant::now();
        while std::net::TcpStream::connect(&addr).is_ok() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Listens again on the same port.
    fn restart(&mut self) {
        let port = self.port;
        let listener = self
            .rt
            .block_on(async move {
                let socket = TcpSocket::new_v4()?;
                socket.set_reuseaddr(true)?;
                socket.bind(([127, 0, 0, 1], port).into())?;
                socket.listen(1024)
            })
            .expect("rebind the same port");
        self.run(listener);
    }

    fn injected(&self) -> BTreeMap<&'static str, u64> {
        self.injected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
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
        buf.extend_from_slice(chunk.get(..n)?);
    }
    String::from_utf8(buf).ok()
}

async fn serve(
    mut stream: TcpStream,
    objects: Arc<HashMap<String, Bytes>>,
    faults: Faults,
    requests: Arc<AtomicU64>,
    injected: Arc<Mutex<BTreeMap<&'static str, u64>>>,
) {
    let Some(head) = read_head(&mut stream).await else { return };
    if faults.never_answer {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return;
    }
    let path = head.split(' ').nth(1).unwrap_or("");
    let key = path.strip_prefix("/data/").unwrap_or("");
    let n = requests.fetch_add(1, Ordering::SeqCst);
    let draw = (mix(n ^ 0x5EED) % 10_000) as f64 / 10_000.0;
    let note = |what: &'static str| {
        *injected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(what).or_default() += 1;
    };
    let Some(body) = objects.get(key) else {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
        return;
    };
    let mut at = faults.server_error;
    if draw < at {
        note("5xx");
        let status = if n.is_multiple_of(2) { "503 Service Unavailable" } else { "500 Internal Server Error" };
        let _ = stream
            .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes())
            .await;
        return;
    }
    at += faults.stall_head;
    if draw < at {
        note("stall before headers");
        tokio::time::sleep(faults.stall).await;
    }
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    at += faults.stall_body;
    if draw < at {
        note("stall mid-body");
        let half = body.len() / 2;
        let _ = stream.write_all(&body[..half]).await;
        let _ = stream.flush().await;
        tokio::time::sleep(faults.stall).await;
        let _ = stream.write_all(&body[half..]).await;
        return;
    }
    let _ = stream.write_all(body).await;
}

fn content(i: usize) -> Bytes {
    support::data::content(i, 100, 8_000, 7)
}

fn key(i: usize) -> String {
    format!("shard-{:02}/{i:05}.bin", i % 7)
}

fn objects(n: usize) -> HashMap<String, Bytes> {
    (0..n).map(|i| (key(i), content(i))).collect()
}

fn server_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime")
}

/// keys → `store.get` (16 in flight, input order) → sink.
fn fetch_pipeline(
    store: Arc<HttpStore>,
    keys: Vec<String>,
    budget: FailureBudget,
) -> spdl_exec::Pipeline<(String, Bytes)> {
    support::data::fetch_pipeline(store, keys, 16, 8, budget)
}

/// A watchdog: runs `body` on its own thread, fails if it takes longer than `secs`.
fn watchdog<R: Send + 'static>(secs: u64, body: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let r = body();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => handle.join().expect("test body"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(_) => unreachable!("body ended without reporting"),
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: still running after {secs} s"),
    }
}

#[test]
fn kill_restart_stalls_and_5xx_mid_run_lose_and_duplicate_nothing() {
    watchdog(600, || {
        const N: usize = 800;
        let rt = server_runtime();
        let objects = objects(N);
        let faults = Faults {
            server_error: 0.30,
            stall_head: 0.02,
            stall_body: 0.02,
            stall: Duration::from_secs(3),
            never_answer: false,
        };
        let mut server = FaultServer::start(&rt, objects.clone(), faults);
        // Enough retries to ride out a 1.5 s outage and then the 34% faults: the outage itself eats about 7
        // attempts of a request in flight (backoff 20 ms doubling to 1 s, refused connections fail at once),
        // so 16 attempts leave 9 for the faults (0.34^9 = 6e-5 per request; with 10 attempts a run failed
        // about once in a few dozen).
        let opts = StoreOptions::default()
            .connect_timeout(Duration::from_secs(2))
            .read_timeout(Duration::from_millis(800))
            .retry(RetryPolicy {
                max_attempts: 16,
                base_delay: Duration::from_millis(20),
                max_delay: Duration::from_secs(1),
            })
            .max_in_flight(16);
        let store = Arc::new(HttpStore::with_options(&server.base(), &opts).expect("store"));
        let keys: Vec<String> = (0..N).map(key).collect();
        let pipeline = fetch_pipeline(store, keys.clone(), FailureBudget::Unlimited);

        let mut delivered: Vec<String> = Vec::new();
        let mut outage = None;
        let t = Instant::now();
        for item in &pipeline {
            let (k, bytes) = item.expect("an unlimited budget never ends the run");
            assert_eq!(Some(&bytes), objects.get(&k), "{k}: wrong bytes");
            delivered.push(k);
            if delivered.len() == N / 3 {
                // Kill the server with requests in flight, keep it down for 1.5 s, restart it.
                let down = Instant::now();
                server.kill();
                std::thread::sleep(Duration::from_millis(1500));
                server.restart();
                outage = Some(down.elapsed());
            }
        }
        let stats = pipeline.stats();
        let failed = stats.stage("fetch").map_or(0, |s| s.items_failed);
        // Nothing lost, nothing duplicated, order kept.
        let expected: Vec<&String> = keys.iter().collect();
        let mut got: Vec<&String> = delivered.iter().collect();
        assert_eq!(got.len() as u64 + failed, N as u64, "{stats}");
        got.dedup();
        assert_eq!(got.len(), delivered.len(), "duplicates");
        let positions: Vec<usize> = got.iter().filter_map(|k| expected.iter().position(|e| e == k)).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "input order");
        assert_eq!(failed, 0, "every object survives 16 attempts: {stats}");
        println!(
            "{N} objects in {:.1} s through a {:.1} s outage (server killed with requests in flight, then restarted), \
             {} requests, faults injected {:?}: {} delivered intact, {failed} failed",
            t.elapsed().as_secs_f64(),
            outage.map_or(0.0, |d| d.as_secs_f64()),
            server.requests.load(Ordering::SeqCst),
            server.injected(),
            delivered.len()
        );
    });
}

#[test]
fn a_server_down_for_good_ends_the_pipeline_with_an_error_within_the_deadline() {
    watchdog(600, || {
        let rt = server_runtime();
        let mut server = FaultServer::start(&rt, objects(200), Faults::default());
        let base = server.base();
        server.kill();
        // Refused connections: 3 attempts each, backoff at most 50 ms.
        let opts = StoreOptions::default()
            .connect_timeout(Duration::from_secs(1))
            .read_timeout(Duration::from_secs(1))
            .retry(RetryPolicy {
                max_attempts: 3,
                base_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(50),
            });
        let store = Arc::new(HttpStore::with_options(&base, &opts).expect("store"));
        let keys: Vec<String> = (0..200).map(key).collect();
        let t = Instant::now();
        let pipeline = fetch_pipeline(store, keys, FailureBudget::Count(10));
        let results: Vec<_> = pipeline.iter().collect();
        let took = t.elapsed();
        let err = results.into_iter().find_map(Result::err).expect("the run ends with an error");
        check_budget_error(&err, "refused");
        assert!(took < Duration::from_secs(30), "took {took:?}");
        println!("server refusing connections: the pipeline ended in {took:?} with: {err}");
    });
}

#[test]
fn a_server_that_never_answers_ends_the_pipeline_with_an_error_within_the_deadline() {
    watchdog(600, || {
        let rt = server_runtime();
        let faults = Faults { never_answer: true, ..Faults::default() };
        let server = FaultServer::start(&rt, objects(50), faults);
        // Each attempt is cut by the 300 ms read timeout: at most ~1 s per object with 3 attempts.
        let opts = StoreOptions::default()
            .connect_timeout(Duration::from_secs(1))
            .read_timeout(Duration::from_millis(300))
            .retry(RetryPolicy {
                max_attempts: 3,
                base_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(50),
            });
        let store = Arc::new(HttpStore::with_options(&server.base(), &opts).expect("store"));
        let keys: Vec<String> = (0..50).map(key).collect();
        let t = Instant::now();
        let pipeline = fetch_pipeline(store, keys, FailureBudget::Count(5));
        let err = pipeline.iter().find_map(Result::err).expect("the run ends with an error");
        let took = t.elapsed();
        check_budget_error(&err, "");
        // 16 in flight, 6 failures needed, each ~1 s: a few seconds; 30 s means a missing timeout.
        assert!(took < Duration::from_secs(30), "took {took:?}");
        println!("server never answering: the pipeline ended in {took:?} with: {err}");
    });
}

fn check_budget_error(err: &PipelineError, cause_hint: &str) {
    match err {
        PipelineError::StageBudgetExceeded { stage, causes, .. } => {
            assert_eq!(stage, "fetch");
            let first = causes.first().expect("causes");
            assert!(first.cause.contains("/data/shard-"), "the cause names the object: {}", first.cause);
            assert!(first.cause.contains("attempt"), "the cause gives the attempts: {}", first.cause);
            if !cause_hint.is_empty() {
                let lower = first.cause.to_lowercase();
                assert!(lower.contains(cause_hint) || lower.contains("connect"), "{}", first.cause);
            }
        }
        other => panic!("expected the stage's budget error, got {other}"),
    }
}
