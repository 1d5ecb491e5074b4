//! Debian source packages fetched with `apt-get source` from the mirror the system already uses, with private
//! apt lists so that the system's stay untouched: the free-threaded CPython ([`crate::free_threaded`]) and the
//! FFmpeg releases of the extra backends ([`crate::ffmpeg_source`]) are built from them.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;

/// Downloads Debian source package `package` from `suite` into `work` with private apt lists (the system's
/// own apt configuration is left alone) and unpacks its upstream `{package}_*.orig.tar.xz` into `work/src`;
/// returns that directory.
pub(crate) fn fetch_debian_source(work: &Path, suite: &str, package: &str) -> Result<PathBuf> {
    let mirror = debian_mirror().context("finding the Debian mirror this system uses")?;
    let keyring = Path::new("/usr/share/keyrings/debian-archive-keyring.gpg");
    let sources = work.join("sources.list");
    fs::write(&sources, format!("deb-src [signed-by={}] {mirror} {suite} main\n", keyring.display()))
        .with_context(|| format!("writing {}", sources.display()))?;
    let lists = work.join("lists");
    let cache = work.join("cache");
    let parts = work.join("sources.list.d");
    for dir in [lists.join("partial"), cache.join("archives/partial"), parts.clone()] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", sources.display()))
            .arg("-o")
            .arg(format!("Dir::Etc::SourceParts={}", parts.display()))
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", lists.display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", cache.display()))
            .args(args)
            .current_dir(work);
        cmd
    };
    run(&mut apt(&["update"])).with_context(|| format!("apt-get update on the private {suite} deb-src list"))?;
    run(&mut apt(&["source", "--download-only", package])).with_context(|| format!("apt-get source {package}"))?;

    let tarball = fs::read_dir(work)
        .with_context(|| format!("listing {}", work.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".orig.tar.xz"))
        })
        .with_context(|| format!("no {package}_*.orig.tar.xz in {}", work.display()))?;
    let src = work.join("src");
    fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
    run(Command::new("tar").arg("-xJf").arg(&tarball).arg("-C").arg(&src).arg("--strip-components=1"))
        .with_context(|| format!("unpacking {}", tarball.display()))?;
    Ok(src)
}

/// The URI of the main Debian archive in the system's apt sources (deb822 `.sources` files or the one-line
/// `sources.list` format), so that the build uses whatever mirror the machine is set up with.
fn debian_mirror() -> Result<String> {
    let mut texts = Vec::new();
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().and_then(OsStr::to_str).is_some_and(|e| e == "sources" || e == "list") {
                texts.push(fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    texts.push(fs::read_to_string("/etc/apt/sources.list").unwrap_or_default());
    let is_archive = |uri: &str| uri.trim_end_matches('/').ends_with("/debian");
    for text in &texts {
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("URIs:") {
                if let Some(uri) = rest.split_whitespace().find(|u| is_archive(u)) {
                    return Ok(uri.trim_end_matches('/').to_string());
                }
            } else if line.starts_with("deb ") || line.starts_with("deb-src ") {
                // `deb [options] URI suite components`
                if let Some(uri) = line.split_whitespace().find(|w| w.contains("://") && is_archive(w)) {
                    return Ok(uri.trim_end_matches('/').to_string());
                }
            }
        }
    }
    bail!("no Debian archive URI (…/debian) in /etc/apt/sources.list or /etc/apt/sources.list.d")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_mirror_or_says_why() {
        // On Debian this names the archive; elsewhere it must fail with a message, not panic.
        match debian_mirror() {
            Ok(uri) => assert!(uri.contains("://") && uri.ends_with("/debian"), "{uri}"),
            Err(e) => assert!(e.to_string().contains("no Debian archive URI")),
        }
    }
}
