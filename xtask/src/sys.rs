//! System packages the test suites need, installed with apt when missing.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Debian packages: FFmpeg libraries and headers for the `ffmpeg` feature (bindgen needs clang), the `ffmpeg`
/// CLI that makes test media, ImageMagick for progressive-JPEG test files, cmake and nasm to build libjpeg-turbo
/// (the `turbojpeg` feature).
const APT_PACKAGES: &[&str] = &[
    "pkg-config",
    "clang",
    "libclang-dev",
    "libavcodec-dev",
    "libavformat-dev",
    "libavutil-dev",
    "libswscale-dev",
    "libswresample-dev",
    "libavfilter-dev",
    "libavdevice-dev",
    "ffmpeg",
    "cmake",
    "nasm",
];

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs the missing packages of [`APT_PACKAGES`] (one `apt-get update` first).
pub(crate) fn ensure_system_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let sudo = if is_root() { None } else { Some("sudo") };
    let apt = |args: &[&str]| -> Result<()> {
        let mut cmd = match sudo {
            Some(s) => {
                let mut c = Command::new(s);
                c.arg("apt-get");
                c
            }
            None => Command::new("apt-get"),
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        crate::run(&mut cmd)
    };
    apt(&["update", "-qq"]).context("apt-get update")?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    apt(&args).context("apt-get install")?;
    let still: Vec<&str> = missing.into_iter().filter(|p| !installed(p)).collect();
    if !still.is_empty() {
        bail!("apt-get did not install: {}", still.join(" "));
    }
    Ok(())
}

pub(crate) fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false)
}

/// Free bytes on the file system that holds `path`, from `df` (None where `df` cannot tell).
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: u64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// Prints the free disk space at a step of `cargo xtask test`, so a CI log shows what each step cost.
pub(crate) fn report_free(path: &std::path::Path, step: &str) -> Option<u64> {
    let free = free_bytes(path);
    if let Some(b) = free {
        eprintln!("xtask: {:.1} GB free on disk {step}", b as f64 / 1e9);
    }
    free
}
