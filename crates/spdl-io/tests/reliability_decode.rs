//! Bad input, one file at a time: every file of the broken-media corpus (`spdl_io::corrupt`, also written by
//! `spdl gen-data --corrupt`; ~900 files in 16 formats with the `ffmpeg` command installed) through every
//! decode entry point of spdl-io, each call under a watchdog.
//!
//! Asserted for every (file, entry point): no panic escapes, the call returns (a hang fails the test with the
//! file's name), an error names the file and says why; files the corpus marks `error` are rejected by every
//! decoder of their family, files marked `ok` decode; good neighbours in a batch come out bit-identical to
//! a batch without the bad file.

#![cfg(all(feature = "corrupt", feature = "audio"))]

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::MediaInput;
use spdl_io::audio::{AudioBatchOptions, AudioOptions, ChannelSelect, decode_audio, decode_audio_batch, probe};
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Transform, decode_image, image_info, load_image};

/// Seed of the corpus.
const SEED: u64 = 8;

/// One file of the broken-media corpus, as `manifest.jsonl` lists it.
#[derive(Debug, Clone)]
struct Entry {
    /// Relative to the corpus directory (`png/trunc-0000100.png`).
    file: String,
    /// Absolute path.
    path: PathBuf,
    format: String,
    /// `image`, `audio` or `video`.
    family: String,
    kind: String,
    name: String,
    detail: String,
    /// `error`, `ok` or `any`.
    expect: String,
}

/// Writes the corpus into `dir` and returns its entries.
fn corpus(dir: &Path) -> Vec<Entry> {
    let summary = spdl_io::corrupt::write_corpus(dir, SEED).expect("write the corpus");
    for s in &summary.skipped {
        println!("skipped {s}");
    }
    let text = std::fs::read_to_string(&summary.manifest).expect("read manifest.jsonl");
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("manifest line is JSON");
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_else(|| panic!("{k} in {line}")).to_owned();
            Entry {
                path: dir.join(s("file")),
                file: s("file"),
                format: s("format"),
                family: s("family"),
                kind: s("kind"),
                name: s("name"),
                detail: s("detail"),
                expect: s("expect"),
            }
        })
        .collect()
}

/// Peak resident set size of this process, KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// Longest any one file may take through all entry points (a loaded 2-core debug build decodes each in
/// well under a second; a hang is what this catches).
const PER_FILE: Duration = Duration::from_secs(120);

#[derive(Debug)]
enum Outcome {
    Ok,
    Err(String),
    Panic(String),
}

/// One call of one entry point on one file.
#[derive(Debug)]
struct Call {
    entry_point: &'static str,
    /// Which decoders the entry point belongs to: "image", "audio"; "image-header" / "audio-header" for
    /// header-only calls.
    decoder: &'static str,
    outcome: Outcome,
    /// What an error must name: the path, or the name given with the bytes.
    name: String,
    took: Duration,
}

/// Runs `f`, catching a panic.
fn call(entry_point: &'static str, decoder: &'static str, name: &str, f: impl FnOnce() -> Result<(), String>) -> Call {
    let t = Instant::now();
    let outcome = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => Outcome::Err(e),
        Err(p) => Outcome::Panic(spdl_report::panic_message(&*p)),
    };
    Call { entry_point, decoder, outcome, name: name.to_owned(), took: t.elapsed() }
}

/// Good neighbours for the batch calls, and their reference decodes.
struct Neighbours {
    jpeg: Vec<u8>,
    png: Vec<u8>,
    wav: Vec<u8>,
    /// Slots 0 and 1 of `[jpeg, png]` decoded alone.
    image_slots: [Vec<u8>; 2],
    /// Slots 0 and 1 of `[wav, wav]` decoded alone.
    audio_slots: [Vec<u8>; 2],
}

fn image_decoder(strict: bool) -> BatchDecoder {
    BatchDecoder::new(
        BatchOptions { transform: Transform::resize(40, 30), strict, threads: Some(1), ..BatchOptions::default() },
        system_allocator(),
    )
    .expect("batch options")
}

fn audio_batch_opts() -> AudioBatchOptions {
    AudioBatchOptions {
        audio: AudioOptions { channels: ChannelSelect::Mono, sample_rate: Some(16_000), ..AudioOptions::default() },
        num_frames: 4000,
        strict: false,
        threads: Some(1),
    }
}

