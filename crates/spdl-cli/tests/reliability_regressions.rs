//! Regression inputs: every file under `tests/regressions/` (found by the broken-media corpus or copied there
//! by `cargo xtask fuzz` from a crash, hang or out-of-memory finding) through every entry point: the image
//! decoders, the audio decoders and probe, and the WebDataset tar reader. None may panic past the API, hang
//! (each file runs under a watchdog) or fail without naming the item.
//!
//! Decoder panics that spdl-io catches and reports as `Error::Decode` ("decoder panicked") are printed as
//! known issues: they are bugs in a decoder, contained. `SPDL_REGRESSIONS_STRICT=1` makes them fail too.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use spdl_buffer::system_allocator;
use spdl_io::MediaInput;
use spdl_io::audio::{AudioBatchOptions, AudioOptions, decode_audio, decode_audio_batch, probe};
use spdl_io::image::{BatchDecoder, BatchOptions, ImageOptions, Transform, decode_image, image_info};
use spdl_source::dataset::ShardReader;

const PER_FILE: Duration = Duration::from_secs(120);

fn inputs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            inputs(&p, out);
        } else if p.file_name().is_some_and(|n| n != "README.md") {
            out.push(p);
        }
    }
}

/// Every entry point on `bytes`; returns (entry point, error text) for each error.
fn run_all(bytes: &[u8], name: &str) -> Vec<(&'static str, String)> {
    let alloc = system_allocator();
    let img = ImageOptions::default();
    let mut errors = Vec::new();
    let mut note = |ep: &'static str, r: Result<(), String>| {
        if let Err(e) = r {
            errors.push((ep, e));
        }
    };
    note("image_info", image_info(bytes, name).map(drop).map_err(|e| spdl_report::error_chain(&e)));
    note(
        "decode_image",
        decode_image(bytes, name, &img, &Transform::None, &alloc).map(drop).map_err(|e| spdl_report::error_chain(&e)),
    );
    let batch =
        BatchDecoder::new(BatchOptions { strict: false, threads: Some(1), ..BatchOptions::default() }, alloc.clone())
            .map_err(|e| spdl_report::error_chain(&e))
            .and_then(|d| d.decode(&[(name, bytes)]).map_err(|e| spdl_report::error_chain(&e)));
    note(
        "BatchDecoder",
        batch.and_then(|o| {
            o.failures.first().map_or(Ok(()), |f| {
                Err(f.batch_item().map_or_else(|| spdl_report::error_chain(f), |(_, e)| spdl_report::error_chain(e)))
            })
        }),
    );
    note("probe", probe(MediaInput::bytes(bytes, name)).map(drop).map_err(|e| spdl_report::error_chain(&e)));
    note(
        "decode_audio",
        decode_audio(MediaInput::bytes(bytes, name), &AudioOptions::default(), &alloc)
            .map(drop)
            .map_err(|e| spdl_report::error_chain(&e)),
    );
    let opts = AudioBatchOptions { strict: false, threads: Some(1), ..AudioBatchOptions::default() };
    let audio_batch =
        decode_audio_batch(&[MediaInput::bytes(bytes, name)], &opts, &alloc).map_err(|e| spdl_report::error_chain(&e));
    note(
        "decode_audio_batch",
        audio_batch.and_then(|b| {
            b.failures.first().map_or(Ok(()), |f| {
                Err(f.batch_item().map_or_else(|| spdl_report::error_chain(f), |(_, e)| spdl_report::error_chain(e)))
            })
        }),
    );
    let mut reader = ShardReader::new(bytes, name);
    let wds = reader.samples().map_err(|e| spdl_report::error_chain(&e)).and_then(|samples| {
        for s in samples.take(bytes.len() / 512 + 2) {
            s.map_err(|e| spdl_report::error_chain(&e))?;
        }
        Ok(())
    });
    note("ShardReader", wds);
    // The in-memory TAR index (`spdl_rs.io.iter_tarfile`): every member it lists lies inside the input.
    let tar = spdl_source::tar_index::index(bytes);
    assert!(
        tar.members.iter().all(|m| m.offset.checked_add(m.size).is_some_and(|end| end <= bytes.len())),
        "{name}: tar_index listed a member outside the input"
    );
    note("tar_index", tar.into_result().map(drop).map_err(|e| format!("{name}: {e}")));
    errors
}

#[test]
fn regression_inputs_never_crash_hang_or_fail_silently() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("regressions");
    let mut files = Vec::new();
    inputs(&root, &mut files);
    files.sort();
    assert!(!files.is_empty(), "no regression inputs under {}", root.display());
    let strict = std::env::var("SPDL_REGRESSIONS_STRICT").is_ok_and(|v| v == "1");
    let mut known = Vec::new();
    for path in &files {
        let bytes = std::fs::read(path).expect("read regression input");
        let name = path.strip_prefix(&root).unwrap_or(path).display().to_string();
        let (tx, rx) = mpsc::channel();
        let worker = {
            let name = name.clone();
            std::thread::spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(|| run_all(&bytes, &name)));
                let _ = tx.send(());
                r
            })
        };
        match rx.recv_timeout(PER_FILE) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("HANG: {name} still running after {PER_FILE:?}"),
        }
        let errors = match worker.join() {
            Ok(Ok(errors)) => errors,
            Ok(Err(p)) | Err(p) => {
                panic!("PANIC escaped for {name}: {}", spdl_report::panic_message(&*p))
            }
        };
        for (ep, e) in &errors {
            assert!(e.contains(&name), "{name} through {ep}: the error does not name the input: {e}");
            if e.contains("panicked") {
                known.push(format!("{name} through {ep}: {e}"));
            }
        }
        println!("{name}: {} entry points returned errors, none crashed", errors.len());
    }
    for k in &known {
        println!("KNOWN ISSUE (decoder panic caught by spdl-io): {k}");
    }
    assert!(!strict || known.is_empty(), "{} decoder panics (SPDL_REGRESSIONS_STRICT=1)", known.len());
    println!("{} regression inputs, {} contained decoder panics", files.len(), known.len());
}
