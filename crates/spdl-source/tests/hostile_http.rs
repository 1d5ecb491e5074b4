//! The HTTP store against a misbehaving server on 127.0.0.1: 500s, connections reset before the response, wrong
//! `Content-Length`, stalls, one-byte drips, endless bodies (chunked and with a huge stated size), redirect
//! loops, huge headers, and a server that ignores `Range` while sending an endless body. Every call must end with
//! the right bytes or a typed error naming the URL, in bounded time and bounded memory. Each test body runs under
//! a watchdog, so a hang fails instead of stalling CI.
#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spdl_source::{HttpStore, ObjectStore, ParallelRead, RetryPolicy, SourceError, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Runs `body` on a runtime of its own on another thread; fails the test if it does not finish within `limit`.
fn watchdog<F, Fut>(limit: Duration, body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(body());
        // Servers spawned by the body are still running: do not wait for them.
        rt.shutdown_background();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("test body hung for more than {limit:?}"),
    }
}

/// Bytes the server wrote, over every connection.
#[derive(Default)]
struct Sent(AtomicU64);

/// Starts the hostile server; the path after `/data/` picks the behaviour.
async fn start() -> (SocketAddr, Arc<Sent>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(Sent::default());
    let s = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(serve(stream, s.clone()));
        }
    });
    (addr, sent)
}

/// Reads the request head; returns the path and whether it had a `Range` header.
async fn read_head(stream: &mut TcpStream) -> Option<(String, bool)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.ok()?;
        if n == 0 || buf.len() > 64 << 10 {
            return None;
        }
        buf.extend_from_slice(&byte[..n]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let path = text.split_whitespace().nth(1)?.to_owned();
    let range = text.lines().any(|l| l.to_ascii_lowercase().starts_with("range:"));
    Some((path, range))
}