fn slots(bytes: &[u8], n: usize) -> Vec<Vec<u8>> {
    let size = bytes.len() / n;
    bytes.chunks(size).map(<[u8]>::to_vec).collect()
}

impl Neighbours {
    fn new(entries: &[Entry]) -> Neighbours {
        let read = |file: &str| {
            let e = entries.iter().find(|e| e.file == file).unwrap_or_else(|| panic!("{file} in the corpus"));
            std::fs::read(&e.path).expect("read seed")
        };
        let (jpeg, png, wav) = (read("jpeg/seed.jpg"), read("png/seed.png"), read("wav/seed.wav"));
        let out = image_decoder(true).decode(&[("a", &jpeg), ("b", &png)]).expect("good images decode");
        let s = slots(out.buffer.as_bytes(), 2);
        let inputs = [MediaInput::bytes(&wav, "a.wav"), MediaInput::bytes(&wav, "b.wav")];
        let audio = decode_audio_batch(&inputs, &audio_batch_opts(), &system_allocator()).expect("good audio");
        assert!(audio.failures.is_empty());
        let a = slots(audio.buffer.as_bytes(), 2);
        Neighbours {
            image_slots: [s[0].clone(), s[1].clone()],
            audio_slots: [a[0].clone(), a[1].clone()],
            jpeg,
            png,
            wav,
        }
    }
}

/// Every entry point on one file.
fn check(e: &Entry, nb: &Neighbours, alloc: &SharedAllocator) -> Vec<Call> {
    let bytes = std::fs::read(&e.path).expect("read corpus file");
    let name = e.file.as_str();
    let path = e.path.display().to_string();
    let img = ImageOptions::default();
    let mut calls = vec![
        call("image_info", "image-header", name, || {
            image_info(&bytes, name).map(drop).map_err(|x| spdl_report::error_chain(&x))
        }),
        call("decode_image", "image", name, || {
            decode_image(&bytes, name, &img, &Transform::None, alloc)
                .map(drop)
                .map_err(|x| spdl_report::error_chain(&x))
        }),
        call("decode_image+resize", "image", name, || {
            decode_image(&bytes, name, &img, &Transform::resize(32, 24), alloc)
                .map(drop)
                .map_err(|x| spdl_report::error_chain(&x))
        }),
        call("load_image", "image", &path, || {
            load_image(&e.path, &img, &Transform::imagenet_eval(), alloc)
                .map(drop)
                .map_err(|x| spdl_report::error_chain(&x))
        }),
        call("BatchDecoder::decode", "image", name, || {
            let items =
                [("good-a.jpg", nb.jpeg.as_slice()), (name, bytes.as_slice()), ("good-b.png", nb.png.as_slice())];
            let out = image_decoder(false).decode(&items).map_err(|x| format!("non-strict batch failed: {x}"))?;
            let s = slots(out.buffer.as_bytes(), 3);
            assert!(s[0] == nb.image_slots[0] && s[2] == nb.image_slots[1], "{name}: a good neighbour changed");
            match out.failures.as_slice() {
                [] => Ok(()),
                [f] if f.batch_item().map(|(i, _)| i) == Some(1) && f.item() == Some(name) => {
                    assert!(s[1].iter().all(|&x| x == 0), "{name}: a failed slot is not zero");
                    Err(cause(f))
                }
                other => panic!("{name}: unexpected failures {other:?}"),
            }
        }),
        call("BatchDecoder::decode(strict)", "image", name, || {
            image_decoder(true).decode(&[(name, &bytes)]).map(drop).map_err(|x| spdl_report::error_chain(&x))
        }),
        call("BatchDecoder::load", "image", &path, || {
            let out = image_decoder(false).load(&[&e.path]).map_err(|x| format!("non-strict batch failed: {x}"))?;
            match out.failures.first() {
                None => Ok(()),
                Some(f) => Err(cause(f)),
            }
        }),
        call("probe", "audio-header", &path, || {
            probe(e.path.as_path()).map(drop).map_err(|x| spdl_report::error_chain(&x))
        }),
        call("decode_audio(path)", "audio", &path, || {
            decode_audio(e.path.as_path(), &AudioOptions::default(), alloc)
                .map(drop)
                .map_err(|x| spdl_report::error_chain(&x))
        }),
        call("decode_audio(bytes)", "audio", name, || {
            let opts =
                AudioOptions { channels: ChannelSelect::Mono, sample_rate: Some(8000), ..AudioOptions::default() };
            decode_audio(MediaInput::bytes(&bytes, name), &opts, alloc)
                .map(drop)
                .map_err(|x| spdl_report::error_chain(&x))
        }),
        call("decode_audio_batch", "audio", name, || {
            let inputs = [
                MediaInput::bytes(&nb.wav, "good-a.wav"),
                MediaInput::bytes(&bytes, name),
                MediaInput::bytes(&nb.wav, "good-b.wav"),
            ];
            let out = decode_audio_batch(&inputs, &audio_batch_opts(), alloc).map_err(|x| format!("batch: {x}"))?;
            let s = slots(out.buffer.as_bytes(), 3);
            assert!(s[0] == nb.audio_slots[0] && s[2] == nb.audio_slots[1], "{name}: a good neighbour changed");
            match out.failures.as_slice() {
                [] => Ok(()),
                [f] if f.batch_item().map(|(i, _)| i) == Some(1) && f.item() == Some(name) => Err(cause(f)),
                other => panic!("{name}: unexpected failures {other:?}"),
            }
        }),
    ];
    // The corpus's expectations are about the decoders of the file's own family.
    for c in &mut calls {
        c.decoder = match (c.decoder, e.family.as_str()) {
            ("image", "image") | ("audio", "audio" | "video") => "own",
            ("image-header", "image") | ("audio-header", "audio" | "video") => "own-header",
            ("image", _) => "not-image",
            ("audio", _) => "not-audio",
            // `probe` describes images too; `image_info` of a non-image is judged with the image decoders.
            ("image-header", _) => "not-image",
            _ => "other-header",
        };
    }
    calls
}

