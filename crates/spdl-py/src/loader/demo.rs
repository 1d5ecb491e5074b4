//! `python -m spdl_rs demo`: a first run of spdl_rs on data it makes itself, the same recipe as `spdl demo`.
//!
//! 1. A small JPEG dataset (`images/class_NNN/img_NNNNN.jpg`, from [`spdl_io::synth::write_dataset`], the
//!    generator `spdl demo` uses), made once and reused.
//! 2. [`spdl_loader::ImageLoader`] over it (read, batch, decode and center-crop to 224x224), with the per-stage
//!    statistics (and the bottleneck), images/s, CPU seconds and peak RSS.
//! 3. Where video decoding works and the `ffmpeg` command is on PATH, a few short H.264 videos and
//!    [`spdl_loader::ClipLoader`] over them (clips/s); otherwise one line says why not and how to get video.
//!
//! The human report is printed as the run goes; the figures are also returned as a dict (`--json`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use spdl_loader::usage::{cpu_seconds, peak_rss_bytes};
use spdl_loader::{GpuMode, ListOptions, Listing, LoaderError, LoaderOptions};

use super::{loader_err, next_batch, stats_table, stop_pipeline};

/// Seed and classes of the dataset: the same files on every machine (those of `spdl demo`).
const SEED: u64 = 2024;
const CLASSES: usize = 10;
/// The side of the square images the loader makes (center crop).
const SIZE: u32 = 224;

/// The video part: short testsrc2 videos (H.264, 25 fps, a keyframe every second), a few clips of each.
const VIDEO_SIZES: [(u32, u32); 4] = [(320, 240), (480, 270), (640, 360), (640, 480)];
const VIDEO_SECONDS: u32 = 3;
const CLIPS_PER_VIDEO: usize = 3;
const CLIP_FRAMES: usize = 8;
const CLIP_SIZE: u32 = 112;
const CLIP_PASSES: usize = 3;

const VIDEO_BUILD_HINT: &str = "to decode video, use a build with the `ffmpeg` feature (the wheel of `cargo xtask \
                                wheel` has it) and FFmpeg's shared libraries (e.g. `apt-get install ffmpeg`)";

/// A one-line progress display on stderr, only when stderr is a terminal.
struct Progress {
    total: usize,
    unit: &'static str,
    enabled: bool,
    t0: Instant,
    last: Option<Instant>,
}

impl Progress {
    fn new(total: usize, unit: &'static str, enabled: bool) -> Self {
        Self { total, unit, enabled: enabled && std::io::stderr().is_terminal(), t0: Instant::now(), last: None }
    }

    fn update(&mut self, done: usize) {
        if !self.enabled || (self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) && done < self.total) {
            return;
        }
        self.last = Some(Instant::now());
        let rate = done as f64 / self.t0.elapsed().as_secs_f64().max(1e-9);
        let filled = (30 * done / self.total.max(1)).min(30);
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(30 - filled));
        let mut err = std::io::stderr();
        let _ = write!(err, "\r[{bar}] {done}/{} {}  {rate:.0}/s ", self.total, self.unit);
        let _ = err.flush();
    }

    fn close(&self) {
        if self.enabled {
            let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(72));
        }
    }
}

/// `"N MiB"` of a byte count.
fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Writes the images of the dataset that are not there yet; returns how many were missing.
fn make_images(py: Python<'_>, dir: &Path, count: usize) -> PyResult<usize> {
    let path = |i: usize| dir.join(format!("class_{:03}", i % CLASSES)).join(format!("img_{i:05}.jpg"));
    let missing = (0..count).filter(|&i| !path(i).is_file()).count();
    if missing > 0 {
        crate::lifecycle::detach(py, || spdl_io::synth::write_dataset(dir, count, SEED, CLASSES)).map_err(|e| {
            PyOSError::new_err(format!(
                "cannot write the demo dataset in {}: {}",
                dir.display(),
                spdl_report::error_chain(&e)
            ))
        })?;
    }
    Ok(missing)
}

/// True for `KeyboardInterrupt` (Ctrl-C stops a run: its figures so far are reported).
fn is_interrupt(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<PyKeyboardInterrupt>(py)
}

