//! `spdl bench` over listings: relative paths resolve against the listing's directory, and a run that loads
//! nothing exits non-zero, still printing its report and naming every failed file.

use std::path::Path;
use std::process::Command;

fn bench(listing: &Path) -> (bool, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("bench")
        .arg(listing)
        .args(["--json", "--no-progress", "--no-gpu", "--threads", "1", "--batch-size", "2", "--size", "32"])
        .output()
        .expect("run spdl bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout}"));
    (out.status.success(), report, stderr)
}

fn write_png(path: &Path, w: u32, h: u32) {
    let rgb = spdl_io::synth::photo(3, w, h);
    let png = spdl_io::synth::encode(&rgb, w, h, spdl_io::image::ImageFormat::Png).expect("encode png");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, png).expect("write png");
}

#[test]
fn a_run_that_loads_nothing_fails_and_names_each_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing: Vec<_> = (0..3).map(|i| dir.path().join(format!("gone/img{i}.jpg"))).collect();
    let listing = dir.path().join("list.txt");
    std::fs::write(&listing, missing.iter().map(|p| format!("{}\n", p.display())).collect::<String>())
        .expect("write listing");
    let (ok, report, stderr) = bench(&listing);
    assert!(!ok, "a run with every image failed must exit non-zero: {stderr}");
    assert_eq!(report["images"], 0, "{report}");
    assert_eq!(report["failed"], 3, "{report}");
    assert!(stderr.contains("no image was loaded"), "{stderr}");
    for p in &missing {
        assert!(stderr.contains(&p.display().to_string()), "{} not named: {stderr}", p.display());
    }
}

#[test]
fn relative_listing_paths_resolve_against_the_listing() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_png(&dir.path().join("data/a.png"), 40, 30);
    write_png(&dir.path().join("data/b.png"), 50, 20);
    let listing = dir.path().join("list.txt");
    std::fs::write(&listing, "data/a.png\ndata/b.png\ndata/missing.png\n").expect("write listing");
    let (ok, report, stderr) = bench(&listing);
    assert!(ok, "{stderr}");
    assert_eq!(report["images"], 2, "{report}");
    assert_eq!(report["failed"], 1, "{report}");
    assert!(stderr.contains("missing.png"), "{stderr}");
}

#[test]
fn a_flat_directory_is_listed_without_labels() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_png(&dir.path().join("a.png"), 40, 30);
    write_png(&dir.path().join("b.png"), 30, 40);
    std::fs::write(dir.path().join("notes.txt"), "not an image").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("bench")
        .arg(dir.path())
        .args(["--json", "--no-progress", "--no-gpu", "--threads", "1", "--batch-size", "2", "--size", "32"])
        .output()
        .expect("run spdl bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["images"], 2, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
}
