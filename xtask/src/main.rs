//! Project automation for spdl-rs: `cargo xtask <command>`.
//!
//! - `test`: installs what the suites need when it is missing (FFmpeg dev packages, the local S3 server, the
//!   Python venvs and a free-threaded CPython), then runs rustfmt, clippy `-D warnings`, rustdoc, every Rust
//!   test suite with every feature, spdl-py's clippy/rustdoc/doctests against the venv's interpreter, mypy and
//!   stubtest on the `spdl_rs` package, and the Python suite on both interpreters. This is the one test
//!   command (the CI one); plain `cargo test` is the quick loop that needs only Rust.
//! - `gen-data [DIR] [--corrupt]`: writes test corpora (photo-like images; with `--corrupt`, broken media).
//! - `bench`: runs the criterion benches with short measurement times (with the S3 bench: feature `s3`).
//! - `compare`: the side-by-side comparison against peer loaders (writes docs/benchmarks.md figures).
//! - `gpu-check`: builds with CUDA and runs the GPU tests and the H2D bandwidth report (needs a GPU).
//! - `fuzz [SECONDS]`: runs every cargo-fuzz target for SECONDS each (default 60; not part of `test`).
//! - `soak [SECONDS] [ARGS]`: a soak test of the `spdl_rs` Python package for SECONDS (default 60; not part of
//!   `test`): random pipelines ended every way (stop, drop, cycles, SIGINT, fork, exit with work in flight),
//!   failing on crashes, hangs and leaked threads, fds or memory. ARGS go to xtask/soak.py (`--seed N`,
//!   `--replay ITER_SEED`, `--scenarios a,b`, `--json PATH`). Needs `cargo xtask test`'s installed wheel.
//! - `stubs [--check] [--module PATH]`: writes the stubs in `crates/spdl-py/python/spdl_rs/_native/` from the
//!   built native module (PyO3's introspection), or with `--check` fails if the committed stubs are not current
//!   (`test` checks them against the installed wheel's module).
//! - `wheel`: the release artefacts of the `spdl_rs` package in `target/wheels/`: an abi3 wheel (CPython >= 3.10),
//!   a free-threaded CPython 3.13t wheel and the sdist, both wheels manylinux_2_28 (zig), checked by auditwheel,
//!   each with the FFmpeg backends it loads at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

mod debian;
mod ffmpeg;
mod ffmpeg_source;
mod free_threaded;
mod fuzz;
mod gpu;
mod keyword_options;
mod python;
mod s3;
mod soak;
mod stubs;
mod sys;
mod wheel;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cd {}", root.display()))?;
    match args.first().map(String::as_str) {
        Some("test") => test(&root, &args[1..]),
        Some("gen-data") => gen_data(&root, &args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("compare") => compare(&root, &args[1..]),
        Some("gpu-check") => gpu_check(&root),
        Some("fuzz") => {
            let seconds = match args.get(1) {
                Some(s) => s.parse().with_context(|| format!("`{s}` is not a number of seconds per target"))?,
                None => 60,
            };
            fuzz::fuzz(&root, seconds)
        }
        Some("soak") => {
            let (seconds, rest) = match args.get(1) {
                Some(s) if !s.starts_with('-') => {
                    (s.parse().with_context(|| format!("`{s}` is not a number of seconds"))?, &args[2..])
                }
                _ => (60, &args[1..]),
            };
            soak::soak(&root, seconds, rest)
        }
        Some("wheel") => {
            // `--ffmpeg 7[,6]`: backends for these FFmpeg majors too, built from Debian's sources.
            let majors = match args.iter().position(|a| a == "--ffmpeg") {
                Some(i) => args
                    .get(i + 1)
                    .context("--ffmpeg needs a list of FFmpeg majors, e.g. --ffmpeg 7")?
                    .split(',')
                    .map(|m| m.trim().parse::<u32>().with_context(|| format!("`{m}` is not an FFmpeg major")))
                    .collect::<Result<Vec<_>>>()?,
                None => Vec::new(),
            };
            wheel::wheel(&root, &majors).map(|_| ())
        }
        Some("stubs") => stubs::stubs(&root, &args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{}", HELP);
            Ok(())
        }
        Some(other) => bail!("unknown xtask command `{other}`\n{HELP}"),
    }
}

