//! Test media made on the spot with the `ffmpeg` CLI (lavfi `sine`/`testsrc`/`color` sources), shared by
//! the audio and video integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Left channel frequency of the stereo test tone (Hz).
pub const LEFT_HZ: f64 = 440.0;
/// Right channel frequency of the stereo test tone (Hz).
pub const RIGHT_HZ: f64 = 1000.0;
/// Amplitude of lavfi's `sine` source.
pub const AMP: f64 = 0.125;
/// Sample rate of the test tones.
pub const RATE: u32 = 44_100;
/// Duration of the test tones (s).
pub const SECONDS: f64 = 3.0;

/// The analytic test tone: channel `ch` (0 = 440 Hz, 1 = 1000 Hz) at time `t`.
pub fn tone(ch: usize, t: f64) -> f64 {
    let f = if ch == 0 { LEFT_HZ } else { RIGHT_HZ };
    AMP * (2.0 * std::f64::consts::PI * f * t).sin()
}

/// Fails the test (never skips it) when the CLI is missing.
pub fn ffmpeg_cli() -> &'static str {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| Command::new("ffmpeg").arg("-version").output().is_ok_and(|o| o.status.success()));
    assert!(
        ok,
        "the `ffmpeg` CLI is needed to make the test media: run `cargo xtask test` (it installs it), \
         or `apt-get install ffmpeg`"
    );
    "ffmpeg"
}

/// A directory for this test binary's media, under cargo's per-target tmp dir.
pub fn media_dir(binary: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("spdl-io-media-{binary}"));
    std::fs::create_dir_all(&dir).expect("create media dir");
    dir
}

/// Runs `ffmpeg -y <args> <out>` once per process per output file; returns the path.
pub fn generate(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    static DONE: OnceLock<Mutex<std::collections::HashMap<PathBuf, ()>>> = OnceLock::new();
    let out = dir.join(name);
    let done = DONE.get_or_init(Default::default);
    let mut guard = done.lock().unwrap_or_else(|e| e.into_inner());
    if guard.contains_key(&out) {
        return out;
    }
    let status = Command::new(ffmpeg_cli())
        .args(["-y", "-hide_banner", "-loglevel", "error", "-nostdin"])
        .args(args)
        .arg(&out)
        .status()
        .expect("run ffmpeg");
    assert!(status.success(), "ffmpeg {args:?} {} failed", out.display());
    guard.insert(out.clone(), ());
    out
}

/// The stereo test tone (L 440 Hz, R 1000 Hz, 3 s at 44.1 kHz) encoded with `codec_args` into `name`.
pub fn tone_file(dir: &Path, name: &str, codec_args: &[&str]) -> PathBuf {
    let filter = format!(
        "sine=f={LEFT_HZ}:r={RATE}:d={SECONDS}[l];sine=f={RIGHT_HZ}:r={RATE}:d={SECONDS}[r];[l][r]amerge=inputs=2"
    );
    let mut args = vec!["-filter_complex", &filter];
    args.extend_from_slice(codec_args);
    generate(dir, name, &args)
}

/// Runs `f` on another thread and fails the test if it takes longer than `secs` (a hang).
pub fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(e) => panic!("{what}: no result within {secs} s ({e}): hung or panicked"),
    }
}

/// Deterministic byte damage: xors `count` bytes spread over `[from, len)` with a fixed pattern.
pub fn flip_bytes(data: &mut [u8], from: usize, count: usize) {
    let len = data.len();
    if len <= from {
        return;
    }
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = from + (x as usize) % (len - from);
        data[at] ^= (x >> 32) as u8 | 1;
    }
}

/// Number of sign changes of `x` (a sine of frequency f over T seconds has about 2 f T).
pub fn zero_crossings(x: &[f32]) -> usize {
    x.windows(2).filter(|w| (w[0] < 0.0) != (w[1] < 0.0)).count()
}

/// Root mean square.
pub fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}
