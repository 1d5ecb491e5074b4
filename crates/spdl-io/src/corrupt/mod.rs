//! A corpus of broken media for reliability tests (feature `corrupt`): what `spdl gen-data DIR --corrupt`
//! and `cargo xtask gen-data --corrupt` write, and what the decoder reliability tests of this crate read.
//!
//! From one intact seed per format (images drawn by [`crate::synth`]; a WAV written here; FLAC, MP3,
//! Ogg Vorbis, AAC, M4A, MP4, MKV and WebM encoded from it by the `ffmpeg` command when it is installed), the
//! generator writes files truncated at many offsets, with flipped and zeroed bytes, empty, under a wrong
//! extension, random garbage, with trailing junk, with absurd header fields (dimensions, sample rates,
//! channel counts, durations, table sizes, chunk lengths: see `headers.rs`) and decompression bombs.
//!
//! `DIR/manifest.jsonl` lists every file, one JSON object per line:
//! `{"file": "png/trunc-0000100.png", "format": "png", "family": "image", "kind": "truncated",
//! "name": "trunc-0000100", "detail": "first 100 of 13210 bytes", "expect": "error", "bytes": 100}`.
//! `expect` is what a decoder of the file's family must do: `error` (reject it, naming the file), `ok`
//! (decode it: the bytes are intact, only the name or the size is unusual) or `any` (either, but return).
//! The same seed writes the same files (the compressed seeds depend on the installed ffmpeg).

use std::path::{Path, PathBuf};

use serde::Serialize;

mod headers;
mod seeds;

/// Why the corpus could not be written. The seeds that need the `ffmpeg` command are never a cause: when
/// it is missing or fails, their formats are left out and listed in [`Summary::skipped`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorpusError {
    /// Creating a directory or writing a file failed.
    #[error("cannot {what} {path}")]
    Io {
        /// `"create"` or `"write"`.
        what: &'static str,
        /// The directory or file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding a seed image failed.
    #[error("cannot encode the {format} seed")]
    Seed {
        /// The seed's format.
        format: &'static str,
        /// Why.
        #[source]
        source: crate::Error,
    },
    /// Writing a manifest line failed.
    #[error("cannot write a manifest line")]
    Manifest(#[from] serde_json::Error),
}

/// Result of the corpus generator.
pub type Result<T, E = CorpusError> = std::result::Result<T, E>;

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| CorpusError::Io { what: "create", path: path.to_owned(), source })
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| CorpusError::Io { what: "write", path: path.to_owned(), source })
}

/// Which decoders read a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `spdl_io::image`.
    Image,
    /// `spdl_io::audio` (feature `audio`).
    Audio,
    /// Video containers (their audio track is read by `spdl_io::audio`, the video by `spdl_io::video`).
    Video,
}

/// What a decoder of the file's family must do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    /// Return an error that names the file.
    Error,
    /// Decode it.
    Ok,
    /// Decode it or return an error; never panic, hang or allocate without bound.
    Any,
}

/// One corruption of a seed, before it is written.
#[derive(Debug)]
pub(crate) struct Variant {
    kind: &'static str,
    name: String,
    detail: String,
    bytes: Vec<u8>,
    expect: Expect,
    /// Extension override (wrong-extension variants).
    ext: Option<&'static str>,
}

impl Variant {
    fn new(kind: &'static str, name: &str, detail: &str, bytes: Vec<u8>, expect: Expect) -> Variant {
        Variant { kind, name: name.to_owned(), detail: detail.to_owned(), bytes, expect, ext: None }
    }
}

/// One line of `manifest.jsonl`.
#[derive(Debug, Serialize)]
struct Entry<'a> {
    file: String,
    format: &'a str,
    family: Family,
    kind: &'a str,
    name: &'a str,
    detail: &'a str,
    expect: Expect,
    bytes: usize,
}

/// What [`write_corpus`] wrote.
#[derive(Debug)]
pub struct Summary {
    /// Files written (seeds included).
    pub files: usize,
    /// Formats with a seed.
    pub formats: Vec<&'static str>,
    /// Formats left out, with the reason (no ffmpeg, an encoder missing).
    pub skipped: Vec<String>,
    /// The manifest.
    pub manifest: PathBuf,
}

/// SplitMix64: a tiny portable PRNG, so the same seed corrupts the same bytes everywhere.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, salt: &str) -> Rng {
        let h = salt.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3));
        Rng(seed ^ h)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// A non-zero mask, so that every flip changes its byte.
    fn mask(&mut self) -> u8 {
        (self.next() % 255) as u8 + 1
    }
}

