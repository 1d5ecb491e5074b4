//! `spdl bench --video DIR`: the clip recipe of [`spdl_loader`] (list videos → read bytes → decode a few
//! clips of each → batch) with a progress bar, Ctrl-C and the report (table or JSON). Needs the `ffmpeg`
//! feature.

use std::path::Path;

use anyhow::Result;

use crate::LoaderArgs;

/// `--clips`, `--frames` of `spdl bench --video`.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "ffmpeg"), allow(dead_code))]
pub struct ClipArgs {
    /// Clips per video.
    pub clips: usize,
    /// Frames per clip.
    pub frames: usize,
}

/// Without FFmpeg, there is no video to load.
#[cfg(not(feature = "ffmpeg"))]
pub fn run(path: &Path, _args: &LoaderArgs, _clips: ClipArgs) -> Result<()> {
    anyhow::bail!(
        "cannot bench the videos of {}: this build of spdl has no video support (rebuild with --features ffmpeg)",
        path.display()
    )
}

/// Runs the clip pipeline and prints the report.
#[cfg(feature = "ffmpeg")]
pub fn run(path: &Path, args: &LoaderArgs, clip_args: ClipArgs) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail};
    use spdl_loader::{ClipLoader, ClipLoaderOptions, ListOptions, Listing, VIDEO_EXTENSIONS};

    use crate::report::StageReport;
    use spdl_loader::usage;

    if args.size == 0 {
        bail!("--size must be at least 1");
    }
    let threads = args.threads.unwrap_or_else(crate::default_threads);
    let opts = ClipLoaderOptions {
        batch_size: args.batch_size,
        threads,
        io_concurrency: args.io_concurrency,
        epochs: args.epochs,
        num_clips: clip_args.clips,
        num_frames: clip_args.frames,
        size: Some((args.size, args.size)),
        seed: args.seed,
        ..ClipLoaderOptions::default()
    };
    let location = path.to_str().context("the path is not UTF-8")?;
    let mut listing = Listing::open_with_extensions(location, &ListOptions::default(), VIDEO_EXTENSIONS)
        .context("cannot list the videos")?;
    if let Some(limit) = args.limit {
        listing.truncate(limit);
    }
    let total = listing.samples.len().saturating_mul(args.epochs);
    let loader = ClipLoader::new(listing, opts).map_err(|e| anyhow::anyhow!("{}", spdl_report::error_chain(&e)))?;

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        let _ = ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let pipeline = loader.pipeline();
    let progress = if args.json || args.no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} videos  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    };

    let cpu0 = usage::cpu_seconds();
    let t0 = Instant::now();
    let (mut videos, mut clips, mut batches) = (0u64, 0u64, 0u64);
    let mut interrupted = false;
    let mut error = None;
    let mut iter = pipeline.iter();
    loop {
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        match iter.next_timeout(Duration::from_millis(100)) {
            None => break,
            Some(Ok(batch)) => {
                videos += batch.len() as u64;
                clips += batch.num_clips() as u64;
                batches += 1;
                progress.inc(batch.len() as u64);
            }
            Some(Err(e)) if e.is_timeout() => continue,
            Some(Err(e)) => {
                error = Some(e);
                break;
            }
        }
    }
    pipeline.stop();
    progress.finish_and_clear();
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = usage::cpu_seconds() - cpu0;
    let stats = pipeline.stats();
    let failed = loader.failed_videos();
    let report = ClipReport {
        mode: "bench-video".into(),
        path: path.display().to_string(),
        videos,
        clips,
        failed,
        batches,
        seconds,
        clips_per_sec: clips as f64 / seconds.max(1e-9),
        cpu_seconds: cpu,
        clips_per_cpu_second: clips as f64 / cpu.max(1e-9),
        peak_rss_bytes: usage::peak_rss_bytes(),
        threads,
        batch_size: args.batch_size,
        num_clips: clip_args.clips,
        num_frames: clip_args.frames,
        size: args.size,
        epochs: args.epochs,
        interrupted,
        bottleneck: stats.bottleneck().map(|s| s.name.clone()),
        stages: stats.stages.iter().map(StageReport::from).collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{stats}");
        report.print_summary();
    }
    if let Some(e) = error {
        return Err(e).context("the pipeline stopped on an error");
    }
    if videos == 0 && failed > 0 && !interrupted {
        bail!("no video was loaded from {}: all {failed} failed (each is named in the warnings above)", path.display());
    }
    Ok(())
}

/// The report of a `spdl bench --video` run (`--json`).
#[cfg(feature = "ffmpeg")]
#[derive(Debug, serde::Serialize)]
struct ClipReport {
    mode: String,
    path: String,
    videos: u64,
    clips: u64,
    failed: u64,
    batches: u64,
    seconds: f64,
    clips_per_sec: f64,
    cpu_seconds: f64,
    clips_per_cpu_second: f64,
    peak_rss_bytes: u64,
    threads: usize,
    batch_size: usize,
    num_clips: usize,
    num_frames: usize,
    size: u32,
    epochs: usize,
    interrupted: bool,
    bottleneck: Option<String>,
    stages: Vec<crate::report::StageReport>,
}

#[cfg(feature = "ffmpeg")]
impl ClipReport {
    fn print_summary(&self) {
        if self.interrupted {
            println!("interrupted (Ctrl-C): figures so far");
        }
        println!(
            "{} videos, {} clips ({} failed videos) in {:.2} s: {:.1} clips/s, {:.1} clips per CPU-second ({:.2} \
             CPU s), peak RSS {:.0} MiB",
            self.videos,
            self.clips,
            self.failed,
            self.seconds,
            self.clips_per_sec,
            self.clips_per_cpu_second,
            self.cpu_seconds,
            self.peak_rss_bytes as f64 / (1024.0 * 1024.0)
        );
        println!(
            "{} threads, batch {}, {} clips x {} frames of {}x{}{}",
            self.threads,
            self.batch_size,
            self.num_clips,
            self.num_frames,
            self.size,
            self.size,
            match &self.bottleneck {
                Some(b) => format!(", bottleneck: {b}"),
                None => String::new(),
            }
        );
    }
}
