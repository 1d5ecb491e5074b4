//! Computes the build id of the FFmpeg backend boundary (`media::abi::build_id`): the crate's version, the
//! compiler's, the target and a digest of the sources whose types cross the boundary (this crate's and
//! spdl-buffer's). A backend and the library that loads it share Rust types, which is sound only when both
//! come from one build; the id tells.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let roots = [manifest.join("src"), manifest.join("../spdl-buffer/src")];
    let mut files = Vec::new();
    for r in &roots {
        println!("cargo:rerun-if-changed={}", r.display());
        sources(r, &mut files);
    }
    files.sort();
    let mut h = DefaultHasher::new();
    for f in &files {
        f.strip_prefix(&manifest).unwrap_or(f).hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let id = format!(
        "spdl-io {} / {} / {} / {:016x}",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        version,
        std::env::var("TARGET").unwrap_or_default(),
        h.finish()
    );
    println!("cargo:rustc-env=SPDL_IO_BUILD_ID={id}");

    // The libjpeg-turbo that turbojpeg-sys built (its headers, passed on through `links = "turbojpeg"`).
    let mut turbo = String::new();
    if let Ok(include) = std::env::var("DEP_TURBOJPEG_INCLUDE") {
        for dir in include.split(',') {
            let Ok(text) = std::fs::read_to_string(Path::new(dir).join("jconfig.h")) else { continue };
            if let Some(v) = text.lines().find_map(|l| l.strip_prefix("#define LIBJPEG_TURBO_VERSION ")) {
                turbo = v.trim().to_owned();
                break;
            }
        }
    }
    println!("cargo:rustc-env=SPDL_IO_TURBOJPEG_VERSION={turbo}");
}
