//! The demo dataset and the `gen-data` corpora.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

/// Seed of the demo dataset: the same files on every machine.
const DEMO_SEED: u64 = 2024;
const DEMO_CLASSES: usize = 10;

/// `$SPDL_DEMO_DIR`, else `$XDG_CACHE_HOME/spdl-rs/demo-v1`, else `~/.cache/spdl-rs/demo-v1`.
pub fn default_demo_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPDL_DEMO_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("spdl-rs").join("demo-v1")
}

/// Writes the demo dataset unless it is already complete (the generator skips files that exist).
pub fn ensure_demo_dataset(dir: &Path, images: usize, verbose: bool) -> Result<()> {
    let t = Instant::now();
    let paths = spdl_io::synth::write_dataset(dir, images, DEMO_SEED, DEMO_CLASSES)
        .with_context(|| format!("cannot write the demo dataset in {}", dir.display()))?;
    if verbose {
        eprintln!(
            "demo dataset: {} JPEGs in {} ({:.1} s to check/make)",
            paths.len(),
            dir.display(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `spdl gen-data`.
pub fn gen_data(dir: &Path, images: usize, classes: usize, seed: u64, corrupt: bool) -> Result<()> {
    let t = Instant::now();
    let paths = spdl_io::synth::write_dataset(dir, images, seed, classes)
        .with_context(|| format!("cannot write images in {}", dir.display()))?;
    eprintln!("{} images in {} ({:.1} s)", paths.len(), dir.display(), t.elapsed().as_secs_f64());
    if corrupt {
        let t = Instant::now();
        let out = dir.join("corrupt");
        let summary = crate::corrupt::write_corpus(&out, seed)
            .with_context(|| format!("cannot write the broken-media corpus in {}", out.display()))?;
        eprintln!(
            "{} broken media files ({} formats: {}) in {}, listed in {} ({:.1} s)",
            summary.files,
            summary.formats.len(),
            summary.formats.join(", "),
            out.display(),
            summary.manifest.display(),
            t.elapsed().as_secs_f64()
        );
        for s in &summary.skipped {
            eprintln!("skipped {s}");
        }
    }
    Ok(())
}