/// Writes the corpus into `dir` (created if needed) and its manifest; returns what was written.
pub fn write_corpus(dir: &Path, seed: u64) -> Result<Summary> {
    create_dir(dir)?;
    let mut all = seeds::images(seed)?;
    let wav = seeds::wav();
    let mut skipped = Vec::new();
    let compressed = if seeds::ffmpeg_available() {
        let work = dir.join(".work");
        create_dir(&work)?;
        let wav_path = work.join("seed.wav");
        write(&wav_path, &wav.bytes)?;
        let (made, failed) = seeds::compressed(&wav_path, &work);
        skipped.extend(failed);
        // Best effort: only scratch files are left if this fails.
        let _ = std::fs::remove_dir_all(&work);
        made
    } else {
        skipped.push("flac, mp3, ogg, aac, m4a, mp4, mkv, webm: the `ffmpeg` command is not installed".into());
        Vec::new()
    };
    all.push(wav);
    all.extend(compressed);

    let manifest_path = dir.join("manifest.jsonl");
    let mut manifest = String::new();
    let mut files = 0;
    for s in &all {
        let sub = dir.join(s.format);
        create_dir(&sub)?;
        let mut variants = vec![Variant::new("seed", "seed", "the intact file", s.bytes.clone(), Expect::Ok)];
        variants.extend(generic(s, seed));
        variants.extend(headers::variants(s.format, &s.bytes));
        if s.format == "png" {
            variants.extend(headers::bombs());
        }
        for v in &variants {
            let ext = v.ext.unwrap_or(s.ext);
            let rel = format!("{}/{}.{ext}", s.format, v.name);
            let path = dir.join(&rel);
            write(&path, &v.bytes)?;
            let entry = Entry {
                file: rel,
                format: s.format,
                family: s.family,
                kind: v.kind,
                name: &v.name,
                detail: &v.detail,
                expect: v.expect,
                bytes: v.bytes.len(),
            };
            manifest.push_str(&serde_json::to_string(&entry)?);
            manifest.push('\n');
            files += 1;
        }
    }
    write(&manifest_path, manifest)?;
    Ok(Summary { files, formats: all.iter().map(|s| s.format).collect(), skipped, manifest: manifest_path })
}

