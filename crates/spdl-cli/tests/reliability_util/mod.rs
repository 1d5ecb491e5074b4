//! Helpers of the reliability tests: the corpus (made by the `spdl gen-data --corrupt` binary), its
//! manifest, a per-call watchdog and process resource counters.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Seed of every corpus the tests make.
pub const SEED: u64 = 8;

/// One file of the broken-media corpus, as `manifest.jsonl` lists it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the corpus directory (`png/trunc-0000100.png`).
    pub file: String,
    /// Absolute path.
    pub path: PathBuf,
    pub format: String,
    /// `image`, `audio` or `video`.
    pub family: String,
    pub kind: String,
    pub name: String,
    pub detail: String,
    /// `error`, `ok` or `any`.
    pub expect: String,
}

/// Runs `spdl gen-data DIR --images N --classes C --corrupt` and returns the corpus entries
/// (the good images are under DIR/class_*/, the broken files under DIR/corrupt/).
pub fn gen_data(dir: &Path, images: usize, classes: usize) -> Vec<Entry> {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("gen-data")
        .arg(dir)
        .args(["--images", &images.to_string(), "--classes", &classes.to_string()])
        .args(["--seed", &SEED.to_string(), "--corrupt"])
        .output()
        .expect("run spdl gen-data");
    assert!(out.status.success(), "spdl gen-data failed: {}", String::from_utf8_lossy(&out.stderr));
    read_manifest(&dir.join("corrupt"))
}

/// Parses `DIR/manifest.jsonl`.
pub fn read_manifest(dir: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(dir.join("manifest.jsonl")).expect("read manifest.jsonl");
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("manifest line is JSON");
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_else(|| panic!("{k} in {line}")).to_owned();
            Entry {
                path: dir.join(s("file")),
                file: s("file"),
                format: s("format"),
                family: s("family"),
                kind: s("kind"),
                name: s("name"),
                detail: s("detail"),
                expect: s("expect"),
            }
        })
        .collect()
}

/// Runs `body` on its own thread; fails the test if it has not finished after `secs`.
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
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: still running after {secs} s"),
    }
}

fn status_field(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// Threads of this process.
pub fn thread_count() -> u64 {
    status_field("Threads:")
}

/// Resident set size, KiB.
pub fn rss_kib() -> u64 {
    status_field("VmRSS:")
}

/// Peak resident set size, KiB.
pub fn peak_rss_kib() -> u64 {
    status_field("VmHWM:")
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("read /proc/self/fd").count()
}
