//! The run-time-loaded FFmpeg backends (crates/spdl-ffmpeg): `libspdl_ffmpeg{M}.so`, one per FFmpeg major M,
//! built against the FFmpeg that pkg-config finds (the system's development packages, or another major's
//! through `PKG_CONFIG_PATH`) and placed beside the `spdl_rs` module that loads them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The FFmpeg major of a libavutil major (FFmpeg 4 shipped libavutil 56, ... FFmpeg 8 libavutil 60).
fn ffmpeg_major(avutil_major: u32) -> Option<u32> {
    (56..=60).contains(&avutil_major).then(|| avutil_major - 52)
}

/// The FFmpeg major whose development files pkg-config finds (`PKG_CONFIG_PATH` picks another).
pub(crate) fn pkg_config_major(pkg_config_path: Option<&Path>) -> Result<u32> {
    let mut cmd = Command::new("pkg-config");
    if let Some(p) = pkg_config_path {
        cmd.env("PKG_CONFIG_PATH", p);
    }
    let out =
        cmd.args(["--modversion", "libavutil"]).output().context("running pkg-config (apt-get install pkg-config)")?;
    if !out.status.success() {
        bail!(
            "pkg-config finds no libavutil: install FFmpeg's development packages (apt-get install libavcodec-dev \
             libavformat-dev libavfilter-dev libswscale-dev libswresample-dev) or point PKG_CONFIG_PATH at another \
             FFmpeg's lib/pkgconfig"
        );
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let avutil: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("pkg-config gave libavutil version {version:?}"))?;
    ffmpeg_major(avutil).with_context(|| format!("libavutil {version} is of no FFmpeg 4-8 that spdl-io supports"))
}

/// Builds the backend for the FFmpeg pkg-config finds (through `pkg_config_path` when given), with `profile`
/// (`"release"` or `"dev"`), into `target_dir`, linked by `linker` when given (else the default), and copies it
/// to `dest_dir/libspdl_ffmpeg{M}.so`. Returns that path. The backend must be built from the same sources, by the
/// same compiler, as the module that loads it (its build id says so).
pub(crate) fn build_backend(
    target_dir: &Path,
    profile: &str,
    dest_dir: &Path,
    linker: Option<&Path>,
    pkg_config_path: Option<&Path>,
) -> Result<PathBuf> {
    let major = pkg_config_major(pkg_config_path)?;
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "-p", "spdl-ffmpeg", "--profile", profile]).env("CARGO_TARGET_DIR", target_dir);
    if let Some(p) = pkg_config_path {
        cmd.env("PKG_CONFIG_PATH", p);
    }
    if let Some(linker) = linker {
        cmd.env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER", linker);
    }
    crate::run(&mut cmd).with_context(|| format!("building the FFmpeg {major} backend"))?;
    let built = target_dir.join(if profile == "dev" { "debug" } else { profile }).join("libspdl_ffmpeg.so");
    fs::create_dir_all(dest_dir).with_context(|| format!("creating {}", dest_dir.display()))?;
    let dest = dest_dir.join(format!("libspdl_ffmpeg{major}.so"));
    // Copy to a temporary name and rename: a process that has the old file mapped keeps it intact.
    let tmp = dest.with_extension("so.tmp");
    fs::copy(&built, &tmp).with_context(|| format!("copying {} to {}", built.display(), tmp.display()))?;
    fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    eprintln!("xtask: FFmpeg {major} backend: {}", dest.display());
    Ok(dest)
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_libavutil_majors_to_ffmpeg_majors() {
        assert_eq!(super::ffmpeg_major(57), Some(5));
        assert_eq!(super::ffmpeg_major(59), Some(7));
        assert_eq!(super::ffmpeg_major(55), None);
    }
}
