//! Bad input in a full pipeline: the broken-media corpus mixed with good files, through spdl-exec
//! pipelines (read → batch → decode) and through `spdl bench`.
//!
//! Asserted: every input comes out exactly once, delivered or reported with its path and cause (none lost,
//! none duplicated); every good file is delivered bit-identical to a run without the bad files; the
//! pipeline ends normally (no panic, no hang: each run is under a watchdog).

mod reliability_util;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use reliability_util::{Entry, gen_data, watchdog};
use spdl_buffer::system_allocator;
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};
use spdl_io::audio::{AudioOptions, ChannelSelect, decode_audio};
use spdl_io::image::{BatchDecoder, BatchOptions, Transform};

/// Good images generated next to the corpus.
const GOOD_IMAGES: usize = 48;
const CLASSES: usize = 4;

/// The generated data, shared by the tests of this binary (made once).
struct Data {
    _dir: tempfile::TempDir,
    root: PathBuf,
    entries: Vec<Entry>,
    good: Vec<PathBuf>,
}

fn data() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let entries = gen_data(dir.path(), GOOD_IMAGES, CLASSES);
        let good = (0..GOOD_IMAGES)
            .map(|i| dir.path().join(format!("class_{:03}", i % CLASSES)).join(format!("img_{i:05}.jpg")))
            .collect();
        Data { root: dir.path().to_path_buf(), _dir: dir, entries, good }
    })
}

/// A fixed interleaving of `items` (a hash of the path), so bad files sit between good ones in every batch.
fn interleave(mut items: Vec<PathBuf>) -> Vec<PathBuf> {
    let key = |p: &Path| {
        p.to_string_lossy()
            .bytes()
            .fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
    };
    items.sort_by_key(|p| key(p));
    items
}

/// What came out for one input.
type Outcomes = BTreeMap<PathBuf, Vec<Result<Vec<u8>, String>>>;

/// read (async, 8 at a time) → batches of 16 → decode (non-strict batch decoder, 2 at a time, input order).
fn image_pipeline(items: Vec<PathBuf>) -> Outcomes {
    let decoder = Arc::new(
        BatchDecoder::new(
            BatchOptions {
                transform: Transform::resize(48, 32),
                strict: false,
                threads: Some(1),
                ..BatchOptions::default()
            },
            system_allocator(),
        )
        .expect("decoder options"),
    );
    let pipeline = PipelineBuilder::new()
        .source(items)
        .pipe(
            Stage::map_async("read", |path: PathBuf| async move {
                let bytes = tokio::fs::read(&path).await?;
                Ok::<_, std::io::Error>((path, bytes))
            })
            .concurrency(8)
            .order(OutputOrder::Input),
        )
        .aggregate(16)
        .pipe(
            Stage::map("decode", move |batch: Vec<(PathBuf, Vec<u8>)>| {
                let named: Vec<(String, &[u8])> =
                    batch.iter().map(|(p, b)| (p.display().to_string(), b.as_slice())).collect();
                let out = decoder.decode(&named)?;
                let size = out.buffer.as_bytes().len() / batch.len().max(1);
                let mut slots: Vec<Result<Vec<u8>, String>> =
                    out.buffer.as_bytes().chunks(size.max(1)).map(|s| Ok(s.to_vec())).collect();
                for f in out.failures {
                    if let Some((i, cause)) = f.batch_item()
                        && let Some(slot) = slots.get_mut(i)
                    {
                        *slot = Err(cause.to_string());
                    }
                }
                let paths = batch.into_iter().map(|(p, _)| p);
                Ok::<_, spdl_io::Error>(paths.zip(slots).collect::<Vec<_>>())
            })
            .concurrency(2)
            .order(OutputOrder::Input),
        )
        .sink(2)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build");
    let mut out = Outcomes::new();
    for batch in &pipeline {
        for (path, r) in batch.expect("the pipeline ends normally") {
            out.entry(path).or_default().push(r);
        }
    }
    let stats = pipeline.stats();
    for s in &stats.stages {
        assert_eq!(s.items_failed, 0, "stage {} failed items: per-image failures stay inside batches\n{stats}", s.name);
    }
    out
}

#[test]
fn image_pipeline_delivers_good_files_bit_identical_and_reports_every_bad_one() {
    watchdog(900, || {
        let d = data();
        let bad: Vec<&Entry> = d.entries.iter().filter(|e| e.kind != "seed").collect();
        let mut all: Vec<PathBuf> = d.good.clone();
        all.extend(bad.iter().map(|e| e.path.clone()));
        let all = interleave(all);

        let clean = image_pipeline(d.good.clone());
        let mixed = image_pipeline(all.clone());

        // Nothing lost, nothing duplicated.
        let inputs: BTreeSet<&PathBuf> = all.iter().collect();
        assert_eq!(inputs.len(), all.len());
        assert_eq!(mixed.keys().collect::<BTreeSet<_>>(), inputs, "every input comes out");
        for (p, rs) in &mixed {
            assert_eq!(rs.len(), 1, "{} came out {} times", p.display(), rs.len());
        }
        // Good files: delivered, bit-identical to the run without bad files.
        for p in &d.good {
            let want = clean.get(p).and_then(|r| r.first()).and_then(|r| r.as_ref().ok()).expect("decoded alone");
            match mixed.get(p).and_then(|r| r.first()) {
                Some(Ok(got)) => assert!(got == want, "{}: differs from the clean run", p.display()),
                other => panic!("{}: good file not delivered: {other:?}", p.display()),
            }
        }
        // Bad files: images marked `error` and every non-image are reported with their path and a cause.
        let (mut delivered, mut reported) = (0, 0);
        for e in &bad {
            let r = mixed.get(&e.path).and_then(|r| r.first()).expect("came out");
            let must_fail = e.family != "image" || e.expect == "error";
            match r {
                Ok(_) => {
                    assert!(!must_fail, "{}: delivered, but it is {} ({})", e.file, e.kind, e.detail);
                    delivered += 1;
                }
                Err(msg) => {
                    assert!(e.expect != "ok" || e.family != "image", "{}: intact image rejected: {msg}", e.file);
                    let path = e.path.display().to_string();
                    assert!(msg.contains(&path), "{}: the error does not name the path: {msg}", e.file);
                    reported += 1;
                }
            }
        }
        println!(
            "image pipeline: {} inputs = {} good (all delivered, bit-identical) + {} broken ({delivered} decodable, {reported} reported with path and cause)",
            all.len(),
            d.good.len(),
            bad.len()
        );
    });
}