async fn write(stream: &mut TcpStream, sent: &Sent, data: &[u8]) -> bool {
    let ok = stream.write_all(data).await.is_ok();
    if ok {
        sent.0.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
    ok
}

/// An endless chunked body of 64 KiB chunks, until the client goes.
async fn endless_chunks(stream: &mut TcpStream, sent: &Sent) {
    let chunk = vec![b'x'; 64 << 10];
    let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
    frame.extend_from_slice(&chunk);
    frame.extend_from_slice(b"\r\n");
    while write(stream, sent, &frame).await {}
}

/// Answers one request and closes the connection: a complete response says `Connection: close`, so that the
/// client does not send its next request (a redirect's) on a connection the server is closing.
async fn serve(mut stream: TcpStream, sent: Arc<Sent>) {
    let Some((path, _range)) = read_head(&mut stream).await else { return };
    let name = path.trim_start_matches("/data/").split('?').next().unwrap_or("").to_owned();
    let sent = &*sent;
    match name.as_str() {
        "ok" => {
            write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").await;
        }
        "500" => {
            write(
                &mut stream,
                sent,
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
        }
        "reset" => {
            // Close at once with RST: linger 0 (a zero linger does not block the drop).
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
            drop(stream);
        }
        "short" => {
            write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n0123456789")
                .await;
        }
        "long" => {
            write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n0123456789")
                .await;
        }
        "stall" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "stall-body" => {
            write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n01234").await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "drip" => {
            // One byte every 100 ms: each read is well inside the read timeout, the whole never ends in time.
            if !write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n").await {
                return;
            }
            while write(&mut stream, sent, b"x").await {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        "endless" => {
            if write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await {
                endless_chunks(&mut stream, sent).await;
            }
        }
        "huge-length" => {
            if write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n").await {
                let chunk = vec![b'x'; 64 << 10];
                while write(&mut stream, sent, &chunk).await {}
            }
        }
        "redirect" => {
            write(
                &mut stream,
                sent,
                b"HTTP/1.1 302 Found\r\nLocation: /data/redirect\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
        }
        "huge-header" => {
            let mut head = b"HTTP/1.1 200 OK\r\nX-Junk: ".to_vec();
            head.extend(std::iter::repeat_n(b'a', 4 << 20));
            head.extend_from_slice(b"\r\nContent-Length: 2\r\n\r\nok");
            write(&mut stream, sent, &head).await;
        }
        "many-headers" => {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..100_000 {
                head.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
            }
            head.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
            write(&mut stream, sent, &head).await;
        }
        // Ignores Range: 200 and an endless body.
        "norange" => {
            if write(&mut stream, sent, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await {
                endless_chunks(&mut stream, sent).await;
            }
        }
        // Answers a range with more bytes than asked.
        "overlong-range" => {
            let head =
                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec();
            if write(&mut stream, sent, &head).await {
                endless_chunks(&mut stream, sent).await;
            }
        }
        _ => {
            write(&mut stream, sent, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        }
    }
}

fn options() -> StoreOptions {
    StoreOptions::default()
        .connect_timeout(Duration::from_secs(2))
        .read_timeout(Duration::from_millis(400))
        .attempt_timeout(Duration::from_millis(1500))
        .max_object_size(1 << 20)
        .retry(RetryPolicy {
            max_attempts: 2,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(20),
        })
}

/// Runs `get` on `name` and checks it fails with an error that names the URL, within `within`.
async fn fails(store: &HttpStore, name: &str, within: Duration) -> SourceError {
    let start = Instant::now();
    let err = store.get(name).await.expect_err(name);
    let elapsed = start.elapsed();
    assert!(elapsed < within, "{name}: took {elapsed:?}: {err}");
    assert!(err.to_string().contains(&format!("/data/{name}")), "{name}: {err}");
    err
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn server_errors_resets_and_bad_lengths_end_with_typed_errors() {
    watchdog(LIMIT, || async {
        let (addr, _) = start().await;
        let store = HttpStore::with_options(&format!("http://{addr}/data"), &options()).unwrap();
        assert_eq!(&store.get("ok").await.unwrap()[..], b"hello");
        for name in ["500", "reset", "short"] {
            let err = fails(&store, name, Duration::from_secs(3)).await;
            assert!(matches!(err, SourceError::Request { attempts: 2, .. }), "{name}: {err}");
        }
        // A body longer than its Content-Length: only the stated bytes are taken.
        assert_eq!(&store.get("long").await.unwrap()[..], b"01234");
        assert!(fails(&store, "missing", Duration::from_secs(2)).await.is_not_found());
    });
}

#[test]
fn stalls_and_drips_end_within_the_attempt_deadline() {
    watchdog(LIMIT, || async {
        let (addr, _) = start().await;
        let store = HttpStore::with_options(&format!("http://{addr}/data"), &options()).unwrap();
        // 2 attempts, each cut by the read timeout (0.4 s) or the attempt deadline (1.5 s).
        for name in ["stall", "stall-body"] {
            let err = fails(&store, name, Duration::from_secs(3)).await;
            assert!(matches!(err, SourceError::Request { attempts: 2, .. }), "{name}: {err}");
        }
        let start = Instant::now();
        let err = fails(&store, "drip", Duration::from_secs(5)).await;
        assert!(start.elapsed() >= Duration::from_millis(2900), "{:?}", start.elapsed());
        assert!(err.to_string().contains("attempt timed out"), "{err}");
        // Without the deadline the drip would go on for 100000 x 100 ms; the default deadline is finite too.
        assert!(StoreOptions::default().attempt_timeout.is_some());
    });
}

#[test]
fn endless_and_oversized_bodies_are_cut_at_the_cap() {
    watchdog(LIMIT, || async {
        let (addr, sent) = start().await;
        let store = HttpStore::with_options(&format!("http://{addr}/data"), &options()).unwrap();
        // Chunked without end: cut once it passes the 1 MiB cap, not retried.
        let err = fails(&store, "endless", Duration::from_secs(3)).await;
        assert!(matches!(err, SourceError::ObjectTooLarge { size: None, limit: 1048576, .. }), "{err}");
        assert!(err.to_string().contains("max_object_size"), "{err}");
        // A stated size over the cap is refused from the header.
        let err = fails(&store, "huge-length", Duration::from_secs(3)).await;
        assert!(matches!(err, SourceError::ObjectTooLarge { size: Some(1_000_000_000_000), .. }), "{err}");
        let err = store.get_parallel("huge-length", ParallelRead::default()).await.unwrap_err();
        assert!(matches!(err, SourceError::ObjectTooLarge { .. }) || matches!(err, SourceError::Request { .. }));
        // What the server managed to push is bounded by the cap plus socket buffers, not by the body.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pushed = sent.0.load(Ordering::Relaxed);
        assert!(pushed < 64 << 20, "the server sent {pushed} bytes");
    });
}

#[test]
fn ranges_against_servers_that_ignore_them_read_only_the_range() {
    watchdog(LIMIT, || async {
        let (addr, sent) = start().await;
        let store = HttpStore::with_options(&format!("http://{addr}/data"), &options()).unwrap();
        let before = sent.0.load(Ordering::Relaxed);
        let start = Instant::now();
        let part = store.get_range("norange", 10..20).await.unwrap();
        assert_eq!(&part[..], b"xxxxxxxxxx");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        let part = store.get_range("norange", 100_000..100_005).await.unwrap();
        assert_eq!(part.len(), 5);
        // A range past the cap would have to be read from byte 0: refused.
        let err = store.get_range("norange", (1 << 20) + 5..(1 << 20) + 10).await.unwrap_err();
        assert!(err.to_string().contains("ignored Range"), "{err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pushed = sent.0.load(Ordering::Relaxed) - before;
        assert!(pushed < 64 << 20, "the server sent {pushed} bytes");
        // A 206 that goes on past the range asked for is a failed attempt, not a buffer that grows.
        let err = store.get_range("overlong-range", 0..10).await.unwrap_err();
        assert!(matches!(err, SourceError::Request { attempts: 2, .. }), "{err}");
        // Small objects from a server that ignores Range still give the right bytes.
        assert_eq!(&store.get_range("ok", 1..3).await.unwrap()[..], b"el");
        assert!(matches!(store.get_range("ok", 5..9).await, Err(SourceError::InvalidRange { .. })));
    });
}

#[test]
fn redirect_loops_and_huge_headers_end() {
    watchdog(LIMIT, || async {
        let (addr, _) = start().await;
        let store = HttpStore::with_options(&format!("http://{addr}/data"), &options()).unwrap();
        let err = fails(&store, "redirect", Duration::from_secs(3)).await;
        // Not retried: a loop does not end by trying again.
        assert!(matches!(err, SourceError::Request { attempts: 1, .. }), "{err}");
        for name in ["huge-header", "many-headers"] {
            let err = fails(&store, name, Duration::from_secs(5)).await;
            assert!(matches!(err, SourceError::Request { .. }), "{name}: {err}");
        }
    });
}
