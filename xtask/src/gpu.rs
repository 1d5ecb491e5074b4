//! `cargo xtask gpu-check`: the spdl-cuda checks that need a GPU.
//!
//! 1. builds spdl-cuda with `--features cuda` in release (tests and the bandwidth example);
//! 2. runs all its tests with `SPDL_REQUIRE_GPU=1`, so a missing GPU fails instead of skipping (serially: the
//!    overlap test times two streams and must not share the GPU with another test);
//! 3. runs `examples/h2d_bandwidth.rs`, which prints pinned vs pageable H2D GB/s for 1–256 MiB against the
//!    card's measured peak, and the pinned pool's steady-state hit rate, each target marked PASS/MISS;
//! 4. runs `spdl demo --json` built with `cuda`: the whole pipeline with its `h2d` stage (`gpu: true`, H2D GB/s).
//!
//! Set `SPDL_GPU_STRICT=1` to make a missed bandwidth/hit-rate target fail the check (it only prints by default:
//! a shared or throttled GPU should not turn a correct build red).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

fn workspace_root() -> PathBuf {
    // xtask/ is one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn run(step: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    eprintln!("==> gpu-check: {step}: cargo {}", args.join(" "));
    let mut cmd = Command::new(cargo());
    cmd.args(args).current_dir(workspace_root());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let status = cmd.status().with_context(|| format!("{step}: could not start cargo"))?;
    if !status.success() {
        bail!("gpu-check: {step} failed ({status})");
    }
    Ok(())
}

/// Builds spdl-cuda with CUDA, runs its tests requiring a GPU, then the H2D bandwidth example.
pub fn gpu_check() -> Result<()> {
    let base = ["-p", "spdl-cuda", "--features", "cuda", "--release"];
    let build: Vec<&str> = ["build", "--all-targets"].iter().chain(&base).copied().collect();
    run("build", &build, &[])?;

    let test: Vec<&str> = ["test"].iter().chain(&base).chain(&["--", "--test-threads=1"]).copied().collect();
    run("GPU tests", &test, &[("SPDL_REQUIRE_GPU", "1")])
        .context("a GPU test failed, or no GPU is usable here (SPDL_REQUIRE_GPU=1 turns skips into failures)")?;

    let strict = std::env::var("SPDL_GPU_STRICT").is_ok_and(|v| v == "1");
    let mut example: Vec<&str> = ["run"].iter().chain(&base).chain(&["--example", "h2d_bandwidth"]).copied().collect();
    if strict {
        example.extend(["--", "--strict"]);
    }
    run("H2D bandwidth", &example, &[("SPDL_REQUIRE_GPU", "1")])?;

    // End to end: the demo pipeline with its `h2d` stage (pinned batches, copy stream); the JSON report carries
    // `gpu: true`, `h2d_gbps` and the pinned pool's hit rate.
    run(
        "demo with the GPU stage",
        &["run", "--release", "-p", "spdl-cli", "--features", "cuda", "--", "demo", "--json", "--epochs", "2"],
        &[],
    )?;
    eprintln!("==> gpu-check: passed");
    Ok(())
}
