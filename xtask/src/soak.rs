//! `cargo xtask soak [SECONDS] [-- ARGS]`: a bounded soak test of the `spdl_rs` Python package (not part of
//! `test`).
//!
//! Runs `xtask/soak.py --seconds SECONDS` (default 60) with the interpreter of the venv that `cargo xtask
//! test` installs the abi3 wheel into (`target/venv-wheel`), or else `.venv` with a development build. For that long the driver builds random
//! pipelines (sync, async and generator ops, aggregate/disaggregate, concurrency and threads 1-4, range, list
//! and generator sources, ops that raise or sleep) and ends each in a random way: exhaustion, `stop(timeout)`,
//! an op's failure, a drop without `stop`, a reference cycle dropped while running, a SIGINT while iterating,
//! a fork (`os.fork` and `multiprocessing`) whose child exits at once or does spdl_rs work and finalizes, and
//! a `python -c` that exits with work in flight. It fails on a crashed or hung child or subprocess, on threads
//! or fds left over at the end, on RSS growth, or on an unexpected exception, and prints a summary table and
//! a `SOAK_JSON {...}` line. The seed is printed; arguments after the seconds go to the driver as they are
//! (`--seed N`, `--replay ITER_SEED`, `--scenarios fork,sigint`, `--json PATH`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs the soak driver for `seconds` with `extra` arguments passed on.
pub fn soak(root: &Path, seconds: u64, extra: &[String]) -> Result<()> {
    let python = venv_python(root)?;
    let script = root.join("xtask/soak.py");
    if !script.is_file() {
        bail!("{} is missing", script.display());
    }
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg("--seconds").arg(seconds.to_string()).args(extra);
    // Unbuffered, so that a hang's last lines and the watchdog's stack dump are not lost.
    cmd.env("PYTHONUNBUFFERED", "1");
    crate::run(&mut cmd).context("the soak test failed (its summary above names each failure and its seed)")
}

/// The venv's interpreter, checked to import `spdl_rs`.
fn venv_python(root: &Path) -> Result<PathBuf> {
    let installed = root.join("target/venv-wheel");
    let venv = if installed.join("bin/python").exists() { installed } else { root.join(".venv") };
    let python = venv.join("bin/python");
    if !python.exists() {
        bail!(
            "{} does not exist: run `cargo xtask test` (or build the module into {} with `maturin develop \
             --release` from crates/spdl-py) first",
            python.display(),
            venv.display()
        );
    }
    let out = Command::new(&python)
        .args(["-c", "import spdl_rs, spdl_rs.pipeline; print(spdl_rs.__file__)"])
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{} cannot import spdl_rs: run `cargo xtask test` (or build the module into {} with `maturin \
             develop --release` from crates/spdl-py) first\n{}",
            python.display(),
            venv.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(python)
}
