//! The Python side of `cargo xtask test`: the spdl-py crate's clippy and rustdoc gates (they need an
//! interpreter to build against, `.venv`), then what users install: the wheels of `cargo xtask wheel`
//! (crate::wheel), each in a fresh venv without a Rust toolchain on `PATH`. The abi3 wheel (`target/venv-wheel`,
//! the system's CPython) gets mypy, stubtest and the pytest suite, run twice: as installed, and with FFmpeg's
//! libraries hidden in a mount namespace. Before the wheels, `cargo xtask stubs --check` compares the committed
//! stubs with a debug build of the module. The free-threaded wheel (`target/venv-wheel-ft`, CPython 3.13t) runs
//! the suite once, so that the module's claim to be safe without the GIL is tested on an interpreter that has
//! none.
//!
//! The free-threaded interpreter comes from [`crate::free_threaded`].

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Python packages of the test venvs, pinned (nothing is built there: the wheels' tools are crate::wheel's).
/// numpy 2.4.6 is the last one with a cp313t wheel (2.5 would be built from source on the free-threaded
/// interpreter, five minutes on two cores).
const TEST_PACKAGES: &[&str] = &["pytest==9.2.0", "numpy==2.4.6"];

/// Python packages of the type checks, pinned; only in `target/venv-wheel` (the checks run once, on the GIL build).
const CHECK_PACKAGES: &[&str] = &["mypy==2.4.1"];

/// Packages of the distributed-training tests (the torchrun example, `get_pytorch_dataloader`, Ray Data),
/// pinned; only in `target/venv-wheel`: neither has a wheel for the free-threaded interpreter. torch pulls its CUDA
/// packages (about 5 GB; it runs on CPU here), which pip caches between runs.
const DIST_PACKAGES: &[&str] = &["torch==2.15.0", "ray[data]==2.60.0"];

/// Cargo features of spdl-py's clippy and rustdoc gates: the abi3 wheel's.
fn module_features() -> String {
    format!("abi3,{}", crate::wheel::WHEEL_FEATURES)
}

/// Runs spdl-py's clippy (and, unless `quick`, unit-test, rustdoc and doctest) gates against `.venv`'s interpreter, then
/// tests what users install: `cargo xtask wheel`'s wheels, each installed into a fresh venv whose `PATH` has no
/// Rust toolchain. The abi3 wheel goes into `target/venv-wheel` (system python3), is type-checked there (mypy,
/// stubtest) and runs `crates/spdl-py/tests` twice: as installed, and again with FFmpeg's libraries hidden
/// (where every video call must raise the clear error and everything else must pass). The free-threaded wheel
/// goes into `target/venv-wheel-ft` (CPython 3.13t) and runs the suite once. Fails if any check or test fails
/// or if pytest collects none. `s3s_fs` is the S3-compatible server binary the S3 tests start (passed to
/// pytest as `SPDL_S3S_FS`).
pub fn python_tests(root: &Path, s3s_fs: &Path, quick: bool) -> Result<()> {
    let crate_dir = root.join("crates/spdl-py");
    if !crate_dir.join("pyproject.toml").is_file() {
        bail!("{} has no pyproject.toml: is {} the repository root?", crate_dir.display(), root.display());
    }
    // The audio/video suites make their media with the ffmpeg CLI; without it they would be skipped.
    which("ffmpeg").context("the ffmpeg CLI is needed to make the Python tests' media (apt-get install ffmpeg)")?;

    let system_python = which("python3").context("python3 is needed for the Python tests")?;
    let venv = ensure_venv(&root.join(".venv"), &system_python)?;
    rust_gates(&venv, &root.join("target/py"), quick)?;
    let started = Instant::now();
    crate::stubs::check_stub(root, &crate::stubs::build_module(root, Some(&venv_python(&venv)))?)?;
    eprintln!("xtask: the stub check took {:.0} s", started.elapsed().as_secs_f64());

    let wheels = crate::wheel::wheel(root, &[])?;
    eprintln!(
        "xtask: testing {} and {} (sdist: {})",
        wheels.abi3.display(),
        wheels.free_threaded.display(),
        wheels.sdist.display()
    );
    let installed = fresh_venv(
        &root.join("target/venv-wheel"),
        &system_python,
        &wheels.abi3,
        &[TEST_PACKAGES, CHECK_PACKAGES, DIST_PACKAGES].concat(),
    )?;
    type_checks(&installed, &crate_dir)?;
    run_pytest(&installed, &crate_dir, false, s3s_fs, Ffmpeg::Present)?;
    run_pytest(&installed, &crate_dir, false, s3s_fs, Ffmpeg::Hidden)?;

    let ft_python = crate::free_threaded::ensure_free_threaded_python()?;
    let installed_ft =
        fresh_venv(&root.join("target/venv-wheel-ft"), &ft_python, &wheels.free_threaded, TEST_PACKAGES)?;
    run_pytest(&installed_ft, &crate_dir, true, s3s_fs, Ffmpeg::Present)?;
    Ok(())
}

