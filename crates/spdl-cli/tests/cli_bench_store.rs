//! `spdl bench` over an object store: a real S3-compatible server (s3s-fs, installed by `cargo xtask test`) on
//! 127.0.0.1 holding an ImageNet-style tree, listed and read through `s3://`, and the same keys read through a
//! list file and `--store`. Needs the `s3` feature (as `cargo xtask test` builds it).
#![cfg(feature = "s3")]

#[path = "../../spdl-source/tests/support/s3s.rs"]
mod s3s;

use std::path::Path;
use std::process::Command;

fn bench(args: &[&str], endpoint: &str) -> (bool, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("bench")
        .args(args)
        .args(["--endpoint", endpoint, "--json", "--no-progress", "--no-gpu", "--threads", "2"])
        .args(["--batch-size", "4", "--size", "32"])
        .env("AWS_ACCESS_KEY_ID", s3s::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3s::SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("run spdl bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.success(), report, stderr)
}

fn write_image(path: &Path, w: u32, h: u32, format: spdl_io::image::ImageFormat) {
    let rgb = spdl_io::synth::photo(u64::from(w), w, h);
    let bytes = spdl_io::synth::encode(&rgb, w, h, format).expect("encode");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn bench_lists_and_reads_an_s3_bucket() {
    let Some(server) = s3s::start() else { return };
    let bucket = server.dir.path().join("photos");
    let mut n = 0;
    for class in ["cat", "dog"] {
        for i in 0..9 {
            let format = if i % 3 == 0 { spdl_io::image::ImageFormat::Png } else { spdl_io::image::ImageFormat::Jpeg };
            let ext = if i % 3 == 0 { "png" } else { "jpg" };
            write_image(&bucket.join(format!("train/{class}/{i:02}.{ext}")), 40 + i, 30, format);
            n += 1;
        }
    }
    std::fs::write(bucket.join("train/README.txt"), "not an image").expect("write");
    std::fs::write(bucket.join("train/dog/broken.jpg"), b"\xff\xd8\xff\xe0 cut").expect("write");

    let (ok, report, stderr) = bench(&["s3://photos/train"], &server.endpoint);
    assert!(ok, "{stderr}");
    assert_eq!(report["images"], n, "{report}");
    assert_eq!(report["failed"], 1, "the broken JPEG is counted: {report}");
    assert!(stderr.contains("broken.jpg"), "{stderr}");

    // Keys from a list file, bytes from the store; a missing key is named with its address.
    let dir = tempfile::tempdir().expect("tempdir");
    let listing = dir.path().join("keys.txt");
    std::fs::write(&listing, "cat/00.png\ncat/01.jpg\ndog/05.jpg\ndog/absent.jpg\n").expect("write");
    let store = "s3://photos/train";
    let (ok, report, stderr) = bench(&[listing.to_str().expect("utf-8"), "--store", store], &server.endpoint);
    assert!(ok, "{stderr}");
    assert_eq!(report["images"], 3, "{report}");
    assert_eq!(report["failed"], 1, "{report}");
    assert!(stderr.contains("s3://photos/train/dog/absent.jpg"), "{stderr}");

    // A bucket that does not exist: a clear error, not a hang.
    let (ok, _, stderr) = bench(&["s3://no-such-bucket/x"], &server.endpoint);
    assert!(!ok);
    assert!(stderr.contains("no-such-bucket"), "{stderr}");
}