/// Runs the image loader over the first `count` images; returns its figures.
fn run_images<'py>(
    py: Python<'py>,
    dir: &Path,
    count: usize,
    batch_size: usize,
    threads: usize,
    human: bool,
) -> PyResult<(Bound<'py, PyDict>, bool)> {
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let opts = LoaderOptions {
        batch_size,
        threads,
        transform: spdl_loader::eval_transform(SIZE),
        gpu: GpuMode::Off,
        ..LoaderOptions::default()
    };
    let location = dir.to_string_lossy().into_owned();
    let loader = crate::lifecycle::detach(py, move || {
        let mut listing = Listing::open(&location, &ListOptions::default())?;
        listing.truncate(count);
        Ok::<_, Box<LoaderError>>(spdl_loader::ImageLoader::new(listing, opts)?)
    })
    .map_err(|e| loader_err(*e))?;
    let pipeline = loader.pipeline();
    let mut progress = Progress::new(loader.images_per_epoch(), "images", human);
    let (mut slots, mut batches, mut first_batch, mut interrupted) = (0usize, 0usize, None, false);
    let outcome = loop {
        match next_batch(py, pipeline, "image loader") {
            Ok(Some(batch)) => {
                first_batch.get_or_insert_with(|| started.elapsed().as_secs_f64());
                slots += batch.labels.len();
                batches += 1;
                progress.update(slots);
            }
            Ok(None) => break Ok(()),
            Err(e) if is_interrupt(py, &e) => {
                interrupted = true;
                break Ok(());
            }
            Err(e) => break Err(e),
        }
    };
    stop_pipeline(py, pipeline);
    progress.close();
    outcome?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let failed = loader.failed_images();
    let images = (slots as u64).saturating_sub(failed);
    let table = stats_table(py, pipeline);
    let bottleneck = pipeline.stats().bottleneck().map(|s| s.name.clone());
    let r = PyDict::new(py);
    r.set_item("path", dir.to_string_lossy())?;
    r.set_item("images", images)?;
    r.set_item("failed", failed)?;
    r.set_item("batches", batches)?;
    r.set_item("seconds", seconds)?;
    r.set_item("first_batch_seconds", first_batch)?;
    let images_per_sec = images as f64 / seconds.max(1e-9);
    r.set_item("images_per_sec", images_per_sec)?;
    r.set_item("cpu_seconds", cpu)?;
    let per_cpu = images as f64 / cpu.max(1e-9);
    r.set_item("images_per_cpu_second", per_cpu)?;
    r.set_item("threads", threads)?;
    r.set_item("batch_size", batch_size)?;
    r.set_item("size", SIZE)?;
    r.set_item("interrupted", interrupted)?;
    r.set_item("bottleneck", &bottleneck)?;
    r.set_item("stats_table", &table)?;
    let peak = peak_rss_bytes();
    r.set_item("peak_rss_bytes", peak)?;
    if human {
        println!("{}", table.trim_end());
        if interrupted {
            println!("interrupted (Ctrl-C): figures so far");
        }
        println!(
            "{images} images ({failed} failed) in {seconds:.2} s: {images_per_sec:.0} images/s, {per_cpu:.0} images \
             per CPU-second ({cpu:.2} CPU s), peak RSS {}",
            mib(peak)
        );
        let bottleneck = bottleneck.map(|b| format!(", bottleneck: {b}")).unwrap_or_default();
        println!("{threads} threads, batch {batch_size}, {SIZE}x{SIZE}{bottleneck}");
    }
    Ok((r, interrupted))
}

/// Why video cannot be decoded here (this loads FFmpeg), and how to get it where that is known.
fn video_unavailable(has_video: bool) -> Option<(String, Option<&'static str>)> {
    let no_feature = || Some(("spdl_rs was built without the `ffmpeg` feature".to_owned(), Some(VIDEO_BUILD_HINT)));
    if !has_video {
        return no_feature();
    }
    #[cfg(feature = "ffmpeg")]
    {
        let status = spdl_io::media::ffmpeg_status();
        (!status.available).then(|| (status.error.unwrap_or_default(), None))
    }
    #[cfg(not(feature = "ffmpeg"))]
    no_feature()
}