/// Why a batch item failed (its own error, without the batch position).
fn cause(f: &spdl_io::Error) -> String {
    f.batch_item().map_or_else(|| f.to_string(), |(_, e)| e.to_string())
}

/// Checks one call against the file's expectation; returns a violation, if any.
fn judge(e: &Entry, c: &Call) -> Option<String> {
    let at = format!("{} through {}", e.file, c.entry_point);
    let must_fail_anywhere = matches!(e.kind.as_str(), "empty") || e.name == "zero-all" || e.name == "random-1k";
    match &c.outcome {
        Outcome::Panic(msg) => Some(format!("{at}: PANIC {msg}")),
        Outcome::Err(msg) => {
            if !msg.contains(&c.name) {
                return Some(format!("{at}: the error does not name the file ({:?}): {msg}", c.name));
            }
            if msg.replace(&c.name, "").trim_matches(|ch: char| !ch.is_alphanumeric()).len() < 8 {
                return Some(format!("{at}: the error gives no cause: {msg}"));
            }
            let expected_ok = e.expect == "ok" && matches!(c.decoder, "own" | "own-header");
            expected_ok.then(|| format!("{at}: an intact file was rejected: {msg}"))
        }
        Outcome::Ok => {
            let expected_err =
                (e.expect == "error" && c.decoder == "own") || must_fail_anywhere || c.decoder == "not-image";
            expected_err.then(|| format!("{at}: decoded, but the file is {} ({})", e.kind, e.detail))
        }
    }
}

