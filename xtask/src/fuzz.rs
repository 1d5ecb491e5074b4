//! `cargo xtask fuzz`: every cargo-fuzz target under `fuzz/` for a bounded time (not part of `test`).
//!
//! Installs cargo-fuzz when it is missing (`cargo install cargo-fuzz --locked`). cargo-fuzz needs a nightly
//! compiler for `-Z sanitizer=address`; when no nightly toolchain is installed (this project pins stable
//! 1.95), the run sets `RUSTC_BOOTSTRAP=1`, which lets the stable compiler accept the `-Z` flags
//! (the standard library itself is then not instrumented, which ASan tolerates).
//!
//! Each target starts from its committed seed corpus `fuzz/corpus/<target>/`; new inputs go to
//! `target/fuzz/corpus/<target>/` and findings to `target/fuzz/artifacts/<target>/`, so the repository is
//! only touched when something is found: every crash, timeout (an input that runs past 10 s) or
//! out-of-memory input is copied to `crates/spdl-cli/tests/regressions/<target>/`, where
//! `cargo test -p spdl-cli --test reliability_regressions` runs it through every entry point from then on,
//! and the command fails listing them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// libFuzzer's per-input time limit: longer is a hang.
const INPUT_TIMEOUT_S: u64 = 10;
/// libFuzzer's memory limit; the targets lower the decoders' limits to stay well under it.
const RSS_LIMIT_MB: u64 = 2048;

/// Runs every target of `root/fuzz` for `seconds_per_target` seconds.
pub fn fuzz(root: &Path, seconds_per_target: u64) -> Result<()> {
    let fuzz_dir = root.join("fuzz");
    let targets = targets(&fuzz_dir)?;
    ensure_cargo_fuzz()?;
    let nightly = has_nightly();
    if !nightly {
        eprintln!(
            "xtask fuzz: no nightly toolchain; using RUSTC_BOOTSTRAP=1 so that stable rustc accepts -Z sanitizer"
        );
    }
    let work = root.join("target").join("fuzz");
    let regressions = root.join("crates").join("spdl-cli").join("tests").join("regressions");
    let mut found = Vec::new();
    let mut summary = Vec::new();
    for target in &targets {
        let corpus = work.join("corpus").join(target);
        let artifacts = work.join("artifacts").join(target);
        for d in [&corpus, &artifacts] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let before = files(&artifacts)?;
        let seeds = fuzz_dir.join("corpus").join(target);
        let mut cmd = cargo_fuzz(nightly);
        cmd.current_dir(&fuzz_dir)
            .args(["run", target])
            .arg(&corpus)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds_per_target}"))
            .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
            .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-print_final_stats=1");
        eprintln!("xtask fuzz: {target} for {seconds_per_target} s");
        let status = cmd.status().with_context(|| format!("cannot run cargo fuzz for {target}"))?;
        let new: Vec<PathBuf> = files(&artifacts)?.into_iter().filter(|f| !before.contains(f)).collect();
        for artifact in &new {
            let dest_dir = regressions.join(target);
            std::fs::create_dir_all(&dest_dir).with_context(|| format!("cannot create {}", dest_dir.display()))?;
            let name = artifact.file_name().context("artifact without a name")?;
            let dest = dest_dir.join(name);
            std::fs::copy(artifact, &dest)
                .with_context(|| format!("cannot copy {} to {}", artifact.display(), dest.display()))?;
            found.push(format!("{target}: {}", dest.display()));
        }
        if !status.success() && new.is_empty() {
            bail!("cargo fuzz run {target} failed ({status}) without leaving an artifact: see its output above");
        }
        summary.push(format!(
            "{target}: {} ({} new findings)",
            if status.success() { "clean" } else { "FOUND" },
            new.len()
        ));
    }
    eprintln!("xtask fuzz: {} targets, {seconds_per_target} s each", targets.len());
    for line in &summary {
        eprintln!("  {line}");
    }
    if !found.is_empty() {
        bail!(
            "the fuzzers found {} input(s) that crash, hang or exhaust memory; copied for the regression test \
             (`cargo test -p spdl-cli --test reliability_regressions`):\n  {}",
            found.len(),
            found.join("\n  ")
        );
    }
    Ok(())
}

/// The `[[bin]]` names of `fuzz/Cargo.toml`: the fuzz targets.
fn targets(fuzz_dir: &Path) -> Result<Vec<String>> {
    let manifest = fuzz_dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| format!("cannot read {}", manifest.display()))?;
    let mut targets = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(value) = line.strip_prefix("name") {
            let name = value.trim_start().trim_start_matches('=').trim().trim_matches('"');
            targets.push(name.to_owned());
        }
    }
    if targets.is_empty() {
        bail!("no [[bin]] fuzz targets in {}", manifest.display());
    }
    Ok(targets)
}

fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry.with_context(|| format!("cannot list {}", dir.display()))?.path();
        if path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn ensure_cargo_fuzz() -> Result<()> {
    let installed = cargo().args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    eprintln!("xtask fuzz: installing cargo-fuzz (a few minutes, once)");
    let status = cargo().args(["install", "cargo-fuzz", "--locked"]).status().context("cannot run cargo install")?;
    if !status.success() {
        bail!("`cargo install cargo-fuzz --locked` failed with {status}");
    }
    Ok(())
}

/// Whether rustup has a nightly toolchain.
fn has_nightly() -> bool {
    Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with("nightly")))
}

fn cargo_fuzz(nightly: bool) -> Command {
    if nightly {
        let mut c = Command::new("cargo");
        c.args(["+nightly", "fuzz"]);
        c
    } else {
        let mut c = cargo();
        c.arg("fuzz").env("RUSTC_BOOTSTRAP", "1");
        c
    }
}