/// The `ffmpeg` command on PATH, if any.
fn ffmpeg_command() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join("ffmpeg")).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Short H.264 test videos made with the `ffmpeg` command (kept once made).
fn make_videos(ffmpeg: &Path, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut paths = Vec::new();
    for (k, (w, h)) in VIDEO_SIZES.iter().enumerate() {
        let path = dir.join(format!("video_{k:02}_{w}x{h}.mp4"));
        if !path.is_file() {
            let tmp = dir.join(format!(".partial-{}-{k:02}", std::process::id()));
            let source = format!("testsrc2=size={w}x{h}:rate=25:duration={VIDEO_SECONDS}");
            let mut child = std::process::Command::new(ffmpeg)
                .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i", &source])
                .args(["-c:v", "libx264", "-preset", "veryfast", "-g", "25", "-pix_fmt", "yuv420p", "-f", "mp4"])
                .arg(&tmp)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run `ffmpeg`: {e}"))?;
            let deadline = Instant::now() + Duration::from_secs(120);
            while child.try_wait().map_err(|e| format!("`ffmpeg`: {e}"))?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let done = child.wait_with_output().map_err(|e| format!("`ffmpeg`: {e}"))?;
            if !done.status.success() {
                let _ = std::fs::remove_file(&tmp);
                let stderr = String::from_utf8_lossy(&done.stderr);
                let detail = stderr.trim().lines().last().map_or_else(|| done.status.to_string(), str::to_owned);
                return Err(format!("`ffmpeg` could not make an H.264 test video: {detail}"));
            }
            std::fs::rename(&tmp, &path).map_err(|e| format!("cannot rename {}: {e}", tmp.display()))?;
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Makes the test videos and runs the clip loader over them; returns its figures, or why it did not run
/// (`ran` is false, `reason` says why, `hint` how to get video where that is the cause).
fn run_videos<'py>(
    py: Python<'py>,
    dir: &Path,
    threads: usize,
    has_video: bool,
    human: bool,
) -> PyResult<Bound<'py, PyDict>> {
    if let Some((reason, hint)) = video_unavailable(has_video) {
        return skipped(py, false, &reason, hint, human);
    }
    let Some(ffmpeg) = ffmpeg_command() else {
        return skipped(py, true, "no `ffmpeg` command on PATH to make the H.264 test videos", None, human);
    };
    let videos = match crate::lifecycle::detach(py, || make_videos(&ffmpeg, dir)) {
        Ok(videos) => videos,
        Err(reason) => return skipped(py, true, &reason, None, human),
    };
    let r = PyDict::new(py);
    r.set_item("available", true)?;
    r.set_item("ran", false)?;
    r.set_item("reason", py.None())?;
    r.set_item("hint", py.None())?;
    run_clips(py, &r, dir, videos.len(), threads, human)?;
    Ok(r)
}

/// The figures of a video part that did not run: `available` (video decoding works here), why not, and how
/// to get video where that is the cause; one line says so unless the output is JSON.
fn skipped<'py>(
    py: Python<'py>,
    available: bool,
    reason: &str,
    hint: Option<&str>,
    human: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let r = PyDict::new(py);
    r.set_item("available", available)?;
    r.set_item("ran", false)?;
    r.set_item("reason", reason)?;
    r.set_item("hint", hint)?;
    if human && available {
        println!("video: skipped: {reason}.");
    } else if human {
        println!("video: unavailable: {reason}{}", hint.map(|h| format!("; {h}.")).unwrap_or_default());
    }
    Ok(r)
}

#[cfg(not(feature = "ffmpeg"))]
fn run_clips(_: Python<'_>, _: &Bound<'_, PyDict>, _: &Path, _: usize, _: usize, _: bool) -> PyResult<()> {
    Err(pyo3::exceptions::PyRuntimeError::new_err("spdl_rs was built without the `ffmpeg` feature"))
}