/// A new venv at `venv` (an old one is cleared) made by `python`, with `wheel` and `packages` installed.
fn fresh_venv(venv: &Path, python: &Path, wheel: &Path, packages: &[&str]) -> Result<PathBuf> {
    let started = Instant::now();
    run(Command::new(python).args(["-m", "venv", "--clear"]).arg(venv))
        .with_context(|| format!("creating the virtual environment {}", venv.display()))?;
    let py = venv_python(venv);
    run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]).args(packages))
        .with_context(|| format!("installing the test packages into {}", venv.display()))?;
    let t = Instant::now();
    run(Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .arg(wheel)
        .env("PATH", path_without_rust(venv)?))
    .with_context(|| format!("installing {} into {}", wheel.display(), venv.display()))?;
    eprintln!(
        "xtask: {} installed into {} in {:.1} s (the venv took {:.0} s)",
        wheel.file_name().unwrap_or_default().to_string_lossy(),
        venv.display(),
        t.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(venv.to_path_buf())
}

/// `PATH` with `venv/bin` first and without any directory that holds a Rust toolchain (`cargo`, `rustc`):
/// the installed package must not need one.
fn path_without_rust(venv: &Path) -> Result<std::ffi::OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![venv.join("bin")];
    dirs.extend(std::env::split_paths(&path).filter(|d| !d.join("cargo").exists() && !d.join("rustc").exists()));
    std::env::join_paths(dirs).context("joining PATH")
}

/// Whether the suite runs with FFmpeg's libraries where the system has them, or hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ffmpeg {
    Present,
    /// In a private mount namespace, every FFmpeg library of the system's library directories is covered by an
    /// empty file, so nothing can load it. The `ffmpeg` CLI that makes the test media keeps working through
    /// copies of them (`target/ffmpeg-cli`, on its own `LD_LIBRARY_PATH`).
    Hidden,
}

/// The system's FFmpeg libraries (`libavcodec.so.59` and the like, real files).
fn system_ffmpeg_libraries() -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for dir in ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        let Ok(entries) = fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ffmpeg = ["libavcodec", "libavformat", "libavutil", "libavfilter", "libavdevice", "libswscale"]
                .iter()
                .chain(&["libswresample", "libpostproc"])
                .any(|l| name.starts_with(&format!("{l}.so.")));
            let path = e.path();
            if ffmpeg && !fs::symlink_metadata(&path).map(|m| m.file_type().is_symlink()).unwrap_or(true) {
                let canonical = path.canonicalize().unwrap_or(path);
                if !out.contains(&canonical) {
                    out.push(canonical);
                }
            }
        }
    }
    Ok(out)
}

