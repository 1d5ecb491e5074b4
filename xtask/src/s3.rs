//! The S3-compatible server that spdl-source's S3 tests and S3 benchmark run against: `s3s-fs`, a real S3 protocol
//! server over a directory. Not on crates.io as a library dependency of the tests (it is a binary), so `cargo
//! xtask test` installs it once with `cargo install` and hands its path to the tests in `SPDL_S3S_FS`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The s3s-fs release that builds with rustc 1.95 (0.17 needs 1.96).
pub const S3S_FS_VERSION: &str = "0.14.1";

/// The environment variable the S3 tests read the binary's path from.
pub const S3S_FS_ENV: &str = "SPDL_S3S_FS";

fn binary_name() -> &'static str {
    if cfg!(windows) { "s3s-fs.exe" } else { "s3s-fs" }
}

/// Looks for s3s-fs where the tests do: `SPDL_S3S_FS`, `PATH`, `$CARGO_HOME/bin`, `~/.cargo/bin`.
pub fn find_s3s_fs() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(S3S_FS_ENV) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(cargo_home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(cargo_home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo").join("bin"));
    }
    dirs.into_iter().map(|d| d.join(binary_name())).find(|p| p.is_file())
}

/// Returns the path of the s3s-fs binary, installing it with `cargo install s3s-fs@0.14.1 --features binary
/// --locked` when it is missing (about 2 minutes on 2 cores, once). Pass the path to the tests as
/// `SPDL_S3S_FS`.
pub fn ensure_s3s_fs() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(S3S_FS_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{S3S_FS_ENV}={} does not name a file", path.display());
        }
        return Ok(path);
    }
    if let Some(path) = find_s3s_fs() {
        return Ok(path);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let spec = format!("s3s-fs@{S3S_FS_VERSION}");
    eprintln!("xtask: installing {spec} for the S3 tests (once; a few minutes)");
    let status = Command::new(&cargo)
        .args(["install", &spec, "--features", "binary", "--locked"])
        .status()
        .with_context(|| format!("running `{} install {spec}`", cargo.to_string_lossy()))?;
    if !status.success() {
        bail!("`cargo install {spec} --features binary --locked` failed ({status})");
    }
    find_s3s_fs().with_context(|| {
        format!(
            "`cargo install {spec}` succeeded but {} is not in PATH, $CARGO_HOME/bin or ~/.cargo/bin",
            binary_name()
        )
    })
}
