//! How `spdl` reports an error that ends it: one `Error:` line that names what failed and each cause once,
//! and exit status 1.

use std::process::Command;

#[test]
fn a_missing_path_names_the_path_and_the_os_cause_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nonexistent");
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("bench")
        .arg(&missing)
        .args(["--no-progress", "--no-gpu"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run spdl bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("Error: ")).unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(line.contains(&missing.display().to_string()), "the path is not named: {stderr}");
    // ENOENT: "No such file or directory (os error 2)".
    let cause = std::io::Error::from_raw_os_error(2).to_string();
    assert_eq!(stderr.matches(&cause).count(), 1, "the OS cause is not named exactly once: {stderr}");
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
}