#[test]
fn every_corrupt_file_through_every_decode_entry_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let entries = corpus(dir.path());
    let formats: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.format.as_str()).collect();
    println!("corpus: {} files, {} formats: {formats:?}", entries.len(), formats.len());
    if formats.contains("mp4") {
        assert!(entries.len() >= 500, "{} files", entries.len());
    } else {
        println!("ffmpeg is not installed: only images and WAV are in the corpus");
    }

    // Every file runs on one worker thread; this thread watches it, so a hang names the file.
    let nb = Neighbours::new(&entries);
    let current = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<(usize, Vec<Call>)>();
    let worker = {
        let entries = entries.clone();
        let current = Arc::clone(&current);
        std::thread::spawn(move || {
            let alloc = system_allocator();
            for (i, e) in entries.iter().enumerate() {
                current.store(i, Ordering::SeqCst);
                if tx.send((i, check(e, &nb, &alloc))).is_err() {
                    return;
                }
            }
        })
    };
    let mut results: Vec<Vec<Call>> = Vec::with_capacity(entries.len());
    for _ in 0..entries.len() {
        match rx.recv_timeout(PER_FILE) {
            Ok((_, calls)) => results.push(calls),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let e = &entries[current.load(Ordering::SeqCst)];
                panic!("HANG: {} ({}: {}) still decoding after {PER_FILE:?}", e.file, e.kind, e.detail);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let e = &entries[current.load(Ordering::SeqCst)];
                match worker.join() {
                    Err(p) => std::panic::resume_unwind(p),
                    Ok(()) => panic!("the worker stopped at {}", e.file),
                }
            }
        }
    }
    worker.join().expect("worker");

    // Figures.
    let calls: usize = results.iter().map(Vec::len).sum();
    let slowest =
        results.iter().zip(&entries).flat_map(|(cs, e)| cs.iter().map(move |c| (c.took, e, c))).max_by_key(|x| x.0);
    let mut table: BTreeMap<(String, &str), (usize, usize)> = BTreeMap::new();
    let mut contained_panics = Vec::new();
    for (cs, e) in results.iter().zip(&entries) {
        for c in cs.iter().filter(|c| c.decoder == "own") {
            let row = table.entry((format!("{:<6} {:<16}", e.family, e.kind), c.entry_point)).or_default();
            match &c.outcome {
                Outcome::Ok => row.0 += 1,
                _ => row.1 += 1,
            }
        }
        for c in cs {
            if let Outcome::Err(m) = &c.outcome
                && m.contains("panicked")
            {
                contained_panics.push(format!("{} through {}: {m}", e.file, c.entry_point));
            }
        }
    }
    println!("{} files x {} entry points = {calls} calls", entries.len(), results.first().map_or(0, Vec::len));
    println!("own-family decoders, per kind and entry point: decoded / rejected");
    for ((kind, ep), (ok, err)) in &table {
        println!("  {kind} {ep:<30} {ok:>4} / {err:>4}");
    }
    println!("header and bomb files, own-family decoders (first entry point):");
    for (cs, e) in results.iter().zip(&entries).filter(|(_, e)| matches!(e.kind.as_str(), "header" | "bomb")) {
        let total: Duration = cs.iter().map(|c| c.took).sum();
        if let Some(c) = cs.iter().find(|c| c.decoder == "own") {
            let what = match &c.outcome {
                Outcome::Ok => "decoded".to_owned(),
                Outcome::Err(m) => format!("rejected: {}", m.replace(&c.name, "<file>")),
                Outcome::Panic(m) => format!("PANIC {m}"),
            };
            println!("  {:<40} [{:>6.2} s] {what}", e.file, total.as_secs_f64());
        }
    }
    if let Some((took, e, c)) = slowest {
        println!("slowest call: {} through {} in {took:?}", e.file, c.entry_point);
    }
    let mut slow_files: Vec<(Duration, &Entry, &Vec<Call>)> =
        results.iter().zip(&entries).map(|(cs, e)| (cs.iter().map(|c| c.took).sum(), e, cs)).collect();
    slow_files.sort_by_key(|x| std::cmp::Reverse(x.0));
    for (total, e, cs) in slow_files.iter().take(5) {
        let per: Vec<String> = cs.iter().map(|c| format!("{} {:.2}", c.entry_point, c.took.as_secs_f64())).collect();
        println!("slow file {} ({:.1} s): {}", e.file, total.as_secs_f64(), per.join(", "));
    }
    for (label, decoder) in [("image decoders", "not-image"), ("audio decoders", "not-audio")] {
        let accepted: Vec<&str> = results
            .iter()
            .zip(&entries)
            .filter(|(cs, _)| cs.iter().any(|c| c.decoder == decoder && matches!(c.outcome, Outcome::Ok)))
            .map(|(_, e)| e.file.as_str())
            .collect();
        println!("{label} that accepted a file of another family: {} {accepted:?}", accepted.len());
    }
    println!("decoder panics caught inside spdl-io and reported as errors: {}", contained_panics.len());
    for p in &contained_panics {
        println!("  {p}");
    }
    let peak = peak_rss_kib();
    println!("peak RSS {} MiB", peak / 1024);

    let violations: Vec<String> =
        results.iter().zip(&entries).flat_map(|(cs, e)| cs.iter().filter_map(move |c| judge(e, c))).collect();
    for v in violations.iter().take(100) {
        println!("VIOLATION {v}");
    }
    assert!(violations.is_empty(), "{} violations (first: {})", violations.len(), violations[0]);
    // Bombs are refused from their headers: nothing near the claimed sizes is ever allocated.
    assert!(peak < 2 * 1024 * 1024, "peak RSS {} MiB", peak / 1024);
}