/// The clip loader over the test videos (`CLIP_PASSES` epochs, `CLIPS_PER_VIDEO` evenly spaced clips of
/// `CLIP_FRAMES` frames each); its figures go into `r`.
#[cfg(feature = "ffmpeg")]
fn run_clips(
    py: Python<'_>,
    r: &Bound<'_, PyDict>,
    dir: &Path,
    videos: usize,
    threads: usize,
    human: bool,
) -> PyResult<()> {
    use spdl_loader::{ClipLoaderOptions, ClipSampling, VIDEO_EXTENSIONS};

    let opts = ClipLoaderOptions {
        batch_size: 1,
        threads,
        epochs: CLIP_PASSES,
        num_clips: CLIPS_PER_VIDEO,
        num_frames: CLIP_FRAMES,
        size: Some((CLIP_SIZE, CLIP_SIZE)),
        sampling: ClipSampling::Regular,
        ..ClipLoaderOptions::default()
    };
    let location = dir.to_string_lossy().into_owned();
    let loader = crate::lifecycle::detach(py, move || {
        let mut listing = Listing::open_with_extensions(&location, &ListOptions::default(), VIDEO_EXTENSIONS)?;
        // Only the videos made here (not a partial file of a run that was killed).
        listing
            .samples
            .retain(|s| Path::new(&s.key).file_name().is_some_and(|n| n.to_string_lossy().starts_with("video_")));
        Ok::<_, Box<LoaderError>>(spdl_loader::ClipLoader::new(listing, opts)?)
    })
    .map_err(|e| loader_err(*e))?;
    let total = videos * CLIP_PASSES * CLIPS_PER_VIDEO;
    let pipeline = loader.pipeline();
    let mut progress = Progress::new(total, "clips", human);
    let (mut done, mut interrupted) = (0usize, false);
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let outcome = loop {
        match next_batch(py, pipeline, "clip loader") {
            Ok(Some(batch)) => {
                done += batch.num_clips();
                progress.update(done);
            }
            Ok(None) => break Ok(()),
            Err(e) if is_interrupt(py, &e) => {
                interrupted = true;
                break Ok(());
            }
            Err(e) => break Err(e),
        }
    };
    stop_pipeline(py, pipeline);
    progress.close();
    outcome?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let table = stats_table(py, pipeline);
    let bottleneck = pipeline.stats().bottleneck().map(|s| s.name.clone());
    let failed = if interrupted { 0 } else { total.saturating_sub(done) };
    let clips_per_sec = done as f64 / seconds.max(1e-9);
    let frames_per_sec = (done * CLIP_FRAMES) as f64 / seconds.max(1e-9);
    r.set_item("ran", true)?;
    r.set_item("path", dir.to_string_lossy())?;
    r.set_item("videos", videos)?;
    r.set_item("clips", done)?;
    r.set_item("failed", failed)?;
    r.set_item("clips_per_video", CLIPS_PER_VIDEO)?;
    r.set_item("frames_per_clip", CLIP_FRAMES)?;
    r.set_item("clip_size", CLIP_SIZE)?;
    r.set_item("seconds", seconds)?;
    r.set_item("clips_per_sec", clips_per_sec)?;
    r.set_item("frames_per_sec", frames_per_sec)?;
    r.set_item("cpu_seconds", cpu)?;
    r.set_item("threads", threads)?;
    r.set_item("interrupted", interrupted)?;
    r.set_item("bottleneck", &bottleneck)?;
    r.set_item("stats_table", &table)?;
    if human {
        println!();
        println!(
            "video: {videos} H.264 test videos in {}; {CLIPS_PER_VIDEO} clips of {CLIP_FRAMES} frames per video at \
             {CLIP_SIZE}x{CLIP_SIZE} (spdl_rs.loader.ClipLoader)",
            dir.display()
        );
        println!("{}", table.trim_end());
        if interrupted {
            println!("interrupted (Ctrl-C): figures so far");
        }
        let bottleneck = bottleneck.map(|b| format!(", bottleneck: {b}")).unwrap_or_default();
        println!(
            "{done} clips ({failed} failed) in {seconds:.2} s: {clips_per_sec:.1} clips/s ({frames_per_sec:.0} \
             frames/s), {cpu:.2} CPU s, peak RSS {}, {threads} threads{bottleneck}",
            mib(peak_rss_bytes())
        );
    }
    Ok(())
}

/// The demo of `python -m spdl_rs demo` in `root` (`images/`, `videos/`): makes the dataset (once), runs the
/// image loader over `images` of them with `threads` decoding threads (default: one per core), then the video
/// part where `has_video` (the caller's `spdl_rs.io.has_video()`) and FFmpeg allow. Prints the report as it
/// goes unless `json_output`, and returns the figures (the `--json` object but for `mode`, `version` and
/// `build_info`). Raises `OSError`/`RuntimeError`/`ValueError` on failure.
#[pyfunction]
#[pyo3(signature = (root, *, images, batch_size, threads, json_output, has_video))]
pub(crate) fn run_demo<'py>(
    py: Python<'py>,
    root: PathBuf,
    images: usize,
    batch_size: usize,
    threads: Option<usize>,
    json_output: bool,
    has_video: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let human = !json_output;
    let t0 = Instant::now();
    let images_dir = root.join("images");
    let made = make_images(py, &images_dir, images)?;
    let dataset = PyDict::new(py);
    dataset.set_item("images", images)?;
    dataset.set_item("made", made)?;
    let seconds = t0.elapsed().as_secs_f64();
    dataset.set_item("seconds", seconds)?;
    if human {
        eprintln!(
            "demo dataset: {images} JPEGs in {} ({made} made, {seconds:.1} s to check/make)",
            images_dir.display()
        );
    }
    let out = PyDict::new(py);
    out.set_item("dir", root.to_string_lossy())?;
    out.set_item("dataset", dataset)?;
    let (report, interrupted) = run_images(py, &images_dir, images, batch_size, threads, human)?;
    out.update(report.as_mapping())?;
    let video = if interrupted {
        skipped(py, false, "interrupted", None, human)?
    } else {
        run_videos(py, &root.join("videos"), threads, has_video, human)?
    };
    out.set_item("video", video)?;
    out.set_item("final_peak_rss_bytes", peak_rss_bytes())?;
    Ok(out)
}
