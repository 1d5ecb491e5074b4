//! FFmpeg majors other than the system's, built from Debian's source packages into a cache outside the clone,
//! so that a `libspdl_ffmpeg{M}.so` backend can be built (`PKG_CONFIG_PATH={prefix}/lib/pkgconfig`) and tested
//! (`SPDL_RS_FFMPEG_DIR={prefix}/lib`) against each major spdl-io supports.
//!
//! The build is decode-only and shared-only: every decoder, demuxer, parser, bitstream filter and filter, but no
//! programs, docs, encoders, muxers, devices, network protocols or hardware acceleration, and no library found
//! by autodetection (only zlib, and bzip2/lzma where their headers are installed, are asked for by name).
//!
//! `cargo xtask wheel --ffmpeg 7` calls [`ensure_ffmpeg`] for each major it is given.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// The file in a finished prefix that says the build and install completed (it holds the source version).
const COMPLETE_STAMP: &str = ".spdl-rs-complete";

/// The Debian suite and source package that carry FFmpeg `major`.
fn debian_source(major: u32) -> Result<(&'static str, &'static str)> {
    match major {
        5 => Ok(("bookworm", "ffmpeg")), // 5.1.x
        7 => Ok(("trixie", "ffmpeg")),   // 7.1.x
        _ => bail!("no Debian suite is known to carry FFmpeg {major} (known: 5 in bookworm, 7 in trixie)"),
    }
}

/// Where FFmpeg `major` is installed: `$SPDL_RS_FFMPEG{major}_PREFIX` if set, else
/// `~/.cache/spdl-rs/ffmpeg{major}`.
fn ffmpeg_prefix(major: u32) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(format!("SPDL_RS_FFMPEG{major}_PREFIX")) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("HOME is not set (needed for ~/.cache/spdl-rs)")?;
    Ok(PathBuf::from(home).join(format!(".cache/spdl-rs/ffmpeg{major}")))
}

/// The `./configure` arguments of the decode-only shared build installed into `prefix`.
fn configure_args(prefix: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--enable-shared",
        "--disable-static",
        "--disable-programs",
        "--disable-doc",
        "--disable-debug",
        "--disable-encoders",
        "--disable-muxers",
        "--disable-indevs",
        "--disable-outdevs",
        "--disable-avdevice",
        "--disable-network",
        "--disable-hwaccels",
        "--disable-autodetect",
        // The libraries find each other (libavcodec → libavutil ...) in the prefix without LD_LIBRARY_PATH.
        "--enable-rpath",
        // Needed by the PNG, TIFF, EXR ... decoders and compressed MOV/Matroska headers.
        "--enable-zlib",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Optional codecs of Matroska/TIFF content, as the distributions' builds have them.
    for (header, flag) in [("/usr/include/bzlib.h", "--enable-bzlib"), ("/usr/include/lzma.h", "--enable-lzma")] {
        if Path::new(header).is_file() {
            args.push(flag.to_string());
        }
    }
    args.push(format!("--prefix={}", prefix.display()));
    args
}

/// Returns the install prefix (with `lib/`, `include/` and `lib/pkgconfig/`) of FFmpeg `major` built from
/// source, building it first unless the prefix holds the completion stamp of an earlier build.
///
/// The prefix is `$SPDL_RS_FFMPEG{major}_PREFIX` if set, else `~/.cache/spdl-rs/ffmpeg{major}`. The source is
/// Debian's `ffmpeg` source package of the suite that carries that major (7: trixie, 5: bookworm), fetched with
/// private apt lists like the free-threaded CPython's; it is configured with [`configure_args`], built with
/// `make -j2` and installed, and the build directory is removed afterwards. A first build takes about nine
/// minutes on two cores (FFmpeg 7.1.5); later calls return at once.
pub(crate) fn ensure_ffmpeg(major: u32) -> Result<PathBuf> {
    let (suite, package) = debian_source(major)?;
    let prefix = ffmpeg_prefix(major)?;
    let stamp = prefix.join(COMPLETE_STAMP);
    if stamp.is_file() && prefix.join("lib/pkgconfig/libavutil.pc").is_file() {
        return Ok(prefix);
    }
    eprintln!("xtask: building FFmpeg {major} ({suite}'s {package}) into {} (once)", prefix.display());
    let name = prefix.file_name().and_then(|n| n.to_str()).unwrap_or("ffmpeg");
    let work = prefix.with_file_name(format!("{name}-build"));
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let source_dir = crate::debian::fetch_debian_source(&work, suite, package)
        .with_context(|| format!("fetching the {package} source package from {suite}"))?;
    let version = fs::read_to_string(source_dir.join("VERSION"))
        .or_else(|_| fs::read_to_string(source_dir.join("RELEASE")))
        .with_context(|| format!("reading the version of the source in {}", source_dir.display()))?
        .trim()
        .to_string();
    if !version.starts_with(&format!("{major}.")) {
        bail!("{suite}'s {package} is FFmpeg {version}, not FFmpeg {major}");
    }
    if prefix.exists() {
        fs::remove_dir_all(&prefix).with_context(|| format!("removing the partial {}", prefix.display()))?;
    }

    let started = Instant::now();
    crate::run(Command::new("./configure").args(configure_args(&prefix)).current_dir(&source_dir))
        .with_context(|| format!("configuring FFmpeg {version} (see {}/ffbuild/config.log)", source_dir.display()))?;
    crate::run(Command::new("make").arg("-j2").current_dir(&source_dir))
        .with_context(|| format!("building FFmpeg {version}"))?;
    crate::run(Command::new("make").arg("install").current_dir(&source_dir))
        .with_context(|| format!("installing FFmpeg {version} into {}", prefix.display()))?;
    let elapsed = started.elapsed();

    let pc = prefix.join("lib/pkgconfig/libavutil.pc");
    if !pc.is_file() {
        bail!("FFmpeg {version} was installed but {} is missing", pc.display());
    }
    fs::write(&stamp, format!("{version}\n")).with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!("xtask: FFmpeg {version} built and installed in {:.0} s: {}", elapsed.as_secs_f64(), prefix.display());
    // The sources and object files are not needed any more.
    let _ = fs::remove_dir_all(&work);
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_suites_of_the_majors_it_builds() {
        assert_eq!(debian_source(7).unwrap(), ("trixie", "ffmpeg"));
        assert!(debian_source(6).unwrap_err().to_string().contains("FFmpeg 6"));
    }

    #[test]
    fn configures_a_shared_decode_only_build_into_the_prefix() {
        let args = configure_args(Path::new("/opt/ff7"));
        for flag in ["--enable-shared", "--disable-static", "--disable-encoders", "--enable-rpath"] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing from {args:?}");
        }
        assert_eq!(args.last().map(String::as_str), Some("--prefix=/opt/ff7"));
    }
}