const HELP: &str = "usage: cargo xtask <test [--quick] [--no-python] | gen-data [DIR] [--corrupt] | bench | compare | gpu-check | stubs [--check] [--module PATH] | fuzz [SECONDS] | soak [SECONDS] [--seed N] [--replay ITER_SEED] [--scenarios a,b] [--json PATH] | wheel [--ffmpeg 7[,6]]>

  soak: a bounded soak test of the spdl_rs Python package (default 60 s; not part of `test`; needs the module
        installed by `cargo xtask test`): random pipelines ended by exhaustion, stop(timeout), op
        failures, drops, reference cycles, SIGINT, fork children and interpreter exit with work in flight;
        fails on a crash, hang, leaked threads/fds, RSS growth or an unexpected exception.
  wheel: builds target/wheels/: the abi3 wheel (CPython >= 3.10), the free-threaded 3.13t wheel and the sdist,
         with maturin --zig for manylinux_2_28, the FFmpeg backends, and auditwheel's check (tools in
         target/wheel-venv). A backend for the FFmpeg whose development files the system has; `--ffmpeg 7`
         adds FFmpeg 7's, built once from Debian's source package into ~/.cache/spdl-rs/ffmpeg7.";

fn project_root() -> Result<PathBuf> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").context("run through `cargo xtask`")?;
    Path::new(&dir).parent().map(Path::to_path_buf).context("xtask has no parent directory")
}

/// Runs a command, streaming its output, and fails with the command line if it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: $ {}", sys::describe(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", sys::describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", sys::describe(cmd));
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Features that the Rust test run turns on: every optional capability whose system dependencies
/// `sys::ensure_system_packages` installs (and the benches that need them, for clippy `--all-targets`).
const TEST_FEATURES: &str = "spdl-io/ffmpeg,spdl-io/turbojpeg,spdl-io/cli-media-tests,spdl-source/http,spdl-source/s3,spdl-cuda/cuda,spdl-cli/ffmpeg,spdl-cli/cuda,spdl-cli/s3,spdl-cli/http,spdl-cli/turbojpeg,spdl-benches/s3,spdl-benches/ffmpeg";

/// Below this much free disk after the Rust suites, `cargo xtask test` frees target/debug before the
/// Python step (about 2 GB in target/py for the module builds, 1.3 GB more for spdl-py's clippy, rustdoc and
/// doctests).
const LOW_DISK_BYTES: u64 = 8_000_000_000;

fn test(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let no_python = args.iter().any(|a| a == "--no-python");
    let started = std::time::Instant::now();

    sys::report_free(root, "before the build");
    sys::ensure_system_packages()?;
    // The S3 tests start their own s3s-fs server on 127.0.0.1; install it once (about 2 minutes).
    let s3s_fs = s3::ensure_s3s_fs()?;

    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // spdl-py is left out of the workspace-wide gates (PyO3 needs an interpreter): its clippy, rustdoc and
    // doctests run in the Python step, against the venv's interpreter.
    run(cargo()
        .args(["clippy", "--workspace", "--exclude", "spdl-py", "--all-targets", "--features", TEST_FEATURES])
        .args(["--", "-D", "warnings"]))?;
    if !quick {
        run(cargo()
            .args(["doc", "--no-deps", "--workspace", "--exclude", "spdl-py", "--features", TEST_FEATURES])
            .env("RUSTDOCFLAGS", "-D warnings"))?;
    }
    run(cargo()
        // Every suite runs even after one fails, so one CI log shows every failure.
        .args(["test", "--workspace", "--exclude", "spdl-py", "--no-fail-fast", "--features", TEST_FEATURES])
        .env(s3::S3S_FS_ENV, &s3s_fs)
        .env("RUST_BACKTRACE", "1"))?;
    if !no_python {
        // The Python module builds into target/py with the release profile and shares nothing with
        // target/debug. Where the disk is short, the debug artefacts go first: their suites are done.
        if sys::report_free(root, "after the Rust suites").is_some_and(|b| b < LOW_DISK_BYTES) {
            let debug = root.join("target/debug");
            eprintln!(
                "xtask: less than {} GB free: removing {} before the Python build",
                LOW_DISK_BYTES / 1_000_000_000,
                debug.display()
            );
            std::fs::remove_dir_all(&debug).with_context(|| format!("removing {}", debug.display()))?;
        }
        python::python_tests(root, &s3s_fs, quick)?;
    }
    sys::report_free(root, "at the end");
    eprintln!("xtask: all checks passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn gen_data(root: &Path, args: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "spdl-cli", "--", "gen-data"]);
    if args.is_empty() {
        cmd.arg(root.join("target/spdl-data"));
    }
    cmd.args(args);
    run(&mut cmd)
}

fn bench(args: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["bench", "-p", "spdl-benches", "--features", "s3", "--"]);
    if args.is_empty() {
        cmd.args(["--warm-up-time", "1", "--measurement-time", "3"]);
    }
    cmd.args(args);
    run(&mut cmd)
}

fn compare(root: &Path, _args: &[String]) -> Result<()> {
    let script = root.join("benches/compare/run.sh");
    if !script.exists() {
        bail!("{} is missing", script.display());
    }
    run(Command::new("bash").arg(script))
}

fn gpu_check(_root: &Path) -> Result<()> {
    gpu::gpu_check()
}
