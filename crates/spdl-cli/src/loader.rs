//! `spdl demo` and `spdl bench`: the command line over [`spdl_loader`]'s recipe (list → read bytes through
//! the store → aggregate → decode + transform the batch → optional H2D), with Ctrl-C, a progress bar and
//! the report (table or JSON).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use spdl_io::image::{ResizeFilter, Transform, TransformName};
use spdl_loader::{GpuMode, GpuStatus, ImageLoader, ListOptions, Listing, LoaderError, LoaderOptions};

use crate::LoaderArgs;
use crate::report::{AutotuneSummary, Report, StageReport};
use spdl_loader::usage;

/// Where `spdl bench` reads bytes from when they are not local files: an object store (`s3://bucket/prefix`,
/// `http(s)://host/path`) given as the PATH (listed) or with `--store` (PATH is then a list file of its keys).
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// `--store URL`: read the keys of the list file PATH from this store.
    pub store: Option<String>,
    /// `--endpoint URL`: an S3-compatible server (path-style addressing), instead of AWS.
    pub endpoint: Option<String>,
}

fn transform(args: &LoaderArgs) -> Result<Transform> {
    if args.size == 0 {
        bail!("--size must be at least 1");
    }
    let name: TransformName = args.transform.parse()?;
    Ok(name.transform(args.size, args.size, ResizeFilter::Bilinear, args.seed))
}

/// The recipe's options from the command line, checked (by the loader's own check, once) before anything is
/// paid.
fn options(args: &LoaderArgs) -> Result<LoaderOptions> {
    let opts = LoaderOptions {
        batch_size: args.batch_size,
        threads: args.threads.unwrap_or_else(crate::default_threads),
        io_concurrency: args.io_concurrency,
        epochs: args.epochs,
        transform: transform(args)?,
        normalize: args.normalize,
        gpu: if args.no_gpu { GpuMode::Off } else { GpuMode::Auto },
        // Hand-set options stay as set unless --autotune asks for tuning all the same.
        autotune: args.autotune || (!args.no_autotune && args.threads.is_none() && args.io_concurrency.is_none()),
        ..LoaderOptions::default()
    };
    opts.validate().map_err(|e| match e {
        LoaderError::InvalidOption { option, reason } => anyhow::anyhow!("--{}: {reason}", option.replace('_', "-")),
        other => other.into(),
    })?;
    Ok(opts)
}

/// Runs the pipeline and prints the report (table or JSON).
pub fn run(path: &Path, args: &LoaderArgs, mode: &str, remote: &Remote) -> Result<()> {
    let opts = options(args)?;
    let opts_threads = opts.threads;
    let list_opts = ListOptions { store: remote.store.clone(), endpoint: remote.endpoint.clone() };
    let location = path.to_str().context("the path is not UTF-8")?;
    let mut listing = Listing::open(location, &list_opts).map_err(|e| {
        anyhow::Error::new(e).context(if remote.store.is_none() && location.starts_with("http") {
            "an HTTP store cannot be listed: give a list file and --store"
        } else {
            "cannot list the dataset"
        })
    })?;
    if let Some(limit) = args.limit {
        listing.truncate(limit);
    }
    let total = listing.samples.len().saturating_mul(args.epochs);
    let started = Instant::now();
    let loader = ImageLoader::new(listing, opts).map_err(|e| {
        let hint = if matches!(e, spdl_loader::LoaderError::Gpu(_)) { " (use --no-gpu to run on CPU)" } else { "" };
        anyhow::anyhow!("{}{hint}", spdl_report::error_chain(&e))
    })?;
    if !args.json {
        eprintln!(
            "{}",
            match loader.gpu_status() {
                GpuStatus::Used { index, name } => format!("GPU {index} ({name}): pinned batches, async H2D copies"),
                GpuStatus::Off => "no GPU (--no-gpu): CPU batches".to_owned(),
                GpuStatus::Unavailable if cfg!(feature = "cuda") => "no GPU: CPU batches".to_owned(),
                GpuStatus::Unavailable => "no GPU: CPU batches (built without the `cuda` feature)".to_owned(),
            }
        );
        if !cfg!(feature = "turbojpeg") {
            eprintln!(
                "JPEG: {} (full decodes); build with --features turbojpeg (needs cmake and nasm) to decode only \
                 what the crop keeps with libjpeg-turbo",
                spdl_io::image::JPEG_DECODER
            );
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // Ctrl-C: stop feeding, print what was measured so far. A second Ctrl-C exits at once.
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
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} images  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    };

    let cpu0 = usage::cpu_seconds();
    let t0 = Instant::now();
    let mut images = 0u64;
    let mut failed_slots = 0u64;
    let mut batches = 0u64;
    let mut interrupted = false;
    let mut error = None;
    let mut first_batch = None;
    let mut iter = pipeline.iter();
    loop {
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        match iter.next_timeout(Duration::from_millis(100)) {
            None => break,
            Some(Ok(batch)) => {
                first_batch.get_or_insert_with(|| started.elapsed().as_secs_f64());
                let n = batch.labels.len();
                debug_assert_eq!(batch.images.len(), n);
                images += (n - batch.failed) as u64;
                failed_slots += batch.failed as u64;
                batches += 1;
                progress.inc(n as u64);
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
    let transfer = match loader.transfer() {
        Some(t) => {
            // Let the last copies finish so the figures cover every batch.
            if let Err(e) = t.synchronize() {
                tracing::warn!(stage = "h2d", "waiting for the last copies failed: {}", spdl_report::error_chain(&e));
            }
            Some(t.stats())
        }
        None => None,
    };
    // Failed reads and failed decodes (each image of a batch, or a batch as a whole) are failed items of
    // their stage; the slots of the delivered batches tell the two kinds of decode failure apart.
    let read_failed = stats.stage("read").map_or(0, |s| s.items_failed);
    let failed_batches = stats.stage("decode").map_or(0, |s| s.items_failed).saturating_sub(failed_slots);
    let report = Report {
        mode: mode.to_string(),
        path: path.display().to_string(),
        images,
        failed: read_failed + failed_slots,
        failed_batches,
        batches,
        seconds,
        first_batch_seconds: first_batch,
        images_per_sec: images as f64 / seconds.max(1e-9),
        cpu_seconds: cpu,
        images_per_cpu_second: images as f64 / cpu.max(1e-9),
        peak_rss_bytes: usage::peak_rss_bytes(),
        threads: opts_threads,
        batch_size: args.batch_size,
        size: args.size,
        epochs: args.epochs,
        interrupted,
        gpu: loader.transfer().is_some(),
        h2d_gbps: transfer.and_then(|t| t.h2d_gbps()),
        h2d_bytes: transfer.map(|t| t.bytes),
        pinned_hit_rate: transfer.and_then(|t| t.pool).map(|p| p.hit_rate()),
        batch_pool_hit_rate: transfer
            .and_then(|t| t.pool)
            .or_else(|| loader.batch_pool_stats())
            .map_or(0.0, |p| p.hit_rate()),
        bottleneck: stats.bottleneck().map(|s| s.name.clone()),
        stages: stats.stages.iter().map(StageReport::from).collect(),
        autotune: pipeline.autotune().map(|r| AutotuneSummary::new(&r, &stats)),
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
    if report.images == 0 && report.failed > 0 && !interrupted {
        // A run that loaded nothing is a failed run, whatever the table says (wrong root, unreadable listing
        // paths, a corpus of one unsupported format): exit non-zero so scripts and CI notice.
        bail!(
            "no image was loaded from {}: all {} failed (each is named in the warnings above)",
            path.display(),
            report.failed
        );
    }
    Ok(())
}
