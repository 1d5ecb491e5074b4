//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod graph;

use std::sync::mpsc;
use std::time::Duration;

/// Runs `body` on its own thread and fails the test if it does not finish within `secs`
/// (a hang becomes a failure instead of a stuck CI job). Panics in `body` propagate.
pub fn watchdog<R: Send + 'static>(secs: u64, body: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let r = body();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => handle.join().expect("test body"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(_) => unreachable!("body ended without reporting"),
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: test still running after {secs} s"),
    }
}

/// The process's thread count, from /proc/self/status.
pub fn thread_count() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()).expect("Threads: line")
}

/// Waits (at most `max`) for the thread count to come back to `baseline` and returns it.
/// `join` returns once the kernel has cleared a thread's id, which can be a moment before
/// the task leaves the process's count; a thread still counted after `max` is a leak.
pub fn threads_back_to(baseline: usize, max: Duration) -> usize {
    let deadline = std::time::Instant::now() + max;
    loop {
        let n = thread_count();
        if n == baseline || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A cheap deterministic hash, for pseudo-random per-item decisions.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Polls `f` until it returns the same value `stable_polls` times in a row (10 ms apart),
/// or `max` elapses; returns the last value.
pub fn settle(max: Duration, stable_polls: usize, f: impl Fn() -> u64) -> u64 {
    let start = std::time::Instant::now();
    let mut last = f();
    let mut same = 0;
    while start.elapsed() < max && same < stable_polls {
        std::thread::sleep(Duration::from_millis(10));
        let now = f();
        if now == last {
            same += 1;
        } else {
            same = 0;
            last = now;
        }
    }
    last
}

/// Up to `n` items and epoch markers from `get_item`, stopping early at the end.
pub fn take_items<T: Send + 'static>(p: &spdl_exec::Pipeline<T>, n: usize) -> Vec<spdl_exec::Item<T>> {
    let mut seen = Vec::new();
    while seen.len() < n {
        match p.get_item(None).expect("item") {
            Some(item) => seen.push(item),
            None => break,
        }
    }
    seen
}
