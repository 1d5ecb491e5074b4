//! `spdl bench --video DIR`: the clip pipeline over videos made here with the `ffmpeg` CLI prints the stats
//! table (with its `decode` stage) and the clip summary; a corrupt video is counted, named, and the run goes on.
#![cfg(feature = "ffmpeg")]

use std::path::Path;
use std::process::Command;

fn make_video(path: &Path) {
    let status = Command::new("ffmpeg")
        .args(["-y", "-hide_banner", "-loglevel", "error", "-nostdin", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=96x64:rate=30")
        .args(["-frames:v", "60", "-c:v", "libx264", "-g", "30", "-pix_fmt", "yuv420p"])
        .arg(path)
        .status()
        .expect("the `ffmpeg` CLI is needed to make the test videos (apt-get install ffmpeg)");
    assert!(status.success(), "ffmpeg failed to make {}", path.display());
}

fn videos(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..n {
        make_video(&dir.path().join(format!("v{i}.mp4")));
    }
    dir
}

fn bench(dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("bench")
        .arg("--video")
        .arg(dir)
        .args(["--no-gpu", "--no-progress", "--clips", "2", "--frames", "4", "--size", "32"])
        .args(extra)
        .output()
        .expect("run spdl bench --video");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bench_video_prints_the_stats_table_and_the_clip_summary() {
    let dir = videos(4);
    let (ok, stdout, stderr) = bench(dir.path(), &[]);
    assert!(ok, "spdl bench --video failed:\n{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l.starts_with("decode ")), "no decode stage in the table:\n{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("read ")), "no read stage in the table:\n{stdout}");
    assert!(stdout.contains("4 videos, 8 clips (0 failed videos)"), "no clip summary:\n{stdout}");
    assert!(stdout.contains("clips/s") && stdout.contains("clips per CPU-second"), "{stdout}");
    assert!(stdout.contains("peak RSS"), "{stdout}");
    assert!(stdout.contains("2 clips x 4 frames of 32x32"), "{stdout}");
}

#[test]
fn a_corrupt_video_is_counted_and_named_and_the_json_report_has_the_rest() {
    let dir = videos(2);
    std::fs::write(dir.path().join("bad.mp4"), vec![0x5a; 2048]).expect("write bad.mp4");
    let (ok, stdout, stderr) = bench(dir.path(), &["--json", "--epochs", "2", "--threads", "1"]);
    assert!(ok, "spdl bench --video failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout}"));
    assert_eq!(report["videos"], 4, "{report}");
    assert_eq!(report["clips"], 8, "{report}");
    assert_eq!(report["failed"], 2, "{report}");
    let decode = report["stages"].as_array().expect("stages").iter().find(|s| s["name"] == "decode").expect("decode");
    assert_eq!(decode["items_failed"], 2, "{report}");
    assert!(stderr.contains("bad.mp4"), "the failed video is not named:\n{stderr}");
}

#[test]
fn a_directory_without_videos_fails_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.jpg"), b"x").expect("write");
    let (ok, stdout, stderr) = bench(dir.path(), &[]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("mp4"), "{stderr}");
}
