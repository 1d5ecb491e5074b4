//! `spdl bench` runs each transform, and reports the time to the first batch.

use std::process::Command;

#[test]
fn every_transform_runs_and_the_first_batch_is_timed() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..6u32 {
        let (w, h) = (120 + 20 * i, 160 - 10 * i);
        let rgb = spdl_io::synth::photo(u64::from(i), w, h);
        let jpg = spdl_io::synth::encode(&rgb, w, h, spdl_io::image::ImageFormat::Jpeg).expect("encode");
        std::fs::write(dir.path().join(format!("{i}.jpg")), jpg).expect("write");
    }
    for transform in ["resize", "center-crop", "random-resized-crop"] {
        let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
            .arg("bench")
            .arg(dir.path())
            .args(["--json", "--no-progress", "--no-gpu", "--threads", "2", "--batch-size", "4", "--size", "64"])
            .args(["--transform", transform, "--seed", "5", "--epochs", "2"])
            .output()
            .expect("run spdl bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{transform}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
        assert_eq!((report["images"].as_u64(), report["failed"].as_u64()), (Some(12), Some(0)), "{report}");
        let first = report["first_batch_seconds"].as_f64().expect("first_batch_seconds");
        assert!(first > 0.0 && first <= report["seconds"].as_f64().unwrap_or(0.0) + 1e-3, "{report}");
    }
}