/// A copy of the `ffmpeg` CLI's FFmpeg libraries under `dir/lib` and a `dir/bin/ffmpeg` that runs the system's
/// CLI with them: the test media are still made where the libraries are hidden.
fn ffmpeg_cli_with_own_libraries(dir: &Path, libs: &[PathBuf]) -> Result<PathBuf> {
    let lib = dir.join("lib");
    let bin = dir.join("bin");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    for l in libs {
        let name = l.file_name().context("a library without a name")?.to_string_lossy().into_owned();
        // Under its soname (libavcodec.so.59), which the CLI asks for.
        let soname = match name.find(".so.") {
            Some(i) => {
                let rest = &name[i + 4..];
                format!("{}.so.{}", &name[..i], rest.split('.').next().unwrap_or(rest))
            }
            None => name.clone(),
        };
        fs::copy(l, lib.join(&soname)).with_context(|| format!("copying {}", l.display()))?;
    }
    let cli = which("ffmpeg")?;
    let wrapper = bin.join("ffmpeg");
    fs::write(&wrapper, format!("#!/bin/sh\nLD_LIBRARY_PATH={} exec {} \"$@\"\n", lib.display(), cli.display()))
        .with_context(|| format!("writing {}", wrapper.display()))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", wrapper.display()))?;
    Ok(bin)
}

/// Runs `cmd`, failing with its command line if it cannot start or exits non-zero.
fn run(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("xtask: {line}");
    let status = cmd.status().with_context(|| format!("could not start {line}"))?;
    if !status.success() {
        bail!("{line} failed ({status})");
    }
    Ok(())
}

fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").context("PATH is not set")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} not found on PATH"))
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin/python")
}

/// Creates the venv with `python` if it is missing (or was made by another interpreter), then installs the
/// pinned test packages into it (a no-op when they are there).
fn ensure_venv(venv: &Path, python: &Path) -> Result<PathBuf> {
    let py = venv_python(venv);
    if py.exists() && !same_interpreter(&py, python)? {
        eprintln!("xtask: {} was made by another interpreter; recreating it", venv.display());
        fs::remove_dir_all(venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    if !py.exists() {
        run(Command::new(python).args(["-m", "venv"]).arg(venv))
            .with_context(|| format!("creating the virtual environment {}", venv.display()))?;
    }
    run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]).args(TEST_PACKAGES))
        .with_context(|| format!("installing the test packages into {}", venv.display()))?;
    Ok(venv.to_path_buf())
}

/// True if the venv's interpreter runs the same executable (by `sys._base_executable`) as `python`.
fn same_interpreter(venv_py: &Path, python: &Path) -> Result<bool> {
    let base = |p: &Path| -> Result<String> {
        let out = Command::new(p)
            .args(["-c", "import os, sys; print(os.path.realpath(sys._base_executable))"])
            .output()
            .with_context(|| format!("running {}", p.display()))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let venv_base = base(venv_py)?;
    // A broken venv (its base interpreter gone) prints nothing: recreate it.
    Ok(!venv_base.is_empty() && venv_base == base(python)?)
}

/// The `cargo` of this xtask, building into `target/py` (unless `CARGO_TARGET_DIR` is set) against the venv's
/// interpreter, like the module builds.
fn cargo_for_py(venv: &Path, target_dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env("PYO3_PYTHON", venv_python(venv));
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        cmd.env("CARGO_TARGET_DIR", target_dir);
    }
    cmd
}

