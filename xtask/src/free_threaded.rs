//! The free-threaded CPython of the Python tests and the 3.13t wheel: `$SPDL_FT_PYTHON` when set (a
//! `python3.13t` from anywhere, e.g. `actions/setup-python` with `3.13t`). Otherwise, as this Debian release
//! does not package one, it is built once from Debian's own source package (the `trixie` suite, fetched by
//! [`crate::debian`]) into a cache outside the clone (`~/.cache/spdl-rs/python3.13t`, or
//! `$SPDL_RS_PYTHON_FT` if set) and reused by every later run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;

/// A free-threaded interpreter to use instead of building one (see the module docs).
const FT_PYTHON_ENV: &str = "SPDL_FT_PYTHON";

/// The Debian source package the free-threaded interpreter is built from, and the suite that has it.
const FT_SOURCE_PACKAGE: &str = "python3.13";
const FT_SUITE: &str = "trixie";
/// Written into the interpreter's prefix after `make install` succeeds; a prefix without it is rebuilt.
const FT_COMPLETE_STAMP: &str = ".spdl-rs-complete";

/// The free-threaded interpreter's prefix: `$SPDL_RS_PYTHON_FT`, else `~/.cache/spdl-rs/python3.13t`.
fn free_threaded_prefix() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SPDL_RS_PYTHON_FT") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("HOME is not set (needed for ~/.cache/spdl-rs)")?;
    Ok(PathBuf::from(home).join(".cache/spdl-rs/python3.13t"))
}

/// Returns the free-threaded interpreter: `$SPDL_FT_PYTHON` if set (it must report the GIL disabled), else
/// the cached `python3.13t`, built into the cache first if it is not there.
pub(crate) fn ensure_free_threaded_python() -> Result<PathBuf> {
    if let Some(given) = std::env::var_os(FT_PYTHON_ENV) {
        let python = PathBuf::from(given);
        let answer = gil_enabled(&python).with_context(|| format!("{FT_PYTHON_ENV}={}", python.display()))?;
        if answer != "False" {
            bail!(
                "{FT_PYTHON_ENV}={} is not a free-threaded interpreter (sys._is_gil_enabled(): {answer})",
                python.display()
            );
        }
        return Ok(python);
    }
    let prefix = free_threaded_prefix()?;
    let python = prefix.join("bin/python3.13t");
    if prefix.join(FT_COMPLETE_STAMP).is_file() && python.is_file() {
        return Ok(python);
    }
    eprintln!("xtask: building a free-threaded CPython into {} (a few minutes, once)", prefix.display());
    let work = prefix.with_file_name("python3.13t-build");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let source_dir = fetch_python_source(&work)?;
    if prefix.exists() {
        fs::remove_dir_all(&prefix).with_context(|| format!("removing the partial {}", prefix.display()))?;
    }
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    run(Command::new("./configure")
        .arg("--disable-gil")
        .arg(format!("--prefix={}", prefix.display()))
        .arg("--with-ensurepip=install")
        .current_dir(&source_dir))
    .context("configuring CPython (free-threaded)")?;
    run(Command::new("make").args(["-j", &jobs]).current_dir(&source_dir)).context("building CPython")?;
    run(Command::new("make").arg("install").current_dir(&source_dir)).context("installing CPython")?;

    let answer = gil_enabled(&python)?;
    if answer != "False" {
        bail!("{} was built but reports the GIL enabled ({answer})", python.display());
    }
    fs::write(prefix.join(FT_COMPLETE_STAMP), FT_SOURCE_PACKAGE)
        .with_context(|| format!("writing {}", prefix.join(FT_COMPLETE_STAMP).display()))?;
    // The sources and object files are not needed any more (about 300 MB).
    let _ = fs::remove_dir_all(&work);
    Ok(python)
}

/// What `sys._is_gil_enabled()` prints on `python` (`False` on a free-threaded interpreter running without the
/// GIL; an error message on interpreters before 3.13).
fn gil_enabled(python: &Path) -> Result<String> {
    let out = Command::new(python)
        .args(["-c", "import sys; print(sys._is_gil_enabled())"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    let mut answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if answer.is_empty() {
        answer = String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or_default().to_string();
    }
    Ok(answer)
}

/// Downloads Debian's `python3.13` source package into `work` with private apt lists and unpacks the
/// upstream tarball; returns the unpacked source directory.
fn fetch_python_source(work: &Path) -> Result<PathBuf> {
    crate::debian::fetch_debian_source(work, FT_SUITE, FT_SOURCE_PACKAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_an_interpreter_about_its_gil_or_fails() {
        assert!(gil_enabled(Path::new("/nonexistent/python3.13t")).is_err());
        let path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(python) = std::env::split_paths(&path).map(|dir| dir.join("python3")).find(|p| p.is_file()) {
            // `True`/`False` from 3.13 on, the AttributeError's line before: never empty.
            assert!(!gil_enabled(&python).expect("python3 runs").is_empty());
        }
    }
}
