//! `spdl bench` against hostile inputs and arguments, each in a child process with a memory cap (`ulimit -v`)
//! and a deadline: huge counts are refused with a message and a non-zero exit (no abort), special files in
//! a listing are failed items (no endless read, no hang), and an aspect-ratio bomb is one failed image.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Virtual memory cap of the child, in KiB (4 GiB: far below what any of these inputs would take
/// unchecked).
const MEMORY_CAP_KIB: u64 = 4 << 20;

/// Runs `spdl ARGS` under the memory cap; fails the test if it runs past `deadline`.
fn spdl(args: &[&str], deadline: Duration) -> Output {
    let line = format!("ulimit -v {MEMORY_CAP_KIB}; exec \"$0\" \"$@\"");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(line)
        .arg(env!("CARGO_BIN_EXE_spdl"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spdl");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("spdl {args:?} ran past {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn bench_args<'a>(path: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["bench", path, "--json", "--no-progress", "--no-gpu", "--threads", "1", "--batch-size", "2"];
    v.extend_from_slice(extra);
    v
}

fn write_png(path: &Path, w: u32, h: u32) {
    let rgb = spdl_io::synth::photo(3, w, h);
    let png = spdl_io::synth::encode(&rgb, w, h, spdl_io::image::ImageFormat::Png).expect("encode png");
    std::fs::write(path, png).expect("write png");
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success());
}

#[test]
fn huge_counts_are_refused_without_an_abort() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_png(&dir.path().join("a.png"), 40, 30);
    let p = dir.path().to_str().expect("utf-8 path");
    for (flag, value, says) in [
        ("--batch-size", "1000000000", "--batch-size: must be within 1..="),
        ("--threads", "100000", "--threads: must be within 1..="),
        ("--io-concurrency", "100000000", "--io-concurrency: must be within 1..="),
        ("--size", "60000", "decode memory budget"),
    ] {
        let mut args = vec!["bench", p, "--json", "--no-progress", "--no-gpu"];
        args.extend_from_slice(&[flag, value]);
        let out = spdl(&args, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {:?} {stderr}", out.status);
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
}

#[test]
fn special_files_are_failed_items_and_a_fifo_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_png(&dir.path().join("good.png"), 40, 30);
    mkfifo(&dir.path().join("pipe.png"));
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.png")).expect("symlink");
    let listing = dir.path().join("list.txt");
    std::fs::write(&listing, "good.png\npipe.png\nzero.png\n").expect("write listing");
    let out = spdl(&bench_args(listing.to_str().expect("utf-8"), &["--size", "32"]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!((report["images"].as_u64(), report["failed"].as_u64()), (Some(1), Some(2)), "{report}");
    assert!(stderr.contains("pipe.png") && stderr.contains("FIFO"), "{stderr}");
    assert!(stderr.contains("zero.png") && stderr.contains("character device"), "{stderr}");

    // A FIFO as the listing itself: refused at once, never opened.
    let fifo = dir.path().join("list.fifo");
    mkfifo(&fifo);
    let out = spdl(&bench_args(fifo.to_str().expect("utf-8"), &[]), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a directory nor a regular file"), "{stderr}");
}

#[test]
fn an_aspect_ratio_bomb_is_one_failed_image() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_png(&dir.path().join("good.png"), 64, 48);
    // 20,000,000 x 1 zeros: about 20 KB of PNG; resized to 224 x 224 unchecked it would take 13 GB.
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, 20_000_000, 1);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().expect("png header");
        w.write_image_data(&vec![0u8; 20_000_000]).expect("png data");
    }
    std::fs::write(dir.path().join("wide.png"), png).expect("write");
    let p = dir.path().to_str().expect("utf-8 path");
    let out = spdl(&bench_args(p, &["--transform", "resize"]), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?} {stderr}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!((report["images"].as_u64(), report["failed"].as_u64()), (Some(1), Some(1)), "{report}");
    assert!(stderr.contains("wide.png") && stderr.contains("resize intermediate pixels"), "{stderr}");
}