/// The Rust gates of the spdl-py crate, which the workspace-wide ones leave out because PyO3 needs an
/// interpreter: clippy `-D warnings` on every target with the module's features, and unless `quick` the unit
/// tests (with the module's features: the parsers and the arenas are tested there), rustdoc `-D warnings` and
/// the doctests (no features: the doctests use only the crate's core).
fn rust_gates(venv: &Path, target_dir: &Path, quick: bool) -> Result<()> {
    let started = Instant::now();
    run(cargo_for_py(venv, target_dir)
        .args(["clippy", "-p", "spdl-py", "--all-targets", "--features", &module_features()])
        .args(["--", "-D", "warnings"]))
    .context("clippy on spdl-py")?;
    eprintln!("xtask: spdl-py clippy took {:.0} s", started.elapsed().as_secs_f64());
    if quick {
        return Ok(());
    }
    let started = Instant::now();
    run(cargo_for_py(venv, target_dir).args(["test", "-p", "spdl-py", "--lib", "--features", &module_features()]))
        .context("the unit tests of spdl-py")?;
    eprintln!("xtask: spdl-py unit tests took {:.0} s", started.elapsed().as_secs_f64());
    let started = Instant::now();
    run(cargo_for_py(venv, target_dir)
        .args(["doc", "-p", "spdl-py", "--no-deps", "--features", &module_features()])
        .env("RUSTDOCFLAGS", "-D warnings"))
    .context("rustdoc on spdl-py")?;
    run(cargo_for_py(venv, target_dir).args(["test", "-p", "spdl-py", "--doc", "--no-default-features"]))
        .context("the doctests of spdl-py")?;
    eprintln!("xtask: spdl-py rustdoc and doctests took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// mypy on the `spdl_rs` package (crates/spdl-py/mypy.ini) and stubtest on the built native module and its
/// submodules, so that the stubs cannot drift from what the Rust code exports. Both run in the venv the module was built into.
fn type_checks(venv: &Path, crate_dir: &Path) -> Result<()> {
    let started = Instant::now();
    let py = venv_python(venv);
    run(Command::new(&py).args(["-m", "mypy", "--config-file", "mypy.ini"]).current_dir(crate_dir))
        .context("mypy on the spdl_rs package")?;
    // stubtest checks the module's submodules too (`_native/io.pyi` is `spdl_rs._native.io`).
    run(Command::new(&py).args(["-m", "mypy.stubtest", "spdl_rs._native"]).current_dir(crate_dir))
        .context("stubtest: the stubs in python/spdl_rs/_native/ differ from the built module")?;
    eprintln!("xtask: mypy and stubtest took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// pytest on the crate's tests. `free_threaded` makes the suite assert that the GIL stays disabled after
/// `import spdl_rs` (crates/spdl-py/tests/conftest.py reads `SPDL_RS_EXPECT_NO_GIL`).
fn run_pytest(venv: &Path, crate_dir: &Path, free_threaded: bool, s3s_fs: &Path, ffmpeg: Ffmpeg) -> Result<()> {
    let py = venv_python(venv);
    let pytest: Vec<std::ffi::OsString> = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
        .iter()
        .map(Into::into)
        .chain([crate_dir.join("tests").into_os_string()])
        .collect();
    let mut path = path_without_rust(venv)?;
    let mut cmd = match ffmpeg {
        Ffmpeg::Present => {
            let mut cmd = Command::new(&py);
            cmd.args(&pytest);
            cmd
        }
        Ffmpeg::Hidden => {
            let libs = system_ffmpeg_libraries()?;
            if libs.is_empty() {
                bail!("found no FFmpeg library to hide (is FFmpeg installed?)");
            }
            let target = crate_dir.join("../../target/ffmpeg-cli");
            let cli = ffmpeg_cli_with_own_libraries(&target, &libs)?;
            let mut dirs = vec![cli];
            dirs.extend(std::env::split_paths(&path));
            path = std::env::join_paths(dirs).context("joining PATH")?;
            let mut script = String::from("set -e\n");
            for l in &libs {
                script.push_str(&format!("mount --bind /dev/null '{}'\n", l.display()));
            }
            script.push_str("exec \"$@\"\n");
            // A mount namespace of its own: as root, or else as root of a new user namespace.
            let mut cmd = Command::new("unshare");
            if !crate::sys::is_root() {
                cmd.arg("--map-root-user");
            }
            cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"]).arg(&py).args(&pytest);
            cmd.env("SPDL_RS_TEST_NO_FFMPEG", "1");
            cmd
        }
    };
    cmd.current_dir(crate_dir)
        .env("PATH", path)
        .env("SPDL_RS_TEST_INSTALLED", "1")
        .env("SPDL_RS_EXPECT_NO_GIL", if free_threaded { "1" } else { "0" })
        .env(crate::s3::S3S_FS_ENV, s3s_fs);
    if free_threaded {
        // Any import that re-enables the GIL warns; make it an error so it cannot pass unnoticed.
        cmd.env("PYTHON_GIL", "0");
    }
    let line = format!("{cmd:?}");
    eprintln!("xtask: {line}");
    let status = cmd.status().with_context(|| format!("could not start {line}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => bail!("pytest collected no test in {} ({line})", crate_dir.join("tests").display()),
        _ => bail!(
            "pytest failed on {} ({status}{})",
            py.display(),
            if ffmpeg == Ffmpeg::Hidden { ", FFmpeg hidden" } else { "" }
        ),
    }
}