/// Offsets to cut a file of `len` bytes at: every small offset where headers live, then fractions.
fn cut_points(len: usize) -> Vec<usize> {
    let small = [1, 2, 3, 4, 6, 8, 11, 12, 16, 24, 32, 44, 48, 64, 100, 128, 200, 256, 512, 1024];
    let fractions = [1, 2, 3, 4, 5, 6, 7]; // eighths
    let mut cuts: Vec<usize> = small.iter().copied().filter(|&c| c < len).collect();
    cuts.extend(fractions.iter().map(|&k| len * k / 8));
    cuts.extend([len.saturating_sub(16), len.saturating_sub(2), len.saturating_sub(1)]);
    cuts.retain(|&c| c > 0 && c < len);
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Format-agnostic corruptions of one seed.
fn generic(s: &seeds::Seed, seed: u64) -> Vec<Variant> {
    let b = &s.bytes;
    let len = b.len();
    let image = s.family == Family::Image;
    let mut rng = Rng::new(seed, s.format);
    let mut v = Vec::new();

    for cut in cut_points(len) {
        // A cut image loses pixel data (or its end marker): decoders must say so. Near the end only a
        // trailer may be lost (GIF's ';', PNG's IEND). Cut audio yields the frames before the cut.
        let expect = if image && cut * 10 <= len * 9 { Expect::Error } else { Expect::Any };
        let detail = format!("first {cut} of {len} bytes");
        v.push(Variant::new(
            "truncated",
            &format!("trunc-{cut:07}"),
            &detail,
            b.get(..cut).unwrap_or_default().to_vec(),
            expect,
        ));
    }

    let mut flip = |name: &str, detail: &str, positions: Vec<usize>, rng: &mut Rng| {
        let mut out = b.clone();
        for p in positions {
            let m = rng.mask();
            if let Some(x) = out.get_mut(p) {
                *x ^= m;
            }
        }
        v.push(Variant::new("flipped", name, detail, out, Expect::Any));
    };
    let anywhere = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.below(len)).collect::<Vec<_>>();
    let p = anywhere(&mut rng, 1);
    flip("flip-1", "1 random byte changed", p, &mut rng);
    let p = anywhere(&mut rng, 1);
    flip("flip-1b", "another random byte changed", p, &mut rng);
    let p = anywhere(&mut rng, 8);
    flip("flip-8", "8 random bytes changed", p, &mut rng);
    let p = anywhere(&mut rng, 64);
    flip("flip-64", "64 random bytes changed", p, &mut rng);
    let p = (0..1).map(|_| rng.below(len.min(64))).collect();
    flip("flip-header-1", "1 byte of the first 64 changed", p, &mut rng);
    let p = (0..4).map(|_| rng.below(len.min(256))).collect();
    flip("flip-header-4", "4 bytes of the first 256 changed", p, &mut rng);
    let p = (0..8).map(|_| len - len / 4 + rng.below(len / 4)).collect();
    flip("flip-tail-8", "8 bytes of the last quarter changed", p, &mut rng);
    let p = (0..len).step_by(101).collect();
    flip("flip-every-101", "every 101st byte changed", p, &mut rng);

    let zeroed = |from: usize, n: usize| {
        let mut out = b.clone();
        let end = from.saturating_add(n).min(len);
        if let Some(s) = out.get_mut(from.min(end)..end) {
            s.fill(0);
        }
        out
    };
    v.push(Variant::new("zeroed", "zero-16-at-8", "16 bytes zeroed at offset 8", zeroed(8, 16), Expect::Any));
    v.push(Variant::new("zeroed", "zero-256-mid", "256 bytes zeroed in the middle", zeroed(len / 2, 256), Expect::Any));
    v.push(Variant::new("zeroed", "zero-second-half", "the second half zeroed", zeroed(len / 2, len), Expect::Any));
    v.push(Variant::new("zeroed", "zero-all", &format!("{len} zero bytes"), vec![0; len], Expect::Error));
    v.push(Variant::new("empty", "empty", "0 bytes", Vec::new(), Expect::Error));

    // Intact bytes under another name: image decoders go by magic bytes, never the extension.
    let ok_if_image = if image { Expect::Ok } else { Expect::Any };
    let others: [&'static str; 2] = match s.ext {
        "png" => ["jpg", "wav"],
        "wav" => ["png", "jpg"],
        _ => ["png", "wav"],
    };
    for other in others {
        let detail = format!("intact {} named .{other}", s.format);
        let mut w = Variant::new("wrong-extension", &format!("as-{other}"), &detail, b.clone(), ok_if_image);
        w.ext = Some(other);
        v.push(w);
    }

    let garbage = rng.bytes(1024);
    v.push(Variant::new("garbage", "random-1k", "1024 random bytes", garbage, Expect::Error));
    let mut prefixed = b.get(..len.min(16)).unwrap_or_default().to_vec();
    prefixed.extend(rng.bytes(2048));
    let prefixed_expect = if image { Expect::Error } else { Expect::Any };
    v.push(Variant::new(
        "garbage",
        "magic-then-random",
        "the first 16 bytes, then 2048 random bytes",
        prefixed,
        prefixed_expect,
    ));
    let mut junk = b.clone();
    junk.extend(rng.bytes(4096));
    v.push(Variant::new("trailing", "junk-4k", "intact, then 4096 random bytes", junk, Expect::Any));
    let mut twice = b.clone();
    twice.extend_from_slice(b);
    v.push(Variant::new("trailing", "doubled", "the file twice in a row", twice, Expect::Any));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_points_stay_inside_the_file() {
        assert!(cut_points(1).is_empty());
        let c = cut_points(10);
        assert_eq!(c, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let c = cut_points(100_000);
        assert!(c.len() >= 25 && c.iter().all(|&x| x > 0 && x < 100_000));
    }

    #[test]
    fn the_corpus_is_deterministic_and_large() {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        let sa = write_corpus(a.path(), 7).expect("corpus");
        let sb = write_corpus(b.path(), 7).expect("corpus");
        assert_eq!(sa.files, sb.files);
        // Images and WAV alone (no ffmpeg) already give a few hundred files.
        assert!(sa.files >= 300, "{} files", sa.files);
        let ma = std::fs::read_to_string(&sa.manifest).expect("manifest");
        for line in ma.lines().filter(|l| l.contains("\"family\":\"image\"") || l.contains("\"format\":\"wav\"")) {
            let file = line.split("\"file\":\"").nth(1).and_then(|r| r.split('"').next()).expect("file field");
            let (x, y) = (std::fs::read(a.path().join(file)), std::fs::read(b.path().join(file)));
            assert_eq!(x.expect("a"), y.expect("b"), "{file}");
        }
    }
}