/// A `tracing` writer into a shared buffer: the pipeline's failure log, to check what it says.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured_log() -> &'static LogBuffer {
    static LOG: OnceLock<LogBuffer> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = LogBuffer::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
        log
    })
}

#[test]
fn audio_pipeline_counts_and_logs_every_bad_clip() {
    let log = captured_log();
    watchdog(900, || {
        let d = data();
        let clips: Vec<&Entry> = d.entries.iter().filter(|e| e.family != "image").collect();
        let items = interleave(clips.iter().map(|e| e.path.clone()).collect());
        let n = items.len();
        let opts = AudioOptions {
            channels: ChannelSelect::Mono,
            sample_rate: Some(16_000),
            num_frames: Some(8000),
            ..AudioOptions::default()
        };
        let pipeline = PipelineBuilder::new()
            .source(items)
            .pipe(
                Stage::map("decode-audio", move |path: PathBuf| {
                    decode_audio(path.as_path(), &opts, &system_allocator()).map(|a| (path, a.buffer))
                })
                .concurrency(2),
            )
            .sink(4)
            .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
            .expect("build");
        let delivered: Vec<PathBuf> = pipeline.iter().map(|r| r.expect("the pipeline ends normally").0).collect();
        let stats = pipeline.stats();
        let failed = stats.stage("decode-audio").map_or(0, |s| s.items_failed);
        assert_eq!(delivered.len() as u64 + failed, n as u64, "every clip is delivered or counted\n{stats}");
        let delivered: BTreeSet<PathBuf> = delivered.into_iter().collect();
        assert_eq!(delivered.len() as u64 + failed, n as u64, "no clip is delivered twice");

        let text =
            String::from_utf8_lossy(&log.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).into_owned();
        let lines: Vec<&str> =
            text.lines().filter(|l| l.contains("decode-audio") && l.contains("item failed")).collect();
        assert_eq!(lines.len() as u64, failed, "one log line per failed clip");
        for e in &clips {
            let path = e.path.display().to_string();
            let logged = lines.iter().any(|l| l.contains(&path));
            assert_ne!(logged, delivered.contains(&e.path), "{}: delivered and logged, or neither", e.file);
            match e.expect.as_str() {
                "error" => assert!(logged, "{}: a bad clip was not reported", e.file),
                "ok" => assert!(!logged, "{}: an intact clip was reported as failed", e.file),
                _ => {}
            }
        }
        println!(
            "audio pipeline: {n} clips = {} delivered + {failed} failed (each logged with stage, path and cause)",
            delivered.len()
        );
    });
}

#[test]
fn spdl_bench_over_good_and_broken_images_reports_each_failure_and_finishes() {
    watchdog(900, || {
        let d = data();
        // What `spdl bench --transform resize --size 64` must deliver: each listed file decoded alone.
        let exts = ["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"];
        let listed: Vec<PathBuf> = d
            .good
            .iter()
            .cloned()
            .chain(d.entries.iter().map(|e| e.path.clone()))
            .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)))
            .collect();
        let decoder = BatchDecoder::new(
            BatchOptions {
                transform: Transform::resize(64, 64),
                strict: false,
                threads: Some(1),
                ..BatchOptions::default()
            },
            system_allocator(),
        )
        .expect("options");
        let failing: Vec<&PathBuf> =
            listed.iter().filter(|p| decoder.load(&[p]).map_or(true, |o| !o.failures.is_empty())).collect();

        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spdl"))
            .arg("bench")
            .arg(&d.root)
            .args(["--json", "--no-progress", "--threads", "2", "--batch-size", "8", "--transform", "resize"])
            .args(["--size", "64", "--no-gpu"])
            .output()
            .expect("run spdl bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "spdl bench failed: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report on stdout");
        let field = |k: &str| report.get(k).and_then(serde_json::Value::as_u64).unwrap_or_else(|| panic!("{k}"));
        assert_eq!(field("images") + field("failed"), listed.len() as u64, "{report}");
        assert_eq!(field("failed"), failing.len() as u64, "{report}");
        assert_eq!(field("failed_batches"), 0);
        for p in &failing {
            let path = p.display().to_string();
            // The engine's warning names the stage, the image and the cause.
            let reported = stderr.lines().any(|l| l.contains(&path) && l.contains("decode") && l.contains("failed"));
            assert!(reported, "{path} not reported");
        }
        println!(
            "spdl bench: {} files listed, {} delivered, {} reported on stderr with path and cause",
            listed.len(),
            field("images"),
            field("failed")
        );
    });
}
